#!/usr/bin/env bash
# gpu-check: the one command that proves tide's GPU path on a machine with ONE NVIDIA GPU.
#
#   bash scripts/gpu-check.sh [--cpu-dry | --info] [--bundle DIR] [--out LOGS] [--python PY]
#
#   (none)          build BUILD_DIR (default build-gpu) with CUDA and NCCL, then every step
#   --bundle DIR    run every step from a bundle made by scripts/gpu-bundle.sh, on a
#                   machine that has the NVIDIA driver, CUDA (or PyTorch's CUDA wheels)
#                   and a Python, and nothing of tide's other dependencies: no build; DIR's
#                   env.sh relocates its Open MPI and finds the CUDA runtime, cuBLAS and
#                   NCCL there (the "bundle" step fails naming what it looked for and
#                   where when one is missing)
#   --cpu-dry       the same steps on cpu/mpi (CI runs this, with and without --bundle)
#   --info          gpu-info only: is there a GPU CUDA can use?
#   --out LOGS      every step's full log, the summary and the rank wrapper go there; it
#                   is emptied first, so one gpu-check did not make must be empty (default:
#                   GPU_CHECK_LOGS, else BUILD_DIR/gpu-check-logs, dry: gpu-check-dry-logs;
#                   with --bundle: ./gpu-check-logs)
#   --python PY     the interpreter of the python-gpu step (default: TIDE_PYTHON, else the
#                   python3 on PATH, which on the GPU machine is the one with PyTorch)
#
# NCCL refuses two ranks on one device of one host, but accepts them when each rank has
# its own NCCL_HOSTID: every rank is then a host of its own and NCCL carries their
# traffic over its socket transport on loopback. Every multi-rank step below starts its
# ranks through a wrapper that sets NCCL_HOSTID=gpu-check-<rank> and TIDE_DEVICE=0.
#
# Time: the GPU machine is lent 15 minutes a call, its start included, so the whole check
# fits 8 (GPU_CHECK_BUDGET, default 450 s; --cpu-dry: 300). Sizes and rank counts are for
# ranks sharing one GPU over loopback sockets: 40 steps of a small model, the conformance
# suite on 2 ranks, benchmarks at one size and one repetition. Each step has a cap of its
# own (below; STEP_TIMEOUT overrides them all) and never more than the budget has left
# less 5 s for the summary; a step that would start with under 10 s left is NOT RUN
# (budget), and one the budget cuts is killed with everything it started (timeout
# signals its process group) and reported TIMEOUT(budget): the later steps still get
# their line, and the summary table comes last, also in LOGS/summary.txt. Exit 1 when
# any step failed, timed out or did not run.
#
# Steps (cap in s on the GPU):
#   gpu-info        a device must answer; a present but broken driver is a failure
#   build           configure with CUDA/NCCL (fails when NCCL is not found) and build;
#   bundle          with --bundle instead: what it was built from, the CUDA libraries found
#                   here, and every carried program's libraries resolved
#   gpu-tests (90)  ctest -L gpu -LE python (single-process GPU tests; a skip is a failure
#                   here), run from a folder of its own so that a ctest running this script
#                   keeps its own Testing/ logs; from a bundle, its gpu-tests.cmake.in
#   python-gpu (120) the Python binding's GPU path under pytest (tests/python/test_device.py
#                   and test_train_torch.py's device test: the ctests test_python_gpu*):
#                   rt.device, CUDA tensors of another device or index
#                   refused, collectives and a reshard on CUDA tensors, and
#                   examples/train_torch.py --device cuda on 2 ranks resized live (dp2,pp1)
#                   -> (dp1,pp2) -> (dp2,pp1), state and losses against its never-resized
#                   run. A Python without PyTorch, with a PyTorch built without CUDA, or
#                   without a working mpi4py is "skipped" with that reason (a missing
#                   dependency); any other skip on a machine with a GPU (no device seen,
#                   no nccl backend) is a failure
#   conf-np2 (60)   the collectives conformance suite on the nccl backend, 2 ranks (abort
#                   while a peer never arrives, cancelled creation included);
#                   GPU_CHECK_CONF_NPS="2 4" adds 4 ranks
#   kill-rank (60)  a rank SIGKILLed inside an allreduce: survivors get ABORTED (from NCCL
#                   itself or the watchdog), rebuild without it and reduce exactly
#   train-ref (60)  never-resized runs: train_mlp --device cuda on 4 ranks, and on cpu
#   train-elastic (90) tided + train_mlp --tide --device cuda on 4 ranks, resized live
#                   (dp2,tp2,pp1) -> (dp1,tp2,pp2) -> (dp2,tp1,pp2) -> (dp4,tp1,pp1):
#                   dp, tp and pp each change; losses compared per step with both refs
#   train-rollback (60) (dp1,tp2) on 2 ranks saving a checkpoint every 5 steps; a rank is
#                   SIGKILLed after a checkpoint was reported: no survivor holds its tp
#                   shard, so tided rolls the job back to the checkpoint (rolled_back)
#                   and the survivor loads it into device memory and trains every step
#   train-recover (60) the same job as train-elastic on (dp2,tp2); a rank is SIGKILLed;
#                   tided recovers it on the nccl backend and training completes every step
#   reshard-bench (60) reshard_bench --backend nccl on 8 ranks, 64 MiB of state, one
#                   repetition: the reshard executor on device memory against plain
#                   ncclSend/ncclRecv of the same bytes between the same rank pairs (ratios
#                   in the table, numbers in the logs' JSON)
#   resize-bench (60) resize_bench on CUDA (live resize vs checkpoint-restart) on a ~25 MiB
#                   model, one run: the ratio, not the size, is checked here
#
# A step that cannot run because one it needs failed (train-elastic compares with
# train-ref's losses; every step needs the build or the bundle) is in the summary as
# NOT-RUN, a failure. GPU_CHECK_ONLY="step ..." runs only those steps after gpu-info and
# build. gpu-info asks nvidia-smi when there is one, else, where a device node exists, the
# CUDA driver itself (scripts/cuda_query.c; a container may have /dev/nvidia* and libcuda
# without nvidia-smi). Overrides for tests: GPU_CHECK_SMI (nvidia-smi), GPU_CHECK_DEVICES
# (the device node glob, python-gpu's too), GPU_CHECK_LIBCUDA (libcuda.so.1),
# GPU_CHECK_TRAIN (train_mlp).
#
# --cpu-dry runs every step, through the same functions, rank wrapper, command lines and
# comparisons, with --device cpu, the mpi backend and small sizes (SKIP_BUILD=1 reuses
# BUILD_DIR as it is): gpu-info only says so, gpu-tests runs ctest -L gpu and accepts
# skips (no GPU), python-gpu runs the binding's device checks and train_torch on cpu,
# reshard-bench runs on mpi against plain MPI, resize-bench on a tiny model. The ctests
# gpu_check_cpu_dry and gpu_bundle (tests/test_gpu_bundle.sh: a fresh bundle, the
# system's Open MPI, ZeroMQ, msgpack-c, SQLite, Criterion and pkg-config hidden) run it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() {
  echo "usage: gpu-check.sh [--cpu-dry | --info] [--bundle DIR] [--out LOGS] [--python PY]" >&2
  exit 2
}
DRY=0 INFO=0 BUNDLE="" OUT_ARG="" PY_ARG=""
while [ $# -gt 0 ]; do
  case "$1" in
  --cpu-dry) DRY=1 ;;
  --info) INFO=1 ;;
  --bundle | --out | --python)
    [ $# -ge 2 ] || usage
    case "$1" in --bundle) BUNDLE=$2 ;; --out) OUT_ARG=$2 ;; --python) PY_ARG=$2 ;; esac
    shift
    ;;
  *) usage ;;
  esac
  shift
