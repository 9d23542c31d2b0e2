#!/usr/bin/env bash
# Fuzzes the proto decoder: builds proto/fuzz_decode with clang, libFuzzer and
# ASan/UBSan into BUILD_DIR (default build-fuzz/), writes a seed corpus of valid
# encoded messages of every type plus a dictionary of their keys, and runs the
# fuzzer for FUZZ_SECONDS (default 60, or the first argument). Exits non-zero on
# any crash, leak, sanitizer report or timeout; the input that did it is left in
# BUILD_DIR/fuzz-artifacts/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-fuzz}"
SECS="${1:-${FUZZ_SECONDS:-60}}"
JOBS="${JOBS:-$(nproc)}"

CC=clang cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTIDE_FUZZ=ON -DTIDE_SANITIZE=ON -DTIDE_CUDA=OFF -DTIDE_BUILD_TESTS=OFF \
  -DTIDE_BUILD_BENCHMARKS=OFF -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz_decode proto_corpus

SEEDS="$BUILD_DIR/fuzz-seeds"
WORK="$BUILD_DIR/fuzz-corpus"      # grows across runs: new coverage found is kept
ART="$BUILD_DIR/fuzz-artifacts/"
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$WORK" "$ART"
"$BUILD_DIR/proto/proto_corpus" "$SEEDS" 8 "$BUILD_DIR/proto.dict"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
"$BUILD_DIR/proto/fuzz_decode" -max_total_time="$SECS" -max_len=65536 -timeout=10 \
  -rss_limit_mb=2048 -dict="$BUILD_DIR/proto.dict" -artifact_prefix="$ART" \
  -print_final_stats=1 "$WORK" "$SEEDS"
echo "fuzz.sh: ${SECS}s of fuzzing found no crash, leak or sanitizer report"
