#!/usr/bin/env bash
# The elastic policy at 4 GPUs per host (issue 30), 2 hosts of scripts/cluster.sh, tided with
# CURVE keys and an ompi-server, one mpirun of 4 ranks per host and launch. Bounds and
# priorities are declared at launch; no tidectl resize or bounds is typed:
#   e1 (bounds 4-12 GPUs, priority 10) starts on h1 at dp 4; a pool of 4 on h2 joins and
#   tided grows e1 to 8 (rule grow); h2 is lost and e1 recovers onto h1 (dp 4); h2 comes
#   back, a new pool of 4 there joins while e1's rate limit holds, offline work fills its
#   GPUs, and tided grows e1 back to 8 preempting it (rule regrow); e2 (bounds 4-4,
#   priority 50) arrives on h2: e1 yields h2's 4 GPUs (rule yield) and e2 starts there
#   (rule start), with no offline work on the GPUs e2 holds; e2 ends, offline work fills
#   e1's idle ranks on h2 until tided grows e1 back onto them (rule grow).
# Checked: each decision's rule (the typed reason), its dp (typed) and GPUs (text); that
# offline work ran (its own marker file) and that every preemption is a "preempted" event
# of work that was requeued, none failed; every launch finishes; e1's losses equal a
# never-resized run's within 1e-5 (the step in flight when h2 was lost may have none) and
# its final state within 1e-4 (mlp_state_diff). Printed: the run's phases' times.
# usage: test_multihost_elastic4.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
# tided's: policy changes of a job at least 20 s apart (a pool that joins within that holds
# offline work meanwhile); preempted offline work gets 2 s to stop
export TIDE_ELASTIC_INTERVAL_MS=20000 TIDE_GRACE_MS=2000
mh_setup 2
mh_grow_setup
T0=$(date +%s)

# global batch 16 over 2 micro-batches: dp 4 and dp 8 fit (dp 12 does not: 8 is e1's most)
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=1100 # e1, paced 80 ms: 88 s at least, for a grow, a loss, a regrow, a yield, a grow
STEPS2=60  # e2
E1=(--min-gpus 4 --max-gpus 12 --priority 10)
ALL4="h2:0,1,2,3"