done
if [ -n "$BUNDLE" ]; then
  [ -f "$BUNDLE/MANIFEST" ] && [ -f "$BUNDLE/env.sh" ] ||
    { echo "gpu-check: $BUNDLE is not a bundle of scripts/gpu-bundle.sh (no MANIFEST, env.sh)" >&2; exit 2; }
  BUNDLE="$(cd "$BUNDLE" && pwd)"
  ROOT="$BUNDLE/src"
  BUILD_DIR="$BUNDLE/build"
  SKIP_BUILD=1
fi
START=$(date +%s)
if [ $DRY -eq 1 ]; then
  BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
  LOGS="${GPU_CHECK_LOGS:-$BUILD_DIR/gpu-check-dry-logs}"
  DEVICE=cpu BACKEND=mpi STEPS="${GPU_CHECK_STEPS:-60}" REF_TOL=1e-5 CPU_TOL=1e-5
  PACE=100 CONF_NPS="${GPU_CHECK_CONF_NPS:-2}" # ctest runs the suite at 2, 4 and 8 ranks anyway
  BUDGET="${GPU_CHECK_BUDGET:-300}"
  RB_ARGS="--min-mib 4 --max-mib 4 --reps 1" # MiB of state, one size
else
  BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
  LOGS="${GPU_CHECK_LOGS:-$BUILD_DIR/gpu-check-logs}"
  # cuBLAS/cuDNN-free kernels, but reduction order differs from the CPU's: looser there
  DEVICE=cuda BACKEND=nccl STEPS="${GPU_CHECK_STEPS:-40}" REF_TOL=1e-4 CPU_TOL=1e-3
  PACE=60 CONF_NPS="${GPU_CHECK_CONF_NPS:-2}"
  BUDGET="${GPU_CHECK_BUDGET:-450}"
  RB_ARGS="--min-mib 64 --max-mib 64 --reps 1"
fi
[ -n "$BUNDLE" ] && [ -z "${GPU_CHECK_LOGS:-}" ] && LOGS="$PWD/gpu-check-logs"
[ -n "$OUT_ARG" ] && LOGS="$OUT_ARG"
DEADLINE=$((START + BUDGET))
JOBS="${JOBS:-$(nproc)}"
RESERVE=5 MIN_STEP=10 # s: kept for the summary; the least a step is started with
# the log folder is emptied first: one given with --out only if this script made it (its
# marker) or it is empty
if [ -n "$OUT_ARG" ] && [ -d "$LOGS" ] && [ -n "$(ls -A "$LOGS")" ] &&
  [ ! -f "$LOGS/.gpu-check-logs" ]; then
  echo "gpu-check: $LOGS holds files gpu-check did not write: give a new or empty folder" >&2
  exit 2
