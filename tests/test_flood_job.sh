#!/usr/bin/env bash
# A real training job under a hostile flood: train_mlp --tide on 4 ranks (dp 2, tp 2)
# against a tided that declares a worker failed after 1.5 s of silence (heartbeats every
# 100 ms; a rank starved that long by the machine, not by tided, fences itself: CI's loaded
# sanitizer run starved one for 673 ms, past the 500 ms this test had), while hostile_bench --endpoint floods that tided from 6 connections at full
# speed (expensive status requests over a 2,000-worker table, malformed messages, 64-frame
# multipart messages, never reading a reply; 3 more each sending 512 MiB multipart messages
# of one shared 256 KiB frame, which tided cuts at --max-client-mb) for most of the run.
# Checked: no worker of the job is ever declared failed (no worker_failed event for one, one
# generation from the first step to the last), the job trains to the end with every loss
# and its whole final state bit-identical to the same run without tided, tided answers
# after the flood, and its peak memory stays under 256 MiB (printed).
# usage: test_flood_job.sh BUILD_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
shift
MPIRUN=("$@")
TRAIN="$B/examples/train_mlp"
STATE_DIFF="$B/examples/mlp_state_diff"
HOSTILE="$B/benchmarks/hostile_bench"
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
tl_setup tide-flood
note() { echo "-- $*"; }

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 23 --lr 0.003 --dp 2 --tp 2 --print-every 1000)
STEPS=120

note "the reference run without tided (dp 2, tp 2)"
"${MPIRUN[@]}" -np 4 "$TRAIN" "${MODEL[@]}" --steps $STEPS --loss-out "$WORK/ref.loss" \
  --state-out "$WORK/ref.state" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log" >&2; fail "reference run"; }

# Under AddressSanitizer (the CI's second pass) freed memory waits in a quarantine of
# 256 MiB before reuse, which a flood of millions of messages fills: that is the
# sanitizer's memory, not tided's, so tided runs with a small one (plain builds ignore it).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8:thread_local_quarantine_size_kb=64" \
  tl_tided "$B/coordinator/tided" "$B/coordinator/tidectl" --heartbeat-ms 100 --miss-limit 15

note "train_mlp --tide on 4 ranks against tided at $EP"
"${MPIRUN[@]}" -np 4 -x TIDE_ENDPOINT="$EP" "$TRAIN" --tide --job flood "${MODEL[@]}" \
  --steps $STEPS --pace-ms 80 --loss-out "$WORK/tide.loss" --state-out "$WORK/tide.state" \
  >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
for _ in $(seq 600); do
  [ "$(awk 'END { print $1 + 0 }' "$WORK/tide.loss" 2>/dev/null || echo 0)" -ge 5 ] && break
  kill -0 "$JOB_PID" 2>/dev/null || break
  sleep 0.1
done
[ "$(awk 'END { print $1 + 0 }' "$WORK/tide.loss" 2>/dev/null || echo 0)" -ge 5 ] ||
  { cat "$WORK/job.log" >&2; fail "the job did not reach step 5"; }

note "6 hostile connections flood tided for 6 s while the job trains"
hrc=0
"$HOSTILE" --endpoint "$EP" --tided-pid "$TIDED_PID" --seconds 6 --table 2000 --clients 2 --amplify 3 \
  --out "$WORK/hostile.json" >"$WORK/hostile.log" 2>&1 || hrc=$?
cat "$WORK/hostile.log"
[ "$hrc" -ne 1 ] || fail "hostile_bench: tided did not answer"
peak=""
if [ "$hrc" -ne 0 ]; then
  # the attacker itself died: libzmq asserts in a client whose connection tided cut in the
  # middle of a message (seen under ASan). tided's side is what this test checks.
  echo "hostile_bench ended with status $hrc (not tided's doing); asking tided directly"
  "$TL_TIDECTL" --endpoint "$EP" --timeout-ms 30000 jobs >/dev/null ||
    fail "tided did not answer after the flood"
  peak=$(awk '/^VmHWM:/ { print $2 }' "/proc/$TIDED_PID/status")
fi
step=$(awk 'END { print $1 + 0 }' "$WORK/tide.loss")
[ "$step" -lt $STEPS ] || fail "the job finished before the flood ended: lengthen it (--pace-ms)"

tl_wait "$JOB_PID" || { cat "$WORK/job.log" >&2; fail "the job failed under the flood"; }
grep -q "$STEPS steps done in 1 generation" "$WORK/job.log" ||
  { cat "$WORK/job.log" >&2; fail "the job did not train to the end in its first generation"; }
ev=$(ctl events --limit 10000 --json)
# the job's workers only: hostile_bench's 2,000 simulated ones ("bulk rank N") heartbeat from
# the flooding process itself, which may starve them of CPU on a loaded machine
if grep '"kind":"worker_failed"' <<<"$ev" | grep -vq '(bulk rank '; then
  echo "$ev" >&2
  fail "tided declared a healthy worker of the job failed during the flood"
fi
cmp -s "$WORK/tide.loss" "$WORK/ref.loss" || {
  diff "$WORK/tide.loss" "$WORK/ref.loss" | head >&2
  fail "the losses differ from the run without tided"
}
"$STATE_DIFF" "$WORK/tide.state" "$WORK/ref.state" ||
  fail "the final state differs from the run without tided"
[ -n "$peak" ] || peak=$(sed -n 's/.*"tided_peak_rss_kib":\([0-9]*\).*/\1/p' "$WORK/hostile.json")
[ -n "$peak" ] && [ "$peak" -gt 0 ] || fail "no peak memory of tided in $WORK/hostile.json"
[ "$peak" -lt $((256 * 1024)) ] || fail "tided's peak memory was $peak KiB under the flood"
echo "PASS: $STEPS steps under a 6 s flood (the flood ended at step $step), no worker failed," \
  "losses and final state bit-identical to the run without tided; tided peak RSS $peak KiB"
