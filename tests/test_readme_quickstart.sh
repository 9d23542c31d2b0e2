#!/usr/bin/env bash
# The README's quickstart, run as it is written. README.md marks two blocks:
#   quickstart:install  how tide is built and installed under /opt/tide: checked to name
#                       that prefix, and done here by `cmake --install` of this build (the
#                       test runs against the build it belongs to, not a fresh one);
#   quickstart:run      run line by line (bash -e -x), its only change /opt/tide -> the
#                       prefix installed here, with HOME, /tmp and the network its own: a
#                       private mount namespace with a fresh /tmp and /dev/shm, a network
#                       namespace (so its fixed ports 5555 and 9400 meet nobody else's) and
#                       a pid namespace (tided and the job it started end with it). The pid
#                       namespace numbers every run's processes alike, and Open MPI names
#                       its shared-memory segments in /dev/shm by host and mpirun's pid:
#                       two runs at once (two test suites on one machine) shared them, and
#                       both jobs crashed or hung, until each got a /dev/shm of its own.
# Then what the block's comments say must be in what each command printed: the resize
# commits with its downtime and bytes, rank 1 idle, job q at generation 2 and dp 1, the
# second resize, the last steps and the fingerprint, and the events newest first.
# Usage: test_readme_quickstart.sh SRC_DIR BUILD_DIR. Skips (77) where namespaces cannot be
# made, unless TIDE_REQUIRE_NETNS=1.
set -euo pipefail
SRC=$(cd "$1" && pwd -P)
BUILD=$(cd "$2" && pwd -P)
# under the build, not /tmp: the block gets a /tmp of its own, which hides the one here
# Not under /tmp (nor the build, which may be): the block's namespace mounts its own /tmp
# over it, which would hide the installed prefix and the block itself (CI's clone is there).
WORK=$(mktemp -d /var/tmp/tide-readme-quickstart.XXXXXX)
fail() {
  echo "FAILED: test_readme_quickstart: $*" >&2
  [ -f "$WORK/run.log" ] && sed 's/^/  | /' "$WORK/run.log" >&2
  exit 1
}
trap 'rm -rf "$WORK"' EXIT

# block NAME: the shell lines between <!-- quickstart:NAME --> and <!-- /quickstart:NAME -->
block() {
  awk -v first="<!-- quickstart:$1 -->" -v last="<!-- /quickstart:$1 -->" \
    '$0 == last { on = 0 } on && !/^```/ { print } $0 == first { on = 1 }' "$SRC/README.md"
}
block install >"$WORK/install.sh"
block run >"$WORK/run.sh"
[ -s "$WORK/install.sh" ] || fail "README.md has no <!-- quickstart:install --> block"
[ -s "$WORK/run.sh" ] || fail "README.md has no <!-- quickstart:run --> block"
grep -q 'cmake --install build --prefix /opt/tide$' "$WORK/install.sh" ||
  fail "the install block does not install into /opt/tide, the prefix the run block uses"
grep -q '/opt/tide/' "$WORK/run.sh" || fail "the run block does not use /opt/tide"

if ! why=$(unshare --net --mount --pid --fork true 2>&1); then
  [ "${TIDE_REQUIRE_NETNS:-0}" = 1 ] && fail "TIDE_REQUIRE_NETNS=1 but unshare: $why"
  echo "SKIP: cannot make namespaces here (unshare: $why)"
  exit 77
fi

P="$WORK/opt-tide"
cmake --install "$BUILD" --prefix "$P" >"$WORK/cmake-install.log" 2>&1 ||
  fail "cmake --install of $BUILD: $(tail -5 "$WORK/cmake-install.log")"
sed "s|/opt/tide|$P|g" "$WORK/run.sh" >"$WORK/run-here.sh"
mkdir -p "$WORK/home" "$WORK/tmp"
chmod 1777 "$WORK/tmp"

# The block leaves tided running (it is started with &): the pid namespace ends it.
# PATH keeps mpirun and cc, nothing of tide's (the block adds the prefix's bin).
start=$(date +%s)
set +e
timeout -k 5 150 env HOME="$WORK/home" \
  unshare --net --mount --pid --fork --kill-child --mount-proc bash -c '
  ip link set lo up || exit 1
  mount --make-rprivate / && mount --bind "$1" /tmp || exit 1
  mount -t tmpfs -o mode=1777 tide-shm /dev/shm || exit 1
  cd "$HOME" && exec bash -e -x "$2"' readme "$WORK/tmp" "$WORK/run-here.sh" \
  </dev/null >"$WORK/run.log" 2>&1
rc=$?
set -e
secs=$(($(date +%s) - start))
[ $rc -eq 0 ] || fail "the quickstart block exited $rc after $secs s"

# out CMD: what the traced command CMD (as bash -x prints it, '+ CMD') printed, up to
# the next traced command
out() {
  awk -v c="+ $1" 'index($0, "+ ") == 1 { on = ($0 == c); next } on' "$WORK/run.log"
}
# shellcheck disable=SC2016  # the trace shows the line as typed
resize1=$(out 'tidectl resize q --dp 1 --wait')
echo "$resize1" | grep -q 'generation 2 committed after step [0-9]*: downtime .* ms .* bytes moved' ||
  fail "tidectl resize q --dp 1 --wait printed no commit with its downtime and bytes: $resize1"
status=$(out 'tidectl status')
echo "$status" | grep -q 'idle' || fail "after dp 2 -> 1, tidectl status shows no idle worker: $status"
jobs=$(out 'tidectl jobs')
# JOB KIND STATE GEN LAYOUT ...
echo "$jobs" | grep -qE '^q +online +running +2 +dp1 tp1 pp1 ' ||
  fail "tidectl jobs does not show job q running at generation 2, dp 1: $jobs"
resize2=$(out 'tidectl resize q --dp 2 --wait')
echo "$resize2" | grep -q 'generation 3 committed' || fail "the second resize printed no commit: $resize2"
tail3=$(out 'tail -3 q.log')
last=$(tail -1 "$WORK/home/myjob/q.log")
echo "$last" | grep -qE '^quickstart: step 600 fingerprint [0-9a-f]{16}$' ||
  fail "q.log does not end with the state's fingerprint at step 600: $last"
echo "$tail3" | grep -qF "$last" || fail "tail -3 q.log did not show the fingerprint: $tail3"
events=$(out 'tidectl events')
# ID DATE TIME JOB KIND DETAIL: job q's creation, resizes and end, newest first
order=$(echo "$events" | awk '$1 ~ /^[0-9]+$/ && $4 == "q" && $5 ~ /^(job_created|resized|job_ended)$/ { printf "%s ", $5 }')
[ "$order" = "job_ended resized resized job_created " ] ||
  fail "tidectl events is not job q's history newest first (ended, resized, resized, created): $events"
echo "test_readme_quickstart: passed: the README's quickstart ran as written in $secs s" \
  "(resizes: $(echo "$resize1" | head -1); $(echo "$resize2" | head -1)); $last"