fi
rm -rf "$LOGS"
mkdir -p "$LOGS" || { echo "gpu-check: cannot make the log folder $LOGS" >&2; exit 2; }
: >"$LOGS/.gpu-check-logs"
LOGS="$(cd "$LOGS" && pwd)"

# The python-gpu step's interpreter: it runs pytest with TIDE_PYTHON
PY="${PY_ARG:-${TIDE_PYTHON:-$(command -v python3 2>/dev/null)}}"
export TIDE_PYTHON="$PY"

# A bundle's environment, set here so that every step inherits it; the bundle step
# reports it (and fails when a CUDA library is missing)
BUNDLE_ENV_OK=1
if [ -n "$BUNDLE" ]; then
  # shellcheck source=gpu-bundle-env.sh
  . "$BUNDLE/env.sh"
  tide_bundle_env "$LOGS" >"$LOGS/bundle-env.log" 2>&1 || BUNDLE_ENV_OK=0
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader,tcp}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
MPIRUN="mpirun --oversubscribe --bind-to none"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
RECOVER_FLAGS="--enable-recovery --mca async_mpi_finalize 1"

# Every rank of a multi-rank step starts through this wrapper: its own NCCL "host" and
# the one GPU. The same on cpu (the variables are then unused).
WRAP="$LOGS/rank-wrapper"
cat >"$WRAP" <<'EOF'
#!/usr/bin/env bash
export NCCL_HOSTID="gpu-check-${OMPI_COMM_WORLD_RANK:-0}" TIDE_DEVICE=0
exec "$@"
EOF
chmod +x "$WRAP"

MODEL=(--layers 4 --hidden 64 --ffn 256 --vocab 64 --seq 16 --global-batch 32
       --micro-batches 4 --lr 0.003 --seed 1234)
# the dry run in CI: the same shapes of work on a smaller model (2 shared cores)
[ $DRY -eq 1 ] && MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16
  --micro-batches 4 --lr 0.003 --seed 1234)
TRAIN="${GPU_CHECK_TRAIN:-$BUILD_DIR/examples/train_mlp}"
TIDED="$BUILD_DIR/coordinator/tided"
TIDECTL="$BUILD_DIR/coordinator/tidectl"

STEPS_DONE=()
FAILED=0

# cap NAME: the step's own limit, s (STEP_TIMEOUT overrides every one); see the top
cap() {
  if [ -n "${STEP_TIMEOUT:-}" ]; then echo "$STEP_TIMEOUT"; return; fi
  # the dry run shares 2 loaded cores in CI: only its budget bounds it
  if [ "$DRY" = 1 ]; then echo 240; return; fi
  case "$1" in
  gpu-info | bundle) echo 30 ;;
  build) echo 400 ;;
  gpu-tests | train-elastic) echo 90 ;;
  python-gpu) echo 120 ;;
  *) echo 60 ;;
  esac
}

# row NAME STATUS SECONDS RESULT: a line of the summary table
row() {
  STEPS_DONE+=("$(printf '%-14s %-18s %5ss  %s' "$1" "$2" "$3" "$4")")
}

# step NAME FUNCTION: runs the function in a child bash under the step's cap, never past
# the budget's deadline less RESERVE; logs to $LOGS/NAME.log and records the result.
# timeout runs it in a process group of its own and signals the whole group, so a step
# cut short leaves nothing of its own running. A step that would start with less than
# MIN_STEP seconds of the budget left is NOT RUN (a failure).
step() {
  local name="$1" fn="$2" t0 rc status dt limit left
  t0=$(date +%s)
  printf '== %-14s ' "$name"
  left=$((DEADLINE - RESERVE - t0))
  if [ "$left" -lt "$MIN_STEP" ]; then
    echo "NOT RUN (budget of ${BUDGET}s spent)"
    FAILED=1
    row "$name" "NOT-RUN(budget)" 0 "the ${BUDGET}s budget was spent before this step"
    return 1
  fi
  limit=$(cap "$name")
  [ "$left" -lt "$limit" ] && limit=$left
  timeout --kill-after=5 "$limit" bash -c "$fn" >"$LOGS/$name.log" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    status=ok
  elif [ $rc -eq 77 ]; then
    status=skipped
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="TIMEOUT(${limit}s)"
    [ "$limit" -lt "$(cap "$name")" ] && status="TIMEOUT(budget)"
    echo "gpu-check: $name cut after ${limit}s ($status)" >>"$LOGS/$name.log"
  else
    status="FAILED(rc=$rc)"
  fi
  echo "$status (${dt}s)"
  if [ "$status" != ok ] && [ "$status" != skipped ]; then
    FAILED=1
    tail -n 25 "$LOGS/$name.log" | sed 's/^/   | /'
  fi
  row "$name" "$status" "$dt" "$(grep -h '^RESULT: ' "$LOGS/$name.log" | tail -1 | cut -c9-)"
  return $rc
}

# want NAME: whether GPU_CHECK_ONLY (empty: every step) selects step NAME
want() {
  [ -z "${GPU_CHECK_ONLY:-}" ] || [[ " $GPU_CHECK_ONLY " == *" $1 "* ]]
}

# not_run NAME WHY: a selected step that cannot run (one it needs failed): in the
# summary as NOT-RUN, and the check fails
not_run() {
  want "$1" || return 0
  printf '== %-14s NOT RUN (%s)\n' "$1" "$2"
  FAILED=1
  row "$1" "NOT-RUN" 0 "$2"
}

