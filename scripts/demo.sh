#!/usr/bin/env bash
# The README's first command: installs dependencies, builds tide, then shows a training
# job resized live. It starts tided (embedded defaults, but on a free loopback port and
# a state file under demo-out/ so that it never clashes with another tided), launches
# `mpirun -np 8 train_mlp --tide` on host memory, resizes the job with tidectl
#   (dp 2, tp 2, pp 2) -> (dp 1, tp 4, pp 2) -> (dp 4, tp 1, pp 1) -> (dp 1, tp 2, pp 2)
# showing `tidectl status` after each switch, backfills the GPUs the last layout leaves
# idle with offline command jobs (`tidectl submit --offline`), fills the pipeline
# bubbles of the layout's members with offline plugin steps (`--plugin tide_task_matmul
# --bubbles`), and ends with the loss curve of this run next to a run of the same model
# that was never resized (bubble filling included, the losses are the same), and the
# job's timeline (`tidectl timeline`): demo-out/timeline.svg, the README's picture
# (docs/demo-timeline.svg is a copy). Everything it started is stopped on exit. About 2
# minutes once built.
#
# `demo.sh --hosts N` (N >= 2, root: network namespaces) instead runs the job on N hosts
# of a cluster made on this machine (scripts/cluster.sh, 1 Gbit/s links): CURVE keys from
# `tidectl keygen`, tided --auth on the bridge address, train_mlp --tide launched on h1
# and then on each further host by an mpirun of its own that joins the running job
# (docs/multihost.md, "Growing a job"), tensor parallelism inside each host and data parallelism
# across them, `tidectl status` showing the hosts, and a resize whose --dry-run says how
# many bytes cross hosts. Then host hN is lost (the job recovers onto the others) and a
# launch on a spare host h(N+1), started later, joins the job, which grows back onto it.
# The cluster is removed on exit.
set -euo pipefail
HOSTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=${2:-}; shift 2 || true ;;
    --hosts=*) HOSTS=${1#--hosts=}; shift ;;
    *) echo "usage: demo.sh [--hosts N]" >&2; exit 2 ;;
  esac
