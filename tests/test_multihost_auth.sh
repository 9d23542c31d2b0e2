#!/usr/bin/env bash
# CURVE end to end across hosts: keys written by `tidectl keygen`, tided --auth bound to
# the bridge address of a 2-host cluster (scripts/cluster.sh), and the real programs.
#   - train_mlp --tide on 2 hosts x 2 ranks registers with a worker key, is resized by
#     the admin key and trains to the end; its losses match a never-resized run;
#   - the worker key cannot resize or drain, the reader key reads status but cannot
#     drain: refused with the reason, nothing changed;
#   - an unknown key and no key at all are refused with a clear error, by tidectl and by
#     libtide (tide_new fails at once, naming the CURVE handshake);
#   - tided killed and restarted on the bridge address while the job trains: the ranks
#     reconnect with their keys and the restarted tided resizes the job back;
#   - one worker identity: each rank prints its tide_worker_id (train_mlp: "pool rank R
#     is worker W on host H device D"); `tidectl status --json` lists W on H device D,
#     before and after the tided restart; the events and the metrics name W with that
#     rank, host and device; `tidectl drain W` moves the job off pool rank R (its trace
#     says so) and nothing else. A one-rank pool registers first, so no id is its rank;
#   - the whole final state equals the never-resized run's (mlp_state_diff: floats within
#     relative 1e-4 in L2 per tensor, step counter and data cursor equal).
# usage: test_multihost_auth.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
MH_METRICS="127.0.0.1:$(mh_free_port)"
mh_setup 2

JOB=authjob
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 7 --lr 0.003)
STEPS=800

note "tided at $EP; the never-resized reference run (dp 2 tp 2) on h1"
timeout 240 "${MPI[@]}" --host h1:4 -np 4 "$TRAIN" "${MODEL[@]}" --dp 2 --tp 2 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
  >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

note "a one-rank pool registers first (worker 0), so that no rank of the job has its rank as id"
timeout 120 "${MPI[@]}" --host h2:1 -np 1 -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" \
  -x TIDE_SERVER_KEY="$KEYS/server.pub" "$TRAIN" --tide --job first "${MODEL[@]}" --steps 1 \
  >"$MH_TMP/first.log" 2>&1 || { cat "$MH_TMP/first.log" >&2; fail "the one-rank pool"; }
grep -q "pool rank 0 is worker 0 on host h2 " "$MH_TMP/first.log" ||
  { cat "$MH_TMP/first.log" >&2; fail "the first registration is not worker 0"; }

note "train_mlp --tide on h1:2,h2:2 with the worker key"
"${MPI[@]}" --host h1:2,h2:2 -np 4 -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" \
  -x TIDE_SERVER_KEY="$KEYS/server.pub" "$TRAIN" --tide --job $JOB "${MODEL[@]}" \
  --dp 2 --tp 2 --steps $STEPS --pace-ms 40 --print-every 1000 \
  --loss-out "$MH_TMP/tide.loss" --trace-out "$MH_TMP/trace" --state-out "$MH_TMP/tide.state" \
  >"$MH_TMP/job.log" 2>&1 &
JOB_PID=$!
MH_PIDS="$JOB_PID"
wait_busy 4 60
status=$(ctl ops status)
echo "$status"
[ "$(grep -c ' h1 .* online ' <<<"$status")" -eq 2 ] &&
  [ "$(grep -c ' h2 .* online ' <<<"$status")" -eq 2 ] ||
  fail "expected 2 online workers on each of h1 and h2"

# "train_mlp: pool rank R is worker W on host H device D", one per rank: "R W H D" lines
ids=$(sed -n 's/^train_mlp: pool rank \([0-9]*\) is worker \([0-9]*\) on host \([^ ]*\) device \([0-9-]*\)$/\1 \2 \3 \4/p' \
  "$MH_TMP/job.log" | sort -n)
