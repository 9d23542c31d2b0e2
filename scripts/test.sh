#!/usr/bin/env bash
# The README's test command: installs dependencies, builds tide, and runs every
# test label (unit, mpi, gpu, slow). GPU tests skip themselves without a GPU.
# TIDE_SANITIZE=1 builds with AddressSanitizer + UBSan into build-asan/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-deps.sh"
if [ "${TIDE_SANITIZE:-0}" = "1" ]; then
  export BUILD_DIR="${BUILD_DIR:-$ROOT/build-asan}"
  bash "$ROOT/scripts/build.sh" -DTIDE_SANITIZE=ON -DTIDE_WERROR=ON
else
  export BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
  bash "$ROOT/scripts/build.sh" -DTIDE_SANITIZE=OFF -DTIDE_WERROR=ON
fi
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 -j "${TEST_JOBS:-2}" "$@"
