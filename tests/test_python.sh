#!/usr/bin/env bash
# The Python binding as a user meets it: examples/train_torch.py under mpirun and the
# real tided, (A) resized live with tidectl through (dp 2, pp 2) -> (dp 1, pp 4) ->
# (dp 4, pp 1) -> (dp 1, pp 2), the state gathered before and after every switch
# bit-identical and the loss of every step equal to a never-resized run within a
# relative 1e-4 (the dp sum's order differs between layouts); (B) a rank killed inside
# a step under `mpirun --enable-recovery`, the survivors recovering from its dp replica
# and finishing with the never-resized run's losses.
# (api) every public call of the binding fed bad input raises a clear TideError, and the
# runtime still works afterwards; struct mirrors that drifted from the library's layout
# are refused with AbiError (tests/test_python_api.py).
#   usage: test_python.sh MODE(resize|recover|api) SOURCE_DIR BUILD_DIR MPIRUN [FLAGS...]
# Exit 77 (skip) only when /usr/bin/python3 lacks torch or mpi4py.
set -uo pipefail
MODE=$1 SRC=$2 BUILD=$3
shift 3
MPIRUN=("$@")
PY=${TIDE_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch, mpi4py" 2>/dev/null || { echo "test_python: torch/mpi4py missing for $PY: skip"; exit 77; }
WORK=$(mktemp -d /tmp/tide-python.XXXXXX)
TIDED_PID="" JOB_PID=""
cleanup() {
  [ -n "$JOB_PID" ] && kill -9 "$JOB_PID" 2>/dev/null
  [ -n "$TIDED_PID" ] && kill "$TIDED_PID" 2>/dev/null && wait "$TIDED_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "test_python($MODE): FAIL: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; } >&2; done
  exit 1
}
export TIDE_LIB="$BUILD/worker/libtide.so" OMP_NUM_THREADS=1
MISS=50
[ "$MODE" = recover ] && MISS=15
"$BUILD/coordinator/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
  --state "$WORK/state.db" --heartbeat-ms 100 --miss-limit $MISS >"$WORK/tided.log" 2>&1 &
TIDED_PID=$!
for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
[ -s "$WORK/endpoint" ] || fail "tided did not start"
export TIDE_ENDPOINT
TIDE_ENDPOINT=$(cat "$WORK/endpoint")
CTL="$BUILD/coordinator/tidectl"
EX="$SRC/examples/train_torch.py"
STEPS=16
# a small model: the test is about the binding, and the machine may be shared
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16)
wait_for() { # FILE REGEX SECONDS
  for _ in $(seq $(($3 * 10))); do
    grep -qE "$2" "$1" && return 0
    kill -0 "$JOB_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE "$2" "$1" || fail "no line matching '$2' in $(basename "$1")"
}

if [ "$MODE" = api ]; then
  TIDECTL="$CTL" "${MPIRUN[@]}" -np 2 "$PY" "$SRC/tests/test_python_api.py" >"$WORK/api.log" 2>&1 ||
    fail "bad input to the public calls: $(tail -n 1 "$WORK/api.log")"
  tail -n 1 "$WORK/api.log"
  exit 0
fi

# the never-resized reference, one rank
"${MPIRUN[@]}" -np 1 "$PY" "$EX" "${MODEL[@]}" --job ref --steps $STEPS --loss-out "$WORK/ref.loss" \
  >"$WORK/ref.log" 2>&1 || fail "the reference run failed"

mkdir "$WORK/check"
if [ "$MODE" = resize ]; then
  "${MPIRUN[@]}" -np 4 "$PY" "$EX" "${MODEL[@]}" --job el --dp 2 --pp 2 --steps $STEPS --step-ms 60 \
    --loss-out "$WORK/el.loss" --check-dir "$WORK/check" >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  wait_for "$WORK/job.log" '^train_torch: step 0 ' 60
  g=1
  for l in "1 4" "4 1" "1 2"; do
    set -- $l
    g=$((g + 1))
    "$CTL" resize el --dp "$1" --pp "$2" >"$WORK/resize$g.log" 2>&1 || fail "tidectl resize el --dp $1 --pp $2"
    wait_for "$WORK/job.log" "generation $g \\(dp $1, tp 1, pp $2\\)" 60
  done
  wait "$JOB_PID" || fail "the elastic run failed"
  JOB_PID=""
  last=$(sed -n 's/.*generation 4 .* from step \([0-9]*\).*/\1/p' "$WORK/job.log")
  [ "${last:-$STEPS}" -lt $STEPS ] || fail "the last resize came after the final step"
  "$PY" "$SRC/tests/python_check_state.py" "$WORK/check" "${MODEL[@]}" >"$WORK/check.log" 2>&1 ||
    fail "state across the switches: $(tail -n 1 "$WORK/check.log")"
  [ "$(grep -c bit-identical "$WORK/check.log")" -eq 3 ] || fail "expected 3 checked switches"
  cat "$WORK/check.log"
else
  # pool rank 3 = (pp 1, dp 1) dies inside step 6; (pp 1, dp 0) holds its replica
  "${MPIRUN[@]}" --enable-recovery --mca async_mpi_finalize 1 -np 4 "$PY" "$EX" "${MODEL[@]}" --job rec \
    --dp 2 --pp 2 --steps $STEPS --step-ms 20 --kill-rank 3 --kill-at 6 \
    --loss-out "$WORK/el.loss" --check-dir "$WORK/check" >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  wait_for "$WORK/job.log" 'rank 3 \(worker [0-9]+\) dies inside step 6' 60
  wait_for "$WORK/job.log" 'generation 2 ' 60
  for w in 0 1 2; do wait_for "$WORK/job.log" "rank $w done" 90; done
  wait "$JOB_PID" 2>/dev/null
  JOB_PID=""
  grep -q "rank 3 done" "$WORK/job.log" && fail "the killed worker finished"
  "$PY" "$SRC/tests/python_check_state.py" "$WORK/check" "${MODEL[@]}" >"$WORK/check.log" 2>&1 ||
    fail "state across the recovery: $(tail -n 1 "$WORK/check.log")"
  cat "$WORK/check.log"
  "$CTL" events --json >"$WORK/events.log" 2>&1 || true
fi

# every step once, and the loss curve of the never-resized run
"$PY" - "$WORK/ref.loss" "$WORK/el.loss" $STEPS <<'PYEOF' || fail "loss curve differs from the never-resized run"
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = [l.split() for l in open(sys.argv[2])]
steps = [int(s) for s, _ in got]
assert steps == list(range(int(sys.argv[3]))), "steps run: %s" % steps
worst = max(abs(float(v) - float(ref[s])) / abs(float(ref[s])) for s, v in got)
assert worst < 1e-4, "worst relative loss difference %.3g" % worst
print("test_python: %d steps, loss within %.2g (relative) of the never-resized run" % (len(got), worst))
PYEOF
echo "test_python($MODE): ok"
