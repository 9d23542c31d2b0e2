#!/usr/bin/env bash
# The Python package installed as a user installs it, against an installed tide.
# 0. the documented way (docs/pytorch.md): `cmake --install` puts the package under the
#    prefix, and the page's one `export PYTHONPATH=...` line (taken from it, /opt/tide replaced by
#    the test's prefix) makes it importable; the installed train_gpt.py then trains a few
#    steps against the installed tided, and tide.torch imports;
# and with pip, offline:
# `cmake --install` into a prefix (then moved, so nothing may depend on the install
# path), `pip install --no-build-isolation --no-deps --target DIR ./python` (offline;
# from a copy, so that pip's build/ never lands in the source tree), and the installed
# package imported from DIR with no TIDE_LIB, TIDE_BUILD_DIR or LD_LIBRARY_PATH and far
# from any source checkout. It must find the prefix's libtide (python/tide/_lib.py):
#   1. with nothing that names the prefix: a clear OSError listing every place it looked
#      (skipped where a libtide is installed system-wide);
#   2. the prefix's bin on PATH (the installed tided): a one-rank job under mpirun
#      against the installed tided (join, an allreduce, a step, finish);
#   3. the prefix's lib/pkgconfig on PKG_CONFIG_PATH (tide.pc);
#   4. TIDE_PREFIX;
#   5. `pip install --prefix P`: the package inside the prefix finds the library beside it;
# each time the library loaded must be the prefix's (tide.library_path()).
#   usage: test_python_install.sh SOURCE_DIR BUILD_DIR MPIRUN [FLAGS...]
# Exit 77 (skip) only when /usr/bin/python3 lacks torch, mpi4py or pip.
set -uo pipefail
SRC=$1 BUILD=$2
shift 2
MPIRUN=("$@")
PY=${TIDE_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch, mpi4py" 2>/dev/null || { echo "test_python_install: torch/mpi4py missing for $PY: skip"; exit 77; }
"$PY" -m pip --version >/dev/null 2>&1 || { echo "test_python_install: no pip for $PY: skip"; exit 77; }
WORK=$(mktemp -d /tmp/tide-pyinstall.XXXXXX)
TIDED_PID=""
cleanup() {
  [ -n "$TIDED_PID" ] && kill "$TIDED_PID" 2>/dev/null && wait "$TIDED_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "test_python_install: FAIL: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; } >&2; done
  exit 1
}
unset TIDE_LIB TIDE_BUILD_DIR TIDE_PREFIX LD_LIBRARY_PATH PKG_CONFIG_PATH PYTHONPATH
export OMP_NUM_THREADS=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_ROOT_USER_ACTION=ignore
BASE_PATH=$PATH
# no tided of another tide on PATH may stand in for the prefix's
if command -v tided >/dev/null; then
  BASE_PATH=$(echo "$PATH" | tr ':' '\n' | grep -vxF "$(dirname "$(command -v tided)")" | paste -sd:)
fi

cmake --install "$BUILD" --prefix "$WORK/first" >"$WORK/install.log" 2>&1 || fail "cmake --install"
mv "$WORK/first" "$WORK/prefix"
P=$(cd "$WORK/prefix" && pwd -P)
cp -r "$SRC/python" "$WORK/pkgsrc"
"$PY" -m pip install --no-build-isolation --no-deps --target "$WORK/site" "$WORK/pkgsrc" \
  >"$WORK/pip.log" 2>&1 || fail "pip install --target of ./python"
[ -f "$WORK/site/tide/__init__.py" ] && [ -f "$WORK/site/tide/py.typed" ] ||
  fail "pip installed no tide package (or no py.typed) under --target"

