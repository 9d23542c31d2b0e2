#!/usr/bin/env bash
# tidectl timeline and the event queries against a real job: train_mlp --tide on 8 ranks
# (dp 2, tp 2, pp 2) is resized to (dp 1, tp 2, pp 2), which leaves 4 GPUs idle; offline
# command jobs backfill them and an offline plugin fills the pipeline bubbles of the
# members. Checked, by reading the SVG's elements back (tests/timeline_check.py): a row per
# GPU of the job, generation 1 on all 8 and generation 2 on the 4 members with their
# coordinates, both ending or starting where the resize mark says, the backfill on the 4
# idle GPUs after the resize and the bubble work on members. And the queries: --job and
# --type select the resize's two events with their typed fields, --follow prints the
# offline assignments as they happen. The Chrome trace (-o FILE.json) holds the same.
# usage: test_timeline.sh BUILD_DIR PYTHON3 MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
PY=$2
shift 2
MPIRUN=("$@")
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN="$B/examples/train_mlp"
# shellcheck source=tided_lib.sh
. "$HERE/tided_lib.sh"
TL_LOGS="tided.log job.log"
tl_setup tide-timeline
note() { echo "-- $*"; }
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export TIDE_PLUGIN_DIR="$B/examples" TIDE_TASK_DIR="$WORK"

tl_tided "$B/coordinator/tided" "$B/coordinator/tidectl"

note "train_mlp --tide on 8 ranks (dp 2, tp 2, pp 2)"
"${MPIRUN[@]}" -np 8 "$TRAIN" --tide --endpoint "$EP" --job tl --dp 2 --tp 2 --pp 2 \
  --layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16 --micro-batches 4 \
  --seed 5 --lr 0.003 --steps 100000 --pace-ms 50 --print-every 1000 >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
# job_is GEN: the job runs generation GEN
job_is() {
  local row
  row=$(ctl jobs --json | grep -o '{"name":"tl"[^}]*}' || true)
  grep -q '"state":"running"' <<<"$row" && grep -q "\"gen\":$1[,}]" <<<"$row"
}
wait_gen() {
  for _ in $(seq 1200); do
    kill -0 "$JOB_PID" 2>/dev/null || fail "train_mlp exited"
    job_is "$1" && return 0
    sleep 0.1
  done
  fail "job tl did not run generation $1: $(ctl jobs --json)"
}
wait_gen 1
sleep 2
note "resize to (dp 1, tp 2, pp 2)"
ctl resize tl --dp 1 --tp 2 --pp 2 >/dev/null
wait_gen 2
sleep 1

ctl events --follow --json --type 'offline_*' >"$WORK/follow.jsonl" 2>"$WORK/follow.err" &
FOLLOW_PID=$!
tl_track $FOLLOW_PID
note "backfill: 4 offline commands for the idle GPUs, a plugin in the members' bubbles"
# the commands hold the 4 idle GPUs until the end: a plugin job may take an idle GPU as
# well as bubbles, and on a loaded machine a command that ended before the bubbles were
# measured left it one (ci60: fill-1 on an idle GPU, eval-4 where eval-1 had run)
for i in 1 2 3 4; do ctl submit --offline --name "eval-$i" -- sleep 600 >/dev/null; done
ctl submit --offline --name fill-1 --plugin tide_task_matmul --bubbles -- --n 64 \
  --rounds 1000000 --rows 2 >/dev/null
# bubbles are measured over a few steps first; a loaded machine takes its time (each
# tidectl call too: the wait is bounded in seconds, not in calls)
deadline=$((SECONDS + 150))
while [ $SECONDS -lt $deadline ]; do
  ev=$(ctl events --json --type offline_assigned --tail 100)
  [ "$(grep -c '"job":"eval-' <<<"$ev")" -ge 4 ] && grep -q '"job":"fill-1".*"bubbles":true' <<<"$ev" &&
    break
  sleep 0.1
done
grep -q '"job":"fill-1".*"bubbles":true' <<<"$ev" || fail "the plugin never ran in bubbles: $ev"
sleep 3 # the plugin fills some bubbles
kill "$FOLLOW_PID"
tl_wait "$FOLLOW_PID" 2>/dev/null || true

note "event queries"
rs=$(ctl events --job tl --type 'resize*' --json)
[ "$(wc -l <<<"$rs")" -eq 2 ] || fail "--job tl --type 'resize*' gave: $rs"
head -1 <<<"$rs" | grep -q '"kind":"resize_started".*"gen":2,"dp":1,"tp":2,"pp":2,"from_dp":2' ||
  fail "resize_started without its typed fields: $rs"
tail -1 <<<"$rs" | grep -q '"kind":"resized".*"gen":2,.*"workers":\[[0-9,]*\],.*"ms":' ||
  fail "resized without its typed fields: $rs"
ctl events --job nobody --json | grep -q . && fail "--job nobody listed events"
n=$(grep -c '"kind":"offline_assigned"' "$WORK/follow.jsonl" || true)
[ "$n" -ge 5 ] || fail "--follow printed $n offline_assigned events: $(cat "$WORK/follow.jsonl" "$WORK/follow.err")"
grep -v '"kind":"offline_' "$WORK/follow.jsonl" && fail "--follow --type 'offline_*' printed other kinds"
table=$(ctl events --tail 3)
[ "$(wc -l <<<"$table")" -eq 4 ] || fail "--tail 3: $table"

note "tidectl timeline tl -o tl.svg"
ctl timeline tl -o "$WORK/tl.svg" || fail "tidectl timeline"
ctl timeline tl -o "$WORK/tl.json" || fail "tidectl timeline -o FILE.json"
"$PY" "$HERE/timeline_check.py" "$WORK/tl.svg" "$WORK/tl.json" || fail "the picture: see above"
echo "PASS: timeline of a resized job with backfill and bubble work checked element by element;" \
  "event queries by job, type, tail and follow"
