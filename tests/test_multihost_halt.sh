#!/usr/bin/env bash
# A whole host lost that held state no other host holds: train_mlp --tide on 2 hosts x 4
# ranks as (dp 1, tp 4, pp 2), one pipeline stage per host (tensor parallelism stays
# inside a host), tided with CURVE keys on the bridge address. Every process of the host
# holding stage 1 is killed at once. Checked: tided says the job cannot go on and why
# (job stalled; a "stalled" event naming the state no live worker holds and the way out,
# a checkpoint), instead of recovering to a layout no survivor can fill; the survivors on
# the other host stop, each with the halt status and tided's reason, within a bounded
# time instead of hanging in their next step.
# (mpirun never exits once a daemon is lost: the test stops it when the survivors are gone.)
# usage: test_multihost_halt.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

JOB=haltjob
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 13 --lr 0.003)
KILL_AT=8

note "train_mlp --tide (dp 1, tp 4, pp 2) on h1:4,h2:4"
"${MPI[@]}" --enable-recovery --mca async_mpi_finalize 1 --host h1:4,h2:4 -np 8 \
  -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  "$TRAIN" --tide --job $JOB "${MODEL[@]}" --dp 1 --tp 4 --pp 2 --steps 100000 --pace-ms 50 \
  --print-every 1000 --loss-out "$MH_TMP/tide.loss" >"$MH_TMP/job.log" 2>&1 &
MH_PIDS=$!
wait_busy 8 60
status=$(ctl ops status)
echo "$status"
# each host holds one whole stage: its 4 workers are pp0/... or pp1/...
one_stage_per_host "$status"
for _ in $(seq 600); do
  step=$(awk 'END { print $1 + 0 }' "$MH_TMP/tide.loss" 2>/dev/null || echo 0)
  [ "$step" -ge $KILL_AT ] && break
  sleep 0.05
done
[ "$step" -ge $KILL_AT ] || fail "the job did not reach step $KILL_AT"

kill_ms=$(date +%s%3N)
bash "$CLUSTER" kill-host $victim --name "$MH_NAME"
note "killed every process of $victim (it held $lost, which nobody else holds) after step $step"

# the survivors stop: no train_mlp process left on the surviving host
for _ in $(seq 900); do
  [ "$(survivors)" -eq 0 ] && break
  sleep 0.1
done
left=$(survivors)
stop_ms=$(date +%s%3N)
cat "$MH_TMP/job.log"
[ "$left" -eq 0 ] || fail "$left train_mlp processes still run on $survivor 90 s after $victim was lost"
kill -9 $MH_PIDS 2>/dev/null || true
wait $MH_PIDS 2>/dev/null || true
MH_PIDS=""

# each survivor that got to say it: the halt status (no live worker holds the data) and
# tided's reason; at least one (MPI_Abort of the first may end the others first)
nh=$(grep -c "^train_mlp: rank [0-9]*: training: no live worker holds the data: tided halted job $JOB: .*no live worker holds" "$MH_TMP/job.log" || true)
[ "$nh" -ge 1 ] || fail "no survivor stopped with the halt status and tided's reason"
ev=$(ctl ops events --limit 10000 --json)
grep -q "\"job\":\"$JOB\",\"kind\":\"stalled\",\"detail\":\"[^\"]*no live worker holds [^\"]*restart it from a checkpoint" <<<"$ev" ||
  { echo "$ev"; fail "no stalled event for $JOB naming the lost state and the way out"; }
! grep -q "\"job\":\"$JOB\",\"kind\":\"recovery_started\"" <<<"$ev" ||
  { echo "$ev"; fail "tided started a recovery that no survivor can fill"; }
# (tidectl jobs shows the job "stalled"; it stays at its generation)
jobs=$(ctl ops jobs --json)
grep -q "{\"name\":\"$JOB\",\"kind\":\"online\",\"state\":\"stalled\",\"gen\":1," <<<"$jobs" ||
  { echo "$jobs"; fail "$JOB is not stalled at generation 1"; }
grep -q "\"job\":\"$JOB\",\"kind\":\"stalled\",\"detail\":\"[^\"]*however many workers join: no live worker holds [^\"]*needed by any worker that replaces worker [0-9]" <<<"$ev" ||
  { echo "$ev"; fail "the stalled event does not say that more workers would not help"; }
reason=$(grep -o "\"kind\":\"stalled\",\"detail\":\"[^\"]*\"" <<<"$ev" | head -1)
echo "$reason"
echo "PASS: $victim lost with $lost's only copy: $nh survivors stopped with tided's reason $((stop_ms - kill_ms)) ms after the kill; job stalled"