# run NAME FUNCTION: step, when selected
run() {
  want "$1" || return 0
  step "$1" "$2"
}

# ---- the steps (each runs in its own bash: exported below) -------------------------------

# cuda_query: the CUDA driver's own answer (cuInit, the devices, the first one's name), from
# scripts/cuda_query.c (a bundle carries it built; else built here with cc), which loads
# libcuda (GPU_CHECK_LIBCUDA) with dlopen: neither the CUDA toolkit nor nvidia-smi is
# needed. Fails when the driver is missing or cannot use a device.
cuda_query() {
  local exe="$BUILD_DIR/cuda_query"
  if [ ! -x "$exe" ]; then
    exe="$LOGS/cuda_query"
    "${CC:-cc}" -o "$exe" "$ROOT/scripts/cuda_query.c" -ldl ||
      { echo "no C compiler to ask the CUDA driver with"; return 1; }
  fi
  "$exe" "${GPU_CHECK_LIBCUDA:-libcuda.so.1}"
}

gpu_info() {
  if [ "$DRY" = 1 ]; then echo "RESULT: cpu dry run"; return 0; fi
  local smi="${GPU_CHECK_SMI:-nvidia-smi}" nodes name
  nodes=$(compgen -G "${GPU_CHECK_DEVICES:-/dev/nvidia[0-9]*}" | tr '\n' ' ')
  if ! command -v "$smi" >/dev/null 2>&1 && [ -z "$nodes" ]; then
    echo "no NVIDIA device on this machine"
    return 77
  fi
  if command -v "$smi" >/dev/null 2>&1; then
    # nvidia-smi exists: the driver must answer it
    "$smi" --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
      echo "an NVIDIA device is present but the driver does not answer"
      return 1
    }
    echo "RESULT: $("$smi" --query-gpu=name --format=csv,noheader | head -1)"
    return 0
  fi
  # device nodes without nvidia-smi (a container given the devices and libcuda only):
  # what matters is whether CUDA can use them, so the driver itself is asked
  name=$(cuda_query) || {
    echo "NVIDIA device nodes exist (${nodes% }) but the CUDA driver cannot use them"
    return 1
  }
  echo "RESULT: $name (no nvidia-smi: asked the CUDA driver)"
}

build() {
  if [ "${SKIP_BUILD:-0}" = 1 ]; then echo "RESULT: reused $BUILD_DIR"; return 0; fi
  [ -f "$ROOT/CMakeLists.txt" ] ||
    { echo "no sources to build at $ROOT (a bundle's copy? run it with --bundle DIR)"; return 1; }
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIDE_CUDA=ON \
    -DTIDE_SANITIZE=OFF || return 1
  grep -q '^TIDE_NCCL_LIBRARY:FILEPATH=.*nccl' "$BUILD_DIR/CMakeCache.txt" || {
    echo "NCCL was not found: the nccl backend is not built"
    return 1
  }
  cmake --build "$BUILD_DIR" -j "$JOBS" || return 1
}

# The bundle's step (--bundle, instead of build): what it was built from, the CUDA
# libraries env.sh found on this machine (or everything it looked in), then every carried
# program and library resolving what it loads: ldd's "not found" names a library that is
# neither carried nor found here. (Open MPI's components load what lib/ carries: the
# bundle was closed over them when it was made.)
bundle_check() {
  local missing
  cat "$BUNDLE/MANIFEST" "$LOGS/bundle-env.log"
  [ "$BUNDLE_ENV_OK" = 1 ] || return 1
  # shellcheck disable=SC2016
  missing=$(find "$BUNDLE/build" "$BUNDLE/lib" "$BUNDLE/ompi/bin" -type f \
    \( -perm -u+x -o -name '*.so*' \) -print0 | xargs -0 -n 8 -P 4 sh -c \
    'for f; do ldd "$f" 2>/dev/null | sed -n "s|^[[:space:]]*\([^ ]*\) => not found.*|\1 ($f)|p"; done' sh)
  [ -z "$missing" ] || { echo "not found by the loader:"; echo "$missing"; return 1; }
  echo "RESULT: $(sed -n 's/^commit: //p' "$BUNDLE/MANIFEST"), $(sed -n 's/^size: //p' \
    "$BUNDLE/MANIFEST"); NCCL $(sed -n 's/^found libnccl[^:]*: //p' "$LOGS/bundle-env.log")"
}

# have_nccl: whether the programs under BUILD_DIR have the nccl backend
have_nccl() {
  if [ -n "$BUNDLE" ]; then
    grep -q '^libnccl' "$BUNDLE/cuda-libs"
  else
    grep -q '^TIDE_NCCL_LIBRARY:FILEPATH=.*nccl' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null
  fi
}