note "the never-resized reference run (dp 4) on h1"
"${MPI[@]}" --host h1:4 -np 4 "$TRAIN" "${MODEL[@]}" --dp 4 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 10000 \
  >"$MH_TMP/ref.log" 2>&1 || { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# launch JOB TAG HOST STEPS DECLARATION...: 4 ranks of JOB on HOST, one mpirun there
# (background, LAUNCHED its pid), its own loss and state files
launch() {
  local job=$1 tag=$2 host=$3 steps=$4
  shift 4
  bash "$CLUSTER" exec "$host" --name "$MH_NAME" \
    "${GROW_MPI[@]}" --host "$host:4" -np 4 "$TRAIN" --tide --job "$job" "${MODEL[@]}" \
    --dp 4 --steps "$steps" --pace-ms 80 --print-every 10000 "$@" \
    --loss-out "$MH_TMP/$job-$tag.loss" --state-out "$MH_TMP/$job-$tag.state" \
    >"$MH_TMP/$job-$tag.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

# kind_events KIND: every event of KIND (all jobs), oldest first
kind_events() {
  ctl ops events --type "$1" --limit 10000 --json | tr '{' '\n' | grep "\"kind\":\"$1\"" || true
}
# count KIND [PATTERN]: events of KIND (matching PATTERN)
count() { kind_events "$1" | grep -c "${2:-.}" || true; }
# wait_count KIND N PATTERN [SECS]: until N events of KIND match PATTERN
wait_count() {
  local i
  for i in $(seq $((${4:-60} * 10))); do
    [ "$(count "$1" "$3")" -ge "$2" ] && return 0
    sleep 0.1
  done
  kind_events "$1" >&2
  fail "fewer than $2 $1 events matching '$3'"
}
# typed EV DP FROM_DP: the decision event's typed layout fields (a start has no from_dp)
typed() {
  local ok=1
  grep -q "\"dp\":$2[,}]" <<<"$1" || ok=0
  if [ "$3" -eq 0 ]; then
    ! grep -q '"from_dp":' <<<"$1" || ok=0
  else
    grep -q "\"from_dp\":$3[,}]" <<<"$1" || ok=0
  fi
  [ $ok = 1 ] || fail "decision's typed dp is not $3 -> $2: $1"
}
# nth_elastic JOB N: JOB's Nth elastic event
nth_elastic() { job_events "$1" | grep '"kind":"elastic"' | sed -n "$2"p; }
# offline_preempted TEXT: the count of offline work the decision's text says it preempted
offline_preempted() {
  local n
  n=$(sed -n 's/.* \([0-9]*\) offline work preempted.*/\1/p' <<<"$1")
  echo "${n:-0}"
}
phase() { echo "   [$(($(date +%s) - T0)) s] $*"; }

note "e1 declares bounds 4-12 GPUs and priority 10 at launch: 4 ranks on h1"
launch e1 a h1 $STEPS "${E1[@]}"
PA=$LAUNCHED
wait_busy 4 90
wait_event e1 elastic_bounds 1
job_events e1 | grep '"kind":"elastic_bounds"' | grep -q "bounds 4-12 GPUs, priority 10, free.*declared at launch" ||
  fail "e1's declaration: $(job_events e1 | grep elastic_bounds)"
ctl ops jobs | grep -q "^e1 .* 10 .* 4-12" || fail "tidectl jobs: $(ctl ops jobs)"
wait_step "$MH_TMP/e1-a.loss" 10
phase "e1 trains on 4 GPUs"

note "offline work is queued: nothing is idle yet"
# two short commands (priority 5: first) that finish, ten long ones that only preemption ends;
# each attempt leaves its name and attempt in a marker file when it really starts
ran="$MH_TMP/offline.ran"
for i in 1 2; do
  ctl ops submit --offline --name "short$i" --priority 5 -- \
    sh -c "echo \$TIDE_OFFLINE_JOB.\$TIDE_OFFLINE_ATTEMPT >>$ran; sleep 1" >/dev/null
done
for i in $(seq 10); do
  ctl ops submit --offline --name "long$i" --priority 1 -- \
    sh -c "echo \$TIDE_OFFLINE_JOB.\$TIDE_OFFLINE_ATTEMPT >>$ran; exec sleep 600" >/dev/null
done
sleep 1
[ "$(count offline_assigned)" -eq 0 ] || fail "offline work on busy GPUs: $(kind_events offline_assigned)"

note "a pool of 4 of e1 on h2 joins: tided grows e1 to 8 GPUs"
launch e1 b h2 $STEPS "${E1[@]}"
PB=$LAUNCHED
decision e1 1 grow "grow dp 4 -> 8 .*+4 GPUs .*takes $ALL4, gives up none" 90
typed "$(nth_elastic e1 1)" 8 4
wait_event e1 resized 1 60
status=$(ctl ops status)
[ "$(grep -c " h2 .* online .*e1" <<<"$status")" -eq 4 ] || fail "e1 does not run on h2's 4: $status"
phase "e1 grew to 8 ($(($(event_ms e1 resized 1) - $(event_ms e1 pool_joined 1))) ms from the pool's join to the commit)"

note "h2 lost: e1 recovers onto h1's 4"
s_kill=$(awk 'END { print $1 + 0 }' "$MH_TMP/e1-a.loss")
bash "$CLUSTER" kill-host h2 --name "$MH_NAME"
wait_event e1 recovered 1 60
wait "$PB" 2>/dev/null || true # its mpirun died with h2
phase "e1 recovered at step $s_kill"

note "h2 comes back, a new pool of 4 joins: offline work fills it until e1 regrows onto it"
on_h2=$(count offline_assigned "h2 device")
bash "$CLUSTER" revive-host h2 --name "$MH_NAME"
launch e1 d h2 $STEPS "${E1[@]}"
PD=$LAUNCHED
wait_event e1 pool_joined 2 90
# the grow is rate-limited (20 s after the last one): the joined GPUs run offline work
wait_count offline_assigned $((on_h2 + 4)) "h2 device" 30
[ "$(count elastic_failed)" -eq 0 ] || fail "$(kind_events elastic_failed)"
[ "$(job_events e1 | grep -c '"kind":"elastic"')" -eq 1 ] ||
  fail "e1 regrew before offline work filled the joined pool: $(job_events e1 | grep '"kind":"elastic"')"
phase "offline work on the joined pool: $(($(count offline_assigned "h2 device") - on_h2)) attempts on h2"
decision e1 2 regrow "regrow dp 4 -> 8 .*+4 GPUs .*0 idle, 0 joining, 4 offline work preempted.*takes $ALL4, gives up none" 60
typed "$(nth_elastic e1 2)" 8 4
wait_event e1 resized 2 60
phase "e1 regrew to 8"

note "e2 (bounds 4-4, priority 50) arrives on h2: e1 yields h2's 4 GPUs, e2 starts there"
launch e2 a h2 $STEPS2 --min-gpus 4 --max-gpus 4 --priority 50
P2=$LAUNCHED
decision e1 3 yield "yield dp 8 -> 4 .*for job [0-9]* (priority 50): -4 GPUs .*gives up $ALL4" 90
typed "$(nth_elastic e1 3)" 4 8
decision e2 1 start "start dp 0 -> 4 .*takes $ALL4" 60
typed "$(nth_elastic e2 1)" 4 0
on_h2=$(count offline_assigned "h2 device")
wait "$P2" || fail "e2 failed: $(tail -3 "$MH_TMP"/e2-a.log)"
grep -q "$STEPS2 steps done" "$MH_TMP/e2-a.log" || fail "e2 did not train to the end"
wait_event e2 job_ended 1 30
# e1's yielded ranks on h2 are idle workers, but their GPUs were e2's while it ran
t_start=$(event_ms e2 elastic 1)
t_end=$(event_ms e2 job_ended 1)
while read -r t; do
  [ -n "$t_end" ] && [ "$t" -ge "$t_end" ] || [ "$t" -lt "$t_start" ] ||
    fail "offline work was given a GPU e2 held (at $t ms; e2 ran $t_start-$t_end ms): $(kind_events offline_assigned)"
done < <(kind_events offline_assigned | grep "h2 device" | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
phase "e2 trained $STEPS2 steps on h2 ($((t_start - $(event_ms e2 job_created 1))) ms from its join to its start)"

note "e2 ended: offline work fills e1's idle ranks on h2 until e1 grows back onto them"
wait_count offline_assigned $((on_h2 + 4)) "h2 device" 30
decision e1 4 grow "grow dp 4 -> 8 .*+4 GPUs .*0 idle, 0 joining, 4 offline work preempted.*takes $ALL4, gives up none" 60
typed "$(nth_elastic e1 4)" 8 4
wait_event e1 resized 4 60
phase "e1 grew back to 8"

for p in "$PA" "$PD"; do
  wait "$p" || fail "a launch of e1 failed: $(tail -3 "$MH_TMP"/e1-*.log)"
done
grep -q "$STEPS steps done" "$MH_TMP/e1-a.log" || fail "e1 did not train to the end"
phase "e1 trained $STEPS steps"

note "every decision and every offline attempt accounted for"
[ "$(job_events e1 | grep -c '"kind":"elastic"')" -eq 4 ] ||
  fail "tided made other decisions for e1: $(job_events e1 | grep '"kind":"elastic"')"
[ "$(job_events e2 | grep -c '"kind":"elastic"')" -eq 1 ] ||
  fail "tided made other decisions for e2: $(job_events e2 | grep '"kind":"elastic"')"
said=0
for n in 1 2 3 4; do said=$((said + $(offline_preempted "$(nth_elastic e1 $n)"))); done
# each preemption is one a decision announced, of work that really ran (an attempt may be
# preempted before its command started: the job's other attempts count), and requeued
[ "$(count preempted)" -eq "$said" ] ||
  fail "the decisions preempted $said, events say: $(kind_events preempted)"
[ "$(count preempted "given to job e1")" -eq "$said" ] || fail "$(kind_events preempted)"
for j in short1 short2; do
  job_events $j | grep -q '"kind":"offline_done"' || fail "$j did not finish: $(job_events $j)"
done
for j in $(kind_events preempted | sed -n 's/.*"job":"\([a-z0-9]*\)".*/\1/p' | sort -u); do
  grep -q "^$j\." "$ran" || fail "$j was preempted but never ran: $(cat "$ran")"
done
[ "$(count offline_failed)" -eq 0 ] || fail "offline work failed: $(kind_events offline_failed)"
jobs=$(ctl ops jobs)
for j in short1 short2 $(seq -f long%g 10); do
  grep -q "^$j .*\(done\|queued\|preempted\|assigned\|running\)" <<<"$jobs" || fail "offline job $j lost: $jobs"
done

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
echo "PASS: e1 (4-12 GPUs) grew 4 -> 8 onto a joining host, recovered from its loss, regrew" \
  "when it came back, yielded 4 to the higher-priority e2 and took them back, with no resize" \
  "typed; offline work filled the idle GPUs $(count offline_assigned) times and $said preemptions" \
  "were requeued; $k steps and the final state match the never-resized run ($(($(date +%s) - T0)) s)"
