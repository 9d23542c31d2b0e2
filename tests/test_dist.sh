#!/usr/bin/env bash
# The conventions of a system package, checked on `cmake --install` into a fresh prefix:
#   - every program prints "NAME (tide) VERSION" for --version, VERSION starting with the
#     project's;
#   - `man` finds and renders the pages of tided, tidectl and tide-ckpt through MANPATH,
#     and the pages checked in under dist/man (installed where help2man is missing) are
#     what help2man makes of this build's --help;
#   - the systemd unit passes `systemd-analyze verify`, starts the installed tided, and
#     tided puts its state under $STATE_DIRECTORY when neither --state nor TIDE_STATE is
#     given (the current directory otherwise, --state over both);
#   - tide.pc names MPI through pkg-config (Requires) and carries no absolute path.
#   usage: test_dist.sh BUILD_DIR SOURCE_DIR PROJECT_VERSION MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
BUILD=$1 SRC=$2 VERSION=$3
shift 3
MPIRUN=("$@")
WORK=$(mktemp -d /tmp/tide-dist.XXXXXX)
TIDED_PID=""
cleanup() {
  [ -n "$TIDED_PID" ] && kill -9 "$TIDED_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "test_dist: FAIL: $*" >&2
  exit 1
}
unset TIDE_STATE TIDE_ENDPOINT TIDE_ENDPOINT_FILE STATE_DIRECTORY MANPATH
cmake --install "$BUILD" --prefix "$WORK/prefix" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log" >&2; fail "cmake --install"; }
P="$WORK/prefix"

# --version
version_of() { # NAME PROGRAM [LAUNCHER...]: PROGRAM --version run under LAUNCHER
  local name=$1 prog=$2 out
  shift 2
  out=$("$@" "$prog" --version) || fail "$name --version exited with $?"
  [ "$(wc -l <<<"$out")" -eq 1 ] || fail "$name --version printed more than one line: $out"
  case "$out" in
    "$name (tide) $VERSION"*) ;;
    *) fail "$name --version printed '$out', not '$name (tide) $VERSION...'" ;;
  esac
}
version_of tided "$P/bin/tided"
version_of tidectl "$P/bin/tidectl"
version_of tide-ckpt "$P/bin/tide-ckpt"
version_of tide-offline-run "$(find "$P" -name tide-offline-run -type f | head -n 1)"
out=$("$P/bin/tidectl" status --version) && [[ "$out" == "tidectl (tide) $VERSION"* ]] ||
  fail "tidectl status --version printed '$out'"
if [ -x "$BUILD/examples/train_mlp" ]; then # an MPI program: printed by rank 0 alone
  version_of train_mlp "$BUILD/examples/train_mlp" "${MPIRUN[@]}" -np 2
fi

# man pages
for prog in tided tidectl tide-ckpt; do
  page=$(MANPATH="$P/share/man" man -w "$prog") || fail "man -w $prog finds no page under $P/share/man"
  [ "$page" = "$P/share/man/man1/$prog.1" ] || fail "man -w $prog gives $page"
  MANPATH="$P/share/man" MANWIDTH=100 man -P cat "$prog" >"$WORK/$prog.txt" 2>"$WORK/man.err" ||
    fail "man $prog: $(cat "$WORK/man.err")"
  grep -q "^NAME" "$WORK/$prog.txt" && grep -qE "^ +$prog - " "$WORK/$prog.txt" ||
    fail "man $prog renders no NAME section naming $prog"
  grep -qE -- '--version' "$WORK/$prog.txt" || fail "man $prog does not mention --version"
  if [ -f "$BUILD/man/$prog.1" ]; then
    # the date line and help2man's own comment aside, the checked-in page is this build's
    if ! diff <(grep -vE '^(\.TH |\.\\")' "$SRC/dist/man/$prog.1") \
      <(grep -vE '^(\.TH |\.\\")' "$BUILD/man/$prog.1") >"$WORK/man.diff"; then
      head -n 20 "$WORK/man.diff" >&2
      fail "dist/man/$prog.1 differs from what help2man makes of this build: cp $BUILD/man/$prog.1 $SRC/dist/man/"
    fi
  fi
