#!/usr/bin/env bash
# test_gpu_check: scripts/gpu-check.sh's decisions that need no GPU to check.
#   gpu-info (--info), nvidia-smi absent (GPU_CHECK_SMI), device nodes faked
#   (GPU_CHECK_DEVICES), the CUDA driver faked by a small libcuda (GPU_CHECK_LIBCUDA):
#     1. no device node: no GPU, nothing checked, exit 0;
#     2. a node and a driver that answers: gpu-info passes, naming the device;
#     3. a node and a driver whose cuInit fails: gpu-info fails (present but broken);
#     4. a node and no driver at all: gpu-info fails.
#   5. --cpu-dry with train_mlp failing (GPU_CHECK_TRAIN=false) and only train-ref and
#      train-elastic selected (GPU_CHECK_ONLY): train-ref fails, and train-elastic, which
#      needs its losses, is in the summary as NOT-RUN; the check fails.
#   8. --cpu-dry --out DIR with a budget (GPU_CHECK_BUDGET=25) that train-ref (a train_mlp
#      that never ends) outlasts: train-ref is cut, TIMEOUT(budget), and nothing it started
#      is left running; train-elastic is NOT-RUN; the summary is the output's last lines,
#      also in DIR/summary.txt, and the check fails.
#   python-gpu (GPU_CHECK_ONLY) where gpu-info finds a GPU but CUDA PyTorch sees none
#   (skipped where PyTorch sees a device: the test would then really run):
#     6. nvidia-smi answers and no device node: the python GPU test skips for want of a
#        device, and on a machine with a GPU that skip fails the check;
#     7. a device node and a working driver: a PyTorch built without CUDA is reported as
#        not run (skipped, the check passes); one with CUDA that sees no device fails.
# Usage: test_gpu_check.sh BUILD_DIR (a build with tided, tidectl and train_mlp).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:?usage: test_gpu_check.sh BUILD_DIR}"
TMP=$(mktemp -d /tmp/tide-gpu-check-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() {
  echo "FAILED: $*"
  exit 1
}

# a fake CUDA driver: cuInit returns $1, one device named "Fake GPU 9000"
fake_driver() {
  cat >"$TMP/fake.c" <<EOF
#include <string.h>
int cuInit(unsigned f) { (void)f; return $1; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int len, int d) { (void)d; strncpy(s, "Fake GPU 9000", (size_t)len); return 0; }
EOF
  cc -shared -fPIC -o "$TMP/libcuda-$1.so.1" "$TMP/fake.c" || fail "cannot build a fake libcuda"
}
fake_driver 0
fake_driver 100
mkdir -p "$TMP/dev"
: >"$TMP/dev/nvidia0"

# info CASE DEVICES LIBCUDA: runs gpu-check.sh --info; its output in $TMP/CASE.out, status in RC
info() {
  GPU_CHECK_SMI="$TMP/no-nvidia-smi" GPU_CHECK_DEVICES="$2" GPU_CHECK_LIBCUDA="$3" \
    GPU_CHECK_LOGS="$TMP/logs-$1" BUILD_DIR="$BUILD" bash "$ROOT/scripts/gpu-check.sh" --info \
    >"$TMP/$1.out" 2>&1
  RC=$?
}

info none "$TMP/none/nvidia[0-9]*" "$TMP/libcuda-0.so.1"
[ $RC -eq 0 ] && grep -q 'no GPU on this machine' "$TMP/none.out" ||
  fail "no device node: want 'no GPU', exit 0 (got $RC): $(cat "$TMP/none.out")"

info works "$TMP/dev/nvidia[0-9]*" "$TMP/libcuda-0.so.1"
[ $RC -eq 0 ] && grep -q 'gpu-check: all passed' "$TMP/works.out" &&
  grep -q 'gpu-info .*ok .*Fake GPU 9000 (1 device)' "$TMP/works.out" ||
  fail "a device node and a working driver without nvidia-smi must pass (got $RC): $(cat "$TMP/works.out")"

info broken "$TMP/dev/nvidia[0-9]*" "$TMP/libcuda-100.so.1"
[ $RC -ne 0 ] && grep -q 'gpu-check: FAILED' "$TMP/broken.out" &&
  grep -q 'cuInit failed: CUDA error 100' "$TMP/broken.out" ||
  fail "a device node and a driver that fails cuInit must fail (got $RC): $(cat "$TMP/broken.out")"

info nodriver "$TMP/dev/nvidia[0-9]*" "$TMP/absent/libcuda.so.1"
[ $RC -ne 0 ] && grep -q 'cannot load the CUDA driver' "$TMP/nodriver.out" ||
  fail "a device node without a driver must fail (got $RC): $(cat "$TMP/nodriver.out")"

GPU_CHECK_ONLY="train-ref train-elastic" GPU_CHECK_TRAIN=/bin/false SKIP_BUILD=1 \
  BUILD_DIR="$BUILD" GPU_CHECK_LOGS="$TMP/logs-dry" bash "$ROOT/scripts/gpu-check.sh" --cpu-dry \
  >"$TMP/dry.out" 2>&1
RC=$?
summary=$(sed -n '/gpu-check summary/,$p' "$TMP/dry.out")
[ $RC -ne 0 ] && echo "$summary" | grep -q '^train-ref .*FAILED' &&
  echo "$summary" | grep -q '^train-elastic .*NOT-RUN .*train-ref failed' &&
  echo "$summary" | grep -q 'gpu-check: FAILED' ||
  fail "train-ref failing must leave train-elastic NOT-RUN in the summary (got $RC): $(cat "$TMP/dry.out")"
# 8. the budget cuts a step cleanly
printf '#!/bin/sh\nwhile :; do sleep 1; done\n' >"$TMP/endless-train"
chmod +x "$TMP/endless-train"
GPU_CHECK_ONLY="train-ref train-elastic" GPU_CHECK_TRAIN="$TMP/endless-train" SKIP_BUILD=1 \
  GPU_CHECK_BUDGET=25 BUILD_DIR="$BUILD" bash "$ROOT/scripts/gpu-check.sh" --cpu-dry \
  --out "$TMP/logs-budget" >"$TMP/budget.out" 2>&1
RC=$?
sleep 2
left=$(pgrep -f "$TMP/endless-train" | wc -l)
[ $RC -ne 0 ] && grep -q '^train-ref .*TIMEOUT(budget)' "$TMP/budget.out" &&
  grep -q '^train-elastic .*NOT-RUN .*train-ref failed' "$TMP/budget.out" &&
  [ "$(tail -1 "$TMP/budget.out")" = "gpu-check: FAILED" ] &&
  grep -q '^train-ref .*TIMEOUT(budget)' "$TMP/logs-budget/summary.txt" && [ "$left" -eq 0 ] ||
  fail "a step the budget cuts: want TIMEOUT(budget), the next NOT-RUN, the summary last and nothing left running ($left left; got $RC): $(cat "$TMP/budget.out")"
for p in $(pgrep -f "$TMP/endless-train"); do kill -KILL "$p" 2>/dev/null; done

PY=${TIDE_PYTHON:-/usr/bin/python3}
TORCH_GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)
if [ -z "$TORCH_GPUS" ]; then
  echo "test_gpu_check: no torch for $PY: python-gpu cases 6-7 not run"
