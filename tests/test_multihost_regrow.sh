#!/usr/bin/env bash
# Growing whatever the launches span, on 3 hosts of scripts/cluster.sh (tided with CURVE
# keys, an ompi-server). Parts:
#   span    launches started by tide-mpirun (docs/multihost.md, "Growing a job"): job s1's
#           first launch spans h1 and h2 (mpirun on h1, an orted on h2); it grows onto a
#           launch on h3, then onto one across h1 and h2 (dp 2 -> 4 -> 8). Job s2's first
#           launch spans h1, h2 and h3 and it grows onto a launch across h2 and h3 (dp 4
#           -> 8). Each grow commits, no daemon crashes, and the losses equal the
#           never-resized run's. Then a launch by a plain mpirun across h1 and h2 (job s3):
#           Open MPI 4.1 cannot connect it, and the resize onto a pool on h3 is refused
#           within seconds with the reason (naming tide-mpirun); the job trains on under
#           its first layout with the never-resized run's losses, the pool still alive.
#   twice   a job launched on h1 grows onto a launch on h2 and then onto one on h3 (one
#           mpirun per host: the job spans three hosts); h2 is lost (kill-host) and the
#           job recovers over h1 and h3; h2 comes back (revive-host), a pool launched there
#           joins and the job grows onto it again. Every launch left finishes; the loss of
#           every step equals the never-resized run's within 1e-5 (the step in flight when
#           h2 was lost may have none: its survivors finished it alone) and the whole final
#           state within 1e-4 (mlp_state_diff). Printed: each grow's time from the resize command
#           to its commit.
# usage: test_multihost_regrow.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 3
mh_grow_setup

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=800 # paced 60 ms: 48 s at least, for the grows, a loss and a return under load

