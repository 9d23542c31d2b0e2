#!/usr/bin/env bash
# A whole host lost: train_mlp --tide on 2 hosts x 4 ranks, (dp 2, tp 4) with one replica
# per host, tided with CURVE keys on the bridge address. While it trains, every process
# of h2 is killed at once (its MPI ranks and Open MPI's daemon: the host lost power).
# Checked: tided declares exactly h2's four workers failed and recovers the job over h1
# from its replica, (dp 1, tp 4); the survivors train to the end; the loss of every
# step, the redone one included, equals the never-resized run within relative 1e-5, and
# so does the whole final state (parameters and Adam moments within relative 1e-4 in L2
# per tensor, the step counter and the data cursor equal: mlp_state_diff). Printed: the
# time from the kill to tided's failure verdict (detection), to the recovery layout
# (plan), the survivors' switch (move) and their first step after it (resume).
# (mpirun itself never exits once a daemon is lost: the test stops it after the ranks
# printed their summary.)
# usage: test_multihost_lost.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

JOB=lostjob
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=60
KILL_AT=12

note "the never-resized reference run (dp 2, tp 4) on h1"
"${MPI[@]}" --host h1:8 -np 8 "$TRAIN" "${MODEL[@]}" --dp 2 --tp 4 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

note "train_mlp --tide (dp 2, tp 4) on h1:4,h2:4"
"${MPI[@]}" --enable-recovery --mca async_mpi_finalize 1 --host h1:4,h2:4 -np 8 \
  -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  "$TRAIN" --tide --job $JOB "${MODEL[@]}" --dp 2 --tp 4 --steps $STEPS --pace-ms 50 \
  --print-every 1000 --loss-out "$MH_TMP/tide.loss" --trace-out "$MH_TMP/trace" \
  --state-out "$MH_TMP/tide.state" \
  >"$MH_TMP/job.log" 2>&1 &
MH_PIDS=$!
wait_busy 8 60
status=$(ctl ops status)
for h in h1 h2; do
  [ "$(grep -c " $h .* online " <<<"$status")" -eq 4 ] || { echo "$status"; fail "4 workers on $h"; }
done
for _ in $(seq 600); do
  step=$(awk 'END { print $1 + 0 }' "$MH_TMP/tide.loss" 2>/dev/null || echo 0)
  [ "$step" -ge $KILL_AT ] && break
  sleep 0.05
done
[ "$step" -ge $KILL_AT ] || fail "the job did not reach step $KILL_AT"

kill_ms=$(date +%s%3N)
bash "$CLUSTER" kill-host h2 --name "$MH_NAME"
note "killed every process of h2 after step $step"

# the survivors finish: their summary line, then mpirun is stopped (it waits for h2)
for _ in $(seq 1200); do
  grep -q "steps done in" "$MH_TMP/job.log" && [ -s "$MH_TMP/tide.state" ] && break
  grep -q "train_mlp: rank .*: " "$MH_TMP/job.log" && break
  sleep 0.1
done
status=$(ctl ops status)
grep -v "generation switch: old member rank" "$MH_TMP/job.log"
grep -q "$STEPS steps done in 2 generations" "$MH_TMP/job.log" ||
  fail "the survivors did not train to the end after a recovery"
kill -9 $MH_PIDS 2>/dev/null || true
wait $MH_PIDS 2>/dev/null || true
MH_PIDS=""
echo "$status"
# failed: exactly h2's four, by missed heartbeats; h1's four left at the end (bye)
ev=$(ctl ops events --json)
nf2=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h2 ' <<<"$ev" || true; } | wc -l)
nf1=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h1 ' <<<"$ev" || true; } | wc -l)
nl1=$({ grep -o '"kind":"worker_left","detail":"worker [0-9]* ([^)]* on h1 ' <<<"$ev" || true; } | wc -l)
[ "$nf2" -eq 4 ] && [ "$nf1" -eq 0 ] && [ "$nl1" -eq 4 ] ||
  { echo "$ev"; fail "failed on h2: $nf2 (want 4), on h1: $nf1 (want 0); h1 left: $nl1 (want 4)"; }
jobs=$(ctl ops jobs --json)
grep -q '"dp":1,"tp":4,"pp":1' <<<"$jobs" || { echo "$jobs"; fail "no (1,4,1) recovery layout"; }
n=$(compare_losses "$MH_TMP/tide.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "losses differ from the never-resized run"
compare_states "$MH_TMP/tide.state" "$MH_TMP/ref.state" 1e-4

# timings: tided's events (ms since the epoch) and the survivors' trace
t_fail=$(grep -o '"time_ms":[0-9]*,"job":[^,]*,"kind":"worker_failed"' <<<"$ev" | head -1 |
         grep -o '[0-9]\{10,\}')
t_plan=$(grep -o '"time_ms":[0-9]*,"job":"'$JOB'","kind":"recovery_started"' <<<"$ev" |
         head -1 | grep -o '[0-9]\{10,\}')
t_done=$(grep -o '"time_ms":[0-9]*,"job":"'$JOB'","kind":"recovered"' <<<"$ev" | head -1 |
         grep -o '[0-9]\{10,\}')
sw=$(grep '^switch gen' "$MH_TMP/trace" | head -1)
gen=$(awk '{ print $3 }' <<<"$sw")
at_us=$(awk '{ for (i = 1; i < NF; i++) if ($i == "at_us") print $(i + 1) }' <<<"$sw")
total_ms=$(awk '{ for (i = 1; i < NF; i++) if ($i == "total_ms") print $(i + 1) }' <<<"$sw")
move_ms=$(awk '{ for (i = 1; i < NF; i++) if ($i == "move_ms") print $(i + 1) }' <<<"$sw")
first=$(awk -v g="$gen" '$1 == "step" && $4 == g { print $8; exit }' "$MH_TMP/trace")
[ -n "$t_fail" ] && [ -n "$t_plan" ] && [ -n "$t_done" ] && [ -n "$at_us" ] && [ -n "$first" ] ||
  { echo "$ev"; fail "missing timing events"; }
printf 'lost host h2: detection %d ms (kill -> first worker_failed), plan %d ms (-> recovery_started), ' \
  $((t_fail - kill_ms)) $((t_plan - t_fail))
printf 'recovered %d ms later (generation %s; the other 3 failures restart it), ' \
  $((t_done - t_plan)) "$gen"
printf 'switch %.1f ms of which move %.1f ms, first step done %d ms after the kill\n' \
  "$total_ms" "$move_ms" $(((first / 1000) - kill_ms))
echo "PASS: host h2 lost; the job recovered on h1 (dp 1, tp 4); $n steps and the final state match the never-resized run"
