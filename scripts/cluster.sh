#!/usr/bin/env bash
# A cluster of N hosts on one machine: each host is a Linux network namespace with its
# own hostname (a UTS namespace per launched command) and an address on a private
# bridge; the machine itself (where tided and mpirun run) holds the bridge's .254.
# Open MPI launches across the hosts through a generated rsh agent, so
# `mpirun --host h1:4,h2:4` starts orted inside each namespace as on a real cluster:
# shared memory inside a host, TCP between hosts. Traffic stays on the bridge's
# private /24 (10.77.K.0/24, K picked free at `up`); nothing is routed anywhere else.
#
#   cluster.sh up N [--name NAME] [--rate RATE]   create; prints the env file to source
#   cluster.sh down [--name NAME]                 kill every process of its hosts, remove all
#   cluster.sh shape RATE|off [--name NAME]       each host's uplink rate (tc tbf: 1gbit, 200mbit)
#   cluster.sh exec HOST CMD... [--name NAME]     run CMD inside HOST's namespace
#   cluster.sh kill-host HOST [--name NAME]       HOST loses power: its link goes silent, then
#                                                 every process of it is SIGKILLed at once
#   cluster.sh revive-host HOST [--name NAME]     HOST comes back after kill-host, as after a
#                                                 power cycle: nothing of it runs, its link,
#                                                 address and uplink rate are as at `up`
#   cluster.sh cut HOST HOST [--name NAME]        the data path between two hosts goes silent:
#                                                 each drops what it sends the other (no RST,
#                                                 no error), both still reach the machine
#   cluster.sh heal HOST HOST [--name NAME]       undoes cut
#   cluster.sh check                              exit 0 if this machine can make one, else
#                                                 print why and exit 77
#   cluster.sh gc                                 remove clusters whose --owner PID is gone
#                                                 (a test killed by its timeout: no trap ran)
#
# The env file (/run/tide-cluster/NAME/env) sets TIDE_CLUSTER_NAME, TIDE_CLUSTER_HOSTS
# ("h1 h2"), TIDE_CLUSTER_ADDR (the machine's bridge address), TIDE_CLUSTER_SUBNET and
# TIDE_CLUSTER_MPI (mpirun flags: agent, interfaces, --allow-run-as-root when root; the
# environment does not reach orted, so these must be flags). NAME: up to 8 of [a-z0-9]
# (interface names are short). `up` without --name picks a name no cluster has ("c" and
# this shell's PID, then a suffix); the other commands default to $TIDE_CLUSTER_NAME (set
# by sourcing the env file), else need --name. Clusters made at once never share a name,
# a subnet or an interface: names and subnets are picked under one machine-wide lock.
# Needs root, iproute2 and util-linux. Host names are h1..hN inside every cluster.
set -euo pipefail

RUN_DIR=${TIDE_CLUSTER_RUN_DIR:-/run/tide-cluster}
# one lock for the whole machine, whatever RUN_DIR: subnets and interfaces are machine-wide
LOCK=/run/lock/tide-cluster.lock

die() { echo "cluster.sh: $*" >&2; exit 1; }

# Prints why a cluster cannot be made here, or nothing.
why_not() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)"; return; }
  for c in ip unshare tc nsenter; do
    command -v "$c" >/dev/null 2>&1 || { echo "needs $c (iproute2, util-linux)"; return; }
  done
  local probe="tideprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace (ip netns add failed)"; return
  fi
  ip netns delete "$probe" 2>/dev/null || true
  if ! ip link add "tpb$$" type bridge 2>/dev/null; then
    echo "cannot create a bridge (ip link add type bridge failed)"; return
  fi
  ip link delete "tpb$$" 2>/dev/null || true
  if ! unshare --uts true 2>/dev/null; then
    echo "cannot create a UTS namespace (unshare --uts failed)"; return
  fi
}

NAME=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME=$2; shift 2 ;;
    --name=*) NAME=${1#--name=}; shift ;;
    --rate) RATE=$2; shift 2 ;;
    --rate=*) RATE=${1#--rate=}; shift ;;
    --owner) OWNER=$2; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