note "the never-resized reference run (dp 1) on h1"
"${MPI[@]}" --host h1:1 -np 1 "$TRAIN" "${MODEL[@]}" --dp 1 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 || { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# [MPIRUN=tide] launch JOB TAG MPIHOST HOSTS NP DP: NP ranks of the job on HOSTS
# ("h1:1,h2:1"), mpirun (tide-mpirun with MPIRUN=tide) on MPIHOST (background, LAUNCHED
# its pid); its own loss and state files (TAG), first layout (dp DP); steps paced so that
# the job still trains when the test acts.
launch() {
  local job=$1 tag=$2 mpihost=$3 hosts=$4 np=$5 dp=$6
  local mpi=("${GROW_MPI[@]}")
  [ "${MPIRUN:-plain}" = tide ] && mpi[0]=$TIDE_BUILD/worker/tide-mpirun
  bash "$CLUSTER" exec "$mpihost" --name "$MH_NAME" \
    "${mpi[@]}" --host "$hosts" -np "$np" "$TRAIN" --tide --job "$job" "${MODEL[@]}" \
    --dp "$dp" --steps $STEPS --pace-ms 60 --print-every 1000 \
    --loss-out "$MH_TMP/$job-$tag.loss" --state-out "$MH_TMP/$job-$tag.state" \
    >"$MH_TMP/$job-$tag.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

# stop PID...: those launches end (mpirun passes SIGTERM to its ranks; SIGKILL after 20 s,
# when a rank does not end: its connecting thread, abandoned inside MPI, may hold it)
stop() {
  local p i
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for i in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "launch $p did not end on SIGTERM in 20 s: killed"
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
  echo "stopped at ${SECONDS}s"
}

# grow JOB N DP: the job resized to (dp DP), its Nth grow; waits for the commit and prints
# the time from the command to it (the event's time, tided's clock: this machine's)
grow() {
  local t0 t1
  t0=$(date +%s%3N)
  ctl ops resize "$1" --dp "$3" >/dev/null
  wait_event "$1" resized "$2" 60
  t1=$(job_events "$1" | grep '"kind":"resized"' | sed -n "$2"p |
       sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p')
  [ -n "$t1" ] || t1=$(date +%s%3N)
  echo "grow $2 of $1 to (dp $3): $((t1 - t0)) ms from the command to the commit"
}

# refused JOB POOLLOG WHO: the join of the resize just typed was aborted within 10 s, the
# reason is in WHO's log (the side that spans hosts), and no daemon crashed
refused() {
  local job=$1 t0=$2 log=$3 t1
  wait_event "$job" resize_aborted 1 30
  t1=$(date +%s%3N)
  [ $((t1 - t0)) -lt 10000 ] || fail "$job: the join was refused only after $((t1 - t0)) ms"
  job_events "$job" | grep '"kind":"resize_aborted"' | grep -q "stays unconnected" ||
    fail "$job: the abort does not say the pool stays unconnected: $(job_events "$job")"
  for _ in $(seq 50); do
    grep -q "runs on another host than its launch's mpirun" "$log" && break
    sleep 0.1
  done
  grep -q "runs on another host than its launch's mpirun.*tide-mpirun" "$log" ||
    fail "$job: no reason in $log: $(tail -5 "$log")"
  ! grep -l "Segmentation fault\|orte_rml_base_parse_uris" "$MH_TMP"/"$job"-*.log ||
    fail "$job: a daemon crashed"
  echo "$job: the join was refused $((t1 - t0)) ms after the resize (at ${SECONDS}s)"
}

# ---- span --------------------------------------------------------------------------------
# gone: every rank of the launches stopped has left tided's table
gone() {
  for _ in $(seq 300); do
    [ "$(ctl ops status | grep -c ' \(online\|idle\) ')" -eq 0 ] && return 0
    sleep 0.1
  done
  fail "ranks of stopped launches are still registered: $(ctl ops status)"
}

# grown JOB N DP: the job's Nth grow committed (dp DP) and no daemon crashed
grown() {
  local job=$1 n=$2 dp=$3
  grow "$job" "$n" "$dp"
  ! grep -l "Segmentation fault\|orte_rml_base_parse_uris" "$MH_TMP"/"$job"-*.log ||
    fail "$job: a daemon crashed"
  job_events "$job" | grep '"kind":"resized"' | sed -n "$n"p | grep -q "\"dp\":$dp," ||
    fail "$job: grow $n did not commit (dp $dp): $(job_events "$job" | grep resized)"
}

# [MPIRUN=tide] first JOB HOSTS NP DP: the job's first launch (mpirun on h1), training
# (P1 its pid)
first() {
  launch "$1" p1 h1 "$2" "$3" "$4"
  P1=$LAUNCHED
  wait_busy "$3" 60
  wait_step "$MH_TMP/$1-p1.loss" 10
}

# [MPIRUN=tide] joins JOB TAG MPIHOST HOSTS NP DP N IDLE: a launch of the job (given the
# first layout's dp) that joins it as its Nth pool, IDLE ranks idle once it did (LAUNCHED
# its pid)
joins() {
  launch "$1" "$2" "$3" "$4" "$5" "$6"
  wait_event "$1" pool_joined "$7"
  wait_idle "$8"
}

# trains_on JOB: 10 more steps of the job, and every loss of its launches equal to the
# never-resized run's
trains_on() {
  local s
  s=$(awk 'END { print $1 + 0 }' "$MH_TMP/$1-p1.loss")
  wait_step "$MH_TMP/$1-p1.loss" $((s + 10))
  cat "$MH_TMP/$1"-p*.loss >"$MH_TMP/$1.loss"
  compare_losses "$MH_TMP/$1.loss" "$MH_TMP/ref.loss" 1e-5 >/dev/null ||
    fail "$1's losses differ from the never-resized run"
}

if [[ " ${TIDE_TEST_PARTS:-span twice} " == *" span "* ]]; then
note "span: job s1 (dp 2) launched by tide-mpirun across h1 and h2; grows onto a launch on" \
  "h3, then onto one across h1 and h2"
MPIRUN=tide first s1 h1:1,h2:1 2 2
MPIRUN=tide joins s1 p2 h3 h3:2 2 2 1 2
P2=$LAUNCHED
grown s1 1 4
MPIRUN=tide joins s1 p3 h1 h1:2,h2:2 4 2 2 4
P3=$LAUNCHED
grown s1 2 8
trains_on s1
stop "$P1" "$P2" "$P3"
gone

note "span: job s2 (dp 4) launched by tide-mpirun across h1, h2 and h3; grows onto a" \
  "launch across h2 and h3"
MPIRUN=tide first s2 h1:1,h2:1,h3:2 4 4
MPIRUN=tide joins s2 p2 h2 h2:2,h3:2 4 4 1 4
P2=$LAUNCHED
grown s2 1 8
trains_on s2
stop "$P1" "$P2"
gone

note "span: job s3 (dp 2) launched by a plain mpirun across h1 and h2; a pool on h3"
first s3 h1:1,h2:1 2 2
joins s3 p2 h3 h3:2 2 2 1 2
P2=$LAUNCHED
t0=$(date +%s%3N)
ctl ops resize s3 --dp 4 >/dev/null
refused s3 "$t0" "$MH_TMP/s3-p1.log"
kill -0 "$P2" 2>/dev/null || fail "the refused pool's launch died: $(tail -5 "$MH_TMP/s3-p2.log")"
trains_on s3
stop "$P1" "$P2"
gone
fi

# ---- twice -------------------------------------------------------------------------------
if [[ " ${TIDE_TEST_PARTS:-span twice} " == *" twice "* ]]; then
note "twice: job g1 (dp 1) on h1, grows onto h2, then onto h3"
launch g1 a h1 h1:1 1 1
PA=$LAUNCHED
wait_busy 1 60
wait_step "$MH_TMP/g1-a.loss" 10
launch g1 b h2 h2:1 1 1
PB=$LAUNCHED
wait_event g1 pool_joined 1
wait_idle 1
grow g1 1 2
launch g1 c h3 h3:2 2 1
PC=$LAUNCHED
wait_event g1 pool_joined 2
wait_idle 2
grow g1 2 4
status=$(ctl ops status)
for h in h1 h2 h3; do
  grep -q " $h .* online .*g1" <<<"$status" || fail "g1 does not run on $h: $status"
done

# a host that was not lost is not revived: that would kill what runs there
! bash "$CLUSTER" revive-host h2 --name "$MH_NAME" 2>/dev/null || fail "revive-host revived h2, which is up"
kill -0 "$PB" 2>/dev/null || fail "h2's launch died"

note "twice: h2 lost; the job recovers over h1 and h3"
s_kill=$(awk 'END { print $1 + 0 }' "$MH_TMP/g1-a.loss")
bash "$CLUSTER" kill-host h2 --name "$MH_NAME"
wait_event g1 recovered 1 60
wait "$PB" 2>/dev/null || true # its mpirun died with h2

note "twice: h2 comes back; a pool launched there joins and the job grows onto it"
bash "$CLUSTER" revive-host h2 --name "$MH_NAME"
s=$(awk 'END { print $1 + 0 }' "$MH_TMP/g1-a.loss")
[ "$s" -lt $((STEPS - 150)) ] || fail "g1 is at step $s of $STEPS before h2 is back: too slow here"
launch g1 d h2 h2:1 1 1
PD=$LAUNCHED
wait_event g1 pool_joined 3
grow g1 3 4
status=$(ctl ops status)
grep -q " h2 .* online .*g1" <<<"$status" || fail "g1 does not run on h2 again: $status"
for p in "$PA" "$PC" "$PD"; do
  wait "$p" || fail "a launch of g1 failed: $(tail -3 "$MH_TMP"/g1-*.log)"
done
grep -q "$STEPS steps done" "$MH_TMP/g1-a.log" || fail "g1 did not train to the end"
cat "$MH_TMP"/g1-*.loss >"$MH_TMP/g1.loss"
compare_losses "$MH_TMP/g1.loss" "$MH_TMP/ref.loss" 1e-5 >/dev/null ||
  fail "g1's losses differ from the never-resized run"
# every step has a loss, but the one h2's loss cut short may have none: a survivor that
# finished its update alone never saw that step's loss (the final state still counts it)
missing=$(awk -v n=$STEPS '{ seen[$1] = 1 } END { for (s = 0; s < n; s++) if (!(s in seen)) print s }' \
  "$MH_TMP/g1.loss")
k=$((STEPS - $(wc -w <<<"$missing")))
for s in $missing; do
  [ "$s" -ge "$s_kill" ] && [ "$s" -le $((s_kill + 5)) ] && [ "$k" -eq $((STEPS - 1)) ] ||
    fail "g1: steps without a loss: $missing (h2 lost after step $s_kill)"
done
state=$(ls "$MH_TMP"/g1-*.state 2>/dev/null | head -1)
compare_states "${state:-$MH_TMP/g1-a.state}" "$MH_TMP/ref.state" 1e-4
echo "twice: grew onto h2 and h3, lost h2, grew onto it again after it came back; $k steps" \
  "and the final state match the never-resized run"
fi
echo "PASS: launches by tide-mpirun that span two and three hosts grow and are grown onto;" \
  "a plain mpirun's spanning launch is refused cleanly; one launch per host grows, twice," \
  "and again onto a host that came back"