done
[[ "$HOSTS" =~ ^[0-9]+$ ]] && [ "$HOSTS" -ne 1 ] && [ "$HOSTS" -le 8 ] ||
  { echo "demo.sh: --hosts takes 2..8" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-deps.sh"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
echo "demo: building into $BUILD_DIR"
bash "$ROOT/scripts/build.sh" >/dev/null

OUT="${DEMO_OUT:-$ROOT/demo-out}"
mkdir -p "$OUT"
rm -f "$OUT"/endpoint "$OUT"/state.db* "$OUT"/*.txt "$OUT"/*.log "$OUT"/*.ckpt
TIDED="$BUILD_DIR/coordinator/tided"
TIDECTL="$BUILD_DIR/coordinator/tidectl"
TRAIN="$BUILD_DIR/examples/train_mlp"
JOB=mlp
STEPS=${DEMO_STEPS:-240}
MODEL=(--layers 4 --hidden 128 --ffn 512 --vocab 64 --seq 16 --global-batch 32
       --micro-batches 4 --steps "$STEPS" --lr 0.003 --seed 1234)

# Open MPI on one machine: shared memory, 8 ranks on however many cores there are.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
# Offline task plugins (libNAME.so) come from here; preempted ones save their state here.
export TIDE_PLUGIN_DIR="$BUILD_DIR/examples" TIDE_TASK_DIR="$OUT"
if [ "$(id -u)" -eq 0 ]; then MPIRUN+=(--allow-run-as-root); fi

TIDED_PID="" TRAIN_PID="" MORE_PIDS=""
cleanup() {
  for p in $TRAIN_PID $MORE_PIDS $TIDED_PID; do
    kill "$p" 2>/dev/null || true
  done
  for p in $TRAIN_PID $MORE_PIDS $TIDED_PID; do
    wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# ---- several hosts -----------------------------------------------------------------------
if [ "$HOSTS" -ge 2 ]; then
  CLUSTER="$ROOT/scripts/cluster.sh"
  if ! why=$(bash "$CLUSTER" check); then echo "demo: --hosts: $why"; exit 1; fi
  CNAME="" # cluster.sh picks a name no other cluster has (others may make theirs at once)
  cleanup_hosts() {
    cleanup
    if [ -n "$CNAME" ]; then bash "$CLUSTER" down --name "$CNAME" || true; fi
  }
  trap cleanup_hosts EXIT
  SPARE=h$((HOSTS + 1)) # a host that arrives later
  say "scripts/cluster.sh up $((HOSTS + 1)): $HOSTS hosts for the job and $SPARE for later, 1 Gbit/s uplinks"
  # shellcheck disable=SC1090 # the env file cluster.sh writes
  . "$(bash "$CLUSTER" up "$((HOSTS + 1))" --owner $$ --rate 1gbit)"
  CNAME=$TIDE_CLUSTER_NAME
  # launches that join a running job connect through an ompi-server (on the bridge)
  ompi-server --no-daemonize -r "$OUT/ompi.uri" --mca oob_tcp_if_include "$TIDE_CLUSTER_SUBNET" \
    >"$OUT/ompi-server.log" 2>&1 &
  MORE_PIDS="$MORE_PIDS $!"
  for _ in $(seq 100); do [ -s "$OUT/ompi.uri" ] && break; sleep 0.05; done
  echo "hosts: $TIDE_CLUSTER_HOSTS on $TIDE_CLUSTER_SUBNET; this machine is $TIDE_CLUSTER_ADDR"
  KEYS="$OUT/keys"
  rm -rf "$KEYS"
  say "tidectl keygen: tided's key pair, an admin key (ops), a worker key (job)"
  "$TIDECTL" keygen "$KEYS" --role server
  "$TIDECTL" keygen "$KEYS" --role admin --name ops
  "$TIDECTL" keygen "$KEYS" --role worker --name job >/dev/null
  "$TIDED" --endpoint "tcp://$TIDE_CLUSTER_ADDR:*" --endpoint-file "$OUT/endpoint" --auth "$KEYS" \
    --state "$OUT/state.db" --heartbeat-ms 200 --miss-limit 10 \
    --ompi-server "file:$OUT/ompi.uri" >"$OUT/tided.log" 2>&1 &
  TIDED_PID=$!
  for _ in $(seq 200); do [ -s "$OUT/endpoint" ] && break; sleep 0.05; done
  [ -s "$OUT/endpoint" ] || { echo "demo: tided did not start; see $OUT/tided.log"; exit 1; }
  EP="$(cat "$OUT/endpoint")"
  say "tided --auth $KEYS listening on $EP"
  ctl() { "$TIDECTL" --endpoint "$EP" --key "$KEYS/ops.key" --server-key "$KEYS/server.pub" "$@"; }
  # launch HOSTLIST NP LOG: train_mlp --tide on those hosts, mpirun on the first of them (as
  # on a cluster; a launch's first rank must be on mpirun's host for a later join), the
  # environment as flags (it does not reach the hosts' daemons)
  launch() {
    bash "$CLUSTER" exec "${1%%:*}" --name "$CNAME" \
      mpirun $TIDE_CLUSTER_MPI --oversubscribe --bind-to none --mca btl self,vader,tcp \
      --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 \
      --ompi-server "file:$OUT/ompi.uri" --enable-recovery --mca async_mpi_finalize 1 \
      --host "$1" -np "$2" -x TIDE_ENDPOINT="$EP" -x TIDE_KEY="$KEYS/job.key" \
      -x TIDE_SERVER_KEY="$KEYS/server.pub" "$TRAIN" --tide --job "$JOB" --dp "$(($2 / 4))" \
      --tp 4 "${MODEL[@]}" --steps 100000 --pace-ms 100 --print-every 20 >"$3.log" 2>"$3.err" &
  }
  # one launch per host, each joining the job started on h1 (a launch across hosts joins
  # or is joined only when tide-mpirun started it: docs/multihost.md, "Growing a job")
  say "on h1: mpirun --host h1:4 train_mlp --tide --dp 1 --tp 4 (log $OUT/train.log)"
  launch "h1:4" 4 "$OUT/train"
  TRAIN_PID=$!
  job_gen() { # the generation the job runs, or 0 while it is not running one
    local row
    row=$(ctl jobs --json 2>/dev/null | grep -o "{\"name\":\"$JOB\"[^}]*}" || true)
    if grep -q "\"state\":\"running\"" <<<"$row"; then
      sed -n 's/.*"gen":\([0-9]*\),.*/\1/p' <<<"$row"
    else
      echo 0
    fi
  }
  wait_running() { # until the job runs generation $1 or a later one
    for _ in $(seq 600); do
      kill -0 "$TRAIN_PID" 2>/dev/null || { echo "demo: train_mlp exited; see $OUT/train.err"; exit 1; }
      [ "$(job_gen)" -ge "$1" ] && return 0
      sleep 0.1
    done
    echo "demo: job $JOB did not run generation $1; see $OUT/train.err"; exit 1
  }
  wait_running 1
  for i in $(seq 2 "$HOSTS"); do
    g=$(job_gen)
    say "on h$i: the same program launched later joins the job; tidectl resize $JOB --dp $i --tp 4"
    launch "h$i:4" 4 "$OUT/train-h$i"
    MORE_PIDS="$MORE_PIDS $!"
    for _ in $(seq 600); do
      [ "$(ctl events --type pool_joined --tail 1000 2>/dev/null | grep -c pool_joined)" -ge $((i - 1)) ] && break
      sleep 0.1
    done
    ctl resize "$JOB" --dp "$i" --tp 4 >/dev/null
    wait_running $((g + 1))
  done
  sleep 3
  say "tidectl status: $((4 * HOSTS)) workers on $HOSTS hosts, each TP group inside one host"
  ctl status
  say "tidectl resize $JOB --dp 1 --tp 4 --pp $HOSTS --dry-run (what would cross hosts)"
  ctl resize "$JOB" --dp 1 --tp 4 --pp "$HOSTS" --dry-run
  say "tidectl resize $JOB --dp 1 --tp 4 --pp $HOSTS"
  ctl resize "$JOB" --dp 1 --tp 4 --pp "$HOSTS"
  wait_running 2
  sleep 3
  say "tidectl status (generation 2: one pipeline stage per host)"
  ctl status
  say "tidectl resize $JOB --dp $HOSTS --tp 4 --pp 1 (back: the stages cross the links)"
  ctl resize "$JOB" --dp "$HOSTS" --tp 4 --pp 1
  wait_running 3
  sleep 2
  ctl status
  g=$(job_gen)
  say "h$HOSTS loses power (scripts/cluster.sh kill-host h$HOSTS): the job recovers onto the others"
  bash "$CLUSTER" kill-host "h$HOSTS" --name "$CNAME"
  wait_running $((g + 1))
  sleep 2
  ctl status
  g=$(job_gen)
  say "a replacement host $SPARE arrives: the same program launched there joins the job"
  launch "$SPARE:4" 4 "$OUT/train-$SPARE"
  MORE_PIDS="$MORE_PIDS $!"
  for _ in $(seq 600); do
    [ "$(ctl events --type pool_joined --tail 1000 2>/dev/null | grep -c pool_joined)" -ge "$HOSTS" ] && break
    sleep 0.1
  done
  sleep 1
  ctl status
  say "tidectl resize $JOB --dp $HOSTS --tp 4: the job grows back onto $SPARE"
  ctl resize "$JOB" --dp "$HOSTS" --tp 4
  wait_running $((g + 1))
  sleep 3
  ctl status
  say "tidectl events: the lost host, the recovery, the join and the grow"
  ctl events --tail 1000 | grep "worker_failed\|recover\|pool_\|join_\|resized" | head -12 || true
  grep "generation\|joined" "$OUT/train.log" || true
  say "tidectl timeline $JOB -o $OUT/timeline.svg (a row per GPU, grouped by host)"
  ctl timeline "$JOB" -o "$OUT/timeline.svg"
  say "done: tided, the job and the $((HOSTS + 1)) hosts are stopped on exit"
  exit 0
