#!/usr/bin/env bash
# A job grows onto a pool launched after it (a second mpirun, on another host), 2 hosts
# of scripts/cluster.sh, tided with CURVE keys on the bridge address, both mpiruns
# started with --ompi-server. Four runs:
#   grow    train_mlp --tide (dp 1, tp 2) on h1; a pool of 2 ranks launched later on h2
#           joins it; resized to (dp 2, tp 2) (the join: one communicator over both
#           launches, a TP group per host) and then to (dp 1, tp 2, pp 2). Checked: both
#           launches finish, tided connected the pool, TP groups never span hosts, the
#           losses equal a never-resized run's within 1e-5, and the final state (its
#           checkpoint converted to one layout) is bit-identical to stopping and
#           restarting the job from checkpoints at the same steps under the same layouts.
#   dies    the same, but a rank of the new pool exits in the middle of the connection
#           (TIDE_JOIN_FAULT=merge: after MPI_Intercomm_create, so every other process is
#           inside MPI_Intercomm_merge): tided aborts the join with the reason and the job
#           goes on under its old layout, bit-equal to a never-resized run; then that
#           launch is stopped and a fresh one on h2 joins, and the job grows onto it: what
#           the abandoned connection left behind does not stop the next join. Losses equal
#           a never-resized run's within 1e-5 to the end.
#   leave   the job grows onto a pool on h2 (pp 2: its second stage there) and shrinks
#           back to (dp 1, tp 2) on h1: the second stage's state moves back from h2, that
#           launch is released, its ranks finish and its mpirun exits 0 while the job
#           trains on h1 to the end; losses within 1e-5 and the final state bit-identical
#           to checkpoint-restart under the same layouts at the same steps.
#   lost    after the grow to (dp 2, tp 2), every process of h1 (the first launch) is
#           killed: the job recovers onto the second pool's ranks, (dp 1, tp 2) on h2,
#           and trains to the end with losses equal to a never-resized run within 1e-5.
# usage: test_multihost_grow.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2
CKPT="$TIDE_BUILD/ckpt/tide-ckpt"

# the ompi-server every launch of a growing job names, and tided told where it is (status
# shows it; the join's events name it)
mh_grow_setup

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=160

