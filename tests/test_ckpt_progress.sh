#!/usr/bin/env bash
# tide-ckpt verify and convert show a progress line on a terminal and nothing more
# otherwise: run under script(1) (util-linux) for a pseudo-terminal, the typescript holds
# the redrawn "verify: ... (100%)" / "convert: ... shard K of N" lines, each erased
# before the result line; into a file, stderr stays empty and stdout is the one result
# line it always was.
#   usage: test_ckpt_progress.sh TRAIN_MLP TIDE_CKPT MPIRUN [MPIRUN FLAGS...]
set -euo pipefail
TRAIN=$1 CKPT=$2
shift 2
MPIRUN=("$@")
WORK=$(mktemp -d /tmp/tide-progress.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() {
  echo "test_ckpt_progress: FAIL: $*" >&2
  for f in "$WORK"/*.out "$WORK"/*.err "$WORK"/*.tty; do
    [ -f "$f" ] && { echo "--- $f"; cat -v "$f" | tail -n 20; } >&2
  done
  exit 1
}
command -v script >/dev/null || fail "script (util-linux) is not installed"

"${MPIRUN[@]}" -np 1 "$TRAIN" --steps 2 --layers 4 --hidden 128 --ckpt-save "$WORK/ck" \
  >"$WORK/train.out" 2>&1 || fail "train_mlp --ckpt-save"

# Not a terminal: one line on stdout, nothing on stderr.
"$CKPT" verify "$WORK/ck" >"$WORK/verify.out" 2>"$WORK/verify.err" || fail "tide-ckpt verify"
[ ! -s "$WORK/verify.err" ] || fail "tide-ckpt verify into a file wrote to stderr"
[ "$(wc -l <"$WORK/verify.out")" -eq 1 ] &&
  grep -qE '^checkpoint .*/step-0+2 \(step 2\): 1 shard files, every checksum matches \([0-9]+ ms\)$' \
    "$WORK/verify.out" || fail "tide-ckpt verify's output changed"
"$CKPT" convert "$WORK/ck" "$WORK/conv" --dp 2 >"$WORK/convert.out" 2>"$WORK/convert.err" ||
  fail "tide-ckpt convert"
[ ! -s "$WORK/convert.err" ] || fail "tide-ckpt convert into a file wrote to stderr"
[ "$(wc -l <"$WORK/convert.out")" -eq 1 ] &&
  grep -qE '^converted .* into .*/conv/step-0+2 \(.*\) in [0-9]+ ms$' "$WORK/convert.out" ||
  fail "tide-ckpt convert's output changed"
rm -rf "$WORK/conv"

# A terminal: the progress lines, then the result after the erased line.
script -qec "'$CKPT' verify '$WORK/ck'" "$WORK/verify.tty" >/dev/null </dev/null ||
  fail "tide-ckpt verify on a terminal"
grep -qaE 'verify: [0-9.]+ of [0-9.]+ MiB \(100%\), [0-9]+ MiB/s' "$WORK/verify.tty" ||
  fail "tide-ckpt verify on a terminal shows no progress line reaching 100%"
grep -qaF $'\r\033[Kcheckpoint ' "$WORK/verify.tty" ||
  fail "the progress line is not erased before verify's result"
script -qec "'$CKPT' convert '$WORK/ck' '$WORK/conv' --dp 2" "$WORK/convert.tty" >/dev/null </dev/null ||
  fail "tide-ckpt convert on a terminal"
grep -qaE 'convert: 0\.0 of [0-9.]+ MiB \(0%\), shard 1 of 2' "$WORK/convert.tty" &&
  grep -qaE 'convert: [0-9.]+ of [0-9.]+ MiB \(100%\), 2 shards' "$WORK/convert.tty" ||
  fail "tide-ckpt convert on a terminal shows no progress from shard 1 of 2 to 100%"
grep -qaF $'\r\033[Kconverted ' "$WORK/convert.tty" ||
  fail "the progress line is not erased before convert's result"
"$CKPT" verify "$WORK/conv" >/dev/null 2>&1 || fail "the converted checkpoint does not verify"
echo "test_ckpt_progress: progress lines on a terminal, output unchanged into files"