# probe [ENV...]: imports the installed tide in a clean environment, from $WORK (no source
# checkout above it), and prints the library it loaded after a geometry call
probe() {
  (cd "$WORK" && env PATH="$BASE_PATH" PYTHONPATH="$WORK/site" "$@" "$PY" -c '
import tide, torch
c = tide.Collection(1)
c.add("w", (4, 2), torch.float32, layer=0, tp_split=0)
assert tide.Layout(1, 2, 1, 1).shard_bytes(c, "w", (0, 0, 1)) == 16
print("LIB", tide.library_path(), tide.__file__)
')
}
in_prefix() { # LOG WHAT: the probe's library must lie in the prefix, the package in site
  local lib pkg
  lib=$(awk '/^LIB / {print $2}' "$1") pkg=$(awk '/^LIB / {print $3}' "$1")
  case "$lib" in
    "$P"/*) ;;
    *) fail "$2: loaded libtide from '$lib', not from the installed prefix $P" ;;
  esac
  case "$pkg" in
    "$WORK"/site/* | "$P"/*) ;;
    *) fail "$2: imported tide from '$pkg', not the pip-installed package" ;;
  esac
}

# 1. nothing names the prefix: a clear error that lists where it looked
system_lib=$("$PY" -c 'import ctypes.util, glob; print(ctypes.util.find_library("tide") or "".join(glob.glob("/usr/lib*/libtide.so") + glob.glob("/usr/local/lib*/libtide.so") + glob.glob("/usr/lib/*/libtide.so") + glob.glob("/usr/local/lib/*/libtide.so")))')
if [ -z "$system_lib" ]; then
  probe >"$WORK/none.log" 2>&1 && fail "with nothing naming the prefix, tide loaded a libtide: $(cat "$WORK/none.log")"
  for want in "OSError: libtide.so not found" "TIDE_PREFIX" "Looked in, in order" \
    "site/tide/libtide.so [the package's folder]: absent" "/usr/local/lib/libtide.so [a standard prefix]"; do
    grep -qF "$want" "$WORK/none.log" || fail "the not-found error does not say '$want': $(tail -n 5 "$WORK/none.log")"
  done
else
  echo "test_python_install: a libtide is installed system-wide ($system_lib): the not-found case is not checked"
fi

# 2. the prefix's bin on PATH: a one-rank job against the installed tided
"$P/bin/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
  --state "$WORK/state.db" >"$WORK/tided.log" 2>&1 &
TIDED_PID=$!
for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
[ -s "$WORK/endpoint" ] || fail "the installed tided did not start"
cat >"$WORK/job.py" <<'EOF'
import mpi4py
mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI
import torch
import tide
c = tide.Collection(1)
c.add("w", (8,), torch.float32, layer=0)
with tide.Runtime(MPI.COMM_WORLD) as rt:
    rt.join("installed", c)
    state = rt.zeros()
    state["w"].fill_(3)
    rt.set_buffers(state)
    assert rt.step_begin() is tide.Action.RUN
    g = rt.allreduce(torch.full((8,), 2.0), tide.Group.DP)
    rt.step_end()
    assert rt.step_begin() is tide.Action.RUN
    rt.finish()
    print("JOB step %d allreduce %.1f device %s" % (rt.view.step, float(g.sum()), rt.device))
print("LIB", tide.library_path(), tide.__file__)
EOF
# 0. docs/pytorch.md's line, in a shell that has nothing else of tide (no pip, no PATH)
line=$(grep -m1 '^export PYTHONPATH=/opt/tide/' "$SRC/docs/pytorch.md")
[ -n "$line" ] || fail "docs/pytorch.md has no 'export PYTHONPATH=/opt/tide/...' line"
line=${line//\/opt\/tide/$P}
[ -f "$P/share/tide/examples/python/train_gpt.py" ] || fail "train_gpt.py is not installed"
(cd "$WORK" && env PATH="$BASE_PATH" TIDE_ENDPOINT="$(cat "$WORK/endpoint")" bash -c "$line
  \"\$0\" -c 'import tide, tide.torch; print(\"LIB\", tide.library_path(), tide.__file__)' &&
  ${MPIRUN[*]} -np 1 \"\$0\" $P/share/tide/examples/python/train_gpt.py --job readme --steps 3 \
    --layers 2 --hidden 16 --heads 2 --seq 8 --global-batch 4" "$PY") >"$WORK/readme.log" 2>&1 ||
  fail "docs/pytorch.md's PYTHONPATH line ($line) and the installed train_gpt.py"
grep -q '^train_gpt: step 0 loss' "$WORK/readme.log" || fail "the installed train_gpt.py did not train"
in_prefix "$WORK/readme.log" "docs/pytorch.md's PYTHONPATH line"
(cd "$WORK" && env PATH="$P/bin:$BASE_PATH" PYTHONPATH="$WORK/site" TIDE_ENDPOINT="$(cat "$WORK/endpoint")" \
  "${MPIRUN[@]}" -np 1 "$PY" "$WORK/job.py") >"$WORK/path.log" 2>&1 ||
  fail "a one-rank job with the prefix's bin on PATH"
grep -q '^JOB step 1 allreduce 16.0 device cpu' "$WORK/path.log" || fail "the one-rank job did not run its step"
in_prefix "$WORK/path.log" "prefix's bin on PATH"

# 3. tide.pc on PKG_CONFIG_PATH
PCDIR=$(dirname "$(find "$P" -name tide.pc | head -n 1)")
probe PKG_CONFIG_PATH="$PCDIR" >"$WORK/pc.log" 2>&1 || fail "import with PKG_CONFIG_PATH=$PCDIR"
in_prefix "$WORK/pc.log" "PKG_CONFIG_PATH"

# 4. TIDE_PREFIX
probe TIDE_PREFIX="$P" >"$WORK/prefix.log" 2>&1 || fail "import with TIDE_PREFIX=$P"
in_prefix "$WORK/prefix.log" "TIDE_PREFIX"

# 5. the package installed into the prefix itself
"$PY" -m pip install --no-build-isolation --no-deps --prefix "$P" "$WORK/pkgsrc" \
  >"$WORK/pip-prefix.log" 2>&1 || fail "pip install --prefix"
# pip's copy, not the one cmake --install put under lib/python3/site-packages
SITE=$(dirname "$(find "$P" -path '*-packages/tide/__init__.py' \
  -not -path "$P/lib/python3/site-packages/*" | head -n 1)")
[ -n "$SITE" ] && [ "$SITE" != . ] || fail "pip install --prefix put no tide package under $P"
(cd "$WORK" && env PATH="$BASE_PATH" PYTHONPATH="$(dirname "$SITE")" "$PY" -c '
import tide
print("LIB", tide.library_path(), tide.__file__)') >"$WORK/inprefix.log" 2>&1 ||
  fail "import of the package installed with --prefix"
in_prefix "$WORK/inprefix.log" "pip install --prefix"
echo "test_python_install: docs/pytorch.md's PYTHONPATH line made the cmake-installed package" \
  "importable (train_gpt trained); pip-installed tide found the installed libtide without" \
  "TIDE_LIB (PATH, pkg-config, TIDE_PREFIX, package prefix); one-rank job: $(grep '^JOB' "$WORK/path.log")"
