# Shared by the multi-host tests (sourced): a cluster of network namespaces from
# scripts/cluster.sh, tided with CURVE keys on the bridge address, and helpers. Each
# test calls mh_setup N; everything it started is removed on exit, failure included.
# Needs: TIDE_BUILD (the build directory), TIDE_SRC (the source tree).
# Skips (exit 77) when namespaces cannot be made here, unless TIDE_REQUIRE_NETNS=1
# (set by .ci/run), which turns the skip into a failure.

MH_SKIP=${TIDE_TEST_SKIP_RC:-77}
TIDED="$TIDE_BUILD/coordinator/tided"
TIDECTL="$TIDE_BUILD/coordinator/tidectl"
TRAIN="$TIDE_BUILD/examples/train_mlp"
# the same program with the tests' fault hook (TIDE_JOIN_FAULT, ...: tests/support/faults.c)
TRAIN_FAULTS="$TIDE_BUILD/tests/faults/train_mlp"
STATE_DIFF="$TIDE_BUILD/examples/mlp_state_diff"
CLUSTER="$TIDE_SRC/scripts/cluster.sh"
MH_NAME="m$$"
MH_TMP=""
TIDED_PID=""
MH_PIDS=""
MH_TIDED_ARGS=() # more flags for tided (mh_tided_start)

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "-- $*"; }

mh_cleanup() {
  local p
  for p in $MH_PIDS $TIDED_PID; do kill -9 "$p" 2>/dev/null || true; done
  for p in $MH_PIDS $TIDED_PID; do wait "$p" 2>/dev/null || true; done
  bash "$CLUSTER" down --name "$MH_NAME" || true
  if [ -n "$MH_TMP" ] && [ -z "${TIDE_TEST_KEEP:-}" ]; then rm -rf "$MH_TMP"; fi
}

# Exits 77 (skip) with the reason when no cluster can be made here, or fails with it
# under TIDE_REQUIRE_NETNS=1.
mh_require_netns() {
  local why
  if ! why=$(bash "$CLUSTER" check); then
    if [ "${TIDE_REQUIRE_NETNS:-0}" = 1 ]; then
      fail "TIDE_REQUIRE_NETNS=1 but: $why"
    fi
    echo "SKIP: $why"
    exit "$MH_SKIP"
  fi
}

# mh_setup N [RATE]: the cluster of N hosts, keys, and tided on the bridge address.
mh_setup() {
  mh_require_netns
  # clusters of tests that were killed (ctest's timeout sends SIGKILL: no trap runs)
  bash "$CLUSTER" gc || true
  trap mh_cleanup EXIT
  trap 'exit 1' INT TERM
  MH_TMP=$(mktemp -d /tmp/tide-mh.XXXXXX)
  local env
  env=$(bash "$CLUSTER" up "$1" --name "$MH_NAME" --owner $$ ${2:+--rate "$2"})
  # shellcheck disable=SC1090
  . "$env"
  KEYS="$MH_TMP/keys"
  "$TIDECTL" keygen "$KEYS" --role server >/dev/null
  "$TIDECTL" keygen "$KEYS" --role admin --name ops >/dev/null
  "$TIDECTL" keygen "$KEYS" --role worker --name pool1 >/dev/null
  "$TIDECTL" keygen "$KEYS" --role reader --name watch >/dev/null
  # a key tided does not know: made elsewhere
  "$TIDECTL" keygen "$MH_TMP/other" --role admin --name stranger >/dev/null
  # the environment does not cross to orted: mpirun flags carry what the ranks need
  MPI=(mpirun $TIDE_CLUSTER_MPI --oversubscribe --bind-to none
       --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none
       --mca mpi_yield_when_idle 1)
  local v
  for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
    if [ -n "${!v:-}" ]; then MPI+=(-x "$v"); fi
  done
  mh_tided_start
}

