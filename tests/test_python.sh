#!/usr/bin/env bash
# The Python binding as a user meets it: examples/train_torch.py under mpirun and the
# real tided, each run compared with the never-resized run of the same script and first
# layout (same ranks, global batch and data order), whose whole state it saves:
# (resize) resized live with tidectl through (dp 2, pp 2) -> (dp 2, pp 1) -> (dp 1, pp 4)
#   -> (dp 4, pp 1). The state gathered before and after every switch is bit-identical;
#   while dp stays (the pp-only switch) no sum changes order, so the state at the first
#   dp change and the loss of every step before it are bit-identical to the never-resized
#   run's; from there the dp sum adds the same gradients in another order (another
#   number of samples per rank before the allreduce), so the final state (parameters,
#   Adam moments: integers equal, floats within a relative L2 of 1e-4, the C tests'
#   measure) and every later step's loss (relative 1e-4) are compared within that.
# (recover) a rank killed inside a step under `mpirun --enable-recovery`, the survivors
#   recovering from its dp replica: losses before the kill bit-identical, the final state
#   and the later losses within the same tolerance.
# (api) every public call of the binding fed bad input raises a clear TideError, and the
#   runtime still works afterwards, a live switch included; struct mirrors that drifted
#   from the library's layout are refused with AbiError (tests/test_python_api.py).
# (device) the GPU path, TIDE_TEST_DEVICE=cuda (default): tests/test_python_device.py
#   (rt.device, tensors of another device or device index refused, collectives and a
#   reshard on device tensors) and train_torch --device cuda on 2 ranks resized live
#   (dp 2, pp 1) -> (dp 1, pp 2) -> (dp 2, pp 1), compared with its never-resized run as
#   above. Each rank runs on TIDE_DEVICE = its rank modulo the GPUs, with an NCCL_HOSTID
#   of its own (NCCL then accepts two ranks on one GPU). Skips (77) like the C GPU tests
#   (tests/gpu_test.h) only where no NVIDIA device exists or CUDA_VISIBLE_DEVICES hides
#   them all, and where this PyTorch or this build has no CUDA (a missing dependency,
#   said so); a device PyTorch cannot use fails. TIDE_TEST_DEVICE=cpu runs the same on
#   the mpi backend (scripts/gpu-check.sh --cpu-dry). TIDE_TEST_NVIDIA_NODES: the device
#   node glob (tests/test_gpu_check.sh fakes one).
#   usage: test_python.sh MODE(resize|recover|api|device) SOURCE_DIR BUILD_DIR MPIRUN [FLAGS...]
# Exit 77 (skip) when /usr/bin/python3 lacks torch or mpi4py, and as said for device.
set -uo pipefail
MODE=$1 SRC=$2 BUILD=$3
shift 3
MPIRUN=("$@")
PY=${TIDE_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch, mpi4py" 2>/dev/null || { echo "test_python: torch/mpi4py missing for $PY: skip"; exit 77; }
DEVICE=cpu
if [ "$MODE" = device ]; then
  DEVICE=${TIDE_TEST_DEVICE:-cuda}
  if [ "$DEVICE" = cuda ]; then
    NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
    TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
    cvd=${CUDA_VISIBLE_DEVICES-unset}
    if ! compgen -G "${TIDE_TEST_NVIDIA_NODES:-/dev/nvidia[0-9]*}" >/dev/null && [ "${NGPU:-0}" = 0 ]; then
      echo "SKIP: test_python_gpu: no CUDA device on this machine (no /dev/nvidia* node)"
      exit 77
    fi
    if [ "${NGPU:-0}" = 0 ] && { [ -z "$cvd" ] || [ "${cvd#-}" != "$cvd" ]; }; then
      echo "SKIP: test_python_gpu: CUDA_VISIBLE_DEVICES='$cvd' hides every device"
      exit 77
    fi
    if [ -z "$TORCH_CUDA" ]; then
      echo "SKIP: test_python_gpu: the PyTorch of $PY is built without CUDA (torch.version.cuda" \
        "is None): install a CUDA build of PyTorch (TIDE_PYTHON names the interpreter)"
      exit 77
    fi
    if [ "${TIDE_TEST_HAVE_NCCL:-1}" != 1 ] && [ "${TIDE_TEST_HAVE_NCCL:-1}" != ON ]; then
      echo "SKIP: test_python_gpu: this build of libtide has no nccl backend (configure with CUDA and NCCL)"
      exit 77
    fi
    if [ "${NGPU:-0}" = 0 ]; then
      echo "FAIL: test_python_gpu: an NVIDIA device is present but PyTorch cannot use it" \
        "(torch.cuda.is_available() is False; CUDA $TORCH_CUDA)" >&2
      exit 1
    fi
  fi
fi
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
CHECK="$SRC/tests/python_check_state.py"
STEPS=16
# a small model: the test is about the binding, and the machine may be shared
MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16)
# Every rank starts through this wrapper: on the GPU its device (a rank of its own per GPU
# while there are enough) and an NCCL "host" of its own; on cpu it only execs.
WRAP="$WORK/rank-wrapper"
cat >"$WRAP" <<EOF
#!/usr/bin/env bash
if [ "$DEVICE" = cuda ]; then
  export NCCL_HOSTID="tide-py-\${OMPI_COMM_WORLD_RANK:-0}" TIDE_DEVICE=\$(( \${OMPI_COMM_WORLD_RANK:-0} % ${NGPU:-1} ))
