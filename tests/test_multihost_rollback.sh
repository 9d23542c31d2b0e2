#!/usr/bin/env bash
# A whole host lost that held state no other host holds, in a job that saves checkpoints:
# train_mlp --tide on 2 hosts x 4 ranks as (dp 1, tp 4, pp 2), one pipeline stage per host,
# tided with CURVE keys on the bridge address, a checkpoint every 4 steps on the file
# system the hosts share. Every process of the host holding stage 1 is killed at once,
# some steps after a checkpoint that tided reported (checkpoint_saved). Checked: tided
# does not stall the job (as test_multihost_halt, which saves none) but rolls it back over
# the survivors to its newest checkpoint: recovery_started events (one more for each of
# the victim's workers declared failed while one was under way, which abandons it) all
# "from the checkpoint of step S" with S the newest checkpoint_saved before the first of
# them (the one seen before the kill, or a later one the job finished while kill-host was
# starting: on a loaded machine that takes long enough for the job to pass a checkpoint),
# and one rolled_back event committing the last of them, layout (dp 1, tp 4, pp 1), "steps
# lost: M - S (the job had completed M)" with M at least the steps done at the kill; the
# survivors train from step S to the end in that generation (train_mlp's summary "N steps
# done in 2 generations"; the loss file holds every step; job_ended); the losses of
# generation 1 and of the rollback's (steps S.., from the recorder's trace) equal a
# never-failed run (dp 1, tp 1, pp 1) within relative 1e-4. Printed: the checkpoint step,
# the steps lost, and the time from the kill to the rolled_back event.
# (mpirun never exits once a daemon is lost: the test stops it when the survivors are gone.)
# TIDE_TEST_KILL_LAG=SECONDS waits that long between choosing the moment and killing the
# host, as a loaded machine does (1 let the job pass the next checkpoint first here; 0.2 did not).
# usage: test_multihost_rollback.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

JOB=rbjob
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 17 --lr 0.003)
STEPS=48
EVERY=4
CK="$MH_TMP/ck"

note "the never-failed reference run (dp 1, tp 1, pp 1) on h1"
"${MPI[@]}" --host h1:1 -np 1 "$TRAIN" "${MODEL[@]}" --dp 1 --tp 1 --pp 1 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --print-every 1000 >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

note "train_mlp --tide (dp 1, tp 4, pp 2) on h1:4,h2:4, a checkpoint every $EVERY steps"
"${MPI[@]}" --enable-recovery --mca async_mpi_finalize 1 --host h1:4,h2:4 -np 8 \
  -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  "$TRAIN" --tide --job $JOB "${MODEL[@]}" --dp 1 --tp 4 --pp 2 --steps $STEPS --pace-ms 50 \
  --ckpt-save "$CK" --ckpt-every $EVERY --print-every 1000 --loss-out "$MH_TMP/tide.loss" \
  --trace-out "$MH_TMP/trace" >"$MH_TMP/job.log" 2>&1 &
MH_PIDS=$!
wait_busy 8 60
status=$(ctl ops status)
echo "$status"
# each host holds one whole stage: its 4 workers are pp0/... or pp1/...
one_stage_per_host "$status"

# newest_ckpt [MAX_MS]: the step of the newest checkpoint_saved event of the job (at or
# before MAX_MS), 0 when none; reads $ev
newest_ckpt() {
  { grep -o "\"time_ms\":[0-9]*,\"job\":\"$JOB\",\"kind\":\"checkpoint_saved\",\"detail\":\"step [0-9]* saved in [^\"]*" <<<"$ev" || true; } |
    awk -v max="${1:-}" '{ t = $0; sub(/^"time_ms":/, "", t); sub(/,.*/, "", t)
                           s = $0; sub(/.*"detail":"step /, "", s); sub(/ .*/, "", s)
                           if ((max == "" || t + 0 <= max + 0) && s + 0 > best) best = s + 0 }
                         END { print best + 0 }'
}
# the kill: a checkpoint past step 4 reported, and the job 2 or 3 steps past it (the loss
# file's last line is the last step done, counted from 0), well before the next one
ck=0 step=0
for _ in $(seq 600); do
  ev=$(ctl ops events --limit 10000 --json 2>/dev/null || true)
  ck=$(newest_ckpt)
  step=$(awk 'END { print $1 + 0 }' "$MH_TMP/tide.loss" 2>/dev/null || echo 0)
  [ "$ck" -gt $EVERY ] && [ "$step" -ge $((ck + 1)) ] && [ "$step" -le $((ck + 2)) ] && break
  [ "$step" -lt $((STEPS - EVERY - 2)) ] || break
  sleep 0.02
