# Shared by the single-host shell tests that run tided and a job on this machine (sourced):
# a work directory removed on exit (kept with TIDE_TEST_KEEP=1), the processes to kill
# then, tided on a free loopback port, and tidectl against it.
#   tl_setup PREFIX          WORK=/tmp/PREFIX.XXXXXX, the cleanup trap
#   tl_track PID             kill -9 PID on exit (a job, a helper)
#   tl_tided_start BUILD [ARGS...]  tided with --heartbeat-ms 100 --miss-limit 30 and ARGS;
#                            EP is its endpoint; tidectl runs as `ctl ARGS...`
# shellcheck shell=bash
TL_PIDS=""
fail() { echo "FAIL: $*" >&2; exit 1; }
tl_cleanup() {
  local p
  for p in $TL_PIDS; do kill -9 "$p" 2>/dev/null || true; done
  for p in $TL_PIDS; do wait "$p" 2>/dev/null || true; done
  if [ -n "${WORK:-}" ] && [ -z "${TIDE_TEST_KEEP:-}" ]; then rm -rf "$WORK"; fi
}
tl_setup() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  trap tl_cleanup EXIT
}
tl_track() { TL_PIDS="$TL_PIDS $1"; }
tl_tided_start() {
  local b=$1
  shift
  TL_TIDECTL="$b/coordinator/tidectl"
  "$b/coordinator/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
    --state "$WORK/state.db" --heartbeat-ms 100 --miss-limit 30 "$@" >"$WORK/tided.log" 2>&1 &
  tl_track $!
  for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
  [ -s "$WORK/endpoint" ] || { cat "$WORK/tided.log" >&2; fail "tided did not start"; }
  EP=$(cat "$WORK/endpoint")
}
ctl() { "$TL_TIDECTL" --endpoint "$EP" --timeout-ms 10000 "$@"; }
