#!/usr/bin/env bash
# test_gpu_skip.sh PROBE: a GPU test must skip only where no NVIDIA device exists, and
# fail where one is present but its driver does not work (tests/gpu_test.h).
#   1. on this machine as it is: 77 without a /dev/nvidia<N> node, 0 with one;
#   2. in a private mount namespace whose /dev is an empty tmpfs holding only a fake
#      /dev/nvidia0 (a device node with no working driver behind it): 1, not a skip;
#   3. the same with CUDA_VISIBLE_DEVICES= (every device hidden on purpose): 77.
# Steps 2-3 need a mount namespace (root); without one the test skips after step 1.
set -u
probe="$1"
fail() { echo "FAILED: $*"; exit 1; }

"$probe"
rc=$?
if compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  [ $rc -eq 0 ] || fail "an NVIDIA device node exists and the probe exited $rc, not 0"
else
  [ $rc -eq 77 ] || fail "no NVIDIA device here and the probe exited $rc, not 77 (skip)"
fi

if ! unshare -m true 2>/dev/null; then
  echo "SKIP: no private mount namespace here (needs root): only step 1 ran"
  exit 77
fi
fake() { # fake [ENV...]: the probe with a device node and no driver behind it
  # shellcheck disable=SC2016
  unshare -m sh -c 'mount -t tmpfs tide-gpu-skip /dev && : >/dev/nvidia0 && exec env "$@"' \
    sh "$@" "$probe"
}
fake
rc=$?
[ $rc -eq 1 ] || fail "a device node without a working driver: the probe exited $rc, not 1"
fake CUDA_VISIBLE_DEVICES=
rc=$?
[ $rc -eq 77 ] || fail "CUDA_VISIBLE_DEVICES= hides every device: the probe exited $rc, not 77"
echo "test_gpu_skip: passed"