elif [ "$TORCH_GPUS" != 0 ]; then
  echo "test_gpu_check: PyTorch sees a GPU here: python-gpu cases 6-7 not run"
else
  printf '#!/bin/sh\necho "Fake GPU 9000"\n' >"$TMP/fake-smi"
  chmod +x "$TMP/fake-smi"
  # python_only CASE SMI DEVICES: gpu-check with only python-gpu after gpu-info and build
  python_only() {
    TIDE_PYTHON="$PY" GPU_CHECK_ONLY=python-gpu GPU_CHECK_SMI="$2" GPU_CHECK_DEVICES="$3" \
      GPU_CHECK_LIBCUDA="$TMP/libcuda-0.so.1" SKIP_BUILD=1 BUILD_DIR="$BUILD" \
      GPU_CHECK_LOGS="$TMP/logs-$1" bash "$ROOT/scripts/gpu-check.sh" >"$TMP/$1.out" 2>&1
    RC=$?
  }
  python_only pynodev "$TMP/fake-smi" "$TMP/none/nvidia[0-9]*"
  [ $RC -ne 0 ] && grep -q '^python-gpu .*FAILED' "$TMP/pynodev.out" &&
    grep -q 'a GPU is present (gpu-info) but the python GPU test skipped: SKIP: .*no CUDA device' "$TMP/pynodev.out" ||
    fail "python-gpu skipping on a machine with a GPU must fail the check (got $RC): $(cat "$TMP/pynodev.out")"
  python_only pynode "$TMP/no-nvidia-smi" "$TMP/dev/nvidia[0-9]*"
  if [ -z "$TORCH_CUDA" ]; then
    [ $RC -eq 0 ] && grep -q '^python-gpu .*skipped .*not run: .*built without CUDA' "$TMP/pynode.out" &&
      grep -q 'gpu-check: all passed' "$TMP/pynode.out" ||
      fail "a PyTorch without CUDA must leave python-gpu skipped with the reason (got $RC): $(cat "$TMP/pynode.out")"
  else
    [ $RC -ne 0 ] && grep -q 'PyTorch cannot use it' "$TMP/pynode.out" ||
      fail "a CUDA PyTorch that sees no device on a machine with one must fail (got $RC): $(cat "$TMP/pynode.out")"
  fi
fi
echo "test_gpu_check: passed"
