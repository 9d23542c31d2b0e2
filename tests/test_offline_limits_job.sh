#!/usr/bin/env bash
# Offline commands that hit their limits beside a real training job: train_mlp --tide on 3
# ranks (dp 2: one rank spare, which takes offline work) against a tided with
# --max-attempts 2 and --offline-max-memory 1G. Two command jobs run on the spare rank:
# "mem" (tidectl submit --max-memory 64M) grows a string to 128 MiB, redrawing a progress
# line (\r, no newline), "procs" (--max-procs 10) starts 50 background sleeps. Checked,
# as an operator and the training job see it:
#   - each attempt's log (tidectl logs, --attempt, --all) starts with the limits in force
#     (the submit's own over tided's default) and ends with the line naming the limit, a
#     line of its own even after the unfinished progress line;
#   - the events: attempt 1 offline_requeued with that line (its reason too) and "failure 1
#     of 2" after the backoff, attempt 2 offline_failed "gave up after 2 failed attempts";
#     tidectl jobs: failed, 2 attempts;
#   - nothing of the commands (keeper, awk, sleeps) runs once the job is failed, the
#     spare worker is idle again and runs the next offline job (under tided's default);
#   - the training job is untouched: one generation, no failure, recovery, resize or stall
#     event, steps advancing during the offline work, losses and final state bit-identical
#     to the same run without tided.
# The limits are applied by a cgroup v2 when the worker's cgroup has the memory and pids
# controllers, else as rlimits (docs/offline.md); the test accepts either (the log says
# which) and prints which one ran. As root, RLIMIT_NPROC binds only once the command runs
# as another user: "procs" then runs its shell as nobody through setpriv, as documented.
# usage: test_offline_limits_job.sh BUILD_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
shift
MPIRUN=("$@")
TRAIN="$B/examples/train_mlp"
STATE_DIFF="$B/examples/mlp_state_diff"
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
TL_LOGS="tided.log job.log"
tl_setup tide-offlimit
note() { echo "-- $*"; }
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export TIDE_LOG_DIR="$WORK/logs"
MARK="offlimit-$$-$RANDOM" # in the offline commands' command lines: found by pgrep -f

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 29 --lr 0.003 --dp 2 --print-every 1000)
# Long enough that the offline work and the spare worker's next job end while it trains:
# beside the ASan pass and two busy loops they once took the job from step 3 past step 300
# (the 300 it had then). TIDE_TEST_STEPS shortens it to see that failure named.
STEPS=${TIDE_TEST_STEPS:-600}

note "the reference run without tided (dp 2)"
"${MPIRUN[@]}" -np 2 "$TRAIN" "${MODEL[@]}" --steps $STEPS --loss-out "$WORK/ref.loss" \
  --state-out "$WORK/ref.state" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log" >&2; fail "reference run"; }

tl_tided "$B/coordinator/tided" "$B/coordinator/tidectl" --max-attempts 2 \
  --retry-backoff-ms 200 --offline-max-memory 1G
last_step() { awk 'END { print $1 + 0 }' "$WORK/tide.loss" 2>/dev/null || echo 0; }

note "train_mlp --tide on 3 ranks (dp 2, one spare)"
"${MPIRUN[@]}" -np 3 -x TIDE_ENDPOINT="$EP" "$TRAIN" --tide --job tl "${MODEL[@]}" \
  --steps $STEPS --pace-ms 50 --loss-out "$WORK/tide.loss" --state-out "$WORK/tide.state" \
  >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
for _ in $(seq 600); do
  [ "$(last_step)" -ge 3 ] && break
  kill -0 "$JOB_PID" 2>/dev/null || fail "train_mlp exited"
  sleep 0.1
done
[ "$(last_step)" -ge 3 ] || fail "the job did not reach step 3"

# job_row NAME: the job's row in tidectl jobs --json ("" when not listed)
job_row() { ctl jobs --json | grep -o "{\"name\":\"$1\"[^}]*}" || true; }
wait_state() {
  local row=""
  for _ in $(seq 600); do
    row=$(job_row "$1")
    grep -q "\"state\":\"$2\"" <<<"$row" && return 0
    sleep 0.1
  done
  fail "offline job $1 is not $2 after 60 s: $row; events: $(ctl events --job "$1")"
}

submitted_at=$(last_step)
note "mem: --max-memory 64M, grows a string to 128 MiB; procs: --max-procs 10, forks 50"
# awk's own message discarded: the progress line is its last output, unfinished, as a
# process killed mid-line leaves it
GROW='BEGIN { s = "x"; while (length(s) < 134217728) {
                s = s s; printf "\rgrown to %d bytes", length(s); fflush() }
              print "grew" }'
