#!/usr/bin/env bash
# End-to-end checkpoints through the real programs (train_mlp under mpirun, tide-ckpt):
#  1. a run in (2, 2, 2) saves every 4 steps (asynchronously) up to step 8;
#  2. a resumed run whose save crashes mid-way (TIDE_CKPT_FAULT=shards:1: every writer
#     _exits after its first shard) leaves step 8 the newest complete checkpoint;
#  3. tide-ckpt verify passes; tide-ckpt convert into (1, 2, 4; uneven stages) gives
#     shard files byte-identical to those a job resumed in that layout saves again, and
#     runs resumed from either continue with identical losses;
#  4. a bit-flipped shard of step 8 is refused naming the file and the run resumes from
#     step 4; tide-ckpt verify names the file and fails;
#  5. elastic mode (libtide's tide_checkpoint_every under tided): a --tide run in
#     (2, 2, 2) checkpoints every 3 steps asynchronously; a --tide job resumes from it in
#     (1, 4, 2) and a standalone one in (4, 1, 2).
# Usage: test_ckpt_resume.sh TRAIN_MLP TIDE_CKPT TIDED MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
TRAIN=$1 TOOL=$2 TIDED=$3
shift 3
MPI=("$@")
W=$(mktemp -d /tmp/tide-ckpt-e2e-XXXXXX)
TIDED_PID=
cleanup() {
  [ -z "$TIDED_PID" ] || kill "$TIDED_PID" 2>/dev/null || true
  [ -z "$TIDED_PID" ] || wait "$TIDED_PID" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
COMMON=(--layers 6 --print-every 100)
fail() { echo "FAIL: $*"; exit 1; }

"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 2 --tp 2 --pp 2 --steps 8 --ckpt-every 4 \
  --ckpt-save "$W/R" > "$W/a.log" 2>&1 || { cat "$W/a.log"; fail "first run"; }
[ -f "$W/R/step-000000000004/MANIFEST" ] && [ -f "$W/R/step-000000000008/MANIFEST" ] ||
  fail "checkpoints 4 and 8 not published: $(ls -R "$W/R")"

# 2. a crash in the middle of a save
if TIDE_CKPT_FAULT=shards:1 "${MPI[@]}" -x TIDE_CKPT_FAULT -np 8 "$TRAIN" "${COMMON[@]}" \
  --dp 2 --tp 2 --pp 2 --steps 12 --ckpt-every 2 --no-ckpt-async --resume "$W/R" \
  --ckpt-save "$W/R" > "$W/crash.log" 2>&1; then
  cat "$W/crash.log"; fail "the run with an injected crash succeeded"
fi
grep -q "TIDE_CKPT_FAULT=shards:1: exiting" "$W/crash.log" || { cat "$W/crash.log"; fail "no crash"; }
[ -d "$W/R/step-000000000010" ] || fail "the crashed save left no trace (was it reached?)"
[ ! -f "$W/R/step-000000000010/MANIFEST" ] || fail "the crashed save was published"
"$TOOL" info "$W/R" > "$W/info.log" || fail "tide-ckpt info"
grep -q "step 8$" "$W/info.log" || { cat "$W/info.log"; fail "newest is not step 8"; }

# 3. verify, convert, and the same layout loaded by a job
"$TOOL" verify "$W/R" || fail "verify"
"$TOOL" convert "$W/R" "$W/C" --dp 1 --tp 2 --pp 4 --stages 0-0,1-2,3-3,4-5 || fail "convert"
"$TOOL" verify "$W/C" || fail "verify of the converted checkpoint"
NEW=(--dp 1 --tp 2 --pp 4 --stages 0-0,1-2,3-3,4-5)
"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" "${NEW[@]}" --steps 8 --resume "$W/R" \
  --ckpt-save "$W/L" > "$W/l.log" 2>&1 || { cat "$W/l.log"; fail "resave in the new layout"; }
n=0
for f in "$W/C/step-000000000008"/shard-*.bin; do
  cmp "$f" "$W/L/step-000000000008/$(basename "$f")" || fail "$(basename "$f") differs"
  n=$((n + 1))
done
[ "$n" -eq 8 ] || fail "expected 8 shard files in (1, 2, 4), found $n"
for src in R C; do
  "${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" "${NEW[@]}" --steps 12 --resume "$W/$src" \
    --loss-out "$W/loss-$src.txt" > "$W/r-$src.log" 2>&1 || { cat "$W/r-$src.log"; fail "resume $src"; }
  grep -q "resumed at step 8" "$W/r-$src.log" || fail "resume $src did not start at step 8"
done
cmp "$W/loss-R.txt" "$W/loss-C.txt" || fail "losses after convert differ from a direct load"
[ "$(wc -l < "$W/loss-R.txt")" -eq 4 ] || fail "expected 4 resumed steps"

# 4. a corrupted shard: refused naming the file; the run falls back to step 4
shard="$W/R/step-000000000008/shard-p1-d0-t1.bin"
printf '\x5a' | dd of="$shard" bs=1 seek=4096 conv=notrunc status=none
if "$TOOL" verify "$W/R" > "$W/v.log" 2>&1; then fail "verify passed a flipped byte"; fi
grep -q "shard-p1-d0-t1.bin is corrupted" "$W/v.log" || { cat "$W/v.log"; fail "verify message"; }
"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 4 --tp 1 --pp 2 --steps 6 --resume "$W/R" \
  > "$W/fb.log" 2>&1 || { cat "$W/fb.log"; fail "fallback run"; }
grep -q "shard-p1-d0-t1.bin is corrupted" "$W/fb.log" || { cat "$W/fb.log"; fail "no refusal"; }
grep -q "resumed at step 4" "$W/fb.log" || { cat "$W/fb.log"; fail "no fallback to step 4"; }

# 5. elastic mode
"$TIDED" --endpoint 'tcp://127.0.0.1:*' --endpoint-file "$W/endpoint" --state "$W/state.db" \
  --heartbeat-ms 100 --miss-limit 50 > "$W/tided.log" 2>&1 &
TIDED_PID=$!
for _ in $(seq 100); do [ -s "$W/endpoint" ] && break; sleep 0.1; done
[ -s "$W/endpoint" ] || fail "tided did not start"
E=$(cat "$W/endpoint")
"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --tide --endpoint "$E" --job ck1 --dp 2 --tp 2 --pp 2 \
  --steps 7 --ckpt-every 3 --ckpt-save "$W/T" > "$W/t.log" 2>&1 || { cat "$W/t.log"; fail "--tide run"; }
for s in 3 6 7; do
  [ -f "$W/T/step-00000000000$s/MANIFEST" ] || { ls -R "$W/T"; fail "--tide: step $s not published"; }
done
"$TOOL" verify "$W/T/step-000000000006" || fail "verify of libtide's checkpoint"
"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --tide --endpoint "$E" --job ck2 --dp 1 --tp 4 --pp 2 \
  --steps 10 --resume "$W/T" > "$W/t2.log" 2>&1 || { cat "$W/t2.log"; fail "--tide resume"; }
grep -q "resumed at step 7" "$W/t2.log" || { cat "$W/t2.log"; fail "--tide resume step"; }
grep -q "10 steps done" "$W/t2.log" || { cat "$W/t2.log"; fail "--tide resumed run did not finish"; }
"${MPI[@]}" -np 8 "$TRAIN" "${COMMON[@]}" --dp 4 --tp 1 --pp 2 --steps 9 \
  --resume "$W/T/step-000000000006" > "$W/t3.log" 2>&1 || { cat "$W/t3.log"; fail "standalone resume"; }
grep -q "resumed at step 6" "$W/t3.log" || { cat "$W/t3.log"; fail "standalone resume step"; }
echo "PASS test_ckpt_resume"