set -- "${ARGS[@]+"${ARGS[@]}"}"
if [ -z "$NAME" ] && [ "${1:-}" != up ]; then NAME=${TIDE_CLUSTER_NAME:-}; fi
# Sets the globals naming cluster $NAME's directory, bridge and namespaces.
names() {
  [[ "$NAME" =~ ^[a-z0-9]{1,8}$ ]] || die "--name '$NAME': up to 8 of a-z 0-9"
  DIR=$RUN_DIR/$NAME
  BR="tcb$NAME"
}
# veth ends of host $2: "tcv"/"tcp" + NAME + "-" + index (the dash keeps cluster "a1" host
# 12 apart from cluster "a11" host 2), at most 3 + 8 + 1 + 2 = 14 characters
veth() { echo "$1$NAME-$2"; }
ns() { echo "tide-$NAME-$1"; }
case "${1:-}" in
  up | check | gc | "") ;;
  *) [ -n "$NAME" ] || die "which cluster? give --name NAME (or source its env file: TIDE_CLUSTER_NAME)"
     names ;;
esac

# link_path cut|heal HOST INDEX: HOST's packets to host INDEX are dropped (cut) or flow (heal).
# A neighbour entry pointing at a MAC nobody has: the bridge floods those frames and every
# host drops them, so the path behaves as a pulled cable (no netem in this kernel).
link_path() {
  local to="${TIDE_CLUSTER_ADDR%.254}.$3"
  if [ "$1" = cut ]; then
    ip netns exec "$(ns "$2")" ip neigh replace "$to" lladdr 02:00:00:00:de:ad dev eth0 nud permanent
  else
    ip netns exec "$(ns "$2")" ip neigh del "$to" dev eth0 2>/dev/null || true
  fi
}

load() {
  [ -f "$DIR/env" ] || die "no cluster '$NAME' (no $DIR/env)"
  # shellcheck disable=SC1090
  . "$DIR/env"
}

# shape_host HOST RATE|off: HOST's uplink rate
shape_host() {
  if [ "$2" = off ]; then
    ip netns exec "$(ns "$1")" tc qdisc del dev eth0 root 2>/dev/null || true
  else
    # a token bucket on the host's uplink: what a NIC of that rate sends
    ip netns exec "$(ns "$1")" tc qdisc replace dev eth0 root tbf rate "$2" \
      burst 256kb latency 100ms
  fi
}

shape() {
  local rate=$1 h
  for h in $TIDE_CLUSTER_HOSTS; do shape_host "$h" "$rate"; done
  echo "$rate" >"$DIR/rate"
}

# revive HOST: HOST back after kill-host. Whatever kill-host left (a process that started
# inside the namespace since) is killed first: a host that comes back runs nothing, and
# holds no connection of its dead processes and sends nothing they queued. Its
# address, link and uplink rate are set again as `up` and `shape` made them (a namespace
# keeps them across kill-host, but an operator may have changed them meanwhile); the
# bridge's end of its link comes up last, so that nothing reaches it half configured.
revive() {
  [[ "$1" =~ ^h([0-9]+)$ ]] || die "revive-host HOST: h1..hN"
  local i=${BASH_REMATCH[1]} s v
  s=$(ns "$1")
  v=$(veth tcv "$i")
  if ! grep -qw "$1" <<<"$TIDE_CLUSTER_HOSTS" || ! ip netns pids "$s" >/dev/null 2>&1; then
    die "revive-host: no host $1 in cluster '$NAME'"
  fi
  # a host whose link is up was not lost: reviving it would kill what runs there
  if ip -o link show dev "$v" | grep -q '[<,]UP[,>]'; then
    die "revive-host: $1 is up (only a host lost with kill-host comes back)"
  fi
  local pids
  pids=$(ip netns pids "$s")
  [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  # A power cycle leaves nothing of the dead processes behind; a namespace keeps two
  # things that would deliver what they had sent once the link is up, as if they still
  # spoke (to tided, to the MPI daemons and ranks of the other hosts): the segments
  # queued for the silent link (waiting on its neighbour entries: taking the link down
  # drops them), and their connections, which linger as orphans (FIN-WAIT-1 with their
  # unsent data) and retransmit (`ss -K` ends them).
  ip netns exec "$s" ip link set eth0 down
  ip netns exec "$s" ss -K -t -a >/dev/null 2>&1 || true
  local left
  left=$(ip netns exec "$s" ss -H -t -a state connected state syn-recv exclude time-wait 2>/dev/null | wc -l)
  [ "$left" -eq 0 ] ||
    die "revive-host: $left TCP connections of $1's dead processes survive (ss -K needs a kernel with CONFIG_INET_DIAG_DESTROY); they would deliver what those processes sent once its link is up"
  ip netns exec "$s" ip link set lo up
  ip netns exec "$s" ip addr replace "${TIDE_CLUSTER_ADDR%.254}.$i/24" dev eth0
  ip netns exec "$s" ip link set eth0 up
  if [ -f "$DIR/rate" ]; then shape_host "$1" "$(cat "$DIR/rate")"; fi
  ip link set "$v" master "$BR"
  ip link set "$v" up
}

down() {
  local h n
  if [ -f "$DIR/env" ]; then
    # shellcheck disable=SC1090
    . "$DIR/env"
  fi
  # a Slurm on the hosts (scripts/slurm.sh): its controller and munged run outside them
  if [ -d "$DIR/slurm" ]; then
    bash "$(dirname "${BASH_SOURCE[0]}")/slurm.sh" down --name "$NAME" || true
  fi
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^tide-$NAME-h[0-9]+$" || true); do
    # every process of the host first, so nothing keeps the namespace alive
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns delete "$n" 2>/dev/null || true
  done
  ip link delete "$BR" 2>/dev/null || true
  rm -rf /etc/netns/tide-"$NAME"-h*
  for h in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
             grep -E "^tc[vp]${NAME}-[0-9]+$" || true); do
    ip link delete "$h" 2>/dev/null || true
  done
  rm -rf "$DIR"
}

