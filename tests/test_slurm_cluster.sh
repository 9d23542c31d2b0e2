#!/usr/bin/env bash
# scripts/slurm.sh on a 3-host namespace cluster: `up` brings slurmctld and a slurmd per
# host to idle nodes; `srun -N 3 hostname` runs on h1, h2 and h3 (each step sees its own
# host's name and address); both partitions exist with their priorities; a batch job
# launches one mpirun per node through scripts/tide-slurm-pools.sh (each mpirun's ranks
# on its own node, in the allocation); `down` while a job runs leaves no process of
# Slurm's (daemons, slurmstepd, tasks), no munged, no mount and no folder behind, a
# namespace made after `down` with one of the freed inodes is not taken for Slurm's, and
# a second `up`/`down` on the same cluster works. tide-slurm-pools refuses to run outside
# an allocation.
# usage: test_slurm_cluster.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# shellcheck source=slurm_lib.sh
. "$TIDE_SRC/tests/slurm_lib.sh"
sl_require
mh_setup 3
SD=/run/tide-cluster/$MH_NAME/slurm

note "up: every node idle"
t0=$(date +%s%3N)
sl_up
echo "Slurm up on 3 hosts in $(($(date +%s%3N) - t0)) ms"
[ "$(sinfo -h -N -p low -t idle -o %N | sort -u | tr '\n' ' ')" = "h1 h2 h3 " ] ||
  fail "nodes not idle: $(sinfo -N)"
sinfo -h -o '%P %l' | grep -q '^low\* ' || fail "no default partition low: $(sinfo)"
# (whole outputs: grep -q would cut a pipe short, and pipefail would call that a failure)
parts=$(scontrol show partition)
conf=$(scontrol show config)
grep -q 'PriorityTier=10 ' <<<"$parts" || fail "no partition of priority tier 10"
grep -q 'GraceTime=30 ' <<<"$parts" || fail "low has no 30 s grace"
grep -q 'permit_job_expansion' <<<"$conf" || fail "job expansion not permitted"
grep -q 'PreemptType *= preempt/partition_prio' <<<"$conf" || fail "no preemption"

note "srun -N 3 hostname"
out=$(srun -N 3 bash -c 'echo "$(hostname) $(hostname -I)"' | sort)
echo "$out"
for i in 1 2 3; do
  grep -q "^h$i ${TIDE_CLUSTER_ADDR%.254}.$i *$" <<<"$out" || fail "no step on h$i with its address: $out"
done

note "tide-slurm-pools: one mpirun per node, each with its ranks on its node"
cat >"$MH_TMP/pools.sbatch" <<EOF
#!/bin/bash
#SBATCH --output=$MH_TMP/pools-%j.out
exec bash $POOLS_SH --ranks-per-node 2 -- --allow-run-as-root --oversubscribe \
  --mca btl_tcp_if_include $TIDE_CLUSTER_SUBNET --mca oob_tcp_if_include $TIDE_CLUSTER_SUBNET \
  bash -c 'echo "rank \$OMPI_COMM_WORLD_RANK of \$OMPI_COMM_WORLD_SIZE on \$(hostname) job \$SLURM_JOB_ID leave \$TIDE_LEAVE_SIGNAL"'
EOF
id=$(sbatch --parsable -N 2 "$MH_TMP/pools.sbatch")
for _ in $(seq 300); do [ -z "$(sl_state "$id")" ] && break; sleep 0.1; done
out=$(cat "$MH_TMP/pools-$id.out")
echo "$out"
for h in h1 h2; do
  [ "$(grep -c "of 2 on $h job $id leave USR1" <<<"$out")" -eq 2 ] || fail "not 2 ranks of a 2-rank launch on $h"
done
! grep -q " on h3 " <<<"$out" || fail "a rank ran outside the allocation"
! env -u SLURM_JOB_ID -u SLURM_JOB_NODELIST bash "$POOLS_SH" -- true 2>"$MH_TMP/err" ||
  fail "tide-slurm-pools ran outside an allocation"
grep -q "not inside a Slurm allocation" "$MH_TMP/err" || fail "no reason: $(cat "$MH_TMP/err")"

note "down while a job runs: nothing left"
id=$(sbatch --parsable -N 3 --wrap 'srun sleep 300')
sl_wait_state "$id" RUNNING 30
for _ in $(seq 100); do [ "$(pgrep -c -f '^sleep 300$' || true)" -ge 3 ] && break; sleep 0.1; done
pids=$(cat "$SD/slurmctld.pid" "$SD/munge/munged.pid" "$SD"/spool/h*/slurmd.pid)
cp "$SD/namespaces" "$MH_TMP/namespaces"
[ -n "$(bash "$SLURM_SH" procs --name "$MH_NAME")" ] || fail "slurm.sh procs names no process while a job runs"
t0=$(date +%s%3N)
bash "$SLURM_SH" down --name "$MH_NAME"
echo "Slurm down in $(($(date +%s%3N) - t0)) ms"
for p in $pids; do ! kill -0 "$p" 2>/dev/null || fail "daemon $p still runs"; done
left=$(bash "$SLURM_SH" procs --name "$MH_NAME" "$MH_TMP/namespaces")
[ -z "$left" ] || fail "processes left in Slurm's namespaces: $left"
# The freed inodes go to the next namespaces made (a test beside this one, an `ip netns
# exec`): processes there are not Slurm's, and down would kill them if they were named.
unshare --mount --uts --propagation private sleep 60 &
other=$!
for _ in $(seq 50); do
  [ "$(stat -L -c %i /proc/$other/ns/mnt)" != "$(stat -L -c %i /proc/self/ns/mnt)" ] && break
  sleep 0.1
done
reused=$(grep -c "^$(stat -L -c %i /proc/$other/ns/mnt) " "$MH_TMP/namespaces" || true)
left=$(bash "$SLURM_SH" procs --name "$MH_NAME" "$MH_TMP/namespaces")
kill "$other"
wait "$other" 2>/dev/null || true
[ -z "$left" ] || fail "a namespace made after down (inode reused: $reused) is named Slurm's: $left"
! pgrep -f "$SD" >/dev/null || fail "a process still names $SD: $(pgrep -af "$SD")"
! grep -q "$SD" /proc/self/mountinfo || fail "a mount of $SD is left"
[ ! -e "$SD" ] || fail "$SD is left"

note "up and down again on the same cluster"
sl_up
srun -N 3 true || fail "srun after a second up"
bash "$SLURM_SH" down --name "$MH_NAME"
[ ! -e "$SD" ] || fail "$SD is left"
echo "PASS: Slurm comes up on the namespace hosts, runs one launch per node, and goes without a trace"
