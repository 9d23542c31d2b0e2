#!/usr/bin/env bash
# A tide job under Slurm on 3 namespace hosts (scripts/slurm.sh), everything of the job's
# side run by an unprivileged user (tided with the Slurm provider, its ompi-server, sbatch
# and all the batch jobs start; only the operator's tidectl and the Slurm daemons are
# root):
#   start   `sbatch -N 2` of a batch script that launches train_mlp one pool per node
#           (tide-slurm-pools): the first pool starts the job, the second joins and tided
#           grows the job onto it (dp 2 over h1 and h2); tidectl status and jobs name the
#           Slurm job of every worker.
#   grow    `tidectl grow JOB --nodes 1 --wait`: tided submits the batch script again (sbatch
#           -N 1), Slurm starts it on the free node, its pool joins and tided grows the job
#           onto it (dp 3); printed: the time from the command to the commit.
#   refuse  `tidectl grow JOB --nodes 5 --wait` (3 nodes in the partition): exit 6, and an event
#           naming the partition limit (Slurm says PartitionConfig or PartitionNodeLimit), the
#           allocation cancelled, nothing waits; `--nodes
#           2` with no free node: an event says it waits for free nodes, and tided cancels
#           it after --slurm-pending-ms with an event; the job trains on meanwhile.
#   shrink  `tidectl resize JOB --dp 2` then `--dp 1`: each time a launch leaves the job and
#           its node goes idle in sinfo (the grown allocation ends; a node of the 2-node
#           allocation is taken out of it with scontrol update), while the job trains on.
#   end     the job trains to its last step: no step lost or run twice, every loss equal to
#           a never-resized run's within 1e-5 and the final state within 1e-4.
# usage: test_slurm_grow.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# shellcheck source=slurm_lib.sh
. "$TIDE_SRC/tests/slurm_lib.sh"
SL_TIDED_ARGS=(--slurm-pending-ms 6000)
SL_STEPS=1000 # paced 60 ms: the job outlives the grow, the refusals and the shrinks under ASan and load
sl_setup 3
JOB=g1

note "the never-resized reference run (dp 1) on h1"
sl_reference

note "start: sbatch -N 2, one pool per node, the job grows onto the second"
sl_batch $JOB
A=$(sl_submit -N 2 "$SL_BATCH")
sl_wait_state "$A" RUNNING 60
wait_event $JOB resized 1 120
sl_wait_hosts $JOB "h1 h2 " 60
status=$(ctl ops status)
echo "$status"
for h in h1 h2; do
  grep -q " $h .* online .*$JOB .*slurm $A" <<<"$status" || fail "$h's worker does not name Slurm job $A"
done
jobs=$(ctl ops jobs)
echo "$jobs"
grep -q "^$JOB .*slurm $A" <<<"$jobs" || fail "tidectl jobs does not name Slurm job $A"
ctl ops status --json | grep -q "\"alloc\":\"slurm $A\"" || fail "status --json has no alloc"
ps -o user= -p "$TIDED_PID" | grep -qx "$SL_USER" || fail "tided does not run as $SL_USER"
n=0
for p in $(pgrep -x train_mlp); do
  grep -q "$SL" "/proc/$p/cmdline" 2>/dev/null || continue # another test's
  [ "$(stat -c %U "/proc/$p")" = "$SL_USER" ] || fail "a rank of the job runs as $(stat -c %U "/proc/$p")"
  n=$((n + 1))
done
[ "$n" -eq 2 ] || fail "$n ranks of the job found, not 2"

note "grow: tidectl grow $JOB --nodes 1 --wait"
t0=$(date +%s%3N)
# --wait blocks until the switch onto the new allocation's pool commits
ctl ops grow $JOB --nodes 1 --wait --wait-ms 180000 >"$MH_TMP/grow.out" ||
  fail "tidectl grow --wait failed: $(cat "$MH_TMP/grow.out")"
grep -q "^generation [0-9]* committed after step" "$MH_TMP/grow.out" ||
  fail "tidectl grow --wait did not print the commit: $(cat "$MH_TMP/grow.out")"
