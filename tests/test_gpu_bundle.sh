#!/usr/bin/env bash
# test_gpu_bundle: a bundle of scripts/gpu-bundle.sh runs scripts/gpu-check.sh with none of
# tide's dependencies installed, as on the GPU machine.
#   make: a fresh bundle is made (its build tree is reused between runs: only the copy is
#      fresh); it is under 48 MiB and carries neither NCCL nor the CUDA runtime nor cuBLAS,
#      but names them in cuda-libs (ctest: gpu_bundle_make, a fixture, so that the build
#      runs beside other tests).
#   check, each in a private mount namespace where the system's Open MPI (libraries,
#   components, help files, config, mpirun/orted/ompi_info), PMIx, ZeroMQ, msgpack-c,
#   SQLite, Criterion, pkg-config and every other library the bundle carries in lib/ are
#   hidden (an empty file bound over each file, an empty tmpfs over each folder):
#   2. gpu-check.sh --cpu-dry --bundle: every step passes, the python step included
#      (--python /usr/bin/python3, which has PyTorch and mpi4py: they load the bundle's
#      Open MPI and ZeroMQ);
#   3. the same, only python-gpu, with no --python and a python3 first on PATH that has no
#      PyTorch: the step is "skipped" with the reason, and the check passes;
#   4. NCCL hidden too: the bundle step fails naming libnccl.so.2 and where it looked (the
#      Python's wheels, the CUDA toolkit), and no later step runs;
#   5. NCCL hidden but present as the nvidia-nccl-cu13 wheel lays it out in the Python's
#      site-packages (nvidia/nccl/lib): found there, and the bundle step passes.
# check needs root for the mount namespace (skips, 77, without one).
# Usage: test_gpu_bundle.sh make|check WORK_DIR (build tree WORK_DIR/build, bundle
# WORK_DIR/bundle)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-}"
WORK="${2:-}"
[ -n "$WORK" ] && { [ "$MODE" = make ] || [ "$MODE" = check ]; } ||
  { echo "usage: test_gpu_bundle.sh make|check WORK_DIR"; exit 2; }