# ctest -L gpu over BUILD_DIR's tests, from a folder of its own (its CTestTestfile names
# the build tree), so that its Testing/ logs are not those of a ctest running this script.
gpu_tests() {
  local dir="$LOGS/ctest-gpu" n skipped
  mkdir -p "$dir"
  command -v ctest >/dev/null || { echo "no ctest (CMake's) on PATH: the gpu tests need it"; return 1; }
  if [ -n "$BUNDLE" ]; then
    sed "s|@TIDE_BUNDLE@|$BUNDLE|g" "$BUILD_DIR/gpu-tests.cmake.in" >"$dir/CTestTestfile.cmake"
  else
    printf 'subdirs("%s")\n' "$BUILD_DIR" >"$dir/CTestTestfile.cmake"
  fi
  # the python GPU test is a step of its own (python-gpu); ctest's own line per test counts
  # (a test under mpirun prints its SKIP once per rank)
  (cd "$dir" && ctest -L gpu -LE python --output-on-failure --timeout 200) | tee "$dir/ctest.out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$dir/ctest.out")
  skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*Skipped' "$dir/ctest.out")
  if [ "$DRY" = 1 ]; then
    echo "RESULT: ${n:-0} gpu tests: $((${n:-0} - ${skipped:-0})) passed, ${skipped:-0} skipped (dry)"
    return 0
  fi
  [ "${n:-0}" -gt 0 ] || { echo "no gpu tests in $BUILD_DIR (built without CUDA?)"; return 1; }
  if [ "${skipped:-0}" -gt 0 ]; then
    echo "a GPU is present but a gpu test skipped itself"
    return 1
  fi
  echo "RESULT: $n gpu tests passed"
}

# python_missing: why the python-gpu step cannot run with TIDE_PYTHON, a dependency it
# lacks (no interpreter, no PyTorch, no mpi4py that loads, no pytest: printed, status 0);
# status 1 when none is missing. mpi4py is loaded without MPI_Init (rc.initialize off).
# A bundle carries pytest (src/pylib) for a Python that has none.
python_missing() {
  local py="$TIDE_PYTHON" err
  [ -n "$py" ] || { echo "no python3 on PATH (name one with --python or TIDE_PYTHON)"; return 0; }
  err=$("$py" -c 'import torch' 2>&1) || { echo "no PyTorch for $py: $(tail -1 <<<"$err")"; return 0; }
  err=$("$py" -c 'import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI' 2>&1) ||
    { echo "no mpi4py that loads for $py: $(tail -1 <<<"$err")"; return 0; }
  err=$("$py" -c 'import pytest' 2>&1) || { echo "no pytest for $py: $(tail -1 <<<"$err")"; return 0; }
  return 1
}

# The Python binding's GPU path on DEVICE (dry: cpu, the mpi backend) with TIDE_PYTHON: the
# ctests test_python_gpu and test_python_gpu_train (tests/python/test_device.py under
# mpirun, test_train_torch.py's device test). A skip is only acceptable for a missing
# dependency, reported with its reason: no PyTorch, mpi4py or pytest (python_missing), a
# PyTorch without CUDA, or, dry, any: gpu-info found a GPU, so any other is a failure.
python_gpu() {
  local out="$LOGS/python-gpu.out" rc rc2 nccl=0 why
  if [ -d "$ROOT/pylib" ] && ! "${TIDE_PYTHON:-false}" -c 'import pytest' >/dev/null 2>&1; then
    export PYTHONPATH="$ROOT/pylib${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if why=$(python_missing); then
    echo "python-gpu: $why"
    echo "RESULT: not run: $why"
    return 77
  fi
  have_nccl && nccl=1
  local args=(-m pytest -q -rs -p no:cacheprovider --color=no --rootdir="$ROOT/tests/python")
  export TIDE_BUILD_DIR="$BUILD_DIR" TIDE_TEST_MPIRUN="$MPIRUN" TIDE_TEST_DEVICE="$DEVICE" \
    TIDE_TEST_HAVE_NCCL=$nccl TIDE_TEST_NVIDIA_NODES="${GPU_CHECK_DEVICES:-/dev/nvidia[0-9]*}"
  # shellcheck disable=SC2086
  $MPIRUN -np 2 "$TIDE_PYTHON" "${args[@]}" "$ROOT/tests/python/test_device.py" >"$out" 2>&1
  rc=$?
  "$TIDE_PYTHON" "${args[@]}" "$ROOT/tests/python/test_train_torch.py::test_device_resize" \
    >>"$out" 2>&1
  rc2=$?
  cat "$out"
  [ "$rc" -eq 0 ] && rc=$rc2
  if [ "$rc" -eq 77 ]; then
    # pytest's "SKIPPED [1] file:line: reason" as "SKIP: reason"
    why=$(grep -m1 -o 'SKIPPED \[[0-9]*\] [^ ]*: .*' "$out" | sed 's/^SKIPPED \[[0-9]*\] [^ ]*: /SKIP: /')
    if [ "$DRY" = 1 ] || grep -q 'built without CUDA\|torch/mpi4py missing' "$out"; then
      echo "RESULT: not run: $(echo "$why" | cut -c1-100)"
      return 77
    fi
    echo "a GPU is present (gpu-info) but the python GPU test skipped: $why"
    return 1
  fi
  [ "$rc" -eq 0 ] || return 1
  echo "RESULT: python GPU path: $(grep -o '[0-9]* passed' "$out" | awk '{n += $1} END {print n}')" \
    "tests passed (test_device on each rank, train_torch resized)"
}

conformance() { # conformance NP
  local out="$LOGS/conf-$1.out"
  $MPIRUN -np "$1" "$WRAP" "$BUILD_DIR/tests/test_collectives_conformance" --backend "$BACKEND" \
    | tee "$out"
  [ "${PIPESTATUS[0]}" -eq 0 ] && grep -q 'conformance: all passed' "$out" || return 1
  echo "RESULT: $(grep -o 'all passed in .*' "$out")"
}

