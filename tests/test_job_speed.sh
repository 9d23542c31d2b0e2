#!/usr/bin/env bash
# A job's speed is what its user sees: train_mlp --tide on 2 ranks (dp 2) whose loop waits
# 100 ms between steps (--pace-ms, as a data loader would) against tided. Checked: the
# steps/s `tidectl jobs` shows is within a factor 1.5 of the rate the job's loss file grows
# at (tided once showed time inside steps only: 20-100 times too fast here), and
# `tidectl checkpoint` scheduled from it lands: the step it names is saved
# (checkpoint_saved) before the job ends. Printed: both speeds and the step.
# usage: test_job_speed.sh BUILD_DIR MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
shift
MPIRUN=("$@")
TRAIN="$B/examples/train_mlp"
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
tl_setup tide-speed
tl_tided_start "$B"

STEPS=100
"${MPIRUN[@]}" -np 2 -x TIDE_ENDPOINT="$EP" "$TRAIN" --tide --job speed --layers 2 --hidden 16 \
  --ffn 32 --vocab 16 --seq 4 --global-batch 4 --micro-batches 1 --dp 2 --steps $STEPS \
  --pace-ms 100 --print-every 1000 --loss-out "$WORK/tide.loss" >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
steps() { awk 'END { print NR + 0 }' "$WORK/tide.loss" 2>/dev/null || echo 0; }
for _ in $(seq 600); do [ "$(steps)" -ge 10 ] && break; sleep 0.05; done
[ "$(steps)" -ge 10 ] || { cat "$WORK/job.log" >&2; fail "the job did not reach step 10"; }
# the rate the loss file grows at over 3 s, and what tided says at the end of it
s0=$(steps) t0=$(date +%s%3N)
sleep 3
s1=$(steps) t1=$(date +%s%3N)
shown=$(ctl --json jobs | grep -o '"name":"speed"[^}]*"throughput":[0-9.e+-]*' |
  grep -o '"throughput":[0-9.e+-]*' | cut -d: -f2)
[ -n "$shown" ] || fail "tidectl jobs shows no speed for job speed"
real=$(awk -v a="$s0" -v b="$s1" -v t="$((t1 - t0))" 'BEGIN { printf "%.2f", (b - a) * 1000 / t }')
awk -v s="$shown" -v r="$real" 'BEGIN { exit !(r > 0 && s <= 1.5 * r && s >= r / 1.5) }' ||
  fail "tidectl jobs shows $shown steps/s; the job runs at $real steps/s"

# three requests back to back (two roots): each is saved, none replaces another
asked=()
for root in a b a; do
  out=$(ctl checkpoint speed --dir "$WORK/ckpt-$root")
  w=$(grep -o 'saves the checkpoint of step [0-9]*' <<<"$out" | grep -o '[0-9]*$')
  [ -n "$w" ] || fail "tidectl checkpoint: $out"
  [ "$w" -lt $STEPS ] || fail "tided asked for step $w of a $STEPS-step job: never reached"
  asked+=("$root:$w")
done
# one asked at the very end: saved if its step comes, else an event says the job ended first
for _ in $(seq 600); do [ "$(steps)" -ge $((STEPS - 4)) ] && break; sleep 0.02; done
late=$(ctl checkpoint speed --dir "$WORK/ckpt-late" 2>&1 | grep -o 'saves the checkpoint of step [0-9]*' |
  grep -o '[0-9]*$' || true)
tl_wait "$JOB_PID" || { cat "$WORK/job.log" >&2; fail "the job failed"; }
sleep 0.5 # the last reports reach tided
ev=$(ctl events --json)
for a in "${asked[@]}"; do
  grep -q "\"kind\":\"checkpoint_saved\",\"detail\":\"step ${a#*:} saved in $WORK/ckpt-${a%%:*}/" <<<"$ev" ||
    { echo "$ev"; fail "the checkpoint of step ${a#*:} under ckpt-${a%%:*} was not saved"; }
done
if [ -n "$late" ]; then
  grep -q "\"kind\":\"checkpoint_saved\",\"detail\":\"step $late saved in $WORK/ckpt-late/" <<<"$ev" ||
    grep -q "\"kind\":\"checkpoint_failed\",\"detail\":\"the checkpoint of step $late under $WORK/ckpt-late failed on worker [0-9]*: [^:]*: rank 0: the job ended at step $STEPS, before step $late" <<<"$ev" ||
    { echo "$ev"; fail "the late request (step $late of $STEPS) was neither saved nor reported"; }
fi
echo "job speed: tidectl jobs $shown steps/s, the loss file $real steps/s; requests at step $s1 of $STEPS saved: ${asked[*]}; one at the end: step ${late:-none (the job had ended)}"
echo "PASS: tided's speed is the wall-clock one, and requested checkpoints land or are reported"