# Starts tided on the bridge address with the keys (again on the same port after a stop);
# with MH_METRICS=HOST:PORT also its Prometheus metrics there.
mh_tided_start() {
  local ep=${EP:-"tcp://$TIDE_CLUSTER_ADDR:*"}
  rm -f "$MH_TMP/endpoint"
  local metrics=()
  if [ -n "${MH_METRICS:-}" ]; then metrics=(--metrics "$MH_METRICS"); fi
  "$TIDED" --endpoint "$ep" --endpoint-file "$MH_TMP/endpoint" --auth "$KEYS" \
    --state "$MH_TMP/state.db" --heartbeat-ms 100 --miss-limit 30 \
    --resize-timeout-ms 60000 "${metrics[@]+"${metrics[@]}"}" \
    "${MH_TIDED_ARGS[@]+"${MH_TIDED_ARGS[@]}"}" >>"$MH_TMP/tided.log" 2>&1 &
  TIDED_PID=$!
  local i
  for i in $(seq 200); do
    [ -s "$MH_TMP/endpoint" ] && break
    kill -0 "$TIDED_PID" 2>/dev/null || { cat "$MH_TMP/tided.log" >&2; fail "tided exited"; }
    sleep 0.05
  done
  [ -s "$MH_TMP/endpoint" ] || fail "tided did not start"
  EP=$(cat "$MH_TMP/endpoint")
  case "$EP" in tcp://"$TIDE_CLUSTER_ADDR":*) ;; *) fail "tided bound $EP" ;; esac
}

# ctl KEY ARGS...: tidectl with that key (ops, pool1, watch) against tided.
ctl() {
  local k=$1
  shift
  "$TIDECTL" --endpoint "$EP" --key "$KEYS/$k.key" --server-key "$KEYS/server.pub" \
    --timeout-ms 5000 "$@"
}

# Waits (up to $2 s) until `tidectl status` (admin) shows $1 workers online.
wait_busy() {
  local n=$1 secs=${2:-60} i
  for i in $(seq $((secs * 10))); do
    if [ "$(ctl ops status 2>/dev/null | grep -c ' online ')" -ge "$n" ]; then return 0; fi
    sleep 0.1
  done
  ctl ops status >&2 || true
  fail "fewer than $n online workers after ${secs}s"
}

# one_stage_per_host STATUS: each of h1 and h2 holds one whole pipeline stage (its online
# workers are all pp0/... or all pp1/... in `tidectl status`) and not the same one; sets
# victim=h2, survivor=h1 and lost (h2's stage).
one_stage_per_host() {
  local h stages s1=""
  for h in h1 h2; do
    stages=$(awk -v h="$h" '$2 == h && $5 == "online" { split($7, r, "/"); print r[1] }' <<<"$1" | sort -u)
    [ "$(wc -w <<<"$stages")" -eq 1 ] || fail "$h holds stages '$stages', not one whole stage"
    [ "$h" = h1 ] && s1=$stages
  done
  [ "$s1" != "$stages" ] || fail "both hosts hold $s1"
  victim=h2 survivor=h1 lost=$stages
}

# survivors: the train_mlp processes left on host $survivor.
survivors() {
  local p n=0
  for p in $(ip netns pids "tide-$MH_NAME-$survivor" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = train_mlp ] && n=$((n + 1))
  done
  echo $n
}

# Compares two loss files ("step loss" lines) within relative tolerance $3 over the
# steps of the first; prints the number of steps compared.
compare_losses() {
  awk -v tol="$3" 'NR == FNR { ref[$1] = $2; next }
    { if (!($1 in ref)) { print "step " $1 " missing from the reference" > "/dev/stderr"; bad = 1; next }
      d = $2 - ref[$1]; if (d < 0) d = -d; m = ref[$1] < 0 ? -ref[$1] : ref[$1];
      if (d > tol * (m > 1e-30 ? m : 1)) { printf "step %d: loss %.9g, never-resized %.9g\n", $1, $2, ref[$1] > "/dev/stderr"; bad = 1 }
      n++ }
    END { if (bad || n == 0) exit 1; print n }' "$2" "$1"
}

# compare_states A B RTOL: the whole final states of two runs (train_mlp --state-out) are
# the same tensors, integers equal, floats within RTOL in relative L2 norm; fails otherwise.
compare_states() {
  [ -s "$1" ] || fail "no final state in $1"
  [ -s "$2" ] || fail "no final state in $2"
  "$STATE_DIFF" "$1" "$2" --rtol "$3" || fail "the final state differs from the never-resized run"
}