done
{ [ "$ck" -gt $EVERY ] && [ "$step" -ge $((ck + 1)) ] && [ "$step" -le $((ck + 2)) ]; } ||
  fail "no kill window: newest checkpoint reported $ck, job at step $step"

kill_ms=$(date +%s%3N)
sleep "${TIDE_TEST_KILL_LAG:-0}"
bash "$CLUSTER" kill-host $victim --name "$MH_NAME"
done_at_kill=$((step + 1))
note "killed every process of $victim (it held $lost, which nobody else holds) after step $step ($done_at_kill steps done; checkpoint of step $ck reported)"

# the survivors train to the end and stop: no train_mlp process left on the surviving host
for _ in $(seq 1200); do
  [ "$(survivors)" -eq 0 ] && break
  sleep 0.1
done
left=$(survivors)
cat "$MH_TMP/job.log"
[ "$left" -eq 0 ] || fail "$left train_mlp processes still run on $survivor 120 s after $victim was lost"
kill -9 $MH_PIDS 2>/dev/null || true
wait $MH_PIDS 2>/dev/null || true
MH_PIDS=""
grep -q "^train_mlp: $STEPS steps done in 2 generations; final loss " "$MH_TMP/job.log" ||
  fail "the survivors did not train to the end in 2 generations"

ev=$(ctl ops events --limit 10000 --json)
ev_obj() { # ev_obj KIND: the job's events KIND, one line each
  grep -o "\"time_ms\":[0-9]*,\"job\":\"$JOB\",\"kind\":\"$1\",\"detail\":\"[^\"]*\"" <<<"$ev" || true
}
[ -z "$(ev_obj stalled)" ] || { echo "$ev"; fail "tided stalled $JOB although it has a checkpoint"; }
[ "$(ev_obj rolled_back | wc -l)" -eq 1 ] || { echo "$ev"; fail "want one rolled_back event"; }
[ -z "$(ev_obj recovered)" ] || { echo "$ev"; fail "a recovered event: the lost stage had no replica"; }
# the checkpoint tided knew when it began to recover: the newest saved before the first
# recovery_started; never older than the one seen before the kill
rs1_ms=$(ev_obj recovery_started | head -1 | sed 's/^"time_ms":\([0-9]*\),.*/\1/')
[ -n "$rs1_ms" ] || { echo "$ev"; fail "no recovery_started event"; }
S=$(newest_ckpt "$rs1_ms")
[ "$S" -ge "$ck" ] || { echo "$ev"; fail "newest checkpoint before the recovery: $S, but $ck was seen before the kill"; }
[ "$S" -eq "$ck" ] || note "the job finished the checkpoint of step $S while the host was being killed (step $ck was the newest at the decision)"
rb=$(ev_obj rolled_back)
echo "$rb"
# tided declares the victim's workers failed one by one: each later verdict abandons the
# recovery under way (resize_aborted) and starts it again with one participant less, so
# the rollback commits generation G = 1 + the recoveries started; each names checkpoint S
G=$(sed -n 's/.*"detail":"generation \([0-9]*\) committed: .*/\1/p' <<<"$rb")
nrs=$(ev_obj recovery_started | wc -l)
nab=$(ev_obj resize_aborted | wc -l)
{ [ -n "$G" ] && [ "$nrs" -ge 1 ] && [ "$G" -eq $((nrs + 1)) ] && [ "$nab" -eq $((nrs - 1)) ]; } ||
  { echo "$ev"; fail "generation ${G:-?} committed after $nrs recoveries started and $nab abandoned"; }
[ "$(ev_obj recovery_started | grep -c "\"detail\":\"generation [0-9]*: [^\"]*from the checkpoint of step $S ")" -eq "$nrs" ] ||
  { echo "$ev"; fail "a recovery does not start from the checkpoint of step $S"; }
ev_obj recovery_started | tail -1 | grep -q "\"detail\":\"generation $G: " ||
  { echo "$ev"; fail "the last recovery started is not generation $G"; }
dir=$(printf '%s/step-%012d' "$CK" "$S")
grep -q "generation $G committed: (dp 1, tp 4, pp 1; [^\"]* from the checkpoint of step $S ($dir); steps lost: " <<<"$rb" ||
  fail "the rolled_back event is not (dp 1, tp 4, pp 1) from the checkpoint of step $S ($dir)"