kill_rank() {
  local out="$LOGS/kill-rank.out"
  # shellcheck disable=SC2086
  $MPIRUN $RECOVER_FLAGS -np 4 "$WRAP" "$BUILD_DIR/tests/test_collectives_recovery" \
    --backend "$BACKEND" 2>&1 | tee "$out"
  grep -q 'recovery: passed' "$out" || return 1
  echo "RESULT: $(grep -c 'the backend saw the dead peer' "$out") of 3 survivors saw it in" \
    "$BACKEND itself"
}

# Never-resized references: the first elastic layout on DEVICE, and on cpu.
train_ref() {
  $MPIRUN -np 4 "$WRAP" "$TRAIN" --device "$DEVICE" --dp 2 --tp 2 --steps "$STEPS" \
    "${MODEL[@]}" --print-every 10 --loss-out "$LOGS/loss-ref.txt" || return 1
  if [ "$DEVICE" != cpu ]; then
    $MPIRUN -np 4 "$TRAIN" --device cpu --dp 2 --tp 2 --steps "$STEPS" "${MODEL[@]}" \
      --print-every 10 --loss-out "$LOGS/loss-cpu.txt" || return 1
  else
    cp "$LOGS/loss-ref.txt" "$LOGS/loss-cpu.txt"
  fi
  echo "RESULT: $(wc -l <"$LOGS/loss-ref.txt") steps"
}

# compare A B TOL: per step, relative loss difference; fails above TOL or on a missing step
compare() {
  awk -v tol="$3" -v steps="$STEPS" '
    FNR == NR { ref[$1] = $2; next }
    { got[$1] = $2 }
    END {
      for (s = 0; s < steps; s++) {
        if (!(s in ref) || !(s in got)) { printf "step %d missing\n", s; bad = 1; continue }
        d = ref[s] - got[s]; if (d < 0) d = -d
        r = d / (ref[s] > 0 ? ref[s] : 1); if (r > worst) worst = r
      }
      printf "%s vs %s: largest relative difference %.2e (limit %s)\n", ARGV[1], ARGV[2], worst, tol
      exit (bad || worst > tol)
    }' "$1" "$2"
}

# tided on a free port in dir $1 (extra flags after); sets EP and TIDED_PID
start_tided() {
  local dir="$1"
  shift
  "$TIDED" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$dir/endpoint" \
    --state "$dir/state.db" "$@" >"$dir/tided.log" 2>&1 &
  TIDED_PID=$!
  for _ in $(seq 200); do [ -s "$dir/endpoint" ] && break; sleep 0.05; done
  [ -s "$dir/endpoint" ] || { echo "tided did not start"; return 1; }
  EP="$(cat "$dir/endpoint")"
}

job_field() { # job_field JOB NAME: a numeric field of the job in `tidectl jobs --json`
  "$TIDECTL" --endpoint "$EP" jobs --json 2>/dev/null | grep -o "{\"name\":\"$1\"[^}]*}" |
    grep -o "\"$2\":[0-9]*" | head -1 | cut -d: -f2
}

wait_gen() { # wait_gen JOB GEN MORE_STEPS PID: until JOB runs GEN and did MORE_STEPS in it
  local start="" s
  for _ in $(seq 1500); do
    if [ "$(job_field "$1" gen)" = "$2" ]; then
      s=$(job_field "$1" step)
      [ -n "$s" ] || s=0
      [ -n "$start" ] || start=$s
      [ "$s" -ge $((start + $3)) ] && return 0
    fi
    kill -0 "$4" 2>/dev/null || { echo "training exited before generation $2 ran $3 steps"; return 1; }
    sleep 0.1
  done
  echo "job $1 did not reach generation $2"
  return 1
}

train_elastic() {
  local dir="$LOGS/elastic" pid rc
  mkdir -p "$dir"
  start_tided "$dir" || return 1
  trap 'kill $pid $TIDED_PID 2>/dev/null; wait 2>/dev/null' EXIT
  $MPIRUN -np 4 "$WRAP" "$TRAIN" --tide --endpoint "$EP" --job gpucheck --device "$DEVICE" \
    --dp 2 --tp 2 --pp 1 --steps "$STEPS" "${MODEL[@]}" --pace-ms "$PACE" --print-every 10 \
    --loss-out "$LOGS/loss-elastic.txt" >"$dir/train.log" 2>&1 &
  pid=$!
  local gen=1
  wait_gen gpucheck 1 3 $pid || return 1
  for l in "1 2 2 2" "2 1 2 2" "4 1 1 0"; do
    set -- $l # dp tp pp, then the steps to see in the generation before the next resize
    gen=$((gen + 1))
    "$TIDECTL" --endpoint "$EP" resize gpucheck --dp "$1" --tp "$2" --pp "$3" || return 1
    wait_gen gpucheck $gen "$4" $pid || { tail -20 "$dir/train.log"; return 1; }
    echo "generation $gen: (dp $1, tp $2, pp $3) running"
  done
  wait $pid
  rc=$?
  [ $rc -eq 0 ] || { tail -30 "$dir/train.log"; return 1; }
  compare "$LOGS/loss-ref.txt" "$LOGS/loss-elastic.txt" "$REF_TOL" || return 1
  compare "$LOGS/loss-cpu.txt" "$LOGS/loss-elastic.txt" "$CPU_TOL" || return 1
  echo "RESULT: 4 generations, loss within $REF_TOL of never-resized, $CPU_TOL of cpu"
}

