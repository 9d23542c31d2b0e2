#!/usr/bin/env bash
# The installed package used as a user uses it: `cmake --install` into a fresh prefix
# (then moved elsewhere, so nothing may depend on the install path), the out-of-tree
# quickstart built from the installed copy with find_package(tide) and with pkg-config,
# both run without LD_LIBRARY_PATH under mpirun against the installed tided, resized
# live with the installed tidectl (dp 2 -> 1 -> 2), and the final state compared with a
# never-resized run of the same program. Also: only include/tide/ is installed under
# include/, each public header compiles alone, the quickstart and the plugin example build
# from those headers only, libtide.so exports exactly the functions they declare and holds
# no test-only code, and the documentation they point to is installed.
#   usage: test_install.sh BUILD_DIR MPIRUN [MPIRUN FLAGS...]
# EXTRA_CFLAGS: flags the program needs to load this build's libtide (sanitizers).
set -euo pipefail
BUILD=$1
shift
MPIRUN=("$@")
WORK=$(mktemp -d /tmp/tide-install.XXXXXX)
TIDED_PID=""
JOB_PID=""
cleanup() {
  [ -n "$JOB_PID" ] && kill -9 "$JOB_PID" 2>/dev/null
  [ -n "$TIDED_PID" ] && kill "$TIDED_PID" 2>/dev/null && wait "$TIDED_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "test_install: FAIL: $*" >&2
  for f in "$WORK"/*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; } >&2
  done
  exit 1
}
unset LD_LIBRARY_PATH

cmake --install "$BUILD" --prefix "$WORK/first" >"$WORK/install.log" 2>&1 || fail "cmake --install"
mv "$WORK/first" "$WORK/prefix"
P=$(cd "$WORK/prefix" && pwd -P)
EX="$P/share/tide/examples/quickstart"
[ -f "$EX/quickstart.c" ] || fail "the quickstart example is not installed under share/tide"
for h in tide.h tide_task.h status.h collection.h comm.h api.h; do
  [ -f "$P/include/tide/$h" ] || fail "include/tide/$h is not installed"
done
# include/ holds tide/ and nothing else (no module headers under generic names such as
# include/reshard/ or include/collectives/)
others=$(find "$P/include" -mindepth 1 -maxdepth 1 ! -name tide -printf '%f ')
[ -z "$others" ] || fail "installed under include/ besides tide/: $others"
# the documentation the installed headers point to is installed too
for ref in $(grep -ohE 'share/[A-Za-z0-9_./-]+[A-Za-z0-9_]' "$P"/include/tide/*.h | sort -u); do
  [ -e "$P/$ref" ] || fail "an installed header points to $ref, which is not installed"
done
for md in $(grep -ohE '[A-Za-z0-9_]+\.md' "$P"/include/tide/*.h | sort -u); do
  [ -n "$(find "$P/share" -name "$md")" ] || fail "an installed header points to $md, which is not installed"
done
# the plugin example: the library where TIDE_PLUGIN_DIR can point, and its source
PLUGIN=$(find "$P" -name libtide_task_matmul.so | head -n 1)
[ -n "$PLUGIN" ] || fail "the plugin example libtide_task_matmul.so is not installed"
nm -D --defined-only "$PLUGIN" | grep -q ' tide_task_v1_get$' ||
  fail "the installed plugin does not export tide_task_v1_get"
PLUGIN_SRC="$P/share/tide/examples/task_matmul/task_matmul.c"
[ -f "$PLUGIN_SRC" ] || fail "the plugin example's source is not installed"
# running under Slurm: the per-node launcher on PATH beside tided, and a batch script
[ -x "$P/bin/tide-slurm-pools" ] || fail "bin/tide-slurm-pools is not installed"
"$P/bin/tide-slurm-pools" --help | grep -q "one tide pool per" || fail "tide-slurm-pools --help"
[ -f "$P/share/tide/examples/slurm/train_mlp.sbatch" ] || fail "the Slurm batch example is not installed"
# tide-mpirun, where it is built (Open MPI 4.x): mpirun with libtide-mpirun.so loaded,
# the launch marked for libtide (OMPI_TIDE_DAEMON_URIS=1 in its ranks), and the ranks
# themselves run without the library
if [ -f "$BUILD/worker/libtide-mpirun.so" ]; then
  [ -x "$P/bin/tide-mpirun" ] || fail "bin/tide-mpirun is not installed"
  renv=$("$P/bin/tide-mpirun" "${MPIRUN[@]:1}" -np 1 env 2>"$WORK/tide-mpirun.log") ||
    fail "tide-mpirun -np 1 env: $(tail -3 "$WORK/tide-mpirun.log")"
  grep -qx "OMPI_TIDE_DAEMON_URIS=1" <<<"$renv" || fail "tide-mpirun did not mark its launch"
  ! grep -q "^LD_PRELOAD=.*libtide-mpirun" <<<"$renv" ||
    fail "a rank started by tide-mpirun inherited libtide-mpirun.so"
  renv=$("${MPIRUN[@]}" -np 1 env) || fail "mpirun -np 1 env"
  ! grep -q "OMPI_TIDE_DAEMON_URIS" <<<"$renv" || fail "a plain mpirun's launch is marked"
fi

# 1. find_package(tide)
cmake -S "$EX" -B "$WORK/qs-cmake" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="${EXTRA_CFLAGS:-}" >"$WORK/cmake.log" 2>&1 || fail "configure with find_package(tide)"
cmake --build "$WORK/qs-cmake" >>"$WORK/cmake.log" 2>&1 || fail "build with find_package(tide)"
QS_CMAKE="$WORK/qs-cmake/quickstart"

# 2. pkg-config (libdir may be lib or lib/<triplet>)
PCDIR=$(dirname "$(find "$P" -name tide.pc | head -n 1)")
[ -n "$PCDIR" ] || fail "tide.pc is not installed"
FLAGS=$(PKG_CONFIG_PATH="$PCDIR" pkg-config --cflags --libs tide) || fail "pkg-config tide"
# shellcheck disable=SC2086
cc -std=c11 -O2 -Wall -Wextra -Werror ${EXTRA_CFLAGS:-} "$EX/quickstart.c" $FLAGS \
  -o "$WORK/qs-pc" >"$WORK/cc.log" 2>&1 || fail "cc \$(pkg-config --cflags --libs tide)"
QS_PC="$WORK/qs-pc"

# Only the installed headers: each public header compiles alone, the quickstart's tide
# headers all come from the prefix, and the plugin example builds from its installed
# source with include/tide/ alone.
# shellcheck disable=SC2086
for h in "$P"/include/tide/*.h; do
  printf '#include <tide/%s>\ntypedef int not_empty;\n' "$(basename "$h")" |
    cc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c - $FLAGS >>"$WORK/cc.log" 2>&1 ||
    fail "include/tide/$(basename "$h") does not compile alone with pkg-config's flags"
done
# shellcheck disable=SC2086
deps=$(cc -std=c11 -M "$EX/quickstart.c" $FLAGS | sed 's/\\$//' | tr ' ' '\n' |
  grep -E '/(tide|reshard|collectives|core)/[^/]*\.h$' || true)
for d in $deps; do
  d=$(realpath -m "$d") # tide.pc's paths go through lib/pkgconfig/../..
  case "$d" in
    "$P"/include/tide/*) ;;
    *) fail "quickstart.c includes $d, not a header of the installed include/tide/" ;;
  esac
done
[ -n "$deps" ] || fail "cc -M lists no tide header for quickstart.c"
cc -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -I"$P/include" "$PLUGIN_SRC" \
  -o "$WORK/libplugin.so" >>"$WORK/cc.log" 2>&1 || fail "the plugin example does not build from include/tide/"

# libtide exports exactly the functions include/tide/*.h declare, computed from the
# headers by the compiler (-aux-info: every prototype of the translation unit with the
# file it comes from; static inline helpers excluded) and from the installed library.
LIBTIDE=$(find "$P" -name 'libtide.so' | head -n 1)
for h in "$P"/include/tide/*.h; do echo "#include <tide/$(basename "$h")>"; done >"$WORK/all.c"
# shellcheck disable=SC2086
cc -std=c11 -fsyntax-only -aux-info "$WORK/aux.txt" "$WORK/all.c" -I"$P/include" $FLAGS >>"$WORK/cc.log" 2>&1 ||
  fail "cc -aux-info over the installed headers (gcc is needed for this check)"
grep -F "/* $P/include/tide/" "$WORK/aux.txt" | grep -v ' static ' |
  sed -E 's@^/\* [^*]* \*/ extern @@; s@^[^(]*[ *]([A-Za-z_][A-Za-z0-9_]*) \(.*@\1@' |
  sort -u >"$WORK/declared.txt"
nm -D --defined-only "$LIBTIDE" | awk '{print $3}' | sed 's/@.*//' | sort -u >"$WORK/exported.txt"
[ "$(wc -l <"$WORK/declared.txt")" -ge 50 ] || fail "only $(wc -l <"$WORK/declared.txt") declarations found in include/tide/"
if ! diff "$WORK/declared.txt" "$WORK/exported.txt" >"$WORK/symbols.diff"; then
  fail "libtide.so's exports differ from include/tide/ ('<' declared, not exported; '>' exported, not declared): $(grep '^[<>]' "$WORK/symbols.diff" | tr '\n' ' ')"
fi

# Test-only code does not ship (tests/support): no test-support file is installed, and
# libtide.so holds none of its generators, plan checker or fault hook, exported or not
# (its full symbol table, and the environment names the hook reads).
others=$(find "$P" \( -name '*test_support*' -o -name '*test_faults*' \) -printf '%P ')
[ -z "$others" ] || fail "test support is installed: $others"
for sym in tide_proto_sample tide_plan_validate tide_plan_simulate; do
  ! nm "$LIBTIDE" 2>/dev/null | grep -qw "$sym" || fail "libtide.so contains the test-only $sym"
done
! grep -aqE 'TIDE_(CKPT|JOIN)_FAULT' "$LIBTIDE" || fail "libtide.so reads a test fault variable"

# Both find the installed libtide by themselves.
for exe in "$QS_CMAKE" "$QS_PC"; do
  lib=$(ldd "$exe" | awk '/libtide\.so/ {print $3}')
  case "$lib" in
    "$P"/*) ;;
    *) fail "$(basename "$exe") loads libtide from '$lib', not from the installed prefix" ;;
  esac
done

# 3. the installed tided on a free loopback port
"$P/bin/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
  --state "$WORK/state.db" --heartbeat-ms 100 --miss-limit 50 >"$WORK/tided.log" 2>&1 &
TIDED_PID=$!
for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
[ -s "$WORK/endpoint" ] || fail "tided did not start"
export TIDE_ENDPOINT
TIDE_ENDPOINT=$(cat "$WORK/endpoint")
CTL=("$P/bin/tidectl")

# degrees not given are kept from the running job: none running, a clear refusal
set +e
"${CTL[@]}" resize nosuch --dp 2 >"$WORK/nosuch.log" 2>&1
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "no running online job 'nosuch'" "$WORK/nosuch.log" ||
  fail "tidectl resize of an unknown job with only --dp: rc $rc, not refused clearly"

STEPS=80
# wait_for FILE REGEX SECONDS
wait_for() {
  for _ in $(seq $(($3 * 10))); do
    grep -qE "$2" "$1" && return 0
    kill -0 "$JOB_PID" 2>/dev/null || break
    sleep 0.1
  done
  grep -qE "$2" "$1" || fail "no line matching '$2' in $(basename "$1")"
}
fingerprint() { sed -n 's/.*fingerprint \([0-9a-f]*\).*/\1/p' "$1"; }

# 4. the never-resized reference (dp 1, same global batch)
"${MPIRUN[@]}" -np 1 "$QS_PC" --job ref --dp 1 --steps $STEPS >"$WORK/ref.log" 2>&1 ||
  fail "the reference run failed"
REF=$(fingerprint "$WORK/ref.log")
[ -n "$REF" ] || fail "the reference run printed no fingerprint"

# 5. the elastic run, resized live from the CLI
"${MPIRUN[@]}" -np 2 "$QS_CMAKE" --job q --dp 2 --steps $STEPS --step-ms 40 \
  >"$WORK/job.log" 2>&1 &
JOB_PID=$!
wait_for "$WORK/job.log" '^quickstart: step 10$' 60
# as the README types it: --wait returns at the commit, so status right after shows it
"${CTL[@]}" resize q --dp 1 --wait >"$WORK/resize1.log" 2>&1 ||
  fail "tidectl resize q --dp 1 --wait: $(cat "$WORK/resize1.log")"
grep -q 'generation 2 committed after step [0-9]*: downtime .* ms .* bytes moved' "$WORK/resize1.log" ||
  fail "resize --wait printed no commit: $(cat "$WORK/resize1.log")"
"${CTL[@]}" status >"$WORK/status.log" 2>&1 || fail "tidectl status"
grep -q 'idle' "$WORK/status.log" || fail "after dp 2 -> 1, tidectl status shows no idle worker"
wait_for "$WORK/job.log" 'generation 2 dp 1' 60
"${CTL[@]}" resize q --dp 2 --wait >"$WORK/resize2.log" 2>&1 ||
  fail "tidectl resize q --dp 2 --wait: $(cat "$WORK/resize2.log")"
grep -q 'generation 3 committed' "$WORK/resize2.log" || fail "no commit: $(cat "$WORK/resize2.log")"
wait_for "$WORK/job.log" 'generation 3 dp 2' 60
wait "$JOB_PID" || fail "the elastic run failed"
JOB_PID=""
GOT=$(fingerprint "$WORK/job.log")
last=$(sed -n 's/.*generation 3 dp 2 from step \([0-9]*\).*/\1/p' "$WORK/job.log")
[ "${last:-$STEPS}" -lt $STEPS ] || fail "the last resize came after the final step"
[ "$GOT" = "$REF" ] || fail "state after two live resizes ($GOT) differs from the never-resized run ($REF)"
echo "test_install: $(wc -l <"$WORK/declared.txt") public functions, all exported and nothing else;" \
  "find_package and pkg-config builds ok; resized dp 2 -> 1 -> 2 at steps" \
  "$(sed -n 's/.*generation \([23]\) dp . from step \([0-9]*\).*/\2/p' "$WORK/job.log" | tr '\n' ' ')" \
  "; state $GOT equals the never-resized run"