lost_n=$(sed -n 's/.*; steps lost: \([0-9]*\) (the job had completed \([0-9]*\)).*/\1/p' <<<"$rb")
M=$(sed -n 's/.*; steps lost: \([0-9]*\) (the job had completed \([0-9]*\)).*/\2/p' <<<"$rb")
{ [ -n "$lost_n" ] && [ -n "$M" ]; } || fail "no \"steps lost: K (the job had completed M)\" in the rolled_back event"
[ "$M" -ge "$done_at_kill" ] || fail "the job had completed $M steps, but $done_at_kill were done at the kill"
[ "$lost_n" -eq $((M - S)) ] || fail "steps lost: $lost_n, want $M - $S"
# killed before the next checkpoint, the job loses the steps since the one seen
[ "$S" -gt "$ck" ] || [ "$lost_n" -gt 0 ] || fail "no step lost: the kill came $done_at_kill steps in, after the checkpoint of step $S"
rb_ms=$(grep -o '"time_ms":[0-9]*' <<<"$rb" | grep -o '[0-9]*$')
[ "$rb_ms" -ge "$kill_ms" ] || fail "rolled back at $rb_ms, before the kill at $kill_ms"
fail1_ms=$(grep -o "\"time_ms\":[0-9]*,\"job\":null,\"kind\":\"worker_failed\",\"detail\":\"worker [0-9]* ([^)]* on $victim " <<<"$ev" |
  head -1 | sed 's/^"time_ms":\([0-9]*\),.*/\1/')
[ -n "$fail1_ms" ] || { echo "$ev"; fail "no worker of $victim declared failed"; }
jobs=$(ctl ops jobs --json)
grep -q "{\"name\":\"$JOB\",\"kind\":\"online\",\"state\":\"[a-z]*\",\"gen\":$G," <<<"$jobs" ||
  { echo "$jobs"; fail "$JOB is not at generation $G"; }

# the loss file holds every step; generation G ran exactly steps S .. STEPS-1, once each,
# generation 1 steps 0, 1, ..., and no other generation ran any
awk -v n=$STEPS '{ seen[$1] = 1 } END { for (i = 0; i < n; i++) if (!(i in seen)) { print "step " i " missing" > "/dev/stderr"; exit 1 } }' \
  "$MH_TMP/tide.loss" || fail "the loss file lacks steps"
grep '^step [0-9]* gen 1 ' "$MH_TMP/trace" | awk '{ print $2, $NF }' >"$MH_TMP/before.loss"
grep "^step [0-9]* gen $G " "$MH_TMP/trace" | awk '{ print $2, $NF }' >"$MH_TMP/after.loss"
awk -v s="$S" -v n=$STEPS '$1 != s + NR - 1 { bad = 1 } END { exit bad || NR != n - s }' "$MH_TMP/after.loss" ||
  { cat "$MH_TMP/after.loss"; fail "generation $G did not run steps $S..$((STEPS - 1)) once each"; }
awk '$1 != NR - 1 { bad = 1 } END { exit bad }' "$MH_TMP/before.loss" ||
  { cat "$MH_TMP/before.loss"; fail "generation 1's steps are not 0, 1, ..."; }
n1=$(wc -l <"$MH_TMP/before.loss")
[ "$(grep -c '^step ' "$MH_TMP/trace")" -eq $((n1 + STEPS - S)) ] ||
  { grep '^step ' "$MH_TMP/trace"; fail "steps recorded in generations other than 1 and $G"; }
[ "$n1" -ge "$done_at_kill" ] || fail "generation 1 recorded $n1 steps, $done_at_kill were done at the kill"
c1=$(compare_losses "$MH_TMP/before.loss" "$MH_TMP/ref.loss" 1e-4) ||
  fail "the losses before the kill differ from the never-failed run"
c2=$(compare_losses "$MH_TMP/after.loss" "$MH_TMP/ref.loss" 1e-4) ||
  fail "the losses after the rollback differ from the never-failed run"
ended=$(ev_obj job_ended | wc -l)
[ "$ended" -eq 1 ] || { echo "$ev"; fail "want one job_ended event, got $ended"; }

echo "PASS: $victim lost with $lost's only copy after $done_at_kill steps; rolled back to the checkpoint of step $S, steps lost: $lost_n (the job had completed $M); rolled_back $((rb_ms - kill_ms)) ms after the kill (first verdict at $((fail1_ms - kill_ms)) ms; generation $G after $nab abandoned recoveries); $c1 steps before and $c2 after the rollback match the never-failed run"
