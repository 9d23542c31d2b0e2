#!/usr/bin/env bash
# tide-slurm-pools: run inside a Slurm batch job (or salloc) to launch one tide pool per
# allocated node: an srun step per node, each running one mpirun whose ranks all sit on
# that node. tide joins and releases launches one at a time, and Open MPI 4.1 connects
# only launches whose ranks run on their mpirun's own host (README, "Growing a job"), so
# an allocation of N nodes is N pools that join and leave the job independently.
#
#   tide-slurm-pools [--ranks-per-node K] [--no-requeue] -- MPIRUN_ARGS... PROGRAM ARGS...
#
# Each node runs `srun --nodes 1 --ntasks 1 --nodelist NODE mpirun --host NODE:K -np K
# MPIRUN_ARGS... PROGRAM ARGS...`. K: --ranks-per-node, else SLURM_NTASKS_PER_NODE, else
# the node's GPUs (SLURM_GPUS_ON_NODE), else 1. The ranks inherit the environment
# (TIDE_ENDPOINT, TIDE_KEY, ...), plus TIDE_LEAVE_SIGNAL=USR1 unless it is set. In
# MPIRUN_ARGS, PROGRAM and ARGS, %n stands for the node's name and %j for the Slurm job id
# (per-node output files: --loss-out run-%j-%n.loss).
#
# Leaving before Slurm takes the nodes: on SIGUSR1 (`#SBATCH --signal=B:USR1@GRACE`, sent
# GRACE seconds before a time limit and, with SlurmctldParameters=preempt_send_user_signal,
# when the allocation is preempted; or `scancel --batch --signal=USR1 JOB`) every pool gets
# SIGUSR1 (srun and mpirun pass it on), each rank's libtide asks tided to shrink the job
# off its pool, and the pools exit once released. When they all have, the allocation
# requeues itself (`scontrol requeue`, unless --no-requeue): it comes back when Slurm
# starts it again, and its pools join the job again. A Slurm job that ends by itself is
# never requeued, so without this a preempted allocation that left in time would be gone.
# SIGTERM (a cancel, the end of the grace time) is passed on to every pool.
# Exit status: 0 when every pool exited 0, else the first failing pool's status.
set -uo pipefail

die() { echo "tide-slurm-pools: $*" >&2; exit 2; }

K="" REQUEUE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks-per-node) K=$2; shift 2 ;;
    --ranks-per-node=*) K=${1#*=}; shift ;;
    --no-requeue) REQUEUE=0; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (mpirun's flags and the program come after --)" ;;
  esac
done
[ $# -ge 1 ] || die "no program: tide-slurm-pools [options] -- MPIRUN_ARGS... PROGRAM ARGS..."
[ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] ||
  die "not inside a Slurm allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST): run it from sbatch or salloc"
if [ -z "$K" ]; then
  K=${SLURM_NTASKS_PER_NODE:-}
  K=${K%%(*} # "2(x3)" when the count is per node already
  if [ -z "$K" ] && [ "${SLURM_GPUS_ON_NODE:-0}" -gt 0 ] 2>/dev/null; then K=$SLURM_GPUS_ON_NODE; fi
  K=${K:-1}
fi
[[ "$K" =~ ^[1-9][0-9]{0,4}$ ]] || die "--ranks-per-node '$K': a count of ranks"
export TIDE_LEAVE_SIGNAL=${TIDE_LEAVE_SIGNAL:-USR1}

NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST") || die "cannot expand '$SLURM_JOB_NODELIST'"
GRES=()
if [ "${SLURM_GPUS_ON_NODE:-0}" -gt 0 ] 2>/dev/null; then GRES=(--gres "gpu:$SLURM_GPUS_ON_NODE"); fi

LEAVING=0
PIDS=()
# the notice reaches the pools through their srun (which passes SIGUSR1 to mpirun, which
# passes it to the ranks); a second notice is passed on too (harmless: a pool leaves once)
on_usr1() {
  LEAVING=1
  echo "tide-slurm-pools: SIGUSR1 (Slurm takes job $SLURM_JOB_ID's nodes soon): the pools leave the job"
  [ ${#PIDS[@]} -eq 0 ] || kill -USR1 "${PIDS[@]}" 2>/dev/null || true
}
on_term() {
  echo "tide-slurm-pools: SIGTERM: stopping the pools"
  [ ${#PIDS[@]} -eq 0 ] || kill -TERM "${PIDS[@]}" 2>/dev/null || true
}
trap on_usr1 USR1
trap on_term TERM

PN='%n' PJ='%j'
for n in $NODES; do
  args=("${@//"$PN"/$n}")
  args=("${args[@]//"$PJ"/$SLURM_JOB_ID}")
  # no --exact: the step gets every CPU of its node (ranks share them); --mpi=none:
  # mpirun starts the ranks itself, whatever the site's MpiDefault
  srun --nodes 1 --ntasks 1 --nodelist "$n" --mpi=none --kill-on-bad-exit=0 "${GRES[@]}" \
    mpirun --host "$n:$K" -np "$K" "${args[@]}" &
  PIDS+=($!)
done
echo "tide-slurm-pools: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): a pool of $K ranks on each of $(echo $NODES)"

# wait for every step; `wait PID` returns early when a trapped signal arrives, so ask again
RC=0
for p in "${PIDS[@]}"; do
  while kill -0 "$p" 2>/dev/null; do wait "$p"; done
  wait "$p" # its own status (bash keeps it once reaped)
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$RC" -eq 0 ]; then RC=$rc; fi
done
if [ "$LEAVING" -eq 1 ] && [ "$REQUEUE" -eq 1 ]; then
  echo "tide-slurm-pools: every pool left; requeueing job $SLURM_JOB_ID so that it joins again when it restarts"
  scontrol requeue "$SLURM_JOB_ID" || echo "tide-slurm-pools: scontrol requeue $SLURM_JOB_ID failed (sbatch --requeue?)"
fi
exit "$RC"
