#!/usr/bin/env bash
# tided resizes a job by itself (its elastic policy: tidectl bounds), 2 hosts of
# scripts/cluster.sh, tided with CURVE keys and an ompi-server, one mpirun per host (Open
# MPI 4.1 connects only launches whose every rank runs on mpirun's host). No tidectl
# resize is typed:
#   a job launched on h1 at dp 1 gets bounds 1-2 GPUs; a pool launched on h2 joins and
#   tided grows the job onto it (event "elastic": rule grow, the GPU it takes, the
#   estimate); h2 is lost and the job recovers onto h1; h2 comes back, a pool launched
#   there joins and tided grows the job again (rule regrow: the size the failure shrank it
#   from). Every launch left finishes; every step's loss equals a never-resized run's
#   within 1e-5 (the step in flight when h2 was lost may have none) and the whole final
#   state within 1e-4 (mlp_state_diff). Printed: the time from each pool's join to the
#   commit of the grow tided decided.
# usage: test_multihost_elastic.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# tided's: policy changes of a job at least 2 s apart (a grow must still save more than 2x
# its estimated downtime over the steps left: --steps below)
export TIDE_ELASTIC_INTERVAL_MS=2000
mh_setup 2
mh_grow_setup

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=1000 # paced 60 ms: 60 s at least, for two grows, a loss and a return under load

note "the never-resized reference run (dp 1) on h1"
"${MPI[@]}" --host h1:1 -np 1 "$TRAIN" "${MODEL[@]}" --dp 1 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 || { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# launch TAG HOST: one rank of job e1 on HOST, mpirun there (background, LAUNCHED its pid);
# its own loss and state files; steps paced so that the job still trains when hosts change
launch() {
  bash "$CLUSTER" exec "$2" --name "$MH_NAME" \
    "${GROW_MPI[@]}" --host "$2:1" -np 1 "$TRAIN" --tide --job e1 "${MODEL[@]}" \
    --dp 1 --steps $STEPS --pace-ms 60 --print-every 1000 \
    --loss-out "$MH_TMP/e1-$1.loss" --state-out "$MH_TMP/e1-$1.state" \
    >"$MH_TMP/e1-$1.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

# decided N RULE WHAT: the job's Nth "elastic" event is rule RULE and says WHAT; its Nth
# "resized" follows (the switch tided started committed); prints the time from the Nth
# pool_joined to that commit
decided() {
  local ev tj tc
  wait_event e1 elastic "$1" 60
  ev=$(job_events e1 | grep '"kind":"elastic"' | sed -n "$1"p)
  grep -q "$2 dp 1 -> 2" <<<"$ev" || fail "elastic decision $1 is not '$2 dp 1 -> 2': $ev"
  grep -q "$3" <<<"$ev" || fail "elastic decision $1 does not say '$3': $ev"
  grep -q "est\. .* s down" <<<"$ev" || fail "elastic decision $1 has no estimate: $ev"
  wait_event e1 resized "$1" 60
  job_events e1 | grep '"kind":"resized"' | sed -n "$1"p | grep -q "(elastic $2 dp 1 -> 2)" ||
    fail "resize $1 was not the policy's: $(job_events e1 | grep resized)"
  tj=$(job_events e1 | grep '"kind":"pool_joined"' | sed -n "$1"p | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
  tc=$(job_events e1 | grep '"kind":"resized"' | sed -n "$1"p | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
  echo "elastic $2 $1: $((tc - tj)) ms from the pool's join to the commit; $(sed 's/.*"detail":"\([^"]*\)".*/\1/' <<<"$ev")"
}

note "e1 (dp 1) on h1, bounds 1-2 GPUs"
launch a h1
PA=$LAUNCHED
wait_busy 1 60
wait_step "$MH_TMP/e1-a.loss" 10
# bad bounds change nothing
! ctl ops bounds e1 3 2 2>"$MH_TMP/bad.err" || fail "bounds 3 2 accepted"
grep -q "min 3 GPUs is above max 2" "$MH_TMP/bad.err" || fail "no reason: $(cat "$MH_TMP/bad.err")"
! ctl ops bounds nosuch 1 2 2>/dev/null || fail "bounds of an unknown job accepted"
ctl ops bounds e1 1 2 --steps $STEPS
wait_event e1 elastic_bounds 1
sleep 1
[ "$(job_events e1 | grep -c '"kind":"elastic"' || true)" -eq 0 ] ||
  fail "tided resized e1 with nowhere to grow: $(job_events e1)"

note "a pool on h2 joins: tided grows e1 onto it"
launch b h2
PB=$LAUNCHED
wait_event e1 pool_joined 1
decided 1 grow "takes h2:0, gives up none"
status=$(ctl ops status)
grep -q " h2 .* online .*e1" <<<"$status" || fail "e1 does not run on h2: $status"

note "h2 lost: e1 recovers onto h1"
s_kill=$(awk 'END { print $1 + 0 }' "$MH_TMP/e1-a.loss")
bash "$CLUSTER" kill-host h2 --name "$MH_NAME"
wait_event e1 recovered 1 60
wait "$PB" 2>/dev/null || true # its mpirun died with h2

note "h2 comes back, a pool launched there joins: tided grows e1 back"
bash "$CLUSTER" revive-host h2 --name "$MH_NAME"
s=$(awk 'END { print $1 + 0 }' "$MH_TMP/e1-a.loss")
[ "$s" -lt $((STEPS - 400)) ] || fail "e1 is at step $s of $STEPS before h2 is back: too slow here"
launch d h2
PD=$LAUNCHED
wait_event e1 pool_joined 2
decided 2 regrow "takes h2:0, gives up none"
for p in "$PA" "$PD"; do
  wait "$p" || fail "a launch of e1 failed: $(tail -3 "$MH_TMP"/e1-*.log)"
done
grep -q "$STEPS steps done" "$MH_TMP/e1-a.log" || fail "e1 did not train to the end"
[ "$(job_events e1 | grep -c '"kind":"elastic"')" -eq 2 ] ||
  fail "tided made other decisions: $(job_events e1 | grep '"kind":"elastic"')"
cat "$MH_TMP"/e1-*.loss >"$MH_TMP/e1.loss"
compare_losses "$MH_TMP/e1.loss" "$MH_TMP/ref.loss" 1e-5 >/dev/null ||
  fail "e1's losses differ from the never-resized run"
missing=$(awk -v n=$STEPS '{ seen[$1] = 1 } END { for (s = 0; s < n; s++) if (!(s in seen)) print s }' \
  "$MH_TMP/e1.loss")
k=$((STEPS - $(wc -w <<<"$missing")))
for s in $missing; do
  [ "$s" -ge "$s_kill" ] && [ "$s" -le $((s_kill + 5)) ] && [ "$k" -eq $((STEPS - 1)) ] ||
    fail "e1: steps without a loss: $missing (h2 lost after step $s_kill)"
done
state=$(ls "$MH_TMP"/e1-*.state 2>/dev/null | head -1)
compare_states "${state:-$MH_TMP/e1-a.state}" "$MH_TMP/ref.state" 1e-4
echo "PASS: tided grew e1 onto a joining host, it recovered from that host's loss, and tided" \
  "grew it back when the host returned, with no resize typed; $k steps and the final state" \
  "match the never-resized run"