fi

# ---- tided -------------------------------------------------------------------------------
"$TIDED" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$OUT/endpoint" \
  --state "$OUT/state.db" >"$OUT/tided.log" 2>&1 &
TIDED_PID=$!
for _ in $(seq 200); do [ -s "$OUT/endpoint" ] && break; sleep 0.05; done
[ -s "$OUT/endpoint" ] || { echo "demo: tided did not start; see $OUT/tided.log"; exit 1; }
EP="$(cat "$OUT/endpoint")"
ctl() { "$TIDECTL" --endpoint "$EP" "$@"; }
say "tided is listening on $EP (state $OUT/state.db, log $OUT/tided.log)"

# ---- the training job ----------------------------------------------------------------------
say "mpirun -np 8 train_mlp --tide --dp 2 --tp 2 --pp 2 (host memory, log $OUT/train.log)"
"${MPIRUN[@]}" -np 8 "$TRAIN" --tide --endpoint "$EP" --job "$JOB" --dp 2 --tp 2 --pp 2 \
  "${MODEL[@]}" --pace-ms 100 --print-every 20 --loss-out "$OUT/loss-resized.txt" \
  >"$OUT/train.log" 2>"$OUT/train.err" &
TRAIN_PID=$!

shown=0
show_train() { # the training output printed since the last call
  local n
  n=$(wc -l <"$OUT/train.log")
  if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$OUT/train.log"; fi
  shown=$n
}
alive() {
  kill -0 "$TRAIN_PID" 2>/dev/null || {
    echo "demo: train_mlp exited early; its errors:"; tail -20 "$OUT/train.err"; exit 1
  }
}
job_field() { # job_field NAME -> the job's field from `tidectl jobs --json` (numbers only)
  ctl jobs --json 2>/dev/null | grep -o "{\"name\":\"$JOB\"[^}]*}" | grep -o "\"$1\":[0-9]*" |
    head -1 | cut -d: -f2
}
wait_gen() { # wait_gen G MIN_STEPS: until the job runs generation G and has done MIN_STEPS more
  local g=$1 more=$2 start="" step
  for _ in $(seq 1200); do
    alive
    if [ "$(job_field gen)" = "$g" ] && ctl jobs --json | grep -q "\"name\":\"$JOB\",[^}]*\"state\":\"running\""; then
      step=$(job_field step)
      [ -n "$start" ] || start=$step
      [ "$step" -ge $((start + more)) ] && return 0
    fi
    sleep 0.1
  done
  echo "demo: job $JOB did not reach generation $g; see $OUT/train.err"; exit 1
}

