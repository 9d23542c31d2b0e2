#!/usr/bin/env bash
# Checkpoint requests reach idle ranks too (a resize may make them members by the request's
# step), and must never come back as failures from them: train_mlp --tide on 3 ranks, first
# layout dp 2 (rank 2 idle), paced at 50 ms a step. TIDE__SAVES_MAX + 2 requests are saved
# one after another while rank 2 is idle (more than a rank may hold pending; tided refuses
# one past what the members hold, and the loop asks again, as an operator would), then
# `tidectl resize --dp 3` makes it a member past all of their steps. Checked: every request
# ends in a checkpoint_saved event, the job trains on dp 3 to its end, and no
# checkpoint_failed event appears (an idle rank once reported each request it held as
# "heard of after the step it asked for" once promoted, and BUSY past 8 while idle).
# usage: test_ckpt_idle.sh BUILD_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
shift
MPIRUN=("$@")
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
tl_setup tide-ckidle
tl_tided_start "$B"

STEPS=400
"${MPIRUN[@]}" -np 3 -x TIDE_ENDPOINT="$EP" "$B/examples/train_mlp" --tide --job idle --layers 2 \
  --hidden 16 --ffn 32 --vocab 16 --seq 4 --global-batch 6 --micro-batches 1 --dp 2 \
  --steps $STEPS --pace-ms 50 --print-every 1000 --loss-out "$WORK/tide.loss" >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
steps() { awk 'END { print NR + 0 }' "$WORK/tide.loss" 2>/dev/null || echo 0; }
for _ in $(seq 600); do [ "$(steps)" -ge 3 ] && break; sleep 0.05; done
[ "$(steps)" -ge 3 ] || { cat "$WORK/job.log" >&2; fail "the job did not reach step 3"; }

asked=()
busy=0
for i in $(seq 10); do
  # the ranks hold 8 requests until their steps: past that tided says BUSY, and we ask again
  for _ in $(seq 300); do
    out=$(ctl checkpoint idle --dir "$WORK/ckpt-$i" 2>&1) && break
    grep -q 'checkpoint requests for steps they have not completed' <<<"$out" ||
      fail "tidectl checkpoint: $out"
    busy=$((busy + 1))
    sleep 0.1
  done
  w=$(grep -o 'saves the checkpoint of step [0-9]*' <<<"$out" | grep -o '[0-9]*$')
  [ -n "$w" ] || fail "tidectl checkpoint: $out"
  asked+=("$i:$w")
done
last=${asked[-1]#*:}
for _ in $(seq 600); do [ "$(steps)" -gt "$last" ] && break; sleep 0.05; done
[ "$(steps)" -gt "$last" ] || fail "the job did not pass step $last"
sleep 0.5 # the publisher's last report reaches tided
out=$(ctl resize idle --dp 3) || fail "tidectl resize --dp 3: $out"
row=""
for _ in $(seq 300); do
  row=$(ctl --json jobs | grep -o '"name":"idle"[^}]*' || true)
  grep -q '"state":"running","gen":2,"dp":3,' <<<"$row" && break
  sleep 0.1
done
grep -q '"state":"running","gen":2,"dp":3,' <<<"$row" || { ctl events; fail "the job is not running on dp 3: $row"; }
at=$(steps)
[ "$at" -lt $((STEPS - 20)) ] || fail "the resize came at step $at of $STEPS: too late to see the promoted rank's steps"
tl_wait "$JOB_PID" || { cat "$WORK/job.log" >&2; fail "the job failed"; }
sleep 0.5
ev=$(ctl events --json)
for a in "${asked[@]}"; do
  grep -q "\"kind\":\"checkpoint_saved\",\"detail\":\"step ${a#*:} saved in $WORK/ckpt-${a%%:*}/" <<<"$ev" ||
    { echo "$ev"; fail "the checkpoint of step ${a#*:} under ckpt-${a%%:*} was not saved"; }
done
if grep -q '"kind":"checkpoint_failed"' <<<"$ev"; then
  echo "$ev" | grep -o '"kind":"checkpoint_failed","detail":"[^"]*"' >&2
  fail "a checkpoint the job took was reported failed"
fi
echo "idle rank: ${#asked[@]} requests saved (steps ${asked[*]}; $busy refused BUSY and asked again) while rank 2 was idle; promoted by dp 3 at step ~$at; no checkpoint_failed"
echo "PASS: checkpoint requests held by an idle rank are never reported as failures"
