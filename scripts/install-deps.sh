#!/usr/bin/env bash
# Installs every Debian package that tide's build, tests, benchmarks and demo
# need. Idempotent and quiet when everything is already there.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  openmpi-bin libopenmpi-dev
  libzmq3-dev libmsgpack-dev libsqlite3-dev sqlite3
  libcriterion-dev libopenblas-dev libxxhash-dev
  procps curl shellcheck
  iproute2 util-linux  # scripts/cluster.sh: ip netns, tc, unshare
  slurmctld slurmd slurm-client munge  # scripts/slurm.sh: a Slurm cluster on those hosts
  python3-torch python3-mpi4py python3-pip python3-setuptools python3-wheel python3-pytest
  fortunes-min  # examples/train_gpt.py's text: English quotations, read from disk
  help2man man-db systemd  # man pages made from --help, `man`, systemd-analyze verify
  chromium                 # tests/test_page.sh: tided's cluster page in a headless browser
  gnuplot-nox              # benchmarks/report: the plots
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