[ "$(wc -l <<<"$ids")" -eq 4 ] || { cat "$MH_TMP/job.log" >&2; fail "not 4 identity lines: $ids"; }
echo "$ids"
# every (W, H, D) a program printed is the row tidectl status --json shows for W
check_ids() {
  local js r w h d
  js=$(ctl ops status --json)
  while read -r r w h d; do
    grep -q "{\"worker\":$w,\"host\":\"$h\",\"device\":$d,[^}]*\"pool_rank\":$r[,}]" <<<"$js" ||
      { echo "$js"; fail "$1: rank $r printed worker $w on $h device $d; tidectl status differs"; }
  done <<<"$ids"
}
check_ids "at the start"
ev=$(ctl ops events --limit 10000 --json)
met=$(curl -s "http://$MH_METRICS/metrics") || fail "no metrics at $MH_METRICS"
while read -r r w h d; do
  grep -q "\"worker_registered\",\"detail\":\"worker $w: [^ ]* rank $r/4 on $h cpu $d " <<<"$ev" ||
    { echo "$ev"; fail "no worker_registered event naming worker $w as rank $r on $h device $d"; }
  grep -q "^tide_worker_info{worker=\"$w\",pool=\"[^\"]*\",rank=\"$r\",host=\"$h\",device=\"$d\",kind=\"cpu\"} 1$" <<<"$met" ||
    { grep tide_worker_info <<<"$met"; fail "metrics: no tide_worker_info for worker $w (rank $r, $h, $d)"; }
  grep -q "^tide_worker_state{worker=\"$w\",state=\"online\",job=\"$JOB\"} 1$" <<<"$met" ||
    { grep tide_worker_state <<<"$met"; fail "metrics: worker $w is not online in $JOB"; }
done <<<"$ids"