done
grep -qE '^ +resize$' "$WORK/tidectl.txt" && grep -q -- '--dry-run' "$WORK/tidectl.txt" ||
  fail "man tidectl lacks the resize command and its --dry-run"
grep -q '/var/lib/tide/state.db' "$WORK/tided.txt" || fail "man tided does not say where the service's state goes"

# tided's state file: $STATE_DIRECTORY/state.db, else ./tide-state.db, --state over both
start_tided() { # DIR [ARGS...]: tided started in DIR, its endpoint file awaited
  local dir=$1
  shift
  rm -f "$WORK/endpoint"
  (cd "$dir" && exec "$P/bin/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" "$@") \
    >"$WORK/tided.log" 2>&1 &
  TIDED_PID=$!
  for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && return 0; sleep 0.1; done
  cat "$WORK/tided.log" >&2
  fail "tided did not start"
}
stop_tided() {
  kill -TERM "$TIDED_PID"
  wait "$TIDED_PID" || fail "tided exited with $? on SIGTERM"
  TIDED_PID=""
}
mkdir -p "$WORK/svc/state" "$WORK/cwd"
STATE_DIRECTORY="$WORK/svc/state" start_tided "$WORK/cwd"
[ -f "$WORK/svc/state/state.db" ] || fail "with STATE_DIRECTORY set, tided did not write \$STATE_DIRECTORY/state.db"
stop_tided
[ ! -e "$WORK/cwd/tide-state.db" ] || fail "with STATE_DIRECTORY set, tided wrote ./tide-state.db too"
start_tided "$WORK/cwd"
[ -f "$WORK/cwd/tide-state.db" ] || fail "without STATE_DIRECTORY, tided did not write ./tide-state.db"
stop_tided
STATE_DIRECTORY="$WORK/svc/state" start_tided "$WORK/cwd" --state "$WORK/given.db"
[ -f "$WORK/given.db" ] || fail "--state $WORK/given.db was not used under STATE_DIRECTORY"
stop_tided

# the systemd unit
UNIT="$P/lib/systemd/system/tided.service"
[ -f "$UNIT" ] || fail "tided.service is not installed under lib/systemd/system"
grep -qx "ExecStart=$P/bin/tided" "$UNIT" || fail "the unit does not start the installed tided: $(grep ExecStart "$UNIT")"
grep -qx "StateDirectory=tide" "$UNIT" || fail "the unit has no StateDirectory=tide"
if ! command -v systemd-analyze >/dev/null; then
  echo "test_dist: systemd-analyze not found (Debian package systemd, scripts/install-deps.sh): tided.service not verified" >&2
else
  # man: the unit's Documentation= pages are looked up, found in the prefix
  if ! MANPATH="$P/share/man" systemd-analyze verify "$UNIT" >"$WORK/verify.log" 2>&1 ||
    [ -s "$WORK/verify.log" ]; then
    if grep -qiE 'Failed to (connect|initialize|setup)|No such file or directory.*(bus|/run/systemd)' "$WORK/verify.log"; then
      echo "test_dist: systemd-analyze cannot run in this container: tided.service not verified:" >&2
      cat "$WORK/verify.log" >&2
    else
      cat "$WORK/verify.log" >&2
      fail "systemd-analyze verify tided.service"
    fi
  fi
fi

# tide.pc
PC=$(find "$P" -name tide.pc | head -n 1)
[ -n "$PC" ] || fail "tide.pc is not installed"
grep -qE '^Requires(\.private)?: *[a-z]' "$PC" || fail "tide.pc requires no pkg-config module for MPI"
abs=$(grep -vE '^(Name|Description|Version|URL):' "$PC" | grep -oE '(^|[ =])(-[IL])?/[^ ]*' || true)
[ -z "$abs" ] || fail "tide.pc carries absolute paths: $abs"
flags=$(PKG_CONFIG_PATH="$(dirname "$PC")" pkg-config --cflags --libs tide) || fail "pkg-config tide"
grep -q -- "-ltide" <<<"$flags" && grep -qE -- "-lmpi" <<<"$flags" ||
  fail "pkg-config --libs tide lacks -ltide or MPI's library: $flags"
echo "test_dist: --version, man pages, tided.service (systemd-analyze verify), the state" \
  "directory and tide.pc ($(grep '^Requires' "$PC")) ok"
