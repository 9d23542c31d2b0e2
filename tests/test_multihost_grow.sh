#!/usr/bin/env bash
# A job grows onto a pool launched after it (a second mpirun, on another host), 2 hosts
# of scripts/cluster.sh, tided with CURVE keys on the bridge address, both mpiruns
# started with --ompi-server. Three runs:
#   grow    train_mlp --tide (dp 1, tp 2) on h1; a pool of 2 ranks launched later on h2
#           joins it; resized to (dp 2, tp 2) (the join: one communicator over both
#           launches, a TP group per host) and then to (dp 1, tp 2, pp 2). Checked: both
#           launches finish, tided connected the pool, TP groups never span hosts, the
#           losses equal a never-resized run's within 1e-5, and the final state (its
#           checkpoint converted to one layout) is bit-identical to stopping and
#           restarting the job from checkpoints at the same steps under the same layouts.
#   dies    the same, but a rank of the new pool exits just before it connects
#           (TIDE_JOIN_FAULT): tided aborts the join with the reason, and the job goes on
#           under its old layout to the end, its losses bit-equal to a never-resized run.
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

# the ompi-server every launch of a growing job names (it runs beside mpirun and tided)
ompi-server --no-daemonize -r "$MH_TMP/ompi.uri" --mca oob_tcp_if_include "$TIDE_CLUSTER_SUBNET" \
  >"$MH_TMP/ompi-server.log" 2>&1 &
MH_PIDS="$MH_PIDS $!"
for _ in $(seq 100); do [ -s "$MH_TMP/ompi.uri" ] && break; sleep 0.05; done
[ -s "$MH_TMP/ompi.uri" ] || fail "ompi-server did not start"
# tided again, told where it is (status shows it; the join's events name it)
kill "$TIDED_PID"
wait "$TIDED_PID" 2>/dev/null || true
MH_TIDED_ARGS=(--ompi-server "file:$MH_TMP/ompi.uri")
mh_tided_start
GROW_MPI=("${MPI[@]}" --ompi-server "file:$MH_TMP/ompi.uri" --enable-recovery
          --mca async_mpi_finalize 1 -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key"
          -x TIDE_SERVER_KEY="$KEYS/server.pub" -x TIDE_SWITCH_TIMEOUT_MS=15000)

MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 11 --lr 0.003)
STEPS=160

note "the never-resized reference run (dp 1, tp 2) on h1"
"${MPI[@]}" --host h1:2 -np 2 "$TRAIN" "${MODEL[@]}" --dp 1 --tp 2 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --print-every 1000 >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

# job_events JOB: the job's events as JSON rows, one per line
job_events() { ctl ops events --json | tr '{' '\n' | grep "\"job\":\"$1\"" || true; }

# wait_event JOB KIND [N] [SECS]: until the job has N events of KIND
wait_event() {
  local i n
  for i in $(seq $((${4:-60} * 10))); do
    n=$(job_events "$1" | grep -c "\"kind\":\"$2\"" || true)
    [ "$n" -ge "${3:-1}" ] && return 0
    sleep 0.1
  done
  job_events "$1" >&2
  fail "job $1: no $2 event (${3:-1} wanted)"
}

# wait_idle N: until N workers are idle (a launched pool has registered and joined)
wait_idle() {
  local i
  for i in $(seq 600); do
    [ "$(ctl ops status | grep -c ' idle ')" -ge "$1" ] && return 0
    sleep 0.1
  done
  ctl ops status >&2
  fail "fewer than $1 idle workers"
}