note "the worker key may read status, not resize or drain"
ctl pool1 status >/dev/null || fail "worker key cannot read status"
set +e
out=$(ctl pool1 resize $JOB --dp 1 --tp 4 --pp 1 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -q "needs an admin key" <<<"$out" || fail "worker key resize: rc $rc: $out"
set +e
out=$(ctl pool1 drain 0 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -q "needs an admin key" <<<"$out" || fail "worker key drain: rc $rc: $out"

note "the reader key reads, and may not act"
ctl watch status >/dev/null || fail "reader key cannot read status"
ctl watch jobs >/dev/null || fail "reader key cannot read jobs"
set +e
out=$(ctl watch drain 0 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -q "needs an admin key" <<<"$out" || fail "reader drain: rc $rc: $out"

note "an unknown key and no key are refused by tidectl"
set +e
out=$("$TIDECTL" --endpoint "$EP" --key "$MH_TMP/other/stranger.key" \
  --server-key "$KEYS/server.pub" status 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -q "CURVE handshake failed (key not allowed)" <<<"$out" ||
  fail "unknown key: rc $rc: $out"
set +e
out=$("$TIDECTL" --endpoint "$EP" --timeout-ms 3000 status 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && grep -q "requires CURVE" <<<"$out" || fail "no key: rc $rc: $out"

note "... and by libtide: a rank with an unknown key, and one with no key"
set +e
out=$(timeout 60 "${MPI[@]}" --host h2:1 -np 1 -x TIDE_ENDPOINT="$EP" \
  -x TIDE_KEY="$MH_TMP/other/stranger.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  "$TRAIN" --tide --job other "${MODEL[@]}" --steps 1 2>&1); rc=$?
set -e
[ $rc -ne 124 ] || fail "libtide with an unknown key: no answer in 60 s: $out"
[ $rc -ne 0 ] && grep -q "CURVE handshake failed (key not allowed)" <<<"$out" ||
  fail "libtide with an unknown key: rc $rc: $out"
set +e
out=$(timeout 60 "${MPI[@]}" --host h2:1 -np 1 -x TIDE_ENDPOINT="$EP" \
  "$TRAIN" --tide --job other "${MODEL[@]}" --steps 1 2>&1); rc=$?
set -e
[ $rc -ne 124 ] || fail "libtide without a key: no answer in 60 s: $out"
[ $rc -ne 0 ] && grep -q "tided requires CURVE: set TIDE_KEY" <<<"$out" ||
  fail "libtide without a key: rc $rc: $out"
# Waits (30 s) until the job's log shows generation $1, else fails with the log's tail.
wait_generation() {
  for _ in $(seq 300); do
    grep -q "generation $1 from step" "$MH_TMP/job.log" && return 0
    sleep 0.1
  done
  tail -20 "$MH_TMP/job.log" >&2
  fail "the job never switched to generation $1"
}
note "the admin key resizes the job across the hosts: (2,2,1) -> (1,4,1), its TP group spanning both (allowed explicitly)"
ctl ops resize $JOB --dp 1 --tp 4 --pp 1 --allow-tp-across-hosts || fail "admin resize"
wait_generation 2

note "tided killed (SIGKILL) and restarted on the bridge address while the job trains"
kill -9 "$TIDED_PID"
wait "$TIDED_PID" 2>/dev/null || true
sleep 1
mh_tided_start
wait_busy 4 30
check_ids "after the tided restart"
note "the restarted tided resizes the job back: (1,4,1) -> (2,2,1)"
ctl ops resize $JOB --dp 2 --tp 2 --pp 1 || fail "resize after the restart"
wait_generation 3

# pool rank 0's worker id is never 0 (the one-rank pool has it): a drain that took the
# id for a pool rank would move the job off another rank, or off none
read -r r0 w0 h0 _ <<<"$(head -1 <<<"$ids")"
[ "$r0" -eq 0 ] && [ "$w0" -ne 0 ] || fail "rank 0 has worker id $w0"
note "tidectl drain $w0 (pool rank 0 on $h0): the job goes on without that rank"
ctl ops drain "$w0" || fail "drain $w0"
for _ in $(seq 300); do
  grep -q "generation 4 from step" "$MH_TMP/job.log" && break
  sleep 0.1
done
grep -q "generation 4 from step" "$MH_TMP/job.log" || { cat "$MH_TMP/job.log" >&2; fail "no switch after the drain"; }
# every rank's trace line of generation 4: rank 0 left, ranks 1..3 did not all leave
grep -q "^rank_switch gen 4 rank 0 member 0 " "$MH_TMP/trace" ||
  { grep rank_switch "$MH_TMP/trace" >&2; fail "drain of worker $w0 did not move the job off pool rank 0"; }
st=$(ctl ops status --json)
grep -q "{\"worker\":$w0,\"host\":\"$h0\",[^}]*\"state\":\"draining\"" <<<"$st" ||
  { echo "$st"; fail "status does not show worker $w0 on $h0 draining"; }
[ "$(grep -o '"state":"draining"' <<<"$st" | wc -l)" -eq 1 ] || { echo "$st"; fail "more than one worker drains"; }
ctl ops events --limit 10000 --json | grep -q "\"kind\":\"drain\",\"detail\":\"worker $w0 drains: job $JOB moves off it\"" ||
  fail "no drain event naming worker $w0"
# (the job lets go of the worker when tided commits generation 4, just after the ranks)
for _ in $(seq 100); do
  met=$(curl -s "http://$MH_METRICS/metrics")
  grep -q "^tide_worker_state{worker=\"$w0\",state=\"draining\",job=\"\"} 1$" <<<"$met" && break
  sleep 0.1
done
grep -q "^tide_worker_state{worker=\"$w0\",state=\"draining\",job=\"\"} 1$" <<<"$met" ||
  { grep tide_worker_state <<<"$met"; fail "metrics do not show worker $w0 draining"; }

wait "$JOB_PID" || { cat "$MH_TMP/job.log" >&2; fail "the job failed"; }
MH_PIDS=""
n=$(compare_losses "$MH_TMP/tide.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "losses differ from the never-resized run"
[ "$n" -eq $STEPS ] || fail "$n of $STEPS steps recorded"
compare_states "$MH_TMP/tide.state" "$MH_TMP/ref.state" 1e-4
echo "PASS: CURVE across 2 hosts: $n steps over 4 generations, a tided restart and a drain match the never-resized run (state too); roles and unknown keys refused; one worker id in the program, status, events, metrics and drain"
