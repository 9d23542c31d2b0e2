#!/usr/bin/env bash
# Fuzzes tide's decoders: builds proto/fuzz_decode (every message and every record: what
# tided stores, the checkpoint manifest and checksum files), proto/fuzz_legacy (the
# readers of tided's schema-1 state texts) and ckpt/fuzz_manifest (a MANIFEST's reader,
# both formats, past their seals) with clang, libFuzzer and ASan/UBSan into BUILD_DIR
# (default build-fuzz/), writes a seed corpus of valid encoded messages of every type plus
# a dictionary of their keys, and runs fuzz_decode for FUZZ_SECONDS (default 60, or the
# first argument), then each other target for a third of that (at least 5 s). Exits
# non-zero on any crash, leak, sanitizer report or timeout; the input that did it is left
# in BUILD_DIR/fuzz-artifacts/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-fuzz}"
SECS="${1:-${FUZZ_SECONDS:-60}}"
JOBS="${JOBS:-$(nproc)}"

CC=clang cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTIDE_FUZZ=ON -DTIDE_SANITIZE=ON -DTIDE_CUDA=OFF -DTIDE_BUILD_TESTS=OFF \
  -DTIDE_BUILD_BENCHMARKS=OFF -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz_decode fuzz_legacy fuzz_manifest proto_corpus \
  tide-ckpt

SEEDS="$BUILD_DIR/fuzz-seeds"
WORK="$BUILD_DIR/fuzz-corpus"      # grows across runs: new coverage found is kept
ART="$BUILD_DIR/fuzz-artifacts/"
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$WORK" "$ART"
"$BUILD_DIR/tests/support/proto_corpus" "$SEEDS" 8 "$BUILD_DIR/proto.dict"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
"$BUILD_DIR/proto/fuzz_decode" -max_total_time="$SECS" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -dict="$BUILD_DIR/proto.dict" -artifact_prefix="$ART" \
  -print_final_stats=1 "$WORK" "$SEEDS"

# the schema-1 texts as tided wrote them, behind the byte that picks their reader
LSEEDS="$BUILD_DIR/fuzz-legacy-seeds"
LWORK="$BUILD_DIR/fuzz-legacy-corpus"
rm -rf "$LSEEDS"
mkdir -p "$LSEEDS" "$LWORK"
printf '\x00%s' '2 1 2 6 4|0 2 6|0 1 2 3' >"$LSEEDS/layout"
printf '\x01%s' 'pool-a 4 1;pool-b 2 2 7;pool-c 2 0' >"$LSEEDS/pools"
printf '\x09%s' 'pool-a' >"$LSEEDS/pool-bare"
printf '\x02%s' $'dp_micro 16 the global batch\ntp 8 attention heads\npp 4611686018427387904\n' \
  >"$LSEEDS/fit"
printf '\x03%s' $'60\t/ck/train/step-000000000060\n100\t/ck/a b/step-000000000100\n' \
  >"$LSEEDS/ckpts"
printf '\x04python3\x00eval.py\x00--data=a b\x00\x00' >"$LSEEDS/argv"
LSECS=$(( SECS / 3 > 5 ? SECS / 3 : 5 ))
"$BUILD_DIR/proto/fuzz_legacy" -max_total_time="$LSECS" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$ART" -print_final_stats=1 "$LWORK" "$LSEEDS"

# manifests: the body of the format-1 fixture (the harness frames it) and the format-2
# manifest tide-ckpt writes converting it, behind the byte that picks the format
MSEEDS="$BUILD_DIR/fuzz-manifest-seeds"
MWORK="$BUILD_DIR/fuzz-manifest-corpus"
rm -rf "$MSEEDS" "$BUILD_DIR/fuzz-ckpt"
mkdir -p "$MSEEDS" "$MWORK"
V1="$ROOT/tests/data/ckpt-v1/step-000000000042"
N=$(stat -c %s "$V1/MANIFEST")
{ printf '\x01'; head -c $((N - 8)) "$V1/MANIFEST" | tail -c +13; } >"$MSEEDS/v1"
"$BUILD_DIR/ckpt/tide-ckpt" convert "$V1" "$BUILD_DIR/fuzz-ckpt" --dp 1 --tp 2 --pp 1 >/dev/null
{ printf '\x00'; cat "$BUILD_DIR/fuzz-ckpt/step-000000000042/MANIFEST"; } >"$MSEEDS/v2"
for f in "$SEEDS"/ckpt_manifest-*; do { printf '\x00'; cat "$f"; } >"$MSEEDS/${f##*/}"; done
"$BUILD_DIR/ckpt/fuzz_manifest" -max_total_time="$LSECS" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -dict="$BUILD_DIR/proto.dict" -artifact_prefix="$ART" \
  -print_final_stats=1 "$MWORK" "$MSEEDS"
echo "fuzz.sh: ${SECS}s + 2 x ${LSECS}s of fuzzing found no crash, leak or sanitizer report"