fi
exec "\$@"
EOF
chmod +x "$WRAP"
wait_for() { # FILE REGEX SECONDS
  for _ in $(seq $(($3 * 10))); do
    grep -qE "$2" "$1" && return 0
    kill -0 "$JOB_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE "$2" "$1" || fail "no line matching '$2' in $(basename "$1")"
}
wait_step() { # N SECONDS: until the elastic run's loss file has step N
  for _ in $(seq $(($2 * 10))); do
    awk -v n="$1" '$1 >= n { f = 1 } END { exit !f }' "$WORK/el.loss" 2>/dev/null && return 0
    kill -0 "$JOB_PID" 2>/dev/null || break
    sleep 0.1
  done
  fail "the elastic run did not reach step $1"
}
switch_step() { # GEN: the step the elastic run's generation GEN started from
  sed -n "s/.*generation $1 .* from step \([0-9]*\).*/\1/p" "$WORK/job.log" | head -n 1
}
# losses EXACT_BEFORE: every step once; steps before EXACT_BEFORE bit-identical to the
# never-resized run's, every step within a relative 1e-4
losses() {
  "$PY" - "$WORK/ref.loss" "$WORK/el.loss" $STEPS "$1" <<'PYEOF' || fail "loss curve differs from the never-resized run"
import sys
ref = dict(l.split() for l in open(sys.argv[1]))
got = [l.split() for l in open(sys.argv[2])]
steps = [int(s) for s, _ in got]
assert steps == list(range(int(sys.argv[3]))), "steps run: %s" % steps
exact = int(sys.argv[4])
for s, v in got:
    if int(s) < exact:
        assert float(v) == float(ref[s]), "step %s: loss %s, never-resized %s (bit-identical wanted)" % (s, v, ref[s])
worst = max(abs(float(v) - float(ref[s])) / abs(float(ref[s])) for s, v in got)
assert worst < 1e-4, "worst relative loss difference %.3g" % worst
print("test_python: %d steps; the first %d bit-identical to the never-resized run, all within "
      "%.2g (relative)" % (len(got), exact, worst))
PYEOF
}

if [ "$MODE" = api ]; then
  TIDECTL="$CTL" "${MPIRUN[@]}" -np 2 "$PY" "$SRC/tests/test_python_api.py" >"$WORK/api.log" 2>&1 ||
    fail "bad input to the public calls: $(grep -m1 FAIL "$WORK/api.log")"
  tail -n 1 "$WORK/api.log"
  exit 0
fi

mkdir "$WORK/check" "$WORK/ref" "$WORK/el"
if [ "$MODE" = resize ]; then
  "${MPIRUN[@]}" -np 4 "$PY" "$EX" "${MODEL[@]}" --job el --dp 2 --pp 2 --steps $STEPS --step-ms 60 \
    --loss-out "$WORK/el.loss" --check-dir "$WORK/check" --state-out "$WORK/el" >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  wait_for "$WORK/job.log" '^train_torch: step 0 ' 60
  g=1
  for l in "2 1" "1 4" "4 1"; do
    set -- $l
    g=$((g + 1))
    "$CTL" resize el --dp "$1" --pp "$2" >"$WORK/resize$g.log" 2>&1 || fail "tidectl resize el --dp $1 --pp $2"
    wait_for "$WORK/job.log" "generation $g \\(dp $1, tp 1, pp $2\\)" 60
    # the pp-only layout must run steps of its own before dp changes
    [ $g -eq 2 ] && wait_step $(($(switch_step 2) + 2)) 60
  done
  wait "$JOB_PID" || fail "the elastic run failed"
  JOB_PID=""
  S2=$(switch_step 2) S3=$(switch_step 3) S4=$(switch_step 4)
  [ "${S4:-$STEPS}" -lt $STEPS ] || fail "the last resize came after the final step"
  [ "$S3" -gt "$S2" ] || fail "the pp-only layout ran no step (switches at $S2 and $S3)"
  # the never-resized run of the same first layout, its state kept where dp first changed
  "${MPIRUN[@]}" -np 4 "$PY" "$EX" "${MODEL[@]}" --job ref --dp 2 --pp 2 --steps $STEPS \
    --loss-out "$WORK/ref.loss" --state-out "$WORK/ref" --state-at "$S3" >"$WORK/ref.log" 2>&1 ||
    fail "the never-resized run failed"
  "$PY" "$CHECK" --switches "$WORK/check" \
    --compare "$WORK/check/g3.before.*.pt" "$WORK/ref/at$S3.*.pt" --label "at the first dp change" \
    --compare "$WORK/el/final.*.pt" "$WORK/ref/final.*.pt" --rtol 1e-4 --label "final, never-resized" \
    -- "${MODEL[@]}" >"$WORK/check.log" 2>&1 || fail "state: $(tail -n 1 "$WORK/check.log")"
  [ "$(grep -c 'step [0-9]*, bit-identical$' "$WORK/check.log")" -eq 3 ] || fail "expected 3 checked switches"
  cat "$WORK/check.log"
  losses "$S3"
