#!/usr/bin/env bash
# tided's live cluster page in a real browser (Debian's chromium, headless): tided with
# --metrics on a free 127.0.0.1 port, train_mlp --tide on 4 ranks (dp 2, pp 2). The page's
# DOM, as chromium renders it after its scripts polled /api/cluster, must show the job
# running with its layout and each of its GPUs with its role; after `tidectl resize --wait`
# to (dp 1, pp 2) it must show generation 2, the new layout, and two GPUs left idle. Also:
# the page and its data name no endpoint and no key, unknown paths are 404, other methods
# 405. Skips (exit 77) where chromium is not installed; CI installs it
# (scripts/install-deps.sh).
# usage: test_page.sh BUILD_DIR PYTHON3 MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
B=$1
PY=$2
shift 2
MPIRUN=("$@")
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium is not installed (apt-get install chromium; scripts/install-deps.sh does)"
  exit 77
fi
TIDECTL="$B/coordinator/tidectl"
TRAIN="$B/examples/train_mlp"
# shellcheck source=tided_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/tided_lib.sh"
TL_LOGS="tided.log job.log"
tl_setup tide-page
note() { echo "-- $*"; }
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
tl_tided "$B/coordinator/tided" "$TIDECTL" --metrics "127.0.0.1:$PORT"

# dom FILE: the page as chromium has it after ~3 s of (virtual) time: three polls
dom() {
  HOME="$WORK" timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu \
    --user-data-dir="$WORK/chromium" --virtual-time-budget=3000 --dump-dom "$URL/" \
    >"$1" 2>"$WORK/chromium.log" || { tail -5 "$WORK/chromium.log"; fail "chromium failed"; }
  grep -q 'data-loaded="1"' "$1" || fail "the page never loaded /api/cluster: $(grep -o 'id="conn"[^<]*' "$1")"
}
# job_row FILE: the job's row of the page's jobs table (its opening tag)
job_row() { grep -o '<tr data-job="pg"[^>]*>' "$1" || true; }
# gpus FILE: the job's GPU cells, one line each (their opening tags)
gpus() { grep -o '<div class="gpu online[^"]*" data-worker="[0-9]*" data-state="online" data-job="pg" data-role="[^"]*"' "$1" || true; }

note "train_mlp --tide on 4 ranks (dp 2, pp 2)"
"${MPIRUN[@]}" -np 4 "$TRAIN" --tide --endpoint "$EP" --job pg --dp 2 --tp 1 --pp 2 \
  --layers 4 --hidden 32 --ffn 64 --vocab 32 --seq 8 --global-batch 16 --micro-batches 4 \
  --seed 5 --lr 0.003 --steps 100000 --pace-ms 50 --print-every 1000 >"$WORK/job.log" 2>&1 &
JOB_PID=$!
tl_track $JOB_PID
for _ in $(seq 1200); do
  kill -0 "$JOB_PID" 2>/dev/null || fail "train_mlp exited"
  ctl jobs --json | grep -q '{"name":"pg","kind":"online","state":"running","gen":1,' && break
  sleep 0.1
done
ctl jobs --json | grep -q '{"name":"pg","kind":"online","state":"running","gen":1,' ||
  fail "job pg never ran generation 1: $(ctl jobs --json)"

note "the page in chromium: generation 1"
dom "$WORK/gen1.html"
row=$(job_row "$WORK/gen1.html")
grep -q 'data-state="running" data-gen="1" data-layout="2x1x2"' <<<"$row" ||
  fail "the page's row of pg: '$row'"
grep -q '>dp 2 · tp 1 · pp 2<' "$WORK/gen1.html" || fail "the page does not print pg's layout"
[ "$(gpus "$WORK/gen1.html" | wc -l)" -eq 4 ] || fail "GPUs of pg on the page: $(gpus "$WORK/gen1.html")"
for role in "s0 d0 t0" "s0 d1 t0" "s1 d0 t0" "s1 d1 t0"; do
  gpus "$WORK/gen1.html" | grep -q "data-role=\"$role\"" || fail "no GPU in role $role"
