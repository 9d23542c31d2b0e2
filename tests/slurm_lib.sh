# Shared by the Slurm tests (sourced after multihost_lib.sh): a Slurm cluster
# (scripts/slurm.sh) on the hosts of a namespace cluster, and (sl_setup) a training job's
# side that runs as an unprivileged user, as on a real cluster: tided with the Slurm
# provider, its ompi-server, the batch jobs and everything they start run as $SL_USER
# (nobody); only the operator's tidectl and the Slurm daemons are root. Batch scripts
# launch train_mlp one pool per node (scripts/tide-slurm-pools.sh).
# Skips (exit 77) with the reason where Slurm cannot run, unless TIDE_REQUIRE_NETNS=1.

SLURM_SH="$TIDE_SRC/scripts/slurm.sh"
POOLS_SH="$TIDE_SRC/scripts/tide-slurm-pools.sh"
SL_USER=${SL_USER:-nobody}
SL=""        # the job side's folder (owned by SL_USER): state, keys, logs, losses
SL_STEPS=600 # steps of the training job (paced: SL_PACE_MS each at least)
SL_PACE_MS=60
SL_MODEL=(--layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 24
          --micro-batches 2 --seed 11 --lr 0.003)

# Exits 77 (skip) with the reason when Slurm cannot run here, or fails under
# TIDE_REQUIRE_NETNS=1.
sl_require() {
  local why
  mh_require_netns
  if ! why=$(bash "$SLURM_SH" check); then
    if [ "${TIDE_REQUIRE_NETNS:-0}" = 1 ]; then fail "TIDE_REQUIRE_NETNS=1 but: $why"; fi
    echo "SKIP: $why"
    exit "$MH_SKIP"
  fi
}

# sl_up: Slurm on the cluster's hosts (mh_setup made them); SLURM_CONF exported. The
# cluster's `down` (mh_cleanup) takes Slurm down with it.
sl_up() {
  local env
  env=$(bash "$SLURM_SH" up --name "$MH_NAME" --grace "${SL_GRACE:-30}") || fail "slurm.sh up failed"
  # shellcheck disable=SC1090
  . "$env"
}

# "${AS_USER[@]}" CMD...: CMD as SL_USER. An array, not a function: `CMD &` of a function
# forks a shell first, and $! would be that root shell's pid instead of CMD's (setpriv
# execs CMD, so its pid is CMD's own).
AS_USER=(setpriv --reuid "$SL_USER" --regid "$(id -g "$SL_USER")" --clear-groups --)