B=$(job_events $JOB | grep '"kind":"allocation_submitted"' | sed -n 's/.*Slurm job \([0-9]*\):.*/\1/p' | head -1)
[ -n "$B" ] || fail "no Slurm job id in the submission event"
wait_event $JOB allocation_started 1 60
wait_event $JOB resized 2 120
t1=$(job_events $JOB | grep '"kind":"resized"' | sed -n 2p | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
echo "grow onto a new Slurm allocation ($B): $((t1 - t0)) ms from tidectl grow to the commit"
sl_wait_hosts $JOB "h1 h2 h3 " 60
[ "$(squeue -h -j "$B" -o %u)" = "$SL_USER" ] || fail "tided's allocation is not $SL_USER's"

note "refuse: more nodes than the partition has (--wait: exit 6 with Slurm's reason)"
rc=0
ctl ops grow $JOB --nodes 5 --wait --wait-ms 60000 >/dev/null 2>"$MH_TMP/err" || rc=$?
[ "$rc" -eq 6 ] || fail "tidectl grow --wait of a refused grow exited $rc, not 6: $(cat "$MH_TMP/err")"
grep -q "ended without growing (grow_refused).*Partition" "$MH_TMP/err" ||
  fail "tidectl grow --wait does not say why: $(cat "$MH_TMP/err")"
wait_event $JOB grow_refused 1 30
job_events $JOB | grep '"kind":"grow_refused"' | grep -q "Partition\(NodeLimit\|Config\) (more nodes" ||
  fail "the refusal does not name the partition limit: $(job_events $JOB | grep grow_refused)"
for _ in $(seq 50); do [ -z "$(squeue -h -u "$SL_USER" -t pending)" ] && break; sleep 0.1; done
[ -z "$(squeue -h -u "$SL_USER" -t pending)" ] || fail "a refused allocation still waits: $(squeue)"
note "refuse: no free node"
ctl ops grow $JOB --nodes 2
wait_event $JOB allocation_pending 1 30
job_events $JOB | grep '"kind":"allocation_pending"' | grep -q "Resources (no free nodes yet)" ||
  fail "the wait does not say why: $(job_events $JOB | grep allocation_pending)"
! ctl ops grow $JOB --nodes 1 2>"$MH_TMP/err" || fail "a second request was accepted while one waits"
grep -q "one request at a time" "$MH_TMP/err" || fail "no reason: $(cat "$MH_TMP/err")"
wait_event $JOB grow_refused 2 30
job_events $JOB | grep '"kind":"grow_refused"' | grep -q "still pending after 6.0 s" ||
  fail "the pending allocation was not cancelled: $(job_events $JOB | grep grow_refused)"
ctl ops jobs | grep -q "^$JOB .*pending" && fail "tidectl jobs still shows a pending allocation"

note "shrink: a launch leaves, its node goes back to Slurm"
for dp in 2 1; do
  before=$(sl_hosts_of $JOB)
  ctl ops resize $JOB --dp $dp >/dev/null
  wait_event $JOB pool_left $((3 - dp)) 60
  after=$(sl_hosts_of $JOB)
  gone=$(comm -23 <(tr ' ' '\n' <<<"$before" | sed '/^$/d') <(tr ' ' '\n' <<<"$after" | sed '/^$/d'))
  [ "$(wc -w <<<"$gone")" -eq 1 ] || fail "dp $dp: hosts '$before' -> '$after'"
  t0=$(date +%s%3N)
  sl_wait_idle "$gone" 30
  echo "dp $dp: $gone left the job; idle in sinfo $(($(date +%s%3N) - t0)) ms after tided released it"
done
sinfo -N

note "end: the job trains to its last step"
for _ in $(seq 1200); do
  [ -z "$(squeue -h -u "$SL_USER" -t running,completing)" ] && break
  sleep 0.1
done
[ -z "$(squeue -h -u "$SL_USER")" ] || fail "Slurm jobs left: $(squeue)"
grep -q "$SL_STEPS steps done" "$SL"/slurm-*.out || fail "$JOB did not train to the end"
sl_check_steps $JOB
compare_states "$(sl_final_state $JOB)" "$MH_TMP/ref.state" 1e-4
! job_events $JOB | grep -q '"kind":"\(recovery_started\|rolled_back\)"' ||
  fail "the job recovered: $(job_events $JOB | grep -i recover)"
echo "PASS: a job launched by sbatch grew by a Slurm allocation, refused what Slurm cannot" \
  "give, gave nodes back as it shrank, and matches a never-resized run"
