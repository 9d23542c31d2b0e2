#!/usr/bin/env bash
# A higher-priority job arriving takes GPUs, 2 hosts of scripts/cluster.sh, tided with CURVE
# keys and an ompi-server, one mpirun per host. Bounds and priorities are declared at launch
# (train_mlp --min-gpus/--max-gpus/--priority); no tidectl resize or bounds is typed:
#   job e1 (bounds 1-2 GPUs, priority 10) starts on h1 at dp 1; a pool launched on h2 joins
#   and tided grows e1 onto it (rule grow); job e2 (bounds 1-1, priority 50) is launched on
#   h2, whose GPU e1 holds: its first layout waits, e1 yields h2 to it (rule yield, for e2,
#   never below its minimum) and e2 starts there (rule start); e2 trains to its end and
#   tided grows e1 back onto h2 (rule grow). Each decision's event is checked (its rule as
#   the typed reason, the text's why); e1's losses and final state equal a never-resized
#   run's (mlp_state_diff). Printed: the time from e2's join to its first step.
# usage: test_multihost_priority.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# tided's: policy changes of a job at least 2 s apart
export TIDE_ELASTIC_INTERVAL_MS=2000
mh_setup 2
mh_grow_setup

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=700   # e1, paced 60 ms: 42 s at least, for a grow, a yield and a grow back
STEPS2=100  # e2, paced 60 ms

note "the never-resized reference run (dp 1) on h1"
"${MPI[@]}" --host h1:1 -np 1 "$TRAIN" "${MODEL[@]}" --dp 1 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 || { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# launch JOB TAG HOST STEPS DECLARATION...: one rank of JOB on HOST (background, LAUNCHED
# its pid), its own loss and state files
launch() {
  local job=$1 tag=$2 host=$3 steps=$4
  shift 4
  bash "$CLUSTER" exec "$host" --name "$MH_NAME" \
    "${GROW_MPI[@]}" --host "$host:1" -np 1 "$TRAIN" --tide --job "$job" "${MODEL[@]}" \
    --dp 1 --steps "$steps" --pace-ms 60 --print-every 1000 "$@" \
    --loss-out "$MH_TMP/$job-$tag.loss" --state-out "$MH_TMP/$job-$tag.state" \
    >"$MH_TMP/$job-$tag.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

note "bad bounds declared at launch: the join is refused with tided's reason, no job made"
# (mpirun --enable-recovery exits 0 whatever its rank did: the rank's own words count)
bash "$CLUSTER" exec h1 --name "$MH_NAME" "${GROW_MPI[@]}" --host h1:1 -np 1 "$TRAIN" --tide \
  --job bad "${MODEL[@]}" --dp 1 --steps 5 --min-gpus 3 --max-gpus 2 >"$MH_TMP/bad.log" 2>&1 || true
! grep -q "steps done" "$MH_TMP/bad.log" || fail "bounds 3-2 were accepted: $(tail -3 "$MH_TMP/bad.log")"
grep -q "tided refused the join of job bad: job bad cannot start: its bounds 3-2 GPUs: min 3 GPUs is above max 2" \
  "$MH_TMP/bad.log" || fail "no reason printed: $(tail -5 "$MH_TMP/bad.log")"
! ctl ops jobs | grep -q "^bad " || fail "a refused join made a job: $(ctl ops jobs)"

note "e1 declares bounds 1-2 GPUs and priority 10 at launch, on h1"
E1=(--min-gpus 1 --max-gpus 2 --priority 10)
launch e1 a h1 $STEPS "${E1[@]}"
PA=$LAUNCHED
wait_busy 1 60
wait_event e1 elastic_bounds 1
job_events e1 | grep '"kind":"elastic_bounds"' | grep -q "bounds 1-2 GPUs, priority 10, free.*declared at launch" ||
  fail "e1's declaration: $(job_events e1 | grep elastic_bounds)"
ctl ops jobs | grep -q "^e1 .* 10 .* 1-2" || fail "tidectl jobs: $(ctl ops jobs)"
wait_step "$MH_TMP/e1-a.loss" 10

note "a pool of e1 on h2 joins: tided grows e1 onto it"
launch e1 b h2 $STEPS "${E1[@]}"
PB=$LAUNCHED
decision e1 1 grow "grow dp 1 -> 2 .*takes h2:0, gives up none"
wait_event e1 resized 1 60

note "e2 (priority 50, bounds 1-1) arrives on h2: e1 yields h2, e2 starts there"
launch e2 a h2 $STEPS2 --min-gpus 1 --max-gpus 1 --priority 50
P2=$LAUNCHED
decision e1 2 yield "yield dp 2 -> 1 .*for job [0-9]* (priority 50).*gives up h2:0"
decision e2 1 start "start dp 0 -> 1 .*takes h2:0"
job_events e2 | grep '"kind":"job_created"' >/dev/null || fail "e2 was not made"
wait "$P2" || fail "e2 failed: $(tail -3 "$MH_TMP"/e2-a.log)"
grep -q "$STEPS2 steps done" "$MH_TMP/e2-a.log" || fail "e2 did not train to the end"
tj=$(job_events e2 | grep '"kind":"job_created"' | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
tl=$(job_events e2 | grep '"kind":"elastic"' | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
echo "e2: $((tl - tj)) ms from its join to its first layout (e1's yield committed first)"

note "e2 ended: tided grows e1 back onto h2"
decision e1 3 grow "grow dp 1 -> 2 .*takes h2:0"
for p in "$PA" "$PB"; do
  wait "$p" || fail "a launch of e1 failed: $(tail -3 "$MH_TMP"/e1-*.log)"
done
grep -q "$STEPS steps done" "$MH_TMP/e1-a.log" || fail "e1 did not train to the end"
n=$(job_events e1 | grep -c '"kind":"elastic"')
[ "$n" -eq 3 ] || fail "tided made other decisions for e1: $(job_events e1 | grep '"kind":"elastic"')"
cat "$MH_TMP"/e1-*.loss >"$MH_TMP/e1.loss"
k=$(compare_losses "$MH_TMP/e1.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "e1's losses differ from the never-resized run"
state=$(ls "$MH_TMP"/e1-*.state 2>/dev/null | head -1)
compare_states "${state:-$MH_TMP/e1-a.state}" "$MH_TMP/ref.state" 1e-4
echo "PASS: e1 grew onto a joining host, yielded it to the higher-priority e2 (declared at" \
  "launch) and grew back when e2 ended, with no resize typed; $k losses and the final state" \
  "match the never-resized run"
