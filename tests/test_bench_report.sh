#!/usr/bin/env bash
# benchmarks/report over the canned results of tests/data/bench: it writes index.html and
# the four PNG plots, the page shows the numbers of every input file and links every
# plot, the inputs are kept under data/, each plot is drawn from its data (other numbers,
# another picture), and bad input is refused with a clear message.
#   usage: test_bench_report.sh SOURCE_DIR
set -euo pipefail
SRC=$1
REPORT="$SRC/benchmarks/report"
DATA="$SRC/tests/data/bench"
WORK=$(mktemp -d /tmp/tide-report.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() {
  echo "test_bench_report: FAIL: $*" >&2
  exit 1
}
if ! command -v gnuplot >/dev/null; then
  echo "test_bench_report: gnuplot not found (Debian gnuplot-nox, scripts/install-deps.sh): skipped" >&2
  exit "${TIDE_TEST_SKIP_RC:-77}"
fi
PY=$(command -v python3)

"$PY" "$REPORT" --in "$DATA" --out "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log" >&2; fail "report"; }
PAGE="$WORK/a/index.html"
[ -s "$PAGE" ] || fail "no index.html"
for plot in resize_downtime reshard_throughput cluster_sim bubble_fill; do
  png="$WORK/a/$plot.png"
  [ -s "$png" ] || fail "no $plot.png"
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$plot.png is not a PNG"
  [ "$(stat -c %s "$png")" -gt 5000 ] || fail "$plot.png is too small to hold a plot"
  grep -q "<img src=\"$plot.png\"" "$PAGE" || fail "the page does not show $plot.png"
done
# the numbers of each input, as the page's tables print them
for n in 61.4 2874.5 370.2 15909.6 "1/43.0" 128.0 1177.6 \
  1.342 1.678 1.500 \
  1.8 11.2 13.0 10.2 30.1 34.2 1024 10000 \
  8192 450 53.4 184.7 18.7 \
  83.7 1.80 12.35 12.12 "task 128x2 rows"; do
  grep -qF ">$n<" "$PAGE" || fail "the page lacks the number $n"
done
# a pair that sent nothing has no throughput to show
grep -qF '>TP 2-&gt;4<' "$PAGE" && fail "the page shows a layout pair that sent no bytes"
for f in "$DATA"/*.json; do
  cmp -s "$f" "$WORK/a/data/$(basename "$f")" || fail "data/$(basename "$f") is not the input"
done
# the plots come from the data: other downtimes, another resize plot; the rest alike
mkdir -p "$WORK/in2"
cp "$DATA"/*.json "$WORK/in2/"
sed -i 's/"downtime_ms":370.215/"downtime_ms":1370.215/' "$WORK/in2/resize_bench_large.json"
"$PY" "$REPORT" --in "$WORK/in2" --out "$WORK/b" >"$WORK/b.log" 2>&1 || { cat "$WORK/b.log" >&2; fail "report (2)"; }
grep -qF '>1370.2<' "$WORK/b/index.html" || fail "the second page lacks the changed downtime"
cmp -s "$WORK/a/resize_downtime.png" "$WORK/b/resize_downtime.png" &&
  fail "resize_downtime.png did not change with the downtime it plots"
cmp -s "$WORK/a/cluster_sim.png" "$WORK/b/cluster_sim.png" ||
  fail "cluster_sim.png changed though its data did not"
# the page it made, made again from its own data/
"$PY" "$REPORT" --in "$WORK/a/data" --out "$WORK/a" >"$WORK/c.log" 2>&1 || { cat "$WORK/c.log" >&2; fail "report --in OUT/data --out OUT"; }
grep -qF '>15909.6<' "$PAGE" || fail "the page made again from data/ lost its numbers"
# the load a --run recorded (data/report_run.json) is on the page, and kept with the data
echo '{"bench": "report_run", "cpus": 2, "start": "2026-12-03 17:00", "end": "2026-12-03 17:09",
 "load_start": [7.5, 6.25, 5.0], "load_end": [9.0, 8.0, 7.0]}' >"$WORK/in2/report_run.json"
"$PY" "$REPORT" --in "$WORK/in2" --out "$WORK/d" >"$WORK/d.log" 2>&1 || { cat "$WORK/d.log" >&2; fail "report (load)"; }
grep -qF 'load average (1, 5, 15 min) 7.50, 6.25, 5.00 at the start, 9.00, 8.00, 7.00 at the end' \
  "$WORK/d/index.html" || fail "the page does not show the load the run recorded"
cmp -s "$WORK/in2/report_run.json" "$WORK/d/data/report_run.json" || fail "data/report_run.json not kept"
grep -q 'load average' "$PAGE" && fail "a page made without --run claims a load average"
# bad input: a clear refusal, exit 2
mkdir -p "$WORK/bad"
echo '{"bench": "resize_bench", ' >"$WORK/bad/broken.json"
set +e
"$PY" "$REPORT" --in "$WORK/bad" --out "$WORK/c" >"$WORK/bad.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "broken.json: not a benchmark's JSON" "$WORK/bad.log" ||
  fail "a broken JSON file: exit $rc, $(cat "$WORK/bad.log")"
echo "test_bench_report: page, 4 plots and the numbers of $(ls "$DATA" | wc -l) result files ok"
