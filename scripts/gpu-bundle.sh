#!/usr/bin/env bash
# gpu-bundle: builds tide with CUDA and NCCL on this machine and collects into one folder
# everything scripts/gpu-check.sh needs on a GPU machine that has a driver, the CUDA
# toolkit, CMake and a Python with PyTorch, but no Open MPI, ZeroMQ, msgpack-c, SQLite,
# pkg-config or network. The folder travels with the call that runs the check:
#
#   bash scripts/gpu-bundle.sh [--out DIR] [--build-dir DIR] [--jobs N]
#   ... on the GPU machine: bash DIR/src/scripts/gpu-check.sh --bundle DIR --out LOGS
#
# The build (--build-dir, default build-bundle/, reused and rebuilt incrementally) is a
# Release one for the H200's sm_90 (GPU_BUNDLE_ARCHS, default 90; the driver compiles the
# PTX for another GPU), without OpenBLAS (the host examples then use their plain loops;
# libopenblas alone would be 35 MiB), and only of the programs the check runs. The
# folder (--out, default build-gpu-bundle/: /build*/ is ignored by git, so it can be
# named in the device tool's carry list) holds:
#   build/     tide's programs, libtide.so and the GPU tests at their build-tree paths,
#              stripped; gpu-tests.cmake.in, the gpu-labelled ctest tests with their paths
#              as @TIDE_BUNDLE@, for gpu-check to write out
#   src/       gpu-check.sh, the Python package and the Python tests and examples; pylib/,
#              pytest for a machine whose Python has none
#   lib/       every shared library those programs and Open MPI's components load that
#              is not the C runtime, the NVIDIA driver, the CUDA runtime, cuBLAS or NCCL
#   lib/fallback/  of those, the base-system ones (libstdc++, zlib, krb5, ...), used only
#              where the machine lacks them (env.sh)
#   ompi/      Open MPI's runtime relocated (OPAL_PREFIX): mpirun, orted, the components
#              whose libraries are carried (not the InfiniBand/UCX/libfabric transports),
#              help files and config; PMIx's components and help files in ompi/pmix
#   env.sh     the run-time environment (scripts/gpu-bundle-env.sh); cuda-libs, the
#              libraries env.sh must find on the machine; MANIFEST, what was built from what
# It fails when NCCL or the CUDA toolkit is missing here, when a program loads a library
# this machine cannot resolve, or when the folder reaches GPU_BUNDLE_MAX_MIB (48) MiB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/build-gpu-bundle"
BUILD="$ROOT/build-bundle"
JOBS="${JOBS:-$(nproc)}"
MAX_MIB="${GPU_BUNDLE_MAX_MIB:-48}"
ARCHS="${GPU_BUNDLE_ARCHS:-90}"
while [ $# -gt 0 ]; do
  case "$1" in
  --out) OUT="$2"; shift 2 ;;
  --build-dir) BUILD="$2"; shift 2 ;;
  --jobs) JOBS="$2"; shift 2 ;;
  *) echo "usage: gpu-bundle.sh [--out DIR] [--build-dir DIR] [--jobs N]" >&2; exit 2 ;;
  esac
done
mkdir -p "$(dirname "$OUT")"
OUT="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
die() { echo "gpu-bundle: $*" >&2; exit 1; }

# ---- build ---------------------------------------------------------------------------
TARGETS=(tided tidectl tide tide-offline-run train_mlp tide_task_matmul reshard_bench resize_bench
  test_collectives_conformance test_collectives_recovery)
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTIDE_CUDA=ON -DTIDE_SANITIZE=OFF \
  -DTIDE_WERROR=ON -DTIDE_OPENBLAS=OFF -DTIDE_BUILD_TESTS=ON -DTIDE_BUILD_BENCHMARKS=ON \
  -DTIDE_MLP_CUDA_ARCHS="$ARCHS" >"$BUILD/gpu-bundle.configure.log" 2>&1 ||
  { tail -20 "$BUILD/gpu-bundle.configure.log"; die "cmake failed (log: $BUILD/gpu-bundle.configure.log)"; }
grep -q '^TIDE_NCCL_LIBRARY:FILEPATH=.*nccl' "$BUILD/CMakeCache.txt" ||
  die "CUDA and NCCL were not found here (CUDAToolkit_ROOT, /usr/local/cuda): a bundle needs both"