children() { # children PID: the pids whose parent is PID (from /proc: no procps needed;
  local d st ppid # builtins only, no process per entry)
  for d in /proc/[0-9]*; do
    { read -r st <"$d/stat"; } 2>/dev/null || continue
    st=${st##*) } # "STATE PPID ..." after the command name, which may hold spaces
    ppid=${st#* }
    [ "${ppid%% *}" = "$1" ] && echo "${d#/proc/}"
  done
  return 0
}

kill_job_rank() { # kill_job_rank MPIRUN_PID RANK: SIGKILLs that rank, a child of mpirun (the
  local c victim=""        # wrapper execs train_mlp)
  for c in $(children "$1"); do
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && victim=$c
  done
  [ -n "$victim" ] || { echo "no rank $2 to kill"; return 1; }
  kill -KILL "$victim"
  echo "killed rank $2, pid $victim"
}

train_recover() {
  local dir="$LOGS/recover" pid
  mkdir -p "$dir"
  start_tided "$dir" --heartbeat-ms 100 --miss-limit 15 || return 1
  trap 'kill $pid $TIDED_PID 2>/dev/null; wait 2>/dev/null' EXIT
  # shellcheck disable=SC2086
  $MPIRUN $RECOVER_FLAGS -np 4 "$WRAP" "$TRAIN" --tide --endpoint "$EP" --job gpurecover \
    --device "$DEVICE" --dp 2 --tp 2 --steps "$STEPS" "${MODEL[@]}" --pace-ms "$PACE" \
    --print-every 10 --loss-out "$LOGS/loss-recover.txt" >"$dir/train.log" 2>&1 &
  pid=$!
  wait_gen gpurecover 1 5 $pid || return 1
  # rank 3; rank 0 writes the losses
  kill_job_rank "$pid" 3 || return 1
  wait_gen gpurecover 2 3 $pid || { tail -30 "$dir/train.log"; return 1; }
  wait $pid # mpirun reports the killed rank: its status is not the survivors'
  compare "$LOGS/loss-ref.txt" "$LOGS/loss-recover.txt" "$REF_TOL" || return 1
  echo "RESULT: recovered to generation 2, all $STEPS steps, loss within $REF_TOL"
}

train_rollback() {
  local dir="$LOGS/rollback" pid ev
  mkdir -p "$dir"
  start_tided "$dir" --heartbeat-ms 100 --miss-limit 15 || return 1
  trap 'kill $pid $TIDED_PID 2>/dev/null; wait 2>/dev/null' EXIT
  # shellcheck disable=SC2086
  $MPIRUN $RECOVER_FLAGS -np 2 "$WRAP" "$TRAIN" --tide --endpoint "$EP" --job gpurollback \
    --device "$DEVICE" --dp 1 --tp 2 --steps "$STEPS" "${MODEL[@]}" --pace-ms "$PACE" \
    --ckpt-save "$dir/ck" --ckpt-every 5 --print-every 10 \
    --loss-out "$LOGS/loss-rollback.txt" >"$dir/train.log" 2>&1 &
  pid=$!
  wait_gen gpurollback 1 12 $pid || return 1
  for _ in $(seq 200); do
    "$TIDECTL" --endpoint "$EP" events --json 2>/dev/null | grep -q '"kind":"checkpoint_saved"' &&
      break
    sleep 0.1
  done
  kill_job_rank "$pid" 1 || return 1
  wait_gen gpurollback 2 3 $pid || { tail -30 "$dir/train.log"; return 1; }
  wait $pid # mpirun reports the killed rank: its status is not the survivor's
  ev=$("$TIDECTL" --endpoint "$EP" events --json)
  grep -o '"kind":"rolled_back","detail":"[^"]*"' <<<"$ev" ||
    { echo "$ev"; echo "no rolled_back event"; return 1; }
  compare "$LOGS/loss-ref.txt" "$LOGS/loss-rollback.txt" "$REF_TOL" || return 1
  echo "RESULT: rolled back to a checkpoint on $DEVICE, all $STEPS steps, loss within $REF_TOL"
}

# reshard_bench on BACKEND: the executor against plain send/recv of the same bytes
# between the same rank pairs (nccl: ncclSend/ncclRecv; dry: MPI); 8 ranks, the (2,2,2)
# layout's. RESULT: the network-phase ratios (plain / executor) over the layout pairs.
reshard_bench() {
  local out="$LOGS/reshard_bench.json" ratios
  # shellcheck disable=SC2086
  $MPIRUN -np 8 "$WRAP" "$BUILD_DIR/benchmarks/reshard_bench" --backend "$BACKEND" $RB_ARGS \
    --out "$out" || return 1
  grep -q "\"backend\": \"$BACKEND\"" "$out" || { echo "no $BACKEND numbers in $out"; return 1; }
  # the largest state's rows: "pair ratio" (null: the plan sends nothing)
  ratios=$(grep '"pair"' "$out" |
    sed -E 's/.*"pair": "([^"]*)", "state_bytes": ([0-9]+).*"ratio_net": ([0-9.]+|null).*/\2|\1 \3/' |
    awk -F'|' '{ st[NR] = $1; row[NR] = $2; if ($1 + 0 > max) max = $1 + 0 }
      END { for (i = 1; i <= NR; i++) if (st[i] + 0 == max) { printf "%s%s", sep, row[i]; sep = ", " } }')
  [ -n "$ratios" ] || { echo "no ratios in $out"; return 1; }
  echo "RESULT: r_net, plain $BACKEND / executor: $ratios"
}

resize_bench() {
  # one GPU: ~25 MiB of parameters and Adam moments, one run (see the top of the file)
  local dev=cuda args=(--layers 4 --hidden 256 --ffn 1024 --vocab 256 --runs 1) pace=""
  # dry: a tiny model, paced so that the resize lands inside the live run
  [ "$DRY" = 1 ] && dev=cpu pace="--pace-ms 50" \
    args=(--layers 2 --hidden 64 --ffn 256 --vocab 64 --runs 1 --steps-after 20)
  cat >"$LOGS/train_mlp_1gpu" <<EOF
#!/usr/bin/env bash
export NCCL_HOSTID="gpu-check-\${OMPI_COMM_WORLD_RANK:-0}" TIDE_DEVICE=0
exec "$TRAIN" --device $dev $pace "\$@"
EOF
  chmod +x "$LOGS/train_mlp_1gpu"
  # tided and mpirun named: the paths compiled in are the build machine's
  "$BUILD_DIR/benchmarks/resize_bench" --tided "$TIDED" --mpirun "$(command -v mpirun)" \
    --train "$LOGS/train_mlp_1gpu" --np 4 --from 2,2,1 \
    --to 1,2,2 --work "$LOGS/resize_bench.d" --out "$LOGS/resize_bench.json" "${args[@]}" ||
    return 1
  echo "RESULT: $(grep -m1 '^downtime goal:' "$LOGS/resize-bench.log")" \
    "; $(grep -m1 '^memory goal:' "$LOGS/resize-bench.log")"
}

export ROOT DRY BUILD_DIR LOGS JOBS DEVICE BACKEND STEPS REF_TOL CPU_TOL PACE MPIRUN RECOVER_FLAGS \
  WRAP TRAIN TIDED TIDECTL RB_ARGS BUNDLE BUNDLE_ENV_OK
export -f cuda_query gpu_info build bundle_check have_nccl gpu_tests python_missing python_gpu \
  conformance kill_rank train_ref compare start_tided job_field wait_gen children kill_job_rank \
  train_elastic train_recover train_rollback reshard_bench resize_bench
# arrays do not export: the functions rebuild MODEL from this string
MODEL_STR="${MODEL[*]}"
export MODEL_STR
pre='MODEL=($MODEL_STR); '

echo "gpu-check: $([ $DRY = 1 ] && echo 'cpu dry run (mpi backend, --device cpu)' ||
  echo "one GPU, nccl backend")${BUNDLE:+, from the bundle $BUNDLE}; python: ${TIDE_PYTHON:-none}"
step gpu-info "${pre}gpu_info"
HAVE=$?
if [ $HAVE -eq 77 ]; then
  echo "gpu-check: no GPU on this machine: nothing checked"
  exit 0
fi
CONF_STEPS=""
for n in $CONF_NPS; do CONF_STEPS="$CONF_STEPS conf-np$n"; done
PREP=build PREP_FN=build
[ -n "$BUNDLE" ] && PREP=bundle PREP_FN=bundle_check
if [ $INFO -eq 1 ]; then
  : # gpu-info only
elif ! step "$PREP" "${pre}$PREP_FN"; then
  for s in gpu-tests python-gpu $CONF_STEPS kill-rank train-ref train-elastic train-recover \
    train-rollback reshard-bench resize-bench; do
    not_run "$s" "the $PREP step failed"
  done
else
  run gpu-tests "${pre}gpu_tests"
  run python-gpu "${pre}python_gpu"
  for n in $CONF_NPS; do run "conf-np$n" "${pre}conformance $n"; done
  run kill-rank "${pre}kill_rank"
  # train-elastic compares its losses with train-ref's: it needs them from this run
  if want train-ref && step train-ref "${pre}train_ref"; then
    run train-elastic "${pre}train_elastic"
    run train-rollback "${pre}train_rollback"
  else
    not_run train-elastic "train-ref failed or did not run: no reference losses"
    not_run train-rollback "train-ref failed or did not run: no reference losses"
  fi
  run train-recover "${pre}train_recover"
  run reshard-bench "${pre}reshard_bench"
  run resize-bench "${pre}resize_bench"
fi

# The summary comes last (and in LOGS/summary.txt): the line a truncated output keeps
TOTAL=$(($(date +%s) - START))
[ "$TOTAL" -gt "$BUDGET" ] && FAILED=1
{
  echo
  echo "---- gpu-check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ)) ----"
  echo "logs: $LOGS"
  printf '%-14s %-18s %6s  %s\n' step status time result
  for s in "${STEPS_DONE[@]}"; do echo "$s"; done
  echo "total: ${TOTAL}s of a ${BUDGET}s budget (GPU_CHECK_BUDGET)"
  [ "$TOTAL" -gt "$BUDGET" ] && echo "gpu-check: over its budget by $((TOTAL - BUDGET))s"
  if [ $FAILED -ne 0 ]; then echo "gpu-check: FAILED"; else echo "gpu-check: all passed"; fi
} | tee "$LOGS/summary.txt"
exit $FAILED