done
grep -q 'data-kind="layout"\|data-kind="job_created"' "$WORK/gen1.html" ||
  fail "the page lists no event of the job"

note "tidectl resize pg --dp 1 --pp 2 --wait"
ctl resize pg --dp 1 --tp 1 --pp 2 --wait >"$WORK/resize.out" 2>"$WORK/resize.err" ||
  fail "resize: $(cat "$WORK/resize.out" "$WORK/resize.err")"
! grep -q "waiting for generation" "$WORK/resize.err" ||
  fail "--wait wrote a progress line where stderr is not a terminal: $(cat "$WORK/resize.err")"
note "the page in chromium: generation 2"
dom "$WORK/gen2.html"
row=$(job_row "$WORK/gen2.html")
grep -q 'data-state="running" data-gen="2" data-layout="1x1x2"' <<<"$row" ||
  fail "after the resize, the page's row of pg: '$row'"
grep -q '>dp 1 · tp 1 · pp 2<' "$WORK/gen2.html" || fail "the page does not print the new layout"
[ "$(gpus "$WORK/gen2.html" | wc -l)" -eq 2 ] || fail "GPUs of pg after the resize: $(gpus "$WORK/gen2.html")"
n_idle=$(grep -o '<div class="gpu idle" data-worker="[0-9]*" data-state="idle"' "$WORK/gen2.html" | wc -l)
[ "$n_idle" -eq 2 ] || fail "$n_idle idle GPUs on the page after the resize, not 2"
grep -q 'data-kind="resized" data-job="pg"' "$WORK/gen2.html" || fail "the page lists no resized event"
# newest first: the resized event comes before the job's first layout
first=$(grep -o 'data-kind="[a-z_]*" data-job="pg"' "$WORK/gen2.html" | head -1)
[ "$first" != 'data-kind="job_created" data-job="pg"' ] || fail "events are oldest first"

note "no secret, only GET, unknown paths 404"
api=$(curl -sf "$URL/api/cluster") || fail "GET /api/cluster"
"$PY" -c 'import json,sys; d=json.load(sys.stdin); assert d["status"]["ompi_server"] == ""' <<<"$api" ||
  fail "/api/cluster is not JSON or names the rendezvous address: $api"
port_ep=${EP##*:}
echo "$api" >"$WORK/api.json"
for f in "$WORK/gen2.html" "$WORK/api.json"; do
  ! grep -q -- "$EP\|127.0.0.1:$port_ep" "$f" || fail "$f names tided's endpoint $EP"
done
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "$URL/nope")" = 404 ] || fail "GET /nope is not 404"
[ "$(code -X POST "$URL/")" = 405 ] || fail "POST / is not 405"
[ "$(code "$URL/metrics")" = 200 ] || fail "/metrics is gone"
csp=$(curl -s -D - -o /dev/null "$URL/" | tr -d '\r' | grep -i '^content-security-policy:') || fail "no CSP header"
grep -q "default-src 'none'" <<<"$csp" || fail "CSP allows loads: $csp"
note "tidectl resize --wait on a terminal: a progress line, cleared at the end"
script -qec "$TIDECTL --endpoint $EP --timeout-ms 20000 resize pg --dp 2 --tp 1 --pp 2 --wait" \
  /dev/null >"$WORK/tty.out" 2>&1 || fail "resize on a terminal: $(cat "$WORK/tty.out")"
grep -q "waiting for generation 3 of pg: [0-9.]* s" "$WORK/tty.out" ||
  fail "no progress line on a terminal: $(cat -v "$WORK/tty.out")"
grep -q "generation 3 committed after step" "$WORK/tty.out" ||
  fail "no commit line on a terminal: $(cat -v "$WORK/tty.out")"
echo "PASS: chromium showed pg at (dp 2, pp 2) on 4 GPUs, then at (dp 1, pp 2) on 2 after" \
  "tidectl resize --wait, with 2 GPUs idle and the resized event first"
