#!/usr/bin/env bash
# Two hosts that reach tided but not each other: train_mlp --tide on 2 hosts x 4 ranks,
# (dp 2, tp 4) with one replica per host, tided with its default stall bound (30 s). While
# it trains, the data path between h1 and h2 is cut (cluster.sh cut: packets dropped both
# ways, no error, every heartbeat still reaches tided). The ranks hang inside a step's
# collective, so nothing fails by liveness.
# Checked: a `stalled` event comes within the bound (plus a heartbeat and the once-a-second
# check), naming both hosts; tided fences h2's four ranks (worker_failed "fenced: ...
# stalled") and none of h1, and recovers the job over h1 from its replica, (dp 1, tp 4); the
# survivors train to the end, the loss of every step and the final state equal to the
# never-resized run (as test_multihost_lost). Printed: the time from the cut to the event.
# usage: test_multihost_partition.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

JOB=cutjob
BOUND_MS=30000 # tided's default --stall-ms
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=60
CUT_AT=12

note "the never-resized reference run (dp 2, tp 4) on h1"
"${MPI[@]}" --host h1:8 -np 8 "$TRAIN" "${MODEL[@]}" --dp 2 --tp 4 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

note "train_mlp --tide (dp 2, tp 4) on h1:4,h2:4"
"${MPI[@]}" --enable-recovery --mca async_mpi_finalize 1 --host h1:4,h2:4 -np 8 \
  -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  "$TRAIN" --tide --job $JOB "${MODEL[@]}" --dp 2 --tp 4 --steps $STEPS --pace-ms 50 \
  --print-every 1000 --loss-out "$MH_TMP/tide.loss" --state-out "$MH_TMP/tide.state" \
  >"$MH_TMP/job.log" 2>&1 &
MH_PIDS=$!
wait_busy 8 60
for _ in $(seq 600); do
  step=$(awk 'END { print $1 + 0 }' "$MH_TMP/tide.loss" 2>/dev/null || echo 0)
  [ "$step" -ge $CUT_AT ] && break
  sleep 0.05
done
[ "$step" -ge $CUT_AT ] || fail "the job did not reach step $CUT_AT"

cut_ms=$(date +%s%3N)
bash "$CLUSTER" cut h1 h2 --name "$MH_NAME"
note "cut the path between h1 and h2 after step $step"

# the event: within the bound, a heartbeat period and the check's second (and load)
t_stall=""
for _ in $(seq 900); do
  ev=$(ctl ops events --json 2>/dev/null || true)
  t_stall=$(grep -o '"time_ms":[0-9]*,"job":"'$JOB'","kind":"stalled"' <<<"$ev" |
    grep -o '[0-9]\{10,\}' | head -1 || true)
  [ -n "$t_stall" ] && break
  sleep 0.1
done
[ -n "$t_stall" ] || { ctl ops status; fail "no stalled event 90 s after the cut"; }
after=$((t_stall - cut_ms))
# the hung step may have begun up to a step (and its pacing) before the cut
[ "$after" -ge $((BOUND_MS - 1000)) ] || fail "stalled after $after ms, before the bound of $BOUND_MS ms"
[ "$after" -le 60000 ] || fail "stalled after $after ms: more than 60 s"
detail=$(grep -o '"kind":"stalled","detail":"[^"]*' <<<"$ev" | head -1)
grep -q "hosts h1 (4 ranks, 4 stalled) and h2 (4 ranks, 4 stalled) cannot reach each other" \
  <<<"$detail" || fail "the event does not name both hosts: $detail"

# the survivors finish: their summary line, then mpirun is stopped (h2's ranks were fenced)
for _ in $(seq 1200); do
  grep -q "steps done in" "$MH_TMP/job.log" && [ -s "$MH_TMP/tide.state" ] && break
  sleep 0.1
done
status=$(ctl ops status)
grep -v "generation switch: old member rank" "$MH_TMP/job.log" | tail -40
grep -q "$STEPS steps done in 2 generations" "$MH_TMP/job.log" ||
  { echo "$status"; fail "the survivors did not train to the end after the partition"; }
kill -9 $MH_PIDS 2>/dev/null || true
wait $MH_PIDS 2>/dev/null || true
MH_PIDS=""
ev=$(ctl ops events --json)
nf2=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h2 [^:]*: fenced: job '$JOB"'s step [0-9]* stalled" <<<"$ev" || true; } | wc -l)
nf1=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h1 ' <<<"$ev" || true; } | wc -l)
[ "$nf2" -eq 4 ] && [ "$nf1" -eq 0 ] ||
  { echo "$ev"; fail "fenced on h2: $nf2 (want 4), failed on h1: $nf1 (want 0)"; }
jobs=$(ctl ops jobs --json)
grep -q '"dp":1,"tp":4,"pp":1' <<<"$jobs" || { echo "$jobs"; fail "no (1,4,1) recovery layout"; }
n=$(compare_losses "$MH_TMP/tide.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "losses differ from the never-resized run"
compare_states "$MH_TMP/tide.state" "$MH_TMP/ref.state" 1e-4
echo "partition h1 | h2: stalled event $after ms after the cut (bound $BOUND_MS ms); $detail"
echo "PASS: a cut between h1 and h2 was seen as a stall and the job recovered on h1 (dp 1, tp 4); $n steps and the final state match the never-resized run"