# the gpu-labelled tests (run by gpu-check's gpu-tests step), the python one apart: built
# as the targets of their names (tide_add_gpu_test's), their commands read once built
GPU_TESTS_JSON="$BUILD/gpu-tests.json"
gpu_tests_json() { (cd "$BUILD" && ctest --show-only=json-v1 -L gpu -LE python) >"$GPU_TESTS_JSON"; }
gpu_tests_json
ALL_TARGETS=$(cmake --build "$BUILD" --target help | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')
mapfile -t GPU_EXES < <(python3 -c 'import json, sys
for t in json.load(open(sys.argv[1]))["tests"]:
    print(t["name"])' "$GPU_TESTS_JSON" | grep -Fxf <(echo "$ALL_TARGETS"))
echo "gpu-bundle: building ${TARGETS[*]} ${GPU_EXES[*]} in $BUILD (sm_$ARCHS)"
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" "${GPU_EXES[@]}" >"$BUILD/gpu-bundle.build.log" 2>&1 ||
  { tail -30 "$BUILD/gpu-bundle.build.log"; die "the build failed (log: $BUILD/gpu-bundle.build.log)"; }
gpu_tests_json
# their programs, relative to the build tree (the first argument there: some start under
# mpirun)
python3 - "$GPU_TESTS_JSON" "$BUILD" >"$BUILD/gpu-tests.progs" <<'EOF2' || die "see above"
import json, sys
for t in json.load(open(sys.argv[1]))["tests"]:
    progs = [a for a in t.get("command", []) if a.startswith(sys.argv[2] + "/")]
    if not progs:
        sys.exit("gpu-bundle: gpu test %s runs no program of the build tree: %s"
                 % (t["name"], t.get("command")))
    print(progs[0][len(sys.argv[2]) + 1:])
EOF2
mapfile -t GPU_PROGS <"$BUILD/gpu-tests.progs"

# ---- the folder ----------------------------------------------------------------------
# a folder is replaced only when it is a bundle (or one whose making stopped half way)
if [ -e "$OUT" ]; then
  [ -f "$OUT/.tide-gpu-bundle" ] || [ -z "$(ls -A "$OUT")" ] ||
    die "$OUT exists and is not a gpu bundle: not replacing it"
  rm -rf "$OUT"
fi
mkdir -p "$OUT"
: >"$OUT/.tide-gpu-bundle"
mkdir -p "$OUT"/{build,src,lib/fallback,ompi/bin,ompi/lib/openmpi,ompi/share/openmpi,ompi/etc} \
  "$OUT"/ompi/pmix/{lib/pmix,share/pmix,etc}

# put SRC DEST: a stripped copy of an ELF file (plain copy otherwise)
put() {
  mkdir -p "$(dirname "$2")"
  if head -c 4 "$1" | grep -q 'ELF'; then
    strip --strip-unneeded -o "$2" "$1"
  else
    cp "$1" "$2"
  fi
}

for rel in coordinator/tided coordinator/tidectl worker/tide-offline-run examples/train_mlp \
  examples/libtide_task_matmul.so benchmarks/reshard_bench benchmarks/resize_bench \
  tests/test_collectives_conformance tests/test_collectives_recovery; do
  put "$BUILD/$rel" "$OUT/build/$rel"
done
for rel in "${GPU_PROGS[@]}"; do put "$BUILD/$rel" "$OUT/build/$rel"; done
# libtide.so: the file the Python binding loads (TIDE_LIB), under its soname too
put "$(readlink -f "$BUILD/worker/libtide.so")" "$OUT/build/worker/libtide.so"
cp "$OUT/build/worker/libtide.so" "$OUT/build/worker/$(readelf -d "$OUT/build/worker/libtide.so" |
  sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
cc -O2 -o "$OUT/build/cuda_query" "$ROOT/scripts/cuda_query.c" -ldl
strip "$OUT/build/cuda_query"

# the sources gpu-check reads at run time (ROOT there is src/)
mkdir -p "$OUT/src/scripts" "$OUT/src/tests" "$OUT/src/examples" "$OUT/src/python"
cp "$ROOT/scripts/gpu-check.sh" "$ROOT/scripts/cuda_query.c" "$OUT/src/scripts/"
cp "$ROOT/scripts/gpu-bundle-env.sh" "$OUT/env.sh"
cp -r "$ROOT/tests/python" "$OUT/src/tests/"
cp "$ROOT/tests/lsan.supp" "$OUT/src/tests/"
# pytest and what it imports, pure Python, for a GPU machine's Python that lacks it
# (gpu-check's python-gpu puts src/pylib on PYTHONPATH only then)
mkdir -p "$OUT/src/pylib"
PYLIB=$(/usr/bin/python3 -c 'import os, pytest; print(os.path.dirname(os.path.dirname(pytest.__file__)))') ||
  die "no pytest for /usr/bin/python3 (scripts/install-deps.sh installs python3-pytest)"
for m in pytest _pytest pluggy iniconfig packaging attr py py.py exceptiongroup tomli; do
  if [ -e "$PYLIB/$m" ]; then cp -r "$PYLIB/$m" "$OUT/src/pylib/"; fi
done
cp "$ROOT"/examples/*.py "$OUT/src/examples/"
cp -r "$ROOT/python/tide" "$OUT/src/python/"
find "$OUT/src" -name __pycache__ -prune -exec rm -rf {} +

# ---- Open MPI, relocated -------------------------------------------------------------
MPIRUN=$(readlink -f "$(command -v mpirun)") || die "no mpirun here"
ompi_dir() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1:\(.*\)/\1/p"; }
PKGLIB=$(ompi_dir pkglibdir)
PKGDATA=$(ompi_dir pkgdatadir)
SYSCONF=$(ompi_dir sysconfdir)
put "$MPIRUN" "$OUT/ompi/bin/mpirun"
put "$(dirname "$MPIRUN")/orted" "$OUT/ompi/bin/orted"
cp "$PKGDATA"/help-*.txt "$OUT/ompi/share/openmpi/"
cp "$SYSCONF"/openmpi-mca-params.conf "$SYSCONF"/openmpi-default-hostfile "$OUT/ompi/etc/" 2>/dev/null ||
  true
# Network transports for clusters (InfiniBand, UCX, libfabric, PSM) stay behind: one
# host's ranks talk over shared memory and TCP. So does OpenSHMEM, which tide never uses.
SKIP_LIBS='libucp|libucs|libuct|libucm|libfabric|libibverbs|librdmacm|libpsm'
SKIP_COMPONENTS='^mca_(atomic|memheap|scoll|spml|sshmem)_'
for c in "$PKGLIB"/*.so; do
  [[ $(basename "$c") =~ $SKIP_COMPONENTS ]] && continue
  deps=$(ldd "$c" 2>/dev/null) || true
  grep -Eq "$SKIP_LIBS" <<<"$deps" && continue
  put "$c" "$OUT/ompi/lib/openmpi/$(basename "$c")"
done
PMIX_LIB=$(readlink -f "$(ldconfig -p | awk '$1 == "libpmix.so.2" && /x86-64/ { print $NF; exit }')")
PMIX_ROOT=$(dirname "$(dirname "$PMIX_LIB")")
[ -d "$PMIX_ROOT/lib/pmix" ] || die "PMIx's components not found next to $PMIX_LIB"
for c in "$PMIX_ROOT"/lib/pmix/*.so; do
  put "$c" "$OUT/ompi/pmix/lib/pmix/$(basename "$c")"
done
cp "$PMIX_ROOT"/share/pmix/help-*.txt "$OUT/ompi/pmix/share/pmix/"
# not PMIx's mca-params.conf: Debian's names its own component folder there, which would
# hide PMIX_PKGLIBDIR's

# ---- the libraries they load -------------------------------------------------------------
# Not carried: the C runtime (glibc) and the NVIDIA driver, present on every such machine,
# and the CUDA runtime, cuBLAS and NCCL, which env.sh finds there (cuda-libs).
GLIBC='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec)\.so'
DRIVER='^(libcuda\.so|libnvidia-)'
CUDA='^(libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink)\.so'
FALLBACK='^(libstdc\+\+|libgcc_s|libz|libudev|libbsd|libmd|libgssapi_krb5|libkrb5|libk5crypto|libkrb5support|libcom_err|libkeyutils|libcap|liblzma|libzstd|libcrypt)\.so'
: >"$OUT/cuda-libs"
declare -A SEEN=()
unresolved=""
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue
  [ -n "${SEEN[$name]:-}" ] && continue
  SEEN[$name]=1
  if [ "$path" = "not" ]; then
    unresolved="$unresolved $name"
  elif [[ $name =~ $GLIBC ]] || [[ $name =~ $DRIVER ]]; then
    :
  elif [[ $name =~ $CUDA ]]; then
    echo "$name" >>"$OUT/cuda-libs"
  elif [[ $name =~ $FALLBACK ]]; then
    put "$(readlink -f "$path")" "$OUT/lib/fallback/$name"
  else
    put "$(readlink -f "$path")" "$OUT/lib/$name"
  fi
done < <(find "$OUT/build" "$OUT/ompi" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' sh {} \; \
  -print | while read -r f; do ldd "$f" 2>/dev/null; done)
[ -z "$unresolved" ] || die "these libraries are loaded but not found here:$unresolved"
# cuBLAS is opened with dlopen at the first GPU gemm (examples/mlp_cuda.cu), so ldd does
# not list it: its soname is a string in the programs that do
for so in $(find "$OUT/build" -type f -exec grep -aoh 'libcublas\.so\.[0-9][0-9]*' {} + | sort -u); do
  printf '%s\n' "$so" "${so/libcublas/libcublasLt}" >>"$OUT/cuda-libs" # and what it loads
done
sort -u -o "$OUT/cuda-libs" "$OUT/cuda-libs"

# the gpu tests, their paths made relative to the bundle for gpu-check (@TIDE_BUNDLE@)
MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
python3 - "$GPU_TESTS_JSON" "$BUILD" "$ROOT" "$OUT/build/gpu-tests.cmake.in" "$MPIEXEC" <<'EOF'
import json, sys
src, build, root, out, mpiexec = sys.argv[1:]
def rel(s):
    if mpiexec and s == mpiexec:
        return "@TIDE_BUNDLE@/ompi/bin/mpirun"
    return (s.replace(build, "@TIDE_BUNDLE@/build").replace(root, "@TIDE_BUNDLE@/src"))
def q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
lines = []
for t in json.load(open(src))["tests"]:
    lines.append("add_test(%s %s)" % (q(t["name"]), " ".join(q(rel(a)) for a in t["command"])))
    for p in t.get("properties", []):
        v = p["value"]
        v = ";".join(str(x) for x in v) if isinstance(v, list) else str(v)
        lines.append("set_tests_properties(%s PROPERTIES %s %s)" % (q(t["name"]), p["name"], q(rel(v))))
open(out, "w").write("\n".join(lines) + "\n")
EOF

KIB=$(du -sk "$OUT" | cut -f1)
{
  echo "tide gpu bundle (scripts/gpu-bundle.sh); run: bash src/scripts/gpu-check.sh --bundle DIR --out LOGS"
  echo "commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "cuda: $(grep -o 'CUDA/NCCL support: .*;' "$BUILD/gpu-bundle.configure.log" | head -1 | sed 's/;$//'), sm_$ARCHS"
  echo "nccl headers: $(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
    "$(sed -n 's/^TIDE_NCCL_INCLUDE_DIR:PATH=//p' "$BUILD/CMakeCache.txt")/nccl.h" | paste -sd.)"
  echo "open mpi: $(ompi_info --parsable 2>/dev/null | sed -n 's/^ompi:version:full://p')"
  echo "carried: $(find "$OUT/lib" -maxdepth 1 -type f | wc -l) libraries, $(find "$OUT/lib/fallback" -type f | wc -l) fallback, $(find "$OUT/ompi" -name '*.so' | wc -l) MPI components"
  echo "found on the GPU machine (cuda-libs): $(paste -sd' ' "$OUT/cuda-libs")"
  echo "size: $((KIB / 1024)) MiB"
} >"$OUT/MANIFEST"
cat "$OUT/MANIFEST"
[ "$KIB" -lt $((MAX_MIB * 1024)) ] || die "$OUT is $((KIB / 1024)) MiB, not under $MAX_MIB MiB"
echo "gpu-bundle: $OUT ($((KIB / 1024)) MiB)"