ctl submit --offline --name mem --max-memory 64M -- /bin/sh -c \
  'exec awk -v "tag=$0" "$1" 2>/dev/null' "$MARK" "$GROW" >/dev/null
SLEEP="60.$$" # a duration of its own: the sleeps' command line, found by pgrep -f
LOOP="i=0; while [ \$i -lt 50 ]; do sleep $SLEEP & i=\$((i+1)); done; wait; echo all $MARK"
if [ "$(id -u)" -eq 0 ]; then
  command -v setpriv >/dev/null || fail "root without setpriv: RLIMIT_NPROC cannot bind"
  ctl submit --offline --name procs --max-procs 10 -- setpriv --reuid=65534 --regid=65534 \
    --clear-groups /bin/sh -c "$LOOP" >/dev/null
else
  ctl submit --offline --name procs --max-procs 10 -- /bin/sh -c "$LOOP" >/dev/null
fi
wait_state mem failed
wait_state procs failed
ended_at=$(last_step)
# the keepers are gone before their worker reports, so nothing may be left by now
left=$(pgrep -af -- "$MARK|$WORK/logs|sleep $SLEEP" || true)
[ -z "$left" ] || fail "processes of the failed attempts still run: $left"

# check_job NAME LIMIT: the events, jobs row and logs of a job failed twice by LIMIT
check_job() {
  local name=$1 limit=$2 ev kinds row
  ev=$(ctl events --job "$name" --json)
  kinds=$(grep -o '"kind":"[a-z_]*"' <<<"$ev" | tr '\n' ' ')
  [ "$kinds" = '"kind":"submitted" "kind":"offline_assigned" "kind":"offline_requeued" "kind":"offline_assigned" "kind":"offline_failed" ' ] ||
    fail "$name: events $kinds: $ev"
  grep '"kind":"offline_requeued"' <<<"$ev" | grep -q "attempt 1 on worker [0-9]* ended failed (exit code -\?[0-9]*): \[tide: [^\"]*$limit.*failure 1 of 2: retried in 200 ms" ||
    fail "$name: the requeue does not name the limit ($limit) and the retry: $ev"
  grep '"kind":"offline_requeued"' <<<"$ev" | grep -q "\"reason\":\"[^\"]*$limit" ||
    fail "$name: the requeue's reason field lost the limit ($limit): $ev"
  # the retry waited its backoff (--retry-backoff-ms 200) before the second attempt
  local t
  t=$(grep -o '"time_ms":[0-9]*,"job":"[a-z]*","kind":"offline_[ar][a-z]*"' <<<"$ev" |
    sed 's/"time_ms":\([0-9]*\).*/\1/' | tail -2 | tr '\n' ' ')
  [ "$(awk '{ print $2 - $1 }' <<<"$t")" -ge 200 ] ||
    fail "$name: retried $(awk '{ print $2 - $1 }' <<<"$t") ms after the failure: $ev"
  grep '"kind":"offline_failed"' <<<"$ev" | grep -q "attempt 2 on worker [0-9]* ended failed (exit code -\?[0-9]*): \[tide: [^\"]*$limit.*gave up after 2 failed attempts" ||
    fail "$name: the final failure does not name the limit ($limit): $ev"
  row=$(job_row "$name")
  grep -q '"state":"failed".*"attempts":2,' <<<"$row" || fail "$name: tidectl jobs: $row"
  ctl jobs | grep -Eq "^$name +command +failed .* 2 +-" || fail "$name: tidectl jobs: $(ctl jobs)"
  ctl logs "$name" >"$WORK/$name.log2" || fail "tidectl logs $name"
  ctl logs "$name" --attempt 1 >"$WORK/$name.log1" || fail "tidectl logs $name --attempt 1"
  for a in 1 2; do
    [ "$(grep -c '^\[tide: limits of this attempt: ' "$WORK/$name.log$a")" -eq 1 ] ||
      fail "$name attempt $a: no limits line: $(cat "$WORK/$name.log$a")"
    tail -1 "$WORK/$name.log$a" | grep -q "^\[tide: .*$limit" ||
      fail "$name attempt $a: the last line does not name the limit: $(cat "$WORK/$name.log$a")"
  done
  [ "$(ctl logs "$name" --all | grep -c "$limit")" -ge 2 ] || fail "tidectl logs $name --all"
  echo "$name: $(tail -1 "$WORK/$name.log2")"
}
# worker_row W: worker W's row in tidectl status --json. The job's workers leave when it
# ends, so a missing row is the job that ended too early, said so (set -e would end the
# test silently at the assignment).
worker_row() {
  local row
  row=$(ctl status --json | grep -o "{\"worker\":$1,[^}]*}" || true)
  [ -n "$row" ] && { echo "$row"; return 0; }
  [ "$(last_step)" -ge $((STEPS - 1)) ] ||
    fail "worker $1 is not in tidectl status (step $(last_step)): $(ctl status); $(ctl jobs)"
  fail "the job ended (step $(last_step) of $STEPS) before the checks of its spare worker $1;" \
    "the offline work ran from step $submitted_at to $ended_at: lengthen it (--steps)"
}
check_job mem "memory limit 64 MiB"
check_job procs "process limit 10"
grep -q "^\[tide: limits of this attempt: memory 64 MiB (" "$WORK/mem.log1" ||
  fail "mem: --max-memory 64M is not what applied: $(cat "$WORK/mem.log1")"
