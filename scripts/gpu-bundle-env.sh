#!/usr/bin/env bash
# The run-time environment of a tide GPU bundle. scripts/gpu-bundle.sh copies this file
# into the bundle as env.sh; scripts/gpu-check.sh --bundle DIR sources it and calls
# tide_bundle_env WORKDIR before its first step. `bash env.sh --check [WORKDIR]` does the
# same and prints the result: what a GPU machine with nothing of tide installed is missing.
#
# tide_bundle_env WORKDIR (a writable folder of this run) sets up:
#  - Open MPI, relocated into the bundle: OPAL_PREFIX and every OPAL_* folder it reads
#    (its components in ompi/lib/openmpi, help files in ompi/share/openmpi, config in
#    ompi/etc; Debian's sysconfdir /etc/openmpi lies outside its prefix, so OPAL_PREFIX
#    alone would not move it), PMIx's the same way (PMIX_*), and mpirun/orted first on
#    PATH (a singleton MPI_Init starts orted from OPAL_BINDIR);
#  - LD_LIBRARY_PATH: the bundle's lib/ (Open MPI, ZeroMQ, msgpack-c, SQLite, xxhash and
#    their own dependencies), then WORKDIR/bundle-libs, where each library of
#    lib/fallback/ (base-system ones: libstdc++, zlib, krb5, ...) that this machine lacks is
#    linked, one by one, so that a newer copy the machine has (and its PyTorch may need)
#    is never shadowed by the bundle's;
#  - the CUDA libraries the bundle was linked against but does not carry (their names in
#    cuda-libs: the CUDA runtime, cuBLAS, NCCL), each looked up in order in: the folders of
#    $TIDE_CUDA_LIBS (colon-separated), the loader's cache (ldconfig -p), the wheels in the
#    site-packages of $TIDE_PYTHON (else the python3 on PATH): nvidia/*/lib, which is where
#    the nvidia-nccl-cu13 wheel and PyTorch's CUDA wheels put them, then the CUDA toolkit:
#    $CUDA_HOME/lib64, /usr/local/cuda/lib64, /usr/local/cuda/lib and its targets folder.
#    The folder each was found in joins LD_LIBRARY_PATH. When one is missing it returns 1
#    after a message naming the library and every place it looked in.
# A library counts as present only as a non-empty file: one hidden by an empty file
# bound over it (tests/test_gpu_bundle.sh hides the system's that way) does not.

TIDE_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# _tb_ldconfig: the loader's cache, "soname path" per line (x86-64 entries only)
_tb_ldconfig() {
  local ldc
  ldc=$(command -v ldconfig 2>/dev/null || echo /sbin/ldconfig)
  [ -x "$ldc" ] || return 0
  "$ldc" -p 2>/dev/null | awk '/x86-64/ && $(NF - 1) == "=>" { print $1, $NF }'
}

# _tb_cached SONAME: the usable file the loader's cache has for SONAME, if any
_tb_cached() {
  local name path
  while read -r name path; do
    [ "$name" = "$1" ] && [ -s "$path" ] && { echo "$path"; return 0; }
  done <<<"$TIDE_BUNDLE_LDCACHE"
  return 1
}

# _tb_find SONAME DIRS: the first usable DIRS/SONAME (DIRS: one folder per line)
_tb_find() {
  local d
  while read -r d; do
    [ -n "$d" ] && [ -s "$d/$1" ] && { echo "$d/$1"; return 0; }
  done <<<"$2"
  return 1
}

# _tb_site PY: the site-packages folders of python PY, one per line
_tb_site() {
  "$1" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null
}

_tb_toolkit() {
  printf '%s\n' ${CUDA_HOME:+"$CUDA_HOME/lib64"} ${CUDA_HOME:+"$CUDA_HOME/lib"} \
    /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
}

# _tb_cuda_dirs PY: the folders searched for the CUDA libraries after the loader's cache,
# in order, one per line: the wheels of python PY, then the toolkit's
_tb_cuda_dirs() {
  local sp d
  if [ -n "$1" ]; then
    for sp in $(_tb_site "$1"); do
      for d in "$sp"/nvidia/*/lib "$sp"/nvidia/*/lib64; do [ -d "$d" ] && echo "$d"; done
    done
  fi
  for d in $(_tb_toolkit); do [ -d "$d" ] && echo "$d"; done
  return 0
}

