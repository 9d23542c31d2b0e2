#!/usr/bin/env bash
# train_mlp's elastic loop across 2 hosts x 4 ranks (scripts/cluster.sh), tided with CURVE
# keys on the bridge address: (dp 2, tp 4) with tensor parallelism inside each host and
# data parallelism across them, resized to (1,4,2) and back while it trains. The checks
# are test_examples_tide's "hosts" mode: the full state bit-identical across every
# reshard, every step once, losses and the whole final state equal to a never-resized run
# (state within relative L2 1e-4: reduction order differs), no TP group spanning two
# hosts, and the bytes moved (in all and across hosts) equal to what
# `tidectl resize --dry-run` said.
# usage: test_multihost_resize.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_setup 2

note "tided at $EP; 8 ranks on h1:4,h2:4"
"${MPI[@]}" --host h1:4,h2:4 -np 8 -x TIDE_TEST_TIDED_ENDPOINT="$EP" \
  -x TIDE_KEY="$KEYS/pool1.key" -x TIDE_SERVER_KEY="$KEYS/server.pub" \
  -x TIDE_TEST_ADMIN_KEY="$KEYS/ops.key" \
  "$TIDE_BUILD/tests/test_examples_tide" "$TIDED" "$TIDECTL" hosts 2>&1 | tee "$MH_TMP/job.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "the job failed"
grep -q "^test_examples_tide: passed" "$MH_TMP/job.log" || fail "no pass line"
grep -q "across hosts, as --dry-run said" "$MH_TMP/job.log" || fail "the ranks ran on one host"
grep -q "^final state equals the never-resized run's" "$MH_TMP/job.log" ||
  fail "the final state was not compared with the never-resized run"
echo "PASS: 2 hosts x 4 ranks resized (2,4,1) -> (1,4,2) -> (2,4,1)"
