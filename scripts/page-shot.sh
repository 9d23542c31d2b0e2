#!/usr/bin/env bash
# Makes docs/live-page.png: tided's live cluster page (tided --metrics; GET /) during a job
# like the demo's (train_mlp --tide on 8 ranks at dp 2, tp 2, pp 2, resized to dp 1, its
# 4 freed GPUs backfilled by offline commands and its pipeline bubbles by an offline
# plugin), photographed by headless chromium at 1280x800.
# usage: scripts/page-shot.sh [BUILD_DIR (build)] [OUT.png (docs/live-page.png)]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B=$(realpath "${1:-$ROOT/build}")
OUT=$(realpath -m "${2:-$ROOT/docs/live-page.png}")
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "page-shot: chromium is not installed (apt-get install chromium)" >&2; exit 1; }
for t in coordinator/tided coordinator/tidectl examples/train_mlp; do
  [ -x "$B/$t" ] || { echo "page-shot: no $B/$t: build first (scripts/build.sh)" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/tide-page-shot.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { echo "page-shot: $*"; }
MPIRUN=(mpirun --oversubscribe --bind-to none)
if [ "$(id -u)" -eq 0 ]; then MPIRUN+=(--allow-run-as-root); fi
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export TIDE_PLUGIN_DIR="$B/examples" TIDE_TASK_DIR="$WORK"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$B/coordinator/tided" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$WORK/endpoint" \
  --state "$WORK/state.db" --metrics "127.0.0.1:$PORT" >"$WORK/tided.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/endpoint" ] && break; sleep 0.1; done
EP=$(cat "$WORK/endpoint")
ctl() { "$B/coordinator/tidectl" --endpoint "$EP" --timeout-ms 20000 "$@"; }

say "train_mlp --tide on 8 ranks (dp 2, tp 2, pp 2)"
"${MPIRUN[@]}" -np 8 "$B/examples/train_mlp" --tide --endpoint "$EP" --job mlp --dp 2 --tp 2 \
  --pp 2 --layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16 \
  --micro-batches 4 --seed 5 --lr 0.003 --steps 100000 --pace-ms 50 --print-every 1000 \
  >"$WORK/job.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do
  ctl jobs --json | grep -q '{"name":"mlp","kind":"online","state":"running"' && break
  sleep 0.2
done
sleep 3
say "tidectl resize mlp --dp 1 --tp 2 --pp 2 --wait"
ctl resize mlp --dp 1 --tp 2 --pp 2 --wait >/dev/null
say "backfill: offline commands on the freed GPUs, a plugin in the members' bubbles"
for i in 1 2 3; do ctl submit --offline --name "eval-$i" -- sleep 600 >/dev/null; done
if [ -e "$B/examples/libtide_task_matmul.so" ]; then
  ctl submit --offline --name fill --plugin tide_task_matmul --bubbles -- --n 64 \
    --rounds 1000000 --rows 2 >/dev/null
fi
sleep 8 # assignments, a few steps of throughput and bubbles measured
say "chromium --headless --screenshot=$OUT --window-size=1280,800"
mkdir -p "$(dirname "$OUT")"
HOME="$WORK" timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$WORK/chromium" --virtual-time-budget=3000 --window-size=1280,800 \
  --screenshot="$OUT" "http://127.0.0.1:$PORT/" >"$WORK/chromium.log" 2>&1 ||
  { tail -5 "$WORK/chromium.log" >&2; exit 1; }
say "wrote $OUT"
