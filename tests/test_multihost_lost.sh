#!/usr/bin/env bash
# A whole host lost: train_mlp --tide on 2 hosts x 4 ranks, (dp 2, tp 4) with one replica
# per host, tided with CURVE keys on the bridge address. While it trains, every process
# of h2 is killed at once (its MPI ranks and Open MPI's daemon: the host lost power).
# Checked: tided declares exactly h2's four workers failed and recovers the job over h1
# from its replica, (dp 1, tp 4); the survivors train to the end; the loss of every
# step, the redone one included, equals the never-resized run within relative 1e-5, and
# so does the whole final state (parameters and Adam moments within relative 1e-4 in L2
# per tensor, the step counter and the data cursor equal: mlp_state_diff). Printed, in ms
# from the kill: tided's failure verdicts (detection), the recovery that committed
# (plan), the survivors' switch done with its phases (move), their first step after it
# (resume); the times must come in that order.
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
ev=$(ctl ops events --limit 10000 --json)
nf2=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h2 ' <<<"$ev" || true; } | wc -l)
nf1=$({ grep -o '"kind":"worker_failed","detail":"worker [0-9]* ([^)]* on h1 ' <<<"$ev" || true; } | wc -l)
nl1=$({ grep -o '"kind":"worker_left","detail":"worker [0-9]* ([^)]* on h1 ' <<<"$ev" || true; } | wc -l)
[ "$nf2" -eq 4 ] && [ "$nf1" -eq 0 ] && [ "$nl1" -eq 4 ] ||
  { echo "$ev"; fail "failed on h2: $nf2 (want 4), on h1: $nf1 (want 0); h1 left: $nl1 (want 4)"; }
# one failure is one recovery: h2's four workers fail in one scan, the job recovers once
nrs=$({ grep -o '"kind":"recovery_started"' <<<"$ev" || true; } | wc -l)
nab=$({ grep -o '"kind":"resize_aborted"' <<<"$ev" || true; } | wc -l)
[ "$nrs" -eq 1 ] && [ "$nab" -eq 0 ] ||
  { echo "$ev"; fail "one host lost: $nrs recovery_started (want 1), $nab resize_aborted (want 0)"; }
jobs=$(ctl ops jobs --json)
grep -q '"dp":1,"tp":4,"pp":1' <<<"$jobs" || { echo "$jobs"; fail "no (1,4,1) recovery layout"; }
n=$(compare_losses "$MH_TMP/tide.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "losses differ from the never-resized run"
compare_states "$MH_TMP/tide.state" "$MH_TMP/ref.state" 1e-4

# timings: tided's events (ms since the epoch) and the survivors' trace (wall clock)
field() { # field NAME LINE: the value after NAME in a "key value key value" line
  awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }' <<<"$2"
}
ev_times() { # ev_times KIND [HOST]: the times of events KIND (of workers on HOST), in order
  grep -o "\"time_ms\":[0-9]*,\"job\":[^,]*,\"kind\":\"$1\",\"detail\":\"[^\"]*" <<<"$ev" |
    { if [ -n "${2:-}" ]; then grep " on $2 "; else cat; fi; } | grep -o '"time_ms":[0-9]*' |
    grep -o '[0-9]*$' || true
}
t_fail1=$(ev_times worker_failed h2 | head -1)
t_fail4=$(ev_times worker_failed h2 | tail -1)
t_done=$(ev_times recovered | head -1)
# the recovery that committed: the one started before the job recovered
t_plan=$(ev_times recovery_started | awk -v d="${t_done:-0}" '$1 <= d' | tail -1)
sw=$(grep '^switch gen' "$MH_TMP/trace" | head -1)
gen=$(field gen "$sw")
at_us=$(field at_us "$sw")
rs=$(awk -v g="$gen" '$1 == "rank_switch" && $3 == g && $7 == 1 { print; exit }' "$MH_TMP/trace")
first=$(awk -v g="$gen" '$1 == "step" && $4 == g { print $8; exit }' "$MH_TMP/trace")
[ -n "$t_fail1" ] && [ -n "$t_fail4" ] && [ -n "$t_plan" ] && [ -n "$t_done" ] &&
  [ -n "$at_us" ] && [ -n "$first" ] && [ -n "$rs" ] ||
  { echo "$ev"; cat "$MH_TMP/trace"; fail "missing timing events"; }
sw_end=$((at_us / 1000))
first_ms=$((first / 1000))
[ "$t_fail1" -ge "$kill_ms" ] && [ "$t_plan" -ge "$t_fail4" ] && [ "$sw_end" -ge "$t_plan" ] &&
  [ "$first_ms" -ge "$sw_end" ] ||
  fail "timings out of order: kill $kill_ms, failed $t_fail1..$t_fail4, recovery $t_plan, switch end $sw_end, first step $first_ms"
printf 'lost host h2 (times from the kill, ms): detection %d (first of h2 failed) .. %d (all four);' \
  $((t_fail1 - kill_ms)) $((t_fail4 - kill_ms))
printf ' plan %d (the committed recovery started, %d after the last verdict);' \
  $((t_plan - kill_ms)) $((t_plan - t_fail4))
printf ' move: switch done %d (%d after the plan: agree %.1f, plan %.1f, move %.1f, groups %.1f on a survivor);' \
  $((sw_end - kill_ms)) $((sw_end - t_plan)) "$(field wait "$rs")" "$(field plan "$rs")" \
  "$(field move "$rs")" "$(field groups "$rs")"
printf ' resume: first step after it done %d (tided committed at %d)\n' \
  $((first_ms - kill_ms)) $((t_done - kill_ms))
echo "PASS: host h2 lost; the job recovered on h1 (dp 1, tp 4); $n steps and the final state match the never-resized run"
