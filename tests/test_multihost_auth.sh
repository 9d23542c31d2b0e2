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
#     reconnect with their keys and the restarted tided resizes the job back.
# usage: test_multihost_auth.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

JOB=authjob
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
       --micro-batches 2 --seed 7 --lr 0.003)
STEPS=500

note "tided at $EP; the never-resized reference run (dp 2 tp 2) on h1"
timeout 120 "${MPI[@]}" --host h1:4 -np 4 "$TRAIN" "${MODEL[@]}" --dp 2 --tp 2 --steps $STEPS \
  --loss-out "$MH_TMP/ref.loss" --print-every 1000 >"$MH_TMP/ref.log" 2>&1 ||
  { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }

note "train_mlp --tide on h1:2,h2:2 with the worker key"
"${MPI[@]}" --host h1:2,h2:2 -np 4 -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key" \
  -x TIDE_SERVER_KEY="$KEYS/server.pub" "$TRAIN" --tide --job $JOB "${MODEL[@]}" \
  --dp 2 --tp 2 --steps $STEPS --pace-ms 40 --print-every 1000 \
  --loss-out "$MH_TMP/tide.loss" >"$MH_TMP/job.log" 2>&1 &
JOB_PID=$!
MH_PIDS="$JOB_PID"
wait_busy 4 60
status=$(ctl ops status)
echo "$status"
[ "$(grep -c ' h1 ' <<<"$status")" -eq 2 ] && [ "$(grep -c ' h2 ' <<<"$status")" -eq 2 ] ||
  fail "expected 2 workers on each of h1 and h2"

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
note "the admin key resizes the job across the hosts: (2,2,1) -> (1,4,1), its TP group spanning both (allowed explicitly)"
ctl ops resize $JOB --dp 1 --tp 4 --pp 1 --allow-tp-across-hosts || fail "admin resize"
for _ in $(seq 300); do
  grep -q "generation 2 from step" "$MH_TMP/job.log" && break
  sleep 0.1
done

note "tided killed (SIGKILL) and restarted on the bridge address while the job trains"
kill -9 "$TIDED_PID"
wait "$TIDED_PID" 2>/dev/null || true
sleep 1
mh_tided_start
wait_busy 4 30
note "the restarted tided resizes the job back: (1,4,1) -> (2,2,1)"
ctl ops resize $JOB --dp 2 --tp 2 --pp 1 || fail "resize after the restart"
wait "$JOB_PID" || { cat "$MH_TMP/job.log" >&2; fail "the job failed"; }
MH_PIDS=""
grep -q "generation 3 from step" "$MH_TMP/job.log" || { cat "$MH_TMP/job.log" >&2; fail "no switch"; }
n=$(compare_losses "$MH_TMP/tide.loss" "$MH_TMP/ref.loss" 1e-5) ||
  fail "losses differ from the never-resized run"
[ "$n" -eq $STEPS ] || fail "$n of $STEPS steps recorded"
echo "PASS: CURVE across 2 hosts: $n steps over 3 generations and a tided restart match the never-resized run; roles and unknown keys refused"
