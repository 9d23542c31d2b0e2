#!/usr/bin/env bash
# scripts/cluster.sh when several clusters exist at once (engineers and tests make theirs
# concurrently on one machine): three clusters made at the same moment without --name get
# three names, three subnets and their own interfaces; clusters whose names would give
# the same veth names without a separator ("a1" host 12, "a11" host 2) coexist; `down`
# without --name takes TIDE_CLUSTER_NAME from the sourced env file and removes that
# cluster only; a command that does not say which cluster is refused.
# usage: test_multihost_cluster.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
TIDE_BUILD=$1 TIDE_SRC=$2
# shellcheck source=multihost_lib.sh
. "$TIDE_SRC/tests/multihost_lib.sh"
mh_require_netns
bash "$CLUSTER" gc || true
T=$(mktemp -d /tmp/tide-cl.XXXXXX)
NAMES=""
cleanup() {
  local n
  for n in $NAMES; do bash "$CLUSTER" down --name "$n" >/dev/null 2>&1 || true; done
  rm -rf "$T"
}
trap cleanup EXIT
# two fixed names of this test, unique to this process
A="a$(($$ % 1000))"
AA="${A}1"
NAMES="$A $AA"

note "three clusters at once, no --name"
for i in 1 2 3; do
  bash "$CLUSTER" up 2 --owner $$ >"$T/env$i" 2>"$T/err$i" &
done
wait
for i in 1 2 3; do
  [ -s "$T/env$i" ] || fail "cluster $i: $(cat "$T/err$i")"
  # shellcheck disable=SC1090
  (. "$(cat "$T/env$i")"; echo "$TIDE_CLUSTER_NAME $TIDE_CLUSTER_SUBNET") >"$T/id$i"
  NAMES="$NAMES $(awk '{print $1}' "$T/id$i")"
done
cat "$T"/id?
[ "$(awk '{print $1}' "$T"/id? | sort -u | wc -l)" -eq 3 ] || fail "two clusters share a name"
[ "$(awk '{print $2}' "$T"/id? | sort -u | wc -l)" -eq 3 ] || fail "two clusters share a subnet"
for i in 1 2 3; do
  # shellcheck disable=SC1090
  (. "$(cat "$T/env$i")"
   out=$(bash "$CLUSTER" exec h2 hostname -I)
   grep -q "${TIDE_CLUSTER_SUBNET%.0/24}.2" <<<"$out" || fail "cluster $i h2 has $out")
done

note "clusters '$A' (12 hosts) and '$AA' (2 hosts): no interface name in common"
bash "$CLUSTER" up 12 --name "$A" --owner $$ >"$T/envA"
bash "$CLUSTER" up 2 --name "$AA" --owner $$ >"$T/envAA" || fail "cluster $AA collided with $A"
# shellcheck disable=SC1090
out=$(. "$(cat "$T/envAA")"; bash "$CLUSTER" exec h2 hostname -I)
[ -n "$out" ] || fail "cluster $AA h2 has no address"

note "down without --name removes the sourced cluster only"
env1=$(cat "$T/env1")
n1=$(awk '{print $1}' "$T/id1")
# shellcheck disable=SC1090
(. "$env1"; bash "$CLUSTER" down)
[ ! -e "$env1" ] || fail "cluster $n1 is still there"
! ip netns list | grep -q "^tide-$n1-" || fail "namespaces of $n1 are left"
for i in 2 3; do
  [ -e "$(cat "$T/env$i")" ] || fail "down of $n1 removed cluster $i"
done
set +e
out=$(env -u TIDE_CLUSTER_NAME bash "$CLUSTER" down 2>&1); rc=$?
set -e
[ $rc -ne 0 ] && grep -q "which cluster" <<<"$out" || fail "down without a name: rc $rc: $out"
echo "PASS: concurrent clusters get their own names, subnets and interfaces; down removes only its own"
