# Shared by the Slurm tests (sourced after multihost_lib.sh): a Slurm cluster
# (scripts/slurm.sh) on the hosts of a namespace cluster, tided beside slurmctld, and
# batch scripts that launch train_mlp one pool per node (scripts/tide-slurm-pools.sh).
# Skips (exit 77) with the reason where Slurm cannot run, unless TIDE_REQUIRE_NETNS=1.

SLURM_SH="$TIDE_SRC/scripts/slurm.sh"
POOLS_SH="$TIDE_SRC/scripts/tide-slurm-pools.sh"

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

# sl_state JOBID: the Slurm job's state (RUNNING, PENDING, ...), or "" when Slurm forgot it
sl_state() { squeue -h -j "$1" -o %T 2>/dev/null || true; }

# sl_wait_state JOBID STATE [SECS]: until the Slurm job is in STATE
sl_wait_state() {
  local i s=""
  for i in $(seq $((${3:-60} * 10))); do
    s=$(sl_state "$1")
    [ "$s" = "$2" ] && return 0
    sleep 0.1
  done
  squeue >&2 || true
  fail "Slurm job $1 is '$s', not $2, after ${3:-60}s"
}

# sl_idle NODE: NODE is idle in sinfo (given back to Slurm)
sl_idle() { [ "$(sinfo -h -n "$1" -o %T 2>/dev/null | sort -u)" = idle ]; }
