#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: installs dependencies, builds tide with
# CUDA/NCCL into build-gpu/, runs every gpu-labelled test (among them the collectives
# conformance suite on the nccl backend: one-rank communicators, self send/recv, the
# reshard executor on device buffers) and prints a short table. Each step runs under a
# timeout (STEP_TIMEOUT seconds, default 900) and the summary always prints; the exit
# status is 0 only when every step passed and no gpu test failed.
#
#   bash scripts/gpu-check.sh            # BUILD_DIR=build-gpu, JOBS=nproc
#   STEP_TIMEOUT=300 bash scripts/gpu-check.sh
#
# Logs of every step are kept in $BUILD_DIR/gpu-check-logs/.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC_DIR="${SRC_DIR:-$ROOT}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"
LOGS="$BUILD_DIR/gpu-check-logs"
mkdir -p "$LOGS"

# MPI programs started without mpirun (singletons) and as root on rented machines.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"

STEPS=()
FAILED=0

# step NAME CMD...: runs CMD under the timeout, logs to $LOGS/NAME.log, records the result.
step() {
  local name="$1"
  shift
  local t0 rc status
  t0=$(date +%s)
  printf '== %-12s ' "$name"
  if declare -F "$1" >/dev/null; then
    # a function of this script: run it in a child bash (timeout needs a program)
    timeout --kill-after=15 "$STEP_TIMEOUT" bash -c "$1" >"$LOGS/$name.log" 2>&1
  else
    timeout --kill-after=15 "$STEP_TIMEOUT" "$@" >"$LOGS/$name.log" 2>&1
  fi
  rc=$?
  if [ $rc -eq 0 ]; then
    status=ok
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="TIMEOUT(${STEP_TIMEOUT}s)"
  else
    status="FAILED(rc=$rc)"
  fi
  local dt=$(($(date +%s) - t0))
  echo "$status (${dt}s)"
  if [ "$status" != ok ]; then
    FAILED=1
    tail -n 25 "$LOGS/$name.log" | sed 's/^/   | /'
  fi
  STEPS+=("$(printf '%-12s %-18s %6ss' "$name" "$status" "$dt")")
  return $rc
}

gpu_info() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  else
    echo "nvidia-smi not found"
    return 1
  fi
}

configure() {
  cmake -S "$SRC_DIR" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIDE_CUDA=ON \
    -DTIDE_SANITIZE=OFF || return 1
  # The GPU checks are pointless without CUDA and NCCL: say so instead of skipping.
  grep -q '^TIDE_NCCL_LIBRARY:FILEPATH=.*nccl' "$BUILD_DIR/CMakeCache.txt" || {
    echo "NCCL was not found: the nccl backend and the gpu tests are not built"
    return 1
  }
}

build() {
  # Keep going past modules that fail so that the GPU tests that can build do.
  cmake --build "$BUILD_DIR" -j "$JOBS" -- -k
}

run_gpu_tests() {
  (cd "$BUILD_DIR" && ctest -L gpu -V --timeout 600 -j 1)
}

# train_mlp on one GPU vs the CPU path, same seed: the loss of every step must agree
# within f32 tolerance (the unit-level comparison is test_examples_gpu above).
train_mlp_cuda() {
  local exe="$BUILD_DIR/examples/train_mlp" out="$BUILD_DIR/gpu-check-logs"
  "$exe" --device cuda --steps 30 --print-every 10 --loss-out "$out/loss-cuda.txt" || return 1
  "$exe" --device cpu --steps 30 --print-every 10 --loss-out "$out/loss-cpu.txt" || return 1
  paste "$out/loss-cpu.txt" "$out/loss-cuda.txt" | awk '
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1); if (r > worst) worst = r;
      printf "step %3d  cpu %.6f  cuda %.6f  rel %.2e\n", $1, $2, $4, r }
    END { printf "largest relative difference %.2e (limit 1e-3 after 30 Adam steps)\n", worst; exit (worst > 1e-3) }'
}

export SRC_DIR BUILD_DIR JOBS
export -f gpu_info configure build run_gpu_tests train_mlp_cuda

step install-deps bash "$ROOT/scripts/install-deps.sh"
step gpu-info gpu_info
HAVE_GPU=$?
step configure configure
CONFIGURED=$?
if [ $CONFIGURED -eq 0 ]; then
  step build build
  step gpu-tests run_gpu_tests
  step train-mlp train_mlp_cuda
fi

echo
echo "---- gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ)) ----"
for s in "${STEPS[@]}"; do echo "$s"; done
if [ -f "$LOGS/gpu-tests.log" ]; then
  echo
  printf '%-44s %-10s %s\n' "gpu test" "result" "time"
  # ctest lines: " 1/3 Test #6: name .......   Passed    1.23 sec"
  grep -E 'Test +#[0-9]+: ' "$LOGS/gpu-tests.log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.*(\*\*\*)? *([A-Za-z ]+[A-Za-z]) +([0-9.]+ sec).*/\1|\3|\4/' |
    awk -F'|' '{ printf "%-44s %-10s %s\n", $1, $2, $3 }'
  if grep -q 'SKIP: ' "$LOGS/gpu-tests.log"; then
    echo "note: tests skipped themselves: $(grep -ho 'SKIP: .*' "$LOGS/gpu-tests.log" | head -1)"
    [ $HAVE_GPU -eq 0 ] && FAILED=1 # a GPU is present, so a skip is a failure here
  fi
  grep -hE '^[0-9]+: (conformance|[a-z_]+: passed)' "$LOGS/gpu-tests.log" | sed 's/^/  /' | head -30
fi
echo "logs: $LOGS"
if [ $FAILED -ne 0 ]; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: all passed"
