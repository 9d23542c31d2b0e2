#!/usr/bin/env bash
# Slurm preempts one allocation of a running tide job (3 namespace hosts, scripts/slurm.sh:
# partition low is preempted by partition high with REQUEUE, a 30 s grace time, and the
# job's --signal=B:USR1@30 sent at preemption). The job's side runs as an unprivileged
# user, as in test_slurm_grow:
#   The job starts by sbatch -N 2 (dp 2 over h1, h2) and grows by `tidectl grow` onto a
#   third allocation on h3 (dp 3). A high-priority job asks for h3: Slurm preempts the
#   allocation on h3 and signals it; its pool asks tided to leave, tided shrinks the job
#   off it live as a planned change (dp 2: no recovery, no rollback, the job's events say
#   why), the pool exits, the allocation requeues itself and the high job starts on h3.
#   When the high job ends, the requeued allocation starts again (its begin time set to
#   now, instead of Slurm's two-minute requeue hold), its pool joins and tided grows the
#   job back onto it (dp 3). The job trains to its last step: every step exactly once in
#   each pool's losses (none lost, none run twice), each equal to a never-resized run's
#   within 1e-5 and the final state within 1e-4. Printed: the time from Slurm's signal to
#   the committed shrink, and from the requeued allocation's start to the committed grow.
# usage: test_slurm_preempt.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# shellcheck source=slurm_lib.sh
. "$TIDE_SRC/tests/slurm_lib.sh"
SL_STEPS=800 # paced 60 ms: the job outlives a preemption, a 20 s high job and a requeue
sl_setup 3
JOB=p1

note "the never-resized reference run (dp 1) on h1"
sl_reference

note "the job: sbatch -N 2, then tidectl grow --nodes 1 (dp 3 over h1, h2, h3)"
sl_batch $JOB
A=$(sl_submit -N 2 -w h1,h2 "$SL_BATCH")
wait_event $JOB resized 1 120
ctl ops grow $JOB --nodes 1
wait_event $JOB allocation_submitted 1 30
B=$(job_events $JOB | grep '"kind":"allocation_submitted"' | sed -n 's/.*Slurm job \([0-9]*\):.*/\1/p' | head -1)
wait_event $JOB resized 2 120
sl_wait_hosts $JOB "h1 h2 h3 " 60
[ "$(squeue -h -j "$B" -o %N)" = h3 ] || fail "Slurm job $B is not on h3: $(squeue)"

note "preemption: a high-priority job takes h3"
t0=$(date +%s%3N)
H=$(sbatch --parsable -p high -w h3 --output="$MH_TMP/high-%j.out" --wrap 'sleep 20') ||
  fail "cannot submit the high-priority job"
wait_event $JOB leave_requested 1 60
wait_event $JOB pool_left 1 60
t1=$(job_events $JOB | grep '"kind":"pool_left"' | head -1 | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
echo "preempted: the job shrank off h3 $((t1 - t0)) ms after the high-priority job was submitted"
sl_wait_hosts $JOB "h1 h2 " 30
sl_wait_state "$H" RUNNING 60
s=$(sl_state "$B")
[ "$s" = PENDING ] || fail "the preempted allocation $B is '$s', not requeued (PENDING)"
grep -q "requeueing job $B" "$SL/slurm-$B.out" || fail "tide-slurm-pools did not requeue $B: $(tail -5 "$SL/slurm-$B.out")"
job_events $JOB | grep '"kind":"leave_requested"' | grep -q "SIGUSR1" ||
  fail "the leave does not say why: $(job_events $JOB | grep leave_requested)"
! job_events $JOB | grep -q '"kind":"\(recovery_started\|rolled_back\|recovered\)"' ||
  fail "the preemption was handled as a failure: $(job_events $JOB | grep -i recover)"

note "the high-priority job ends; the requeued allocation starts and the job grows back"
sl_wait_state "$H" "" 60
scontrol update JobId="$B" StartTime=now
sl_wait_state "$B" RUNNING 60
t0=$(date +%s%3N)
wait_event $JOB resized 4 120
t1=$(job_events $JOB | grep '"kind":"resized"' | sed -n 4p | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
echo "requeued allocation $B started again: the job grew back onto h3 $((t1 - t0)) ms later"
sl_wait_hosts $JOB "h1 h2 h3 " 60
wait_event $JOB allocation_started 2 30 # tided watched it come back

note "the job trains to its last step"
for _ in $(seq 1800); do
  [ -z "$(squeue -h -u "$SL_USER")" ] && break
  sleep 0.1
done
[ -z "$(squeue -h -u "$SL_USER")" ] || fail "Slurm jobs left: $(squeue)"
grep -q "$SL_STEPS steps done" "$SL"/slurm-*.out || fail "$JOB did not train to the end"
sl_check_steps $JOB
compare_states "$(sl_final_state $JOB)" "$MH_TMP/ref.state" 1e-4
! job_events $JOB | grep -q '"kind":"\(recovery_started\|rolled_back\|recovered\)"' ||
  fail "the job recovered: $(job_events $JOB | grep -i recover)"
echo "PASS: a preempted allocation left the job live with no step lost, and its requeued" \
  "allocation joined it again"