fail() {
  echo "FAILED: $*"
  exit 1
}
mkdir -p "$WORK"
TMP=$(mktemp -d /tmp/tide-gpu-bundle-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export TIDE_TEST_EMPTY="$TMP/empty"
: >"$TIDE_TEST_EMPTY"
chmod 600 "$TIDE_TEST_EMPTY"
B="$WORK/bundle"

if [ "$MODE" = make ]; then
  t0=$(date +%s)
  bash "$ROOT/scripts/gpu-bundle.sh" --out "$B" --build-dir "$WORK/build" --jobs "${JOBS:-2}" \
    >"$TMP/bundle.out" 2>&1 || fail "gpu-bundle.sh: $(tail -20 "$TMP/bundle.out")"
  kib=$(du -sk "$B" | cut -f1)
  [ "$kib" -lt $((48 * 1024)) ] || fail "the bundle is $((kib / 1024)) MiB, not under 48 MiB"
  grep -qx 'libnccl.so.2' "$B/cuda-libs" && grep -qx 'libcudart.so.13' "$B/cuda-libs" ||
    fail "cuda-libs does not name NCCL and the CUDA runtime: $(cat "$B/cuda-libs")"
  grep -qx 'libcublas.so.13' "$B/cuda-libs" ||
    fail "cuda-libs does not name cuBLAS, which train_mlp opens at its first GPU gemm: $(cat "$B/cuda-libs")"
  for l in libnccl libcudart libcublas; do
    [ -z "$(find "$B" -name "$l.so*")" ] || fail "the bundle carries $l, which the GPU machine has"
  done
  echo "bundle: $((kib / 1024)) MiB in $(($(date +%s) - t0))s"
  echo "test_gpu_bundle(make): passed"
  exit 0
fi

[ -f "$B/MANIFEST" ] || fail "no bundle in $B: run test_gpu_bundle.sh make first (gpu_bundle_make)"
if ! unshare -m true 2>/dev/null; then
  echo "SKIP: no private mount namespace here (needs root)"
  exit 77
fi

# hide.sh: run inside the namespace; hides the system's copies of the bundle's libraries
# and of tide's dependencies, checks that they are gone, then runs "$@".
cat >"$TMP/hide.sh" <<'EOF'
set -u
B=$1
shift
empty=$TIDE_TEST_EMPTY # an empty file of mode 0600: neither a library nor a program
hide_file() { [ -e "$1" ] && mount --bind "$empty" "$1"; }
hide_dir() { [ -d "$1" ] && mount -t tmpfs tide-hidden "$1"; }
A=/usr/lib/x86_64-linux-gnu
for d in $A/openmpi $A/pmix2 /usr/share/openmpi /etc/openmpi /usr/include/criterion \
  /usr/include/msgpack $A/pkgconfig /usr/share/pkgconfig /usr/lib/pkgconfig \
  $A/openmpi/include /usr/include/x86_64-linux-gnu/openmpi; do
  hide_dir "$d"
done
# every library the bundle carries, and Criterion's, under all their names
for so in "$B"/lib/*.so* libcriterion.so.3; do
  base=$(basename "$so")
  for f in $A/"${base%%.so*}".so*; do hide_file "$(readlink -f "$f")"; done
done
for f in /usr/include/zmq.h /usr/include/zmq_utils.h /usr/include/msgpack.h /usr/include/sqlite3.h \
  /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info /usr/bin/mpicc \
  /usr/bin/pkg-config /usr/bin/pkgconf /usr/bin/x86_64-linux-gnu-pkg-config; do
  hide_file "$(readlink -f "$f")"
done
for h in "${TIDE_TEST_HIDE_ALSO[@]}"; do hide_file "$(readlink -f "$h")"; done
# the proof that they are gone
for so in libmpi.so.40 libzmq.so.5 libmsgpackc.so.2 libsqlite3.so.0 libopen-pal.so.40; do
  [ -s "$A/$so" ] && { echo "FAILED: $A/$so still visible"; exit 1; }
done
if pkg-config --version >/dev/null 2>&1 || mpirun --version >/dev/null 2>&1; then
  echo "FAILED: pkg-config or mpirun still runs"
  exit 1
fi
exec "$@"
EOF

# in_ns LOG ARGS...: gpu-check.sh from the bundle inside a namespace with the above hidden
# (HIDE: more files to hide, space-separated); its status in RC, its output in LOG
in_ns() {
  local log=$1
  shift
  # shellcheck disable=SC2016
  unshare -m bash -c 'IFS=" " read -r -a TIDE_TEST_HIDE_ALSO <<<"${HIDE:-}"; . "$0" "$@"' \
    "$TMP/hide.sh" "$B" bash "$B/src/scripts/gpu-check.sh" "$@" >"$log" 2>&1
  RC=$?
}
summary() { sed -n '/gpu-check summary/,$p' "$1"; }

# 2. every step, from the bundle alone
in_ns "$TMP/all.out" --cpu-dry --bundle "$B" --out "$TMP/logs-all" --python /usr/bin/python3
s=$(summary "$TMP/all.out")
[ $RC -eq 0 ] && grep -q 'gpu-check: all passed' <<<"$s" ||
  fail "gpu-check --cpu-dry --bundle in the namespace (got $RC): $(tail -60 "$TMP/all.out")"
for st in gpu-info bundle gpu-tests python-gpu conf-np2 kill-rank train-ref train-elastic \
  train-rollback train-recover reshard-bench resize-bench; do
  grep -q "^$st  *ok " <<<"$s" || fail "step $st is not ok: $s"
done
grep -q "found libnccl.so.2: " "$TMP/logs-all/bundle-env.log" ||
  fail "the bundle step did not report NCCL: $(cat "$TMP/logs-all/bundle-env.log")"
echo "all steps: ok"

# 3. python-gpu with a python3 on PATH that has no PyTorch (site-packages off)
mkdir -p "$TMP/py"
printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' >"$TMP/py/python3"
chmod +x "$TMP/py/python3"
PATH="$TMP/py:$PATH" GPU_CHECK_ONLY=python-gpu TIDE_PYTHON='' \
  in_ns "$TMP/nopy.out" --cpu-dry --bundle "$B" --out "$TMP/logs-nopy"
[ $RC -eq 0 ] &&
  grep -q "^python-gpu  *skipped .*not run: no PyTorch for $TMP/py/python3: .*No module named 'torch'" \
    "$TMP/nopy.out" || fail "a python3 without torch: want python-gpu skipped with the reason (got $RC): $(cat "$TMP/nopy.out")"
echo "python3 without torch: skipped with the reason"

# 4. NCCL missing on the machine
NCCL=$(readlink -f "$(grep -o '/[^ ]*libnccl.so.2' "$TMP/logs-all/bundle-env.log" | head -1)")
[ -s "$NCCL" ] || fail "no NCCL found in the first run to hide"
HIDE="$NCCL" GPU_CHECK_ONLY=gpu-tests in_ns "$TMP/nonccl.out" --cpu-dry --bundle "$B" \
  --out "$TMP/logs-nonccl" --python "$TMP/py/python3"
[ $RC -ne 0 ] && grep -q '^bundle  *FAILED' "$TMP/nonccl.out" &&
  grep -q 'missing on this machine: libnccl.so.2; looked in:' "$TMP/nonccl.out" &&
  grep -q "the wheels of $TMP/py/python3: .*/nvidia/\*/lib" "$TMP/nonccl.out" &&
  grep -q 'the CUDA toolkit: /usr/local/cuda/lib64' "$TMP/nonccl.out" &&
  grep -q '^gpu-tests  *NOT-RUN .*the bundle step failed' "$TMP/nonccl.out" ||
  fail "NCCL missing: want the bundle step failing with where it looked (got $RC): $(cat "$TMP/nonccl.out")"
echo "NCCL missing: named, with where it was looked for"

# 5. NCCL as its wheel lays it out, in the site-packages of the python the check uses
site="$TMP/site-packages"
mkdir -p "$site/nvidia/nccl/lib"
: >"$site/nvidia/nccl/lib/libnccl.so.2"
printf '#!/bin/sh\necho %s\n' "$site" >"$TMP/py/fakepython"
chmod +x "$TMP/py/fakepython"
# shellcheck disable=SC2016
HIDE="$NCCL" GPU_CHECK_ONLY=none unshare -m bash -c \
  'mount --bind "$1" "$2" && shift 2 && IFS=" " read -r -a TIDE_TEST_HIDE_ALSO <<<"$HIDE" && . "$@"' \
  bash "$NCCL" "$site/nvidia/nccl/lib/libnccl.so.2" "$TMP/hide.sh" "$B" bash \
  "$B/src/scripts/gpu-check.sh" --cpu-dry --bundle "$B" --out "$TMP/logs-wheel" \
  --python "$TMP/py/fakepython" >"$TMP/wheel.out" 2>&1
RC=$?
[ $RC -eq 0 ] && grep -q '^bundle  *ok' "$TMP/wheel.out" &&
  grep -q "found libnccl.so.2: $site/nvidia/nccl/lib/libnccl.so.2" "$TMP/logs-wheel/bundle-env.log" ||
  fail "NCCL in the python's wheel: want it found there (got $RC): $(cat "$TMP/wheel.out" "$TMP/logs-wheel/bundle-env.log")"
echo "NCCL from the wheel: found"
echo "test_gpu_bundle(check): passed"