# A TCP port on 127.0.0.1 that nothing listens on now.
mh_free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  fail "no free port found"
}

# mh_grow_setup: what a job that grows needs (docs/multihost.md, "Growing a job"): an ompi-server
# beside tided, tided restarted to name it, and GROW_MPI: mpirun's flags for every launch
# of such a job (the ompi-server, recovery, tided's endpoint and the pool key).
mh_grow_setup() {
  ompi-server --no-daemonize -r "$MH_TMP/ompi.uri" --mca oob_tcp_if_include "$TIDE_CLUSTER_SUBNET" \
    >"$MH_TMP/ompi-server.log" 2>&1 &
  MH_PIDS="$MH_PIDS $!"
  for _ in $(seq 100); do [ -s "$MH_TMP/ompi.uri" ] && break; sleep 0.05; done
  [ -s "$MH_TMP/ompi.uri" ] || fail "ompi-server did not start"
  kill "$TIDED_PID"
  wait "$TIDED_PID" 2>/dev/null || true
  MH_TIDED_ARGS=(--ompi-server "file:$MH_TMP/ompi.uri")
  mh_tided_start
  GROW_MPI=("${MPI[@]}" --ompi-server "file:$MH_TMP/ompi.uri" --enable-recovery
            --mca async_mpi_finalize 1 -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/pool1.key"
            -x TIDE_SERVER_KEY="$KEYS/server.pub" -x TIDE_SWITCH_TIMEOUT_MS=15000)
}

# ---- waiting on a job that grows (test_multihost_grow, test_multihost_regrow) ----

# job_events JOB: the job's events as JSON rows, one per line
job_events() { ctl ops events --job "$1" --limit 10000 --json | tr '{' '\n' | grep "\"job\":\"$1\"" || true; }

# wait_event JOB KIND [N] [SECS]: until the job has N events of KIND
wait_event() {
  local i n
  for i in $(seq $((${4:-60} * 10))); do
    n=$(job_events "$1" | grep -c "\"kind\":\"$2\"" || true)
    [ "$n" -ge "${3:-1}" ] && return 0
    sleep 0.1
  done
  job_events "$1" >&2
  # a worker's reason reaches tided as a code only ("could not switch: timed out"): the
  # stage it stopped at is in its launch's log
  grep -H "could not\|timed out\|abandon\|error" "$MH_TMP"/*.log 2>/dev/null | tail -n 20 >&2 || true
  fail "job $1: no $2 event (${3:-1} wanted)"
}

# wait_idle N: until N workers are idle (a launched pool has registered and joined)
wait_idle() {
  local i
  for i in $(seq 600); do
    [ "$(ctl ops status | grep -c ' idle ')" -ge "$1" ] && return 0
    sleep 0.1
  done
  ctl ops status >&2
  fail "fewer than $1 idle workers"
}

# wait_step FILE N: until the loss file has reached step N
wait_step() {
  local i s=0
  for i in $(seq 1200); do
    s=$(awk 'END { print $1 + 0 }' "$1" 2>/dev/null || echo 0)
    [ "$s" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "step $2 not reached (at $s)"
}

# ---- the elastic policy's decisions (test_multihost_priority, test_multihost_elastic4) ----

# decision JOB N RULE WHAT [SECS]: JOB's Nth "elastic" event has the typed reason RULE and
# says WHAT (waits up to SECS, 60, for it)
decision() {
  local ev
  wait_event "$1" elastic "$2" "${5:-60}"
  ev=$(job_events "$1" | grep '"kind":"elastic"' | sed -n "$2"p)
  grep -q "\"reason\":\"$3\"" <<<"$ev" || fail "$1's elastic decision $2 is not rule $3: $ev"
  grep -q "$4" <<<"$ev" || fail "$1's elastic decision $2 does not say '$4': $ev"
}

# event_ms JOB KIND N: the time (ms) of JOB's Nth event of KIND
event_ms() {
  job_events "$1" | grep "\"kind\":\"$2\"" | sed -n "$3"p | sed -n 's/.*"time_ms":\([0-9]*\).*/\1/p'
}