grep -q "grew" "$WORK/mem.log1" "$WORK/mem.log2" && fail "mem grew past its limit"
grep -q "grown to 16777216 bytes" "$WORK/mem.log1" || fail "mem: no progress: $(cat "$WORK/mem.log1")"
grep -q "^\[tide: limits of this attempt: memory 1024 MiB (.*processes 10 (" "$WORK/procs.log1" ||
  fail "procs: tided's default memory and --max-procs 10 do not both apply: $(cat "$WORK/procs.log1")"
grep -qi "fork" "$WORK/procs.log1" || fail "procs: no fork was refused: $(cat "$WORK/procs.log1")"
grep -q "all $MARK" "$WORK/procs.log1" "$WORK/procs.log2" && fail "procs ran all 50 processes"
how=$(grep -o '(cgroup memory.max)\|(RLIMIT_AS' "$WORK/mem.log1" | head -1)
W=$(ctl events --job mem --type offline_assigned --json | grep -o '"workers":\[[0-9]*\]' | sort -u)
[ "$(wc -l <<<"$W")" -eq 1 ] || fail "mem ran on workers $W: only one is spare"
W=${W#\"workers\":[}
W=${W%]}
gpu=$(worker_row "$W")
grep -q '"state":"idle".*"offline":null' <<<"$gpu" || fail "worker $W after the failures: $gpu"

note "the spare worker $W takes the next offline job"
ctl submit --offline --name next -- /bin/sh -c "echo next $MARK" >/dev/null
wait_state next done
ctl events --job next --type offline_assigned --json | grep -q "\"workers\":\[$W\]" ||
  fail "next did not run on worker $W: $(ctl events --job next --json)"
ctl logs next >"$WORK/next.log" || fail "tidectl logs next"
grep -q "^next $MARK" "$WORK/next.log" && grep -q "limits of this attempt: memory 1024 MiB" \
  "$WORK/next.log" || fail "next's log: $(cat "$WORK/next.log")"
for _ in $(seq 100); do
  gpu=$(worker_row "$W")
  grep -q '"state":"idle".*"offline":null' <<<"$gpu" && break
  sleep 0.1
done
grep -q '"state":"idle".*"offline":null' <<<"$gpu" || fail "worker $W after next: $gpu"

note "the training job"
[ "$ended_at" -gt "$submitted_at" ] ||
  fail "no step from $submitted_at to $ended_at while the offline work ran"
[ "$ended_at" -lt $((STEPS - 20)) ] ||
  fail "the job reached step $ended_at before the offline work ended: lengthen it (--steps)"
tl_wait "$JOB_PID" || fail "train_mlp failed"
grep -q "$STEPS steps done in 1 generation" "$WORK/job.log" ||
  fail "the job did not train to the end in its first generation"
# its events: created, its one layout, ended; no failure, recovery, resize or stall
ev=$(ctl events --job tl --json)
bad=$(grep -vE '"kind":"(job_created|layout|job_ended)"' <<<"$ev" || true)
[ -z "$bad" ] && [ "$(grep -c '"kind":"layout"' <<<"$ev")" -eq 1 ] ||
  fail "the training job was disturbed: $ev"
bad=$(ctl events --limit 10000 --json | grep -E '"kind":"worker_(failed|fenced)"' || true)
[ -z "$bad" ] || fail "a worker failed: $bad"
cmp -s "$WORK/tide.loss" "$WORK/ref.loss" || {
  diff "$WORK/tide.loss" "$WORK/ref.loss" | head >&2
  fail "the losses differ from the run without tided"
}
"$STATE_DIFF" "$WORK/tide.state" "$WORK/ref.state" ||
  fail "the final state differs from the run without tided"
echo "PASS: limits applied by ${how#(}; mem and procs failed twice each naming their limit" \
  "(events, jobs, logs), nothing left running, worker $W idle and ran the next job; the" \
  "training job went on (offline work from step $submitted_at to $ended_at of $STEPS), one generation," \
  "losses and state identical to the run without tided"