elif [ "$MODE" = recover ]; then
  KILL_AT=6
  "${MPIRUN[@]}" -np 4 "$PY" "$EX" "${MODEL[@]}" --job ref --dp 2 --pp 2 --steps $STEPS \
    --loss-out "$WORK/ref.loss" --state-out "$WORK/ref" >"$WORK/ref.log" 2>&1 ||
    fail "the never-resized run failed"
  # pool rank 3 = (pp 1, dp 1) dies inside step KILL_AT; (pp 1, dp 0) holds its replica
  "${MPIRUN[@]}" --enable-recovery --mca async_mpi_finalize 1 -np 4 "$PY" "$EX" "${MODEL[@]}" --job rec \
    --dp 2 --pp 2 --steps $STEPS --step-ms 20 --kill-rank 3 --kill-at $KILL_AT \
    --loss-out "$WORK/el.loss" --check-dir "$WORK/check" --state-out "$WORK/el" >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  wait_for "$WORK/job.log" "rank 3 \\(worker [0-9]+\\) dies inside step $KILL_AT" 60
  wait_for "$WORK/job.log" 'generation 2 ' 60
  for w in 0 1 2; do wait_for "$WORK/job.log" "rank $w done" 90; done
  wait "$JOB_PID" 2>/dev/null
  JOB_PID=""
  grep -q "rank 3 done" "$WORK/job.log" && fail "the killed worker finished"
  "$PY" "$CHECK" --switches "$WORK/check" \
    --compare "$WORK/el/final.*.pt" "$WORK/ref/final.*.pt" --rtol 1e-4 --label "final, never-resized" \
    -- "${MODEL[@]}" >"$WORK/check.log" 2>&1 || fail "state across the recovery: $(tail -n 1 "$WORK/check.log")"
  cat "$WORK/check.log"
  "$CTL" events --json >"$WORK/events.log" 2>&1 || true
  losses $KILL_AT
else # device
  TIDECTL="$CTL" "${MPIRUN[@]}" -np 2 "$WRAP" "$PY" "$SRC/tests/test_python_device.py" "$DEVICE" \
    >"$WORK/device.log" 2>&1 || fail "the binding on $DEVICE: $(grep -m1 FAIL "$WORK/device.log")"
  tail -n 1 "$WORK/device.log"
  STEPS=12
  "${MPIRUN[@]}" -np 2 "$WRAP" "$PY" "$EX" "${MODEL[@]}" --device "$DEVICE" --job ref --dp 2 --steps $STEPS \
    --loss-out "$WORK/ref.loss" --state-out "$WORK/ref" >"$WORK/ref.log" 2>&1 ||
    fail "the never-resized run on $DEVICE failed"
  "${MPIRUN[@]}" -np 2 "$WRAP" "$PY" "$EX" "${MODEL[@]}" --device "$DEVICE" --job el --dp 2 --steps $STEPS \
    --step-ms 100 --loss-out "$WORK/el.loss" --check-dir "$WORK/check" --state-out "$WORK/el" \
    >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  wait_for "$WORK/job.log" '^train_torch: step 0 ' 120
  g=1
  for l in "1 2" "2 1"; do
    set -- $l
    g=$((g + 1))
    "$CTL" resize el --dp "$1" --pp "$2" >"$WORK/resize$g.log" 2>&1 || fail "tidectl resize el --dp $1 --pp $2"
    wait_for "$WORK/job.log" "generation $g \\(dp $1, tp 1, pp $2\\)" 120
  done
  wait "$JOB_PID" || fail "the elastic run on $DEVICE failed"
  JOB_PID=""
  [ "$(switch_step 3)" -lt $STEPS ] || fail "the last resize came after the final step"
  if [ "$DEVICE" = cuda ]; then
    grep -q "train_torch: pool rank 1 on cuda:" "$WORK/job.log" || fail "train_torch did not train on cuda"
  fi
  "$PY" "$CHECK" --switches "$WORK/check" \
    --compare "$WORK/el/final.*.pt" "$WORK/ref/final.*.pt" --rtol 1e-4 --label "final, never-resized" \
    -- "${MODEL[@]}" >"$WORK/check.log" 2>&1 || fail "state on $DEVICE: $(tail -n 1 "$WORK/check.log")"
  [ "$(grep -c 'step [0-9]*, bit-identical$' "$WORK/check.log")" -eq 2 ] || fail "expected 2 checked switches"
  cat "$WORK/check.log"
  # bit-identical before the first dp change on the cpu; CUDA kernels may pick another
  # reduction order from run to run (warn_only determinism), so only the tolerance there
  exact=0
  [ "$DEVICE" = cpu ] && exact=$(switch_step 2)
  losses "$exact"
fi
echo "test_python($MODE): ok"