# _tb_looked PY: every place the CUDA libraries were looked for, for the message
_tb_looked() {
  local sp d
  echo "  - \$TIDE_CUDA_LIBS: ${TIDE_CUDA_LIBS:-(unset)}"
  echo "  - the loader's cache (ldconfig -p)"
  if [ -z "$1" ]; then
    echo "  - no Python's wheels: no python3 on PATH and TIDE_PYTHON unset"
  else
    for sp in $(_tb_site "$1"); do echo "  - the wheels of $1: $sp/nvidia/*/lib"; done
  fi
  for d in $(_tb_toolkit); do
    echo "  - the CUDA toolkit: $d$([ -d "$d" ] || echo ' (absent)')"
  done
}

# tide_bundle_env WORKDIR: see the top of the file. Prints one line per CUDA library found.
tide_bundle_env() {
  local work="$1" libs f so d py user dirs found missing="" extra=""
  libs="$work/bundle-libs"
  export OPAL_PREFIX="$TIDE_BUNDLE/ompi"
  export OPAL_EXEC_PREFIX="$OPAL_PREFIX" OPAL_BINDIR="$OPAL_PREFIX/bin" \
    OPAL_LIBDIR="$TIDE_BUNDLE/lib" OPAL_PKGLIBDIR="$OPAL_PREFIX/lib/openmpi" \
    OPAL_DATAROOTDIR="$OPAL_PREFIX/share" OPAL_DATADIR="$OPAL_PREFIX/share" \
    OPAL_PKGDATADIR="$OPAL_PREFIX/share/openmpi" OPAL_SYSCONFDIR="$OPAL_PREFIX/etc" \
    OPAL_LIBEXECDIR="$OPAL_PREFIX/bin"
  export PMIX_PREFIX="$OPAL_PREFIX/pmix"
  export PMIX_EXEC_PREFIX="$PMIX_PREFIX" PMIX_LIBDIR="$TIDE_BUNDLE/lib" \
    PMIX_PKGLIBDIR="$PMIX_PREFIX/lib/pmix" PMIX_DATADIR="$PMIX_PREFIX/share" \
    PMIX_PKGDATADIR="$PMIX_PREFIX/share/pmix" PMIX_SYSCONFDIR="$PMIX_PREFIX/etc"
  export PATH="$OPAL_BINDIR:$PATH"
  TIDE_BUNDLE_LDCACHE=$(_tb_ldconfig)
  mkdir -p "$libs" || return 1
  find "$libs" -mindepth 1 -delete
  for f in "$TIDE_BUNDLE"/lib/fallback/*; do
    [ -f "$f" ] || continue
    so=$(basename "$f")
    _tb_cached "$so" >/dev/null || ln -s "$f" "$libs/$so"
  done
  py=${TIDE_PYTHON:-$(command -v python3 2>/dev/null)}
  user=$(tr ':' '\n' <<<"${TIDE_CUDA_LIBS:-}")
  dirs=$(_tb_cuda_dirs "$py")
  while read -r so; do
    [ -n "$so" ] || continue
    found=$(_tb_find "$so" "$user") || found=""
    if [ -z "$found" ] && ! found=$(_tb_cached "$so"); then
      found=$(_tb_find "$so" "$dirs") || found=""
    fi
    if [ -n "$found" ]; then
      d=$(dirname "$found")
      # a library of the loader's cache needs no folder of its own
      if ! [ "$(_tb_cached "$so")" = "$found" ] && [[ ":$extra:" != *":$d:"* ]]; then
        extra="$extra:$d"
      fi
      echo "found $so: $(readlink -f "$found")"
    else
      missing="$missing $so"
    fi
  done <"$TIDE_BUNDLE/cuda-libs"
  export LD_LIBRARY_PATH="$TIDE_BUNDLE/lib:$libs$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -n "$missing" ]; then
    echo "missing on this machine:${missing}; looked in:"
    _tb_looked "$py"
    echo "  the bundle does not carry the CUDA runtime, cuBLAS or NCCL: install the CUDA" \
      "toolkit (NCCL: the nvidia-nccl-cu13 wheel in the Python that runs the check," \
      "TIDE_PYTHON or python3 on PATH), or name their folders in TIDE_CUDA_LIBS"
    return 1
  fi
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = "--check" ]; then
  w=${2:-$(mktemp -d /tmp/tide-bundle-env.XXXXXX)}
  tide_bundle_env "$w"
  rc=$?
  echo "OPAL_PREFIX=$OPAL_PREFIX"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "fallback libraries linked: $(find "$w/bundle-libs" -mindepth 1 -printf '%f ' 2>/dev/null)"
  exit $rc
fi
