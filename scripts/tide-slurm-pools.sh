#!/usr/bin/env bash
# tide-slurm-pools: run inside a Slurm batch job (or salloc) to launch one tide pool per
# allocated node: an srun step per node, each running one mpirun whose ranks all sit on
# that node. tide joins and releases launches one at a time, and Open MPI 4.1 connects
# only launches whose ranks run on their mpirun's own host (docs/multihost.md, "Growing a job"), so
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
# Shrinking gives nodes back: a pool that exits 0 while others still run (tide released
# it) has its node taken out of the allocation (`scontrol update NodeList=`), so the node
# goes idle; the batch script's own node stays until the allocation ends.
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
    -h | --help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
declare -A NODE_OF # pool pid -> its node
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
  NODE_OF[$!]=$n
done
echo "tide-slurm-pools: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): a pool of $K ranks on each of $(echo $NODES)"

# give_back NODE: a pool that tide released (it exited 0 while others still run) leaves its
# node idle in the allocation: the allocation shrinks to the nodes still in use, so Slurm
# can give NODE to other jobs. The batch script's own node (SLURMD_NODENAME) stays: the
# allocation cannot lose it, and it is given back when the allocation ends.
give_back() {
  local left=() p
  for p in "${PIDS[@]}"; do left+=("${NODE_OF[$p]}"); done
  if [ "$1" = "${SLURMD_NODENAME:-}" ]; then
    echo "tide-slurm-pools: the pool on $1 ended; $1 runs this batch script, so it stays in job $SLURM_JOB_ID until the job ends"
    return
  fi
  local keep
  keep=$(printf '%s\n' "${SLURMD_NODENAME:-}" "${left[@]}" | sed '/^$/d' | sort -u | paste -sd,)
  if scontrol update JobId="$SLURM_JOB_ID" NodeList="$keep"; then
    echo "tide-slurm-pools: the pool on $1 ended (tide released it, or the job ended); $1 given back (job $SLURM_JOB_ID keeps $keep)"
  else
    echo "tide-slurm-pools: the pool on $1 ended; giving $1 back failed (scontrol update JobId=$SLURM_JOB_ID NodeList=$keep)"
  fi
}

# wait for every pool, each as it ends; `wait -n` returns early when a trapped signal
# arrives (no pid then), so ask again
RC=0
while [ ${#PIDS[@]} -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${PIDS[@]}"
  rc=$?
  [ -n "${done_pid:-}" ] || continue # a trapped signal, not a pool
  rest=()
  for p in "${PIDS[@]}"; do [ "$p" = "$done_pid" ] || rest+=("$p"); done
  PIDS=(${rest[@]+"${rest[@]}"})
  if [ "$rc" -ne 0 ] && [ "$RC" -eq 0 ]; then RC=$rc; fi
  if [ "$rc" -eq 0 ] && [ "$LEAVING" -eq 0 ] && [ ${#PIDS[@]} -gt 0 ]; then give_back "${NODE_OF[$done_pid]}"; fi
done
if [ "$LEAVING" -eq 1 ] && [ "$REQUEUE" -eq 1 ]; then
  echo "tide-slurm-pools: every pool left; requeueing job $SLURM_JOB_ID so that it joins again when it restarts"
  scontrol requeue "$SLURM_JOB_ID" || echo "tide-slurm-pools: scontrol requeue $SLURM_JOB_ID failed (sbatch --requeue?)"
fi
exit "$RC"