# sl_setup N: N hosts with Slurm; the job side's folder, keys, ompi-server and tided (Slurm
# provider) as SL_USER; SL_BATCH: the batch script (sl_batch). tided from mh_setup (root)
# is replaced.
sl_setup() {
  sl_require
  mh_setup "$1"
  sl_up
  kill "$TIDED_PID"
  wait "$TIDED_PID" 2>/dev/null || true
  TIDED_PID=""
  chmod 755 "$MH_TMP"
  SL="$MH_TMP/job"
  mkdir -p "$SL/keys"
  cp "$KEYS"/server.key "$KEYS"/*.pub "$KEYS/pool1.key" "$SL/keys/"
  chown -R "$SL_USER" "$SL"
  "${AS_USER[@]}" ompi-server --no-daemonize -r "$SL/ompi.uri" --mca oob_tcp_if_include "$TIDE_CLUSTER_SUBNET" \
    >"$SL/ompi-server.log" 2>&1 &
  MH_PIDS="$MH_PIDS $!"
  for _ in $(seq 100); do [ -s "$SL/ompi.uri" ] && break; sleep 0.05; done
  [ -s "$SL/ompi.uri" ] || fail "ompi-server did not start: $(cat "$SL/ompi-server.log")"
  sl_tided_start
}

# sl_tided_start: tided as SL_USER on the bridge address, the Slurm provider on (again on
# the same port after a stop); EP its endpoint. SL_TIDED_ARGS: more flags.
sl_tided_start() {
  local ep=${EP:-"tcp://$TIDE_CLUSTER_ADDR:*"}
  rm -f "$SL/endpoint"
  "${AS_USER[@]}" "$TIDED" --endpoint "$ep" --endpoint-file "$SL/endpoint" --auth "$SL/keys" \
    --state "$SL/state.db" --heartbeat-ms 100 --miss-limit 30 --resize-timeout-ms 60000 \
    --ompi-server "file:$SL/ompi.uri" --provider slurm --slurm-poll-ms 500 \
    "${SL_TIDED_ARGS[@]+"${SL_TIDED_ARGS[@]}"}" >>"$SL/tided.log" 2>&1 &
  TIDED_PID=$!
  for _ in $(seq 200); do
    [ -s "$SL/endpoint" ] && break
    kill -0 "$TIDED_PID" 2>/dev/null || { cat "$SL/tided.log" >&2; fail "tided exited"; }
    sleep 0.05
  done
  [ -s "$SL/endpoint" ] || fail "tided did not start"
  EP=$(cat "$SL/endpoint")
}

# sl_batch JOB: writes $SL/JOB.sbatch, the batch script of training job JOB: one pool of
# one rank per node, every setting in the file (tided submits it again as it is, with its
# own environment); each pool writes $SL/JOB-SLURMJOB-NODE.{loss,state}, Slurm the output to
# $SL/slurm-SLURMJOB.out.
sl_batch() {
  local job=$1 f="$SL/$1.sbatch" v san=""
  for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
    if [ -n "${!v:-}" ]; then san="$san export $v='${!v}';"; fi
  done
  cat >"$f" <<EOF
#!/bin/bash
#SBATCH --job-name=tide-$job
#SBATCH --requeue
#SBATCH --signal=B:USR1@${SL_GRACE:-30}
#SBATCH --output=$SL/slurm-%j.out
export TIDE_ENDPOINT=$EP TIDE_KEY=$SL/keys/pool1.key TIDE_SERVER_KEY=$SL/keys/server.pub
export TIDE_SWITCH_TIMEOUT_MS=15000 TIDE_LOG=info
$san
exec bash $POOLS_SH -- --oversubscribe --bind-to none \\
  --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 \\
  --mca btl_tcp_if_include $TIDE_CLUSTER_SUBNET --mca oob_tcp_if_include $TIDE_CLUSTER_SUBNET \\
  --ompi-server file:$SL/ompi.uri --enable-recovery --mca async_mpi_finalize 1 \\
  $TRAIN --tide --job $job ${SL_MODEL[*]} --dp 1 --steps $SL_STEPS --pace-ms $SL_PACE_MS \\
  --print-every 1000 --loss-out $SL/$job-%j-%n.loss --state-out $SL/$job-%j-%n.state
EOF
  chown "$SL_USER" "$f"
  SL_BATCH=$f
}

# sl_submit ARGS...: sbatch --parsable ARGS as SL_USER; prints the Slurm job id
sl_submit() {
  (cd "$SL" && "${AS_USER[@]}" sbatch --parsable "$@") || fail "sbatch $* failed"
}

# sl_reference: the never-resized run (dp 1) of the batch script's model and steps on h1
# (as root, outside Slurm) into $MH_TMP/ref.{loss,state}
sl_reference() {
  "${MPI[@]}" --host h1:1 -np 1 "$TRAIN" "${SL_MODEL[@]}" --dp 1 --steps $SL_STEPS \
    --loss-out "$MH_TMP/ref.loss" --state-out "$MH_TMP/ref.state" --print-every 1000 \
    >"$MH_TMP/ref.log" 2>&1 || { cat "$MH_TMP/ref.log" >&2; fail "reference run"; }
}

# sl_state JOBID: the Slurm job's state (RUNNING, PENDING, ...), or "" when Slurm forgot it
sl_state() { squeue -h -j "$1" -o %T 2>/dev/null || true; }

# sl_wait_state JOBID STATE [SECS]: until the Slurm job is in STATE
sl_wait_state() {
  local s=""
  for _ in $(seq $((${3:-60} * 10))); do
    s=$(sl_state "$1")
    [ "$s" = "$2" ] && return 0
    sleep 0.1
  done
  squeue >&2 || true
  fail "Slurm job $1 is '$s', not $2, after ${3:-60}s"
}

# sl_node_state NODE: NODE's state in sinfo (idle, alloc, ...)
sl_node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | sort -u | tr '\n' ' ' | sed 's/ $//'; }

# sl_wait_idle NODE [SECS]: until NODE is idle in sinfo (given back to Slurm)
sl_wait_idle() {
  local s=""
  for _ in $(seq $((${2:-30} * 10))); do
    s=$(sl_node_state "$1")
    [ "$s" = idle ] && return 0
    sleep 0.1
  done
  squeue >&2 || true
  fail "$1 is '$s' in sinfo, not idle, after ${2:-30}s"
}

# sl_hosts_of JOB: the hosts of JOB's online workers in tidectl status, sorted
sl_hosts_of() {
  ctl ops status | awk -v j="$1" '$5 == "online" && $6 == j { print $2 }' | sort -u | tr '\n' ' '
}

# sl_wait_hosts JOB "h1 h2 " [SECS]: until JOB's online workers are on exactly those hosts
sl_wait_hosts() {
  local h=""
  for _ in $(seq $((${3:-60} * 10))); do
    h=$(sl_hosts_of "$1")
    [ "$h" = "$2" ] && return 0
    sleep 0.1
  done
  ctl ops status >&2 || true
  fail "job $1 runs on '$h', not '$2', after ${3:-60}s"
}

# sl_check_steps JOB: every pool's loss file holds strictly increasing steps (no step of the
# job ran twice), together they hold every step 0..SL_STEPS-1 (none lost), and each loss
# equals the never-resized run's within 1e-5 (dp changes the order of the gradient sum).
sl_check_steps() {
  local f
  for f in "$SL/$1"-*.loss; do
    awk -v f="$f" 'NR > 1 && $1 <= prev { print f ": step " $1 " after step " prev > "/dev/stderr"; bad = 1 }
      { prev = $1 } END { exit bad }' "$f" || fail "job $1: a step ran twice in $f"
  done
  cat "$SL/$1"-*.loss >"$MH_TMP/$1.loss"
  compare_losses "$MH_TMP/$1.loss" "$MH_TMP/ref.loss" 1e-5 >/dev/null ||
    fail "job $1's losses differ from the never-resized run"
  local k
  k=$(awk '{ print $1 }' "$MH_TMP/$1.loss" | sort -nu | wc -l)
  [ "$k" -eq "$SL_STEPS" ] || fail "job $1: $k of $SL_STEPS steps have a loss"
}

# sl_final_state JOB: the final state one of its pools wrote (the job's last layout's first rank)
sl_final_state() {
  local f
  f=$(ls -t "$SL/$1"-*.state 2>/dev/null | head -1)
  [ -n "$f" ] || fail "job $1 wrote no final state"
  echo "$f"
}
