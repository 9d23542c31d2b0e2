#!/usr/bin/env bash
# The README's first command. Sets up tide and shows the coordinator.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-deps.sh"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
bash "$ROOT/scripts/build.sh" >/dev/null
"$BUILD_DIR/coordinator/tided" --help