note "the never-resized reference run (dp 1, tp 2) on h1"
"${MPI[@]}" --host h1:2 -np 2 "$TRAIN" "${MODEL[@]}" --dp 1 --tp 2 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --print-every 1000 >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# launch JOB HOST TAG EXTRA...: a pool of 2 ranks of the job on HOST (background; steps
# paced PACE_MS, default 40 ms, so that the job is still running when a test acts); each
# launch has its own loss file (its rank 0 empties it at start), the job one checkpoint.
# LAUNCH_TRAIN: the program (default train_mlp; TRAIN_FAULTS for one with the fault hook).
# mpirun runs on the pool's host: Open MPI 4.1 connects only launches whose every rank
# runs on mpirun's own host (see docs/multihost.md, "Growing a job"; test_multihost_regrow).
launch() {
  local job=$1 host=$2 tag=$3
  shift 3
  bash "$CLUSTER" exec "$host" --name "$MH_NAME" \
    "${GROW_MPI[@]}" --host "$host:2" -np 2 "$@" "${LAUNCH_TRAIN:-$TRAIN}" --tide --job "$job" "${MODEL[@]}" \
    --dp 1 --tp 2 --steps $STEPS --pace-ms "${PACE_MS:-40}" --print-every 1000 \
    --loss-out "$MH_TMP/$job-$tag.loss" --ckpt-save "$MH_TMP/$job.ck" \
    >"$MH_TMP/$job-$tag.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

# losses JOB TOL: every step of the job's launches (both loss files) against the reference;
# every step from 0 to STEPS-1 must be there, except one whose loss no survivor can know:
# a host lost inside the step's last reduction (the loss sum) leaves the survivors to
# finish it alone (tide_mlp_finish_step), and its loss is lost with the host when the
# host had not written it yet. Such a step must be one the launches' logs name as
# "finished alone", and at most one. Prints the number of steps with a loss.
losses() {
  cat "$MH_TMP/$1"-p*.loss >"$MH_TMP/$1.loss"
  compare_losses "$MH_TMP/$1.loss" "$MH_TMP/ref.loss" "$2" >/dev/null || return 1
  local k alone missing
  k=$(awk '{ print $1 }' "$MH_TMP/$1.loss" | sort -nu | wc -l)
  alone=$(cat "$MH_TMP/$1"-p*.log |
    sed -n 's/.*step \([0-9]*\) finished alone after a peer failed.*/\1/p' | sort -nu)
  missing=$(awk -v n=$STEPS '{ have[$1] = 1 } END { for (s = 0; s < n; s++) if (!(s in have)) print s }' \
    "$MH_TMP/$1.loss")
  if [ -n "$missing" ]; then
    if [ "$(wc -l <<<"$missing")" -ne 1 ] || ! grep -qx "$missing" <<<"$alone"; then
      echo "job $1: $k of $STEPS steps have a loss; missing: $(tr "\n" " " <<<"$missing")," \
        "finished alone (loss unknown): $(tr "\n" " " <<<"$alone")" >&2
      return 1
    fi
    echo "job $1: step $missing was finished alone by the survivors, its loss died with h1" >&2
  fi
  echo "$k"
}

# switch_steps JOB: "GEN STEP" of each committed switch, from tided's events
switch_steps() {
  job_events "$1" | grep '"kind":"\(resized\|recovered\)"' |
    sed -n 's/.*generation \([0-9]*\) committed: .* from step \([0-9]*\),.*/\1 \2/p'
}

# same_as_restart JOB NP1 HOSTS1 LAYOUT1 NP2 HOSTS2 LAYOUT2 NP3 HOSTS3 LAYOUT3: the job's
# final checkpoint against stopping and restarting the never-resized program from
# checkpoints at the job's two switch steps (tided's events) under the same three layouts
# ("--dp 1 --tp 2"), both converted to one layout and compared byte for byte.
same_as_restart() {
  local job=$1 sw s1 s2
  mapfile -t sw < <(switch_steps "$job")
  [ "${#sw[@]}" -eq 2 ] || fail "$job: want 2 switches, got: ${sw[*]}"
  s1=${sw[0]#* } s2=${sw[1]#* }
  note "$job switched at steps $s1 and $s2; the same layouts at the same steps by checkpoint-restart"
  # shellcheck disable=SC2086
  "${MPI[@]}" --host "$3" -np "$2" "$TRAIN" "${MODEL[@]}" $4 --steps "$s1" \
    --print-every 1000 --ckpt-save "$MH_TMP/$job-cr1" >"$MH_TMP/$job-cr1.log" 2>&1 ||
    fail "restart run 1"
  # shellcheck disable=SC2086
  "${MPI[@]}" --host "$6" -np "$5" "$TRAIN" "${MODEL[@]}" $7 --steps "$s2" \
    --resume "$MH_TMP/$job-cr1" --print-every 1000 --ckpt-save "$MH_TMP/$job-cr2" \
    >"$MH_TMP/$job-cr2.log" 2>&1 || fail "restart run 2"
  # shellcheck disable=SC2086
  "${MPI[@]}" --host "$9" -np "$8" "$TRAIN" "${MODEL[@]}" ${10} --steps $STEPS \
    --resume "$MH_TMP/$job-cr2" --print-every 1000 --ckpt-save "$MH_TMP/$job-cr3" \
    >"$MH_TMP/$job-cr3.log" 2>&1 || fail "restart run 3"
  [ -d "$MH_TMP/$job.ck" ] || fail "$job saved no final checkpoint"
  "$CKPT" verify "$MH_TMP/$job.ck" >/dev/null || fail "$job's final checkpoint does not verify"
  "$CKPT" convert "$MH_TMP/$job.ck" "$MH_TMP/$job-live1" --dp 1 --tp 1 --pp 1 >/dev/null ||
    fail "convert $job"
  "$CKPT" convert "$MH_TMP/$job-cr3" "$MH_TMP/$job-cr1x" --dp 1 --tp 1 --pp 1 >/dev/null ||
    fail "convert $job-cr3"
  local a b
  a=$(find "$MH_TMP/$job-live1" -type f ! -name MANIFEST | sort)
  b=$(find "$MH_TMP/$job-cr1x" -type f ! -name MANIFEST | sort)
  [ -n "$a" ] && [ "$(wc -l <<<"$a")" -eq "$(wc -l <<<"$b")" ] ||
    fail "the converted checkpoints differ in files"
  paste <(echo "$a") <(echo "$b") | while read -r x y; do
    cmp -s "$x" "$y" || fail "final state differs from checkpoint-restart: $x vs $y"
  done
}

# TIDE_TEST_PARTS: the runs to do (default all four; for debugging one)
part() { [[ " ${TIDE_TEST_PARTS:-grow dies leave lost} " == *" $1 "* ]]; }

# ---- grow -------------------------------------------------------------------------------
if part grow; then
note "grow: job g1 (dp 1, tp 2) on h1, then a pool launched on h2"
launch g1 h1 p1
P1=$LAUNCHED
wait_busy 2 60
wait_step "$MH_TMP/g1-p1.loss" 10
launch g1 h2 p2
P2=$LAUNCHED
wait_event g1 pool_joined 1
wait_idle 2
ctl ops status | grep -q "ompi-server file:$MH_TMP/ompi.uri" || fail "status does not show the ompi-server"
ctl ops resize g1 --dp 2 --tp 2 >"$MH_TMP/resize1.txt"
wait_event g1 pool_connected 1
wait_event g1 resized 1
status=$(ctl ops status)
echo "$status"
# TP groups inside hosts: each host's two workers share their dp rank
for h in h1 h2; do
  roles=$(grep " $h .* online " <<<"$status" | grep -o 'pp[0-9]*/dp[0-9]*' | sort -u | wc -l)
  [ "$roles" -eq 1 ] || fail "the TP group on $h is split: $status"
done
wait_step "$MH_TMP/g1-p1.loss" 80
ctl ops resize g1 --dp 1 --tp 2 --pp 2 >/dev/null
wait_event g1 resized 2
wait "$P1" || fail "the first launch of g1 failed: $(tail -5 "$MH_TMP/g1-p1.log")"
wait "$P2" || fail "the joined launch of g1 failed: $(tail -5 "$MH_TMP/g1-p2.log")"
grep -q "$STEPS steps done" "$MH_TMP/g1-p1.log" || fail "g1 did not train to the end"
n=$(losses g1 1e-5) ||
  fail "g1's losses differ from the never-resized run"
same_as_restart g1 2 h1:2 "--dp 1 --tp 2" 4 h1:2,h2:2 "--dp 2 --tp 2" \
  4 h1:2,h2:2 "--dp 1 --tp 2 --pp 2"
echo "grow: $n steps match the never-resized run; the final state equals checkpoint-restart's"
fi

# ---- dies --------------------------------------------------------------------------------
if part dies; then
note "dies: job g2 (dp 1, tp 2) on h1; a rank of the joining pool exits inside the connection"
# paced to outlast the failed join, the stop of its launch and a second join
PACE_MS=150 launch g2 h1 p1
P1=$LAUNCHED
wait_busy 2 60
wait_step "$MH_TMP/g2-p1.loss" 10
PACE_MS=150 LAUNCH_TRAIN=$TRAIN_FAULTS launch g2 h2 p2 -x TIDE_JOIN_FAULT=merge:3
P2=$LAUNCHED
wait_event g2 pool_joined 1
wait_idle 2
t0=$(date +%s%3N)
ctl ops resize g2 --dp 2 --tp 2 >/dev/null
wait_event g2 resize_aborted 1 60
t1=$(date +%s%3N)
job_events g2 | grep '"kind":"resize_aborted"' | grep -q "stays unconnected" ||
  fail "the abort does not say the pool stays unconnected: $(job_events g2)"
grep -q "exits at stage merge" "$MH_TMP/g2-p2.log" ||
  fail "job rank 3 did not die inside the connection: $(tail -5 "$MH_TMP/g2-p2.log")"
grep -q "inside MPI_Intercomm_merge" "$MH_TMP/g2-p1.log" ||
  fail "the job's ranks were not left inside MPI_Intercomm_merge: $(tail -5 "$MH_TMP/g2-p1.log")"
# every step so far ran on the first layout, bit-equal to the never-resized run
s_ab=$(awk 'END { print $1 + 0 }' "$MH_TMP/g2-p1.loss")
compare_losses "$MH_TMP/g2-p1.loss" "$MH_TMP/ref.loss" 0 >/dev/null ||
  fail "g2's losses after the failed join differ from the never-resized run"
# the operator stops what is left of that launch and starts a fresh one: the job, whose
# ranks abandoned a connection inside MPI, must connect again
kill -TERM "$P2" 2>/dev/null || true
wait "$P2" 2>/dev/null || true
for _ in $(seq 600); do
  [ "$(ctl ops status | grep -c ' idle ')" -eq 0 ] && break
  sleep 0.1
done
[ "$(ctl ops status | grep -c ' idle ')" -eq 0 ] || fail "the stopped launch's ranks stay idle"
PACE_MS=150 launch g2 h2 p3
P3=$LAUNCHED
wait_event g2 pool_joined 2
wait_idle 2
ctl ops resize g2 --dp 2 --tp 2 >/dev/null
wait_event g2 pool_connected 1 90
wait_event g2 resized 1 90
s_re=$(switch_steps g2 | awk '{ print $2 }')
wait "$P1" || fail "g2's first launch failed: $(tail -5 "$MH_TMP/g2-p1.log")"
wait "$P3" || fail "g2's second launch failed: $(tail -5 "$MH_TMP/g2-p3.log")"
grep -q "$STEPS steps done in 2 generations;" "$MH_TMP/g2-p1.log" ||
  fail "g2 did not train to the end after growing: $(tail -5 "$MH_TMP/g2-p1.log")"
n=$(losses g2 1e-5) ||
  fail "g2's losses differ from the never-resized run"
echo "dies: the join was abandoned $((t1 - t0)) ms after the resize (step $s_ab: bit-equal so far);" \
  "a fresh launch joined at step $s_re; $n steps match"
fi

# ---- leave ------------------------------------------------------------------------------
if part leave; then
note "leave: job g4 grows onto a pool on h2, then shrinks back off it"
launch g4 h1 p1
P1=$LAUNCHED
wait_busy 2 60
wait_step "$MH_TMP/g4-p1.loss" 10
launch g4 h2 p2 -x TIDE_LOG=info
P2=$LAUNCHED
wait_event g4 pool_joined 1
wait_idle 2
ctl ops resize g4 --dp 1 --tp 2 --pp 2 >/dev/null
wait_event g4 resized 1
wait_step "$MH_TMP/g4-p2.loss" 60 # the last stage (on h2) records the losses now
ctl ops resize g4 --dp 1 --tp 2 --pp 1 >/dev/null
wait_event g4 pool_left 1
wait_event g4 resized 2
# the layers of the second stage came back from the launch that left
moved=$(job_events g4 | grep '"kind":"resized"' | sed -n 's/.*generation 3 committed: .* \([0-9]*\) bytes moved.*/\1/p')
[ "${moved:-0}" -gt 0 ] || fail "generation 3 moved no state off the leaving launch: $(job_events g4)"
# the released launch finishes on its own, exit code 0, while the job trains on
wait "$P2" || fail "the released launch of g4 failed: $(tail -5 "$MH_TMP/g4-p2.log")"
s_left=$(awk 'END { print $1 + 0 }' "$MH_TMP/g4-p1.loss")
kill -0 "$P1" 2>/dev/null || fail "g4's first launch ended with the release (at step $s_left)"
[ "$s_left" -lt $((STEPS - 10)) ] ||
  fail "the released launch exited only at step $s_left, near the end of the job"
grep -q "released this rank's pool" "$MH_TMP/g4-p2.log" ||
  fail "g4's joined launch was not released: $(tail -5 "$MH_TMP/g4-p2.log")"
wait "$P1" || fail "g4's first launch failed after the other left: $(tail -5 "$MH_TMP/g4-p1.log")"
grep -q "$STEPS steps done in 3 generations;" "$MH_TMP/g4-p1.log" ||
  fail "g4 did not train to the end: $(tail -5 "$MH_TMP/g4-p1.log")"
jobs=$(ctl ops jobs --json)
grep -q '"name":"g4".*"dp":1,"tp":2,"pp":1' <<<"$jobs" || fail "g4 is not (1,2,1): $jobs"
n=$(losses g4 1e-5) ||
  fail "g4's losses differ from the never-resized run"
same_as_restart g4 2 h1:2 "--dp 1 --tp 2" 4 h1:2,h2:2 "--dp 1 --tp 2 --pp 2" 2 h1:2 "--dp 1 --tp 2"
echo "leave: $moved bytes came back; the joined launch was released and exited 0 at step" \
  "$s_left; $n steps match and the final state equals checkpoint-restart's"
fi

# ---- lost --------------------------------------------------------------------------------
if part lost; then
note "lost: job g3 grows onto a pool on h2, then h1 (its first launch) is lost"
launch g3 h1 p1
P1=$LAUNCHED
wait_busy 2 60
wait_step "$MH_TMP/g3-p1.loss" 10
launch g3 h2 p2
P2=$LAUNCHED
wait_event g3 pool_joined 1
wait_idle 2
ctl ops resize g3 --dp 2 --tp 2 >/dev/null
wait_event g3 resized 1
wait_step "$MH_TMP/g3-p1.loss" 60
s_kill=$(awk 'END { print $1 + 0 }' "$MH_TMP/g3-p1.loss")
kill_ms=$(date +%s%3N)
bash "$CLUSTER" kill-host h1 --name "$MH_NAME"
wait_event g3 recovered 1 60
t_rec=$(date +%s%3N)
wait "$P2" || fail "the joined launch of g3 failed after h1 was lost: $(tail -5 "$MH_TMP/g3-p2.log")"
kill -9 "$P1" 2>/dev/null || true
grep -q "$STEPS steps done" "$MH_TMP/g3-p2.log" ||
  fail "g3 did not train to the end on h2: $(tail -5 "$MH_TMP/g3-p2.log")"
jobs=$(ctl ops jobs --json)
grep -q '"name":"g3".*"dp":1,"tp":2,"pp":1' <<<"$jobs" || fail "g3 is not (1,2,1): $jobs"
# the joined launch records the steps its members ran too: a step h1 finished but did not
# live to write down is still in the job's losses
grep -q "^$s_kill " "$MH_TMP/g3-p2.loss" ||
  fail "the joined launch did not record step $s_kill, which it ran with h1"
n=$(losses g3 1e-5) ||
  fail "g3's losses differ from the never-resized run"
echo "lost: h1 lost, the job recovered onto the joined pool in $((t_rec - kill_ms)) ms; $n steps match"
fi
echo "PASS: a job grew onto a later pool, survived a join that failed, let a pool leave, and" \
  "survived the loss of its first host"
