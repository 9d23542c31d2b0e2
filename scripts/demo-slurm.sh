#!/usr/bin/env bash
# tide under Slurm in about three minutes (docs/slurm.md; root: it makes a
# 3-host namespace cluster with scripts/cluster.sh and a Slurm cluster on it with
# scripts/slurm.sh, both removed on exit). The job's side runs as user nobody, as on a
# real cluster: tided --provider slurm, its ompi-server, sbatch and everything the batch
# jobs start; only the operator's tidectl and the Slurm daemons are root. It shows:
#   start    `sbatch -N 2` of a batch script that launches train_mlp one pool per node
#            (tide-slurm-pools): the job trains on h1 and h2; tidectl status and jobs
#            name the Slurm job of every worker;
#   grow     `tidectl grow demo --nodes 1`: tided submits the batch script again, Slurm
#            starts it on h3 and the job grows onto it (dp 3);
#   refuse   `tidectl grow demo --nodes 5`: more nodes than the partition has, refused
#            with an event (nothing waits);
#   preempt  a high-priority job takes h3: Slurm's grace signal makes the pool there
#            leave the job live (no recovery, no step lost); when the high job ends, the
#            requeued allocation starts again and the job grows back onto h3;
#   shrink   `tidectl resize demo --dp 2`: a pool leaves and its node is idle in sinfo;
#   end      the job trains to its last step: its losses equal a never-resized run's.
# usage: sudo bash scripts/demo-slurm.sh   (BUILD_DIR: the build, default ./build; built if
# tided is missing there)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC2034 # read by the sourced helpers
TIDE_SRC=$ROOT
TIDE_BUILD=${BUILD_DIR:-$ROOT/build}
if [ ! -x "$TIDE_BUILD/coordinator/tided" ]; then
  echo "demo-slurm: building into $TIDE_BUILD"
  BUILD_DIR=$TIDE_BUILD bash "$ROOT/scripts/build.sh" >/dev/null
fi
# The Slurm tests' helpers (cluster, keys, tided as nobody, batch script, checks): the demo
# runs the same steps, slower, and shows what tide and Slurm say at each.
# shellcheck source=../tests/multihost_lib.sh
. "$ROOT/tests/multihost_lib.sh"
# shellcheck source=../tests/slurm_lib.sh
. "$ROOT/tests/slurm_lib.sh"
SL_STEPS=1000 # paced 60 ms: long enough for a grow, a preemption with its requeue, a shrink
JOB=demo

show() {
  echo
  echo "\$ $*"
  "$@"
}
# events JOB KIND...: the job's events of those kinds, as text, oldest first (tidectl
# events lists the newest first)
events() {
  local job=$1
  shift
  ctl ops events --limit 1000 | awk -v j="$job" -v k="$*" '
    BEGIN { n = split(k, ks, " "); for (i = 1; i <= n; i++) want[ks[i]] = 1 }
    $0 ~ " " j " " { for (f = 1; f <= NF; f++) if ($f in want) { print; next } }' | tac
}

echo "== a Slurm cluster of 3 nodes (partitions low, preemptible with a 30 s grace, and high)"
sl_setup 3
show sinfo
sl_reference # the never-resized run the losses are compared with at the end

echo
echo "== start: sbatch -N 2 (one pool per node; the first starts the job, the second joins)"
sl_batch $JOB
show grep -v '^#SBATCH --output' "$SL_BATCH"
A=$(sl_submit -N 2 -w h1,h2 "$SL_BATCH")
wait_event $JOB resized 1 120
show squeue
show ctl ops status
show ctl ops jobs

echo
echo "== grow: tidectl grow $JOB --nodes 1 (tided submits the batch script again)"
show ctl ops grow $JOB --nodes 1
wait_event $JOB resized 2 120
sl_wait_hosts $JOB "h1 h2 h3 " 60
show squeue
show ctl ops jobs
B=$(squeue -h -w h3 -u "$SL_USER" -o %i | head -1)

echo
echo "== refuse: tidectl grow $JOB --nodes 5 (the partition has 3 nodes)"
show ctl ops grow $JOB --nodes 5
wait_event $JOB grow_refused 1 30
events $JOB grow_refused

echo
echo "== preempt: a high-priority job asks for h3; Slurm signals allocation $B, its pool leaves live"
show sbatch -p high -w h3 --output=/dev/null --wrap 'sleep 15'
wait_event $JOB pool_left 1 60
sl_wait_hosts $JOB "h1 h2 " 30
show squeue
events $JOB leave_requested resize_started resized pool_left | tail -4
echo
echo "   ... the high-priority job runs 15 s; then Slurm may start the requeued allocation again"
H=$(squeue -h -p high -o %i | head -1)
[ -z "$H" ] || sl_wait_state "$H" "" 60
scontrol update JobId="$B" StartTime=now # Slurm holds a requeued job ~2 min otherwise
wait_event $JOB resized 4 120
sl_wait_hosts $JOB "h1 h2 h3 " 60
events $JOB allocation_started resized | tail -2
show ctl ops jobs

echo
echo "== shrink: tidectl resize $JOB --dp 2 (a pool leaves; its node goes back to Slurm)"
show ctl ops resize $JOB --dp 2
wait_event $JOB pool_left 2 60
gone=$(comm -23 <(printf '%s\n' h1 h2 h3) <(sl_hosts_of $JOB | tr ' ' '\n' | sed '/^$/d'))
sl_wait_idle "$gone" 30
show sinfo -N

echo
echo "== end: the job trains to its last step ($SL_STEPS)"
for _ in $(seq 1800); do
  [ -z "$(squeue -h -u "$SL_USER")" ] && break
  sleep 0.1
done
sl_check_steps $JOB
compare_states "$(sl_final_state $JOB)" "$MH_TMP/ref.state" 1e-4
n=$(job_events $JOB | grep -c '"kind":"\(recovery_started\|rolled_back\|recovered\)"' || true)
echo "every step 0..$((SL_STEPS - 1)) ran once over Slurm jobs $A and $B, losses equal to the" \
  "never-resized run's within 1e-5, final state within 1e-4; recoveries: $n"
echo "demo-slurm: done"
