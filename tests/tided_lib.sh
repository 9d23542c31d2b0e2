# Shared by the single-host shell tests that run tided and a job on this machine (sourced):
# a work directory removed on exit (kept with TIDE_TEST_KEEP=1), the processes to kill
# then, tided on a free loopback port, and tidectl against it.
#   tl_setup PREFIX          WORK=/tmp/PREFIX.XXXXXX, the cleanup trap
#   tl_track PID             kill -9 PID on exit (a job, a helper), the last tracked first
#   tl_wait PID              waits for a tracked PID and forgets it (its status is returned)
#   tl_tided TIDED TIDECTL [ARGS...]  tided with ARGS (its own defaults otherwise), its log
#                            in $WORK/tided.log; EP is its endpoint, TIDED_PID its pid, and
#                            tidectl runs as `ctl ARGS...`
#   tl_tided_start BUILD [ARGS...]  the build's tided with --heartbeat-ms 100 --miss-limit 30
#                            and ARGS
#   fail MESSAGE             says so, with the last lines of each log named in TL_LOGS
#                            (files under $WORK; tided.log by default), and exits 1
# shellcheck shell=bash
TL_PIDS=""
TL_LOGS="${TL_LOGS:-tided.log}"
fail() {
  local f
  echo "FAIL: $*" >&2
  for f in $TL_LOGS; do
    [ -f "${WORK:-}/$f" ] || continue
    echo "--- $f" >&2
    tail -20 "$WORK/$f" >&2 || true
  done
  exit 1
}
# The last started is killed first: a job before the tided it talks to.
tl_cleanup() {
  local p last_first=""
  for p in $TL_PIDS; do last_first="$p $last_first"; done
  for p in $last_first; do kill -9 "$p" 2>/dev/null || true; done
  for p in $last_first; do wait "$p" 2>/dev/null || true; done
  if [ -n "${WORK:-}" ] && [ -z "${TIDE_TEST_KEEP:-}" ]; then rm -rf "$WORK"; fi
}
tl_setup() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  trap tl_cleanup EXIT
}
tl_track() { TL_PIDS="$TL_PIDS $1"; }
# A waited-for pid may be reused by the time of the cleanup: it is no longer killed then.
tl_wait() {
  local rc=0 p keep=""
  wait "$1" || rc=$?
  for p in $TL_PIDS; do [ "$p" = "$1" ] || keep="$keep $p"; done
  TL_PIDS=$keep
  return $rc
}
tl_tided() {
  local tided=$1
  TL_TIDECTL=$2
  shift 2
  rm -f "$WORK/endpoint"
  "$tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
    --state "$WORK/state.db" "$@" >"$WORK/tided.log" 2>&1 &
  TIDED_PID=$!
  tl_track "$TIDED_PID"
  for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
  [ -s "$WORK/endpoint" ] || fail "tided did not start"
  EP=$(cat "$WORK/endpoint")
}
tl_tided_start() {
  local b=$1
  shift
  tl_tided "$b/coordinator/tided" "$b/coordinator/tidectl" --heartbeat-ms 100 --miss-limit 30 "$@"
}
ctl() { "$TL_TIDECTL" --endpoint "$EP" --timeout-ms 20000 "$@"; }