wait_gen 1 25
show_train
say "tidectl status"
ctl status
ctl jobs

gen=1
for target in "1 4 2" "4 1 1" "1 2 2"; do
  read -r dp tp pp <<<"$target"
  gen=$((gen + 1))
  say "tidectl resize $JOB --dp $dp --tp $tp --pp $pp"
  ctl resize "$JOB" --dp "$dp" --tp "$tp" --pp "$pp"
  wait_gen "$gen" 25
  show_train
  say "tidectl status (generation $gen)"
  ctl status
done

# ---- backfill the idle GPUs with offline work -------------------------------------------
idle=$(ctl status --json | grep -o '"state":"idle"' | wc -l)
say "tidectl submit --offline: $idle offline command jobs for the $idle idle GPUs"
for i in $(seq "$idle"); do
  ctl submit --offline --name "eval-$i" -- sh -c \
    'echo "offline job $TIDE_OFFLINE_JOB running on device $TIDE_OFFLINE_DEVICE"; exec sleep 600'
done
for _ in $(seq 100); do
  [ "$(ctl status --json | grep -o '"state":"offline"' | wc -l)" -ge "$idle" ] && break
  sleep 0.1
done
say "tidectl status (offline work backfills the idle GPUs)"
ctl status

# ---- fill the pipeline bubbles of the members --------------------------------------------
members=$(ctl status --json | grep -o '"state":"online"' | wc -l)
say "tidectl submit --offline --plugin tide_task_matmul --bubbles: $members jobs for the bubbles of the $members members"
for i in $(seq "$members"); do
  ctl submit --offline --name "fill-$i" --plugin tide_task_matmul --bubbles -- \
    --n 128 --rounds 1000000 --rows 2
done
ctl jobs

say "waiting for train_mlp to finish its $STEPS steps"
wait "$TRAIN_PID" || { echo "demo: train_mlp failed; see $OUT/train.err"; TRAIN_PID=""; exit 1; }
TRAIN_PID=""
show_train

say "tidectl timeline $JOB -o $OUT/timeline.svg (a row per GPU: layouts, resizes, backfill)"
ctl timeline "$JOB" -o "$OUT/timeline.svg"

# ---- the never-resized run and the loss table ---------------------------------------------
say "reference: the same model never resized (standalone mpirun -np 8 train_mlp --dp 2 --tp 2 --pp 2)"
"${MPIRUN[@]}" -np 8 "$TRAIN" --dp 2 --tp 2 --pp 2 "${MODEL[@]}" --print-every 100000 \
  --loss-out "$OUT/loss-reference.txt" >"$OUT/reference.log" 2>&1 ||
  { echo "demo: reference run failed; see $OUT/reference.log"; exit 1; }
tail -1 "$OUT/reference.log"

say "loss per step: resized live vs never resized (every $((STEPS / 16)) steps and around each switch)"
switches=$(grep -o 'from step [0-9]*' "$OUT/train.log" | awk '{print $3}' | tr '\n' ' ')
awk -v every=$((STEPS / 16)) -v sw="$switches" '
  BEGIN { n = split(sw, s, " "); for (i = 1; i <= n; i++) { mark[s[i] - 1] = 1; mark[s[i]] = "switch" } }
  NR == FNR { ref[$1] = $2; next }
  {
    res[$1] = $2; steps++
    d = ($2 - ref[$1]) / ref[$1]; if (d < 0) d = -d; if (d > worst) worst = d
    if ($1 % every == 0 || ($1 in mark)) rows[++nr] = $1
  }
  END {
    printf "%6s  %14s  %14s\n", "step", "loss resized", "loss reference"
    for (i = 1; i <= nr; i++)
      printf "%6d  %14.6f  %14.6f%s\n", rows[i], res[rows[i]], ref[rows[i]],
             mark[rows[i]] == "switch" ? "   <- new layout" : ""
    printf "%d steps in both runs; largest relative difference %.2e\n", steps, worst
  }' "$OUT/loss-reference.txt" "$OUT/loss-resized.txt"
say "demo done: outputs in $OUT"