up() {
  local n=${1:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 16 ] || die "up N: N in 1..16"
  local why
  why=$(why_not)
  [ -z "$why" ] || die "$why"
  mkdir -p "$RUN_DIR" "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  flock 9
  if [ -z "$NAME" ]; then
    # a name no cluster has: not in use here, no namespace or bridge of that name left over
    local base="c$$" suffix="" nsl
    nsl=$(ip netns list 2>/dev/null || true)
    for suffix in "" a b c d e f g h i j k l m n o p q r s t u v w x y z; do
      NAME=${base:0:$((8 - ${#suffix}))}$suffix
      [ ! -e "$RUN_DIR/$NAME" ] && ! ip link show "tcb$NAME" >/dev/null 2>&1 &&
        ! grep -q "^tide-$NAME-" <<<"$nsl" && break
      NAME=""
    done
    [ -n "$NAME" ] || die "no free cluster name for c$$: give --name"
  fi
  names
  [ ! -e "$DIR" ] || die "cluster '$NAME' exists: cluster.sh down --name $NAME first"
  if ip link show "$BR" >/dev/null 2>&1 ||
     grep -q "^tide-$NAME-" <<<"$(ip netns list 2>/dev/null || true)"; then
    die "cluster '$NAME' has no $DIR but its bridge or namespaces exist (another RUN_DIR?): pick another --name"
  fi
  # a /24 that no interface of this machine uses yet (the lock makes the pick atomic)
  local k used
  used=$(ip -o -4 addr show | awk '{print $4}')
  for k in $(seq 1 250); do
    grep -q "^10\.77\.$k\." <<<"$used" || break
  done
  grep -q "^10\.77\.$k\." <<<"$used" && die "no free 10.77.K.0/24"
  mkdir -p "$DIR"
  trap 'down' ERR
  local sub="10.77.$k"
  ip link add "$BR" type bridge
  ip addr add "$sub.254/24" dev "$BR"
  ip link set "$BR" up
  local hosts="" i
  for i in $(seq 1 "$n"); do
    local h="h$i" v p s
    v=$(veth tcv "$i")
    p=$(veth tcp "$i")
    s=$(ns "$h")
    ip netns add "$s"
    ip link add "$v" type veth peer name "$p"
    ip link set "$p" netns "$s"
    ip link set "$v" master "$BR"
    ip link set "$v" up
    ip netns exec "$s" ip link set "$p" name eth0
    ip netns exec "$s" ip addr add "$sub.$i/24" dev eth0
    ip netns exec "$s" ip link set eth0 up
    ip netns exec "$s" ip link set lo up
    hosts="$hosts${hosts:+ }$h"
  done
  # name lookups inside a host never leave the machine: `ip netns exec` binds
  # /etc/netns/NS/* over /etc/* (an unreachable DNS server costs ~10 s per MPI_Init)
  local hosts_file="127.0.0.1 localhost"$'\n'"$sub.254 tide-coordinator"
  for i in $(seq 1 "$n"); do hosts_file="$hosts_file"$'\n'"$sub.$i h$i"; done
  for i in $(seq 1 "$n"); do
    mkdir -p "/etc/netns/$(ns "h$i")"
    printf '%s\n' "$hosts_file" >"/etc/netns/$(ns "h$i")/hosts"
    printf '# no DNS inside tide cluster %s\n' "$NAME" >"/etc/netns/$(ns "h$i")/resolv.conf"
  done
  # the launch agent: mpirun runs `agent HOST CMD...` as it would run ssh
  cat >"$DIR/agent" <<EOF
#!/bin/sh
# rsh agent of tide cluster '$NAME': runs a command inside host \$1's namespace
# under a UTS namespace named after the host (generated by scripts/cluster.sh)
h="\$1"; shift
case "\$h" in h[0-9]*) ;; *) echo "agent: unknown host '\$h'" >&2; exit 255 ;; esac
# not exec: this shell stays outside the namespace, so losing the host (kill-host) does
# not kill mpirun's child; mpirun takes a launch agent that dies as a daemon that never
# started and tears the whole job down, while a lost connection to a running daemon is
# survivable (--enable-recovery), as with ssh to a real host that loses power
ip netns exec "tide-$NAME-\$h" unshare --uts sh -c "hostname \$h; \$*"
rc=\$?
[ "\$rc" -gt 128 ] && exit 0 # killed by a signal: the host was lost after it started
exit "\$rc"
EOF
  chmod 755 "$DIR/agent"
  local mpi="--mca plm_rsh_agent $DIR/agent --mca oob_tcp_if_include $sub.0/24"
  mpi="$mpi --mca btl_tcp_if_include $sub.0/24"
  [ "$(id -u)" -ne 0 ] || mpi="$mpi --allow-run-as-root"
  cat >"$DIR/env" <<EOF
TIDE_CLUSTER_NAME=$NAME
TIDE_CLUSTER_HOSTS="$hosts"
TIDE_CLUSTER_ADDR=$sub.254
TIDE_CLUSTER_SUBNET=$sub.0/24
TIDE_CLUSTER_MPI="$mpi"
export TIDE_CLUSTER_NAME TIDE_CLUSTER_HOSTS TIDE_CLUSTER_ADDR TIDE_CLUSTER_SUBNET TIDE_CLUSTER_MPI
EOF
  TIDE_CLUSTER_HOSTS=$hosts
  if [ -n "${OWNER:-}" ]; then echo "$OWNER" >"$DIR/owner"; fi
  if [ -n "${RATE:-}" ]; then shape "$RATE"; fi
  trap - ERR
  echo "$DIR/env"
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  shape) load; [ $# -eq 1 ] || die "shape RATE|off"; shape "$1" ;;
  exec)
    load
    [ $# -ge 2 ] || die "exec HOST CMD..."
    h=$1; shift
    exec ip netns exec "$(ns "$h")" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$h" "$@" ;;
  kill-host)
    load
    [ $# -eq 1 ] || die "kill-host HOST"
    [[ "$1" =~ ^h([0-9]+)$ ]] || die "kill-host HOST: h1..hN"
    # as when the host loses power: its link goes silent first (no FIN or RST reaches
    # the others; their packets to it are dropped), then all of its processes die at once
    ip link set "$(veth tcv "${BASH_REMATCH[1]}")" down
    pids=$(ip netns pids "$(ns "$1")")
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true ;;
  cut | heal)
    load
    [ $# -eq 2 ] && [[ "$1" =~ ^h([0-9]+)$ ]] && a=${BASH_REMATCH[1]} &&
      [[ "$2" =~ ^h([0-9]+)$ ]] && b=${BASH_REMATCH[1]} && [ "$a" != "$b" ] ||
      die "$cmd HOST HOST: two of h1..hN"
    link_path "$cmd" "$1" "$b"
    link_path "$cmd" "$2" "$a" ;;
  revive-host)
    load
    [ $# -eq 1 ] || die "revive-host HOST"
    revive "$1" ;;
  gc)
    for d in "$RUN_DIR"/*/; do
      [ -f "$d/owner" ] || continue
      o=$(cat "$d/owner")
      if ! kill -0 "$o" 2>/dev/null; then
        n=$(basename "$d")
        echo "cluster.sh: removing cluster '$n' (owner $o is gone)" >&2
        bash "$0" down --name "$n"
      fi
    done ;;
  check)
    why=$(why_not)
    if [ -n "$why" ]; then echo "cluster.sh: cannot make a cluster here: $why"; exit 77; fi ;;
  *) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