# wait_step FILE N: until the loss file has reached step N
wait_step() {
  local i s=0
  for i in $(seq 1200); do
    s=$(awk 'END { print $1 + 0 }' "$1" 2>/dev/null || echo 0)
    [ "$s" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "step $2 not reached (at $s)"
}

# launch JOB HOST TAG EXTRA...: a pool of 2 ranks of the job on HOST (background); each
# launch has its own loss file (its rank 0 empties it at start), the job one checkpoint.
# mpirun runs on the pool's host, as on a cluster (mpirun on the first node of the
# allocation): Open MPI 4.1's orted crashes serving MPI_Comm_accept/connect's lookup
# for a rank it hosts, while mpirun itself serves it (see README, "Growing a job").
launch() {
  local job=$1 host=$2 tag=$3
  shift 3
  bash "$CLUSTER" exec "$host" --name "$MH_NAME" \
    "${GROW_MPI[@]}" --host "$host:2" -np 2 "$@" "$TRAIN" --tide --job "$job" "${MODEL[@]}" \
    --dp 1 --tp 2 --steps $STEPS --pace-ms 40 --print-every 1000 \
    --loss-out "$MH_TMP/$job-$tag.loss" --ckpt-save "$MH_TMP/$job.ck" \
    >"$MH_TMP/$job-$tag.log" 2>&1 &
  LAUNCHED=$!
  MH_PIDS="$MH_PIDS $LAUNCHED"
}

# losses JOB TOL: every step of the job's launches (both loss files) against the reference;
# every step from 0 to STEPS-1 must be there. Prints the number of distinct steps.
losses() {
  cat "$MH_TMP/$1"-p*.loss >"$MH_TMP/$1.loss"
  compare_losses "$MH_TMP/$1.loss" "$MH_TMP/ref.loss" "$2" >/dev/null || return 1
  local k
  k=$(awk '{ print $1 }' "$MH_TMP/$1.loss" | sort -nu | wc -l)
  [ "$k" -eq $STEPS ] || { echo "job $1: $k of $STEPS steps have a loss" >&2; return 1; }
  echo "$k"
}

# switch_steps JOB: "GEN STEP" of each committed switch, from tided's events
switch_steps() {
  job_events "$1" | grep '"kind":"\(resized\|recovered\)"' |
    sed -n 's/.*generation \([0-9]*\) committed: .* from step \([0-9]*\),.*/\1 \2/p'
}

# TIDE_TEST_PARTS: the runs to do (default all three; for debugging one)
part() { [[ " ${TIDE_TEST_PARTS:-grow dies lost} " == *" $1 "* ]]; }

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
mapfile -t sw < <(switch_steps g1)
[ "${#sw[@]}" -eq 2 ] || fail "g1: want 2 switches, got: ${sw[*]}"
s1=${sw[0]#* } s2=${sw[1]#* }
note "g1 switched at steps $s1 and $s2; the same layouts at the same steps by checkpoint-restart"
"${MPI[@]}" --host h1:2 -np 2 "$TRAIN" "${MODEL[@]}" --dp 1 --tp 2 --steps "$s1" \
  --print-every 1000 --ckpt-save "$MH_TMP/cr1" >"$MH_TMP/cr1.log" 2>&1 || fail "restart run 1"
"${MPI[@]}" --host h1:2,h2:2 -np 4 "$TRAIN" "${MODEL[@]}" --dp 2 --tp 2 --steps "$s2" \
  --resume "$MH_TMP/cr1" --print-every 1000 --ckpt-save "$MH_TMP/cr2" >"$MH_TMP/cr2.log" 2>&1 ||
  fail "restart run 2"
"${MPI[@]}" --host h1:2,h2:2 -np 4 "$TRAIN" "${MODEL[@]}" --dp 1 --tp 2 --pp 2 --steps $STEPS \
  --resume "$MH_TMP/cr2" --print-every 1000 --ckpt-save "$MH_TMP/cr3" >"$MH_TMP/cr3.log" 2>&1 ||
  fail "restart run 3"
# both final states in one layout, shard files compared byte for byte
[ -d "$MH_TMP/g1.ck" ] || fail "g1 saved no final checkpoint"
"$CKPT" verify "$MH_TMP/g1.ck" >/dev/null || fail "g1's final checkpoint does not verify"
"$CKPT" convert "$MH_TMP/g1.ck" "$MH_TMP/live1" --dp 1 --tp 1 --pp 1 >/dev/null || fail "convert g1"
"$CKPT" convert "$MH_TMP/cr3" "$MH_TMP/cr1x" --dp 1 --tp 1 --pp 1 >/dev/null || fail "convert cr3"
a=$(find "$MH_TMP/live1" -type f ! -name MANIFEST | sort)
b=$(find "$MH_TMP/cr1x" -type f ! -name MANIFEST | sort)
[ -n "$a" ] && [ "$(wc -l <<<"$a")" -eq "$(wc -l <<<"$b")" ] || fail "the converted checkpoints differ in files"
paste <(echo "$a") <(echo "$b") | while read -r x y; do
  cmp -s "$x" "$y" || fail "final state differs from checkpoint-restart: $x vs $y"
done
echo "grow: $n steps match the never-resized run; the final state equals checkpoint-restart's"
fi

# ---- dies --------------------------------------------------------------------------------
if part dies; then
note "dies: job g2 (dp 1, tp 2) on h1; a rank of the joining pool exits before connecting"
launch g2 h1 p1
P1=$LAUNCHED
wait_busy 2 60
wait_step "$MH_TMP/g2-p1.loss" 10
launch g2 h2 p2 -x TIDE_JOIN_FAULT=connect:3
P2=$LAUNCHED
wait_event g2 pool_joined 1
wait_idle 2
t0=$(date +%s%3N)
ctl ops resize g2 --dp 2 --tp 2 >/dev/null
wait_event g2 resize_aborted 1 60
t1=$(date +%s%3N)
job_events g2 | grep '"kind":"resize_aborted"' | grep -q "stays unconnected" ||
  fail "the abort does not say the pool stays unconnected: $(job_events g2)"
wait "$P1" || fail "g2's first launch failed after the failed join: $(tail -5 "$MH_TMP/g2-p1.log")"
wait "$P2" 2>/dev/null || true
grep -q "$STEPS steps done in 1 generation;" "$MH_TMP/g2-p1.log" ||
  fail "g2 did not train to the end on its first layout: $(tail -5 "$MH_TMP/g2-p1.log")"
n=$(losses g2 0) ||
  fail "g2's losses differ from the never-resized run"
echo "dies: the join was abandoned $((t1 - t0)) ms after the resize; g2 trained on, $n steps equal"
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
n=$(losses g3 1e-5) ||
  fail "g3's losses differ from the never-resized run"
echo "lost: h1 lost, the job recovered onto the joined pool in $((t_rec - kill_ms)) ms; $n steps match"
fi
echo "PASS: a job grew onto a later pool, survived a join that failed, and the loss of its first host"
