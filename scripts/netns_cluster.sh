#!/usr/bin/env bash
# A test cluster on one machine: N network namespaces, one per "node", each
# with its loopback up (the ranks of one node talk over it, the emulation's
# NVLink) and one veth on a shared bridge, the cross-node network, shaped
# with tc (tbf for the bandwidth, netem for the latency). Needs root (CI
# runs as root).
#
#   scripts/netns_cluster.sh up N [--rate 100mbit] [--delay 1ms] [--prefix trn]
#       (--rate: tbf; --delay: netem, which some kernels lack: refused then)
#   scripts/netns_cluster.sh down [--prefix trn]
#   scripts/netns_cluster.sh exec K CMD [ARGS...]   # run CMD inside node K (host name <prefix>-node<K>)
#   scripts/netns_cluster.sh addr K                  # node K's address
#
# Node k is namespace <prefix>-node<k> with address 10.231.<subnet>.<k+1>/24
# (a private range used only inside these namespaces; the bridge in the
# root namespace has no address, so the host itself is not on the network).
# `up` first removes a cluster of the same prefix, so it is idempotent; a
# caller that must clean up after a failure runs `down` from a trap.
# Exit codes: 0 done, 2 usage, 77 namespaces not permitted here (not root,
# or the kernel or container refuses them): tests report that as skipped.
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

prefix=trn
rate=""
delay=""
cmd=${1:-}
[ -n "$cmd" ] || usage
shift

# The subnet's third byte, from the prefix, so two clusters of different
# prefixes (tests running at once) do not share addresses.
subnet_of() { echo $(( $(printf '%s' "$1" | cksum | cut -d' ' -f1) % 200 + 20 )); }

ns_of() { echo "$prefix-node$1"; }
addr_of() { echo "10.231.$(subnet_of "$prefix").$(($1 + 1))"; }
bridge_of() { echo "${prefix:0:8}-br"; }
# Interface names are at most 15 bytes.
host_veth_of() { echo "${prefix:0:8}-v$1"; }

refuse() {
  echo "netns_cluster: $1" >&2
  exit 77
}

need_root() {
  [ "$(id -u)" -eq 0 ] || refuse "needs root (network namespaces and tc); run it as root or under sudo"
  command -v unshare >/dev/null || refuse "the unshare command is missing (Debian package util-linux)"
  unshare --uts true 2>/dev/null || refuse "UTS namespaces are not permitted here (unshare --uts was refused)"
  command -v ip >/dev/null || refuse "the ip command is missing (Debian package iproute2)"
  command -v tc >/dev/null || refuse "the tc command is missing (Debian package iproute2)"
}

down() {
  local b
  b=$(bridge_of)
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-node[0-9]*$" || true); do
    ip netns del "$ns" 2>/dev/null || true  # takes its end of the veth, and with it the host end
    rm -rf "/etc/netns/$ns"
  done
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${prefix:0:8}-v[0-9]*$" || true); do
    ip link del "$v" 2>/dev/null || true
  done
  ip link del "$b" 2>/dev/null || true
}

# Egress of each node's eth0: every cross-node packet passes one shaped
# link. tbf for the bandwidth; netem (a module some kernels lack) for the
# latency, with the tbf under it when both are asked for.
shape() {
  local ns=$1
  local tbf=(tbf rate "$rate" burst 64kbit latency 400ms)
  if [ -n "$delay" ]; then
    if ! ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay "$delay" 2>/dev/null; then
      echo "netns_cluster: --delay needs the netem qdisc, which this kernel does not have (tc qdisc add ... netem was refused); --rate alone works with tbf" >&2
      return 1
    fi
    [ -z "$rate" ] || ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: "${tbf[@]}"
  elif [ -n "$rate" ]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root "${tbf[@]}" 2>/dev/null || {
      trap - ERR
      down
      refuse "tc cannot shape a link here (tc qdisc add ... tbf was refused)"
    }
  fi
}

# Each node has a host name of its own (its namespace's name: `exec` runs
# commands in a UTS namespace that sets it) and an /etc/hosts naming every
# node, which `ip netns exec` mounts over /etc/hosts inside the namespace:
# launchers that pass host names (torchrun's c10d rendezvous sets
# MASTER_ADDR to the host name of rank 0's node) then work as across hosts.
write_hosts() {
  local ns=$1 n=$2 j
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    for ((j = 0; j < n; j++)); do echo "$(addr_of "$j") $(ns_of "$j")"; done
  } > "/etc/netns/$ns/hosts"
}

reach() {
  local k=$1 port=$((40000 + RANDOM % 20000))
  ip netns exec "$(ns_of "$k")" python3 -c "
import socket; s = socket.socket(); s.bind(('$(addr_of "$k")', $port)); s.listen(1); s.settimeout(10)
c, _ = s.accept(); c.close()" &
  local listener=$!
  local rc=0
  ip netns exec "$(ns_of 0)" python3 -c "
import socket, time
for _ in range(100):
    try:
        socket.create_connection(('$(addr_of "$k")', $port), timeout=1).close(); break
    except OSError: time.sleep(0.1)
else: raise SystemExit(1)" || rc=1
  wait "$listener" 2>/dev/null || true
  return $rc
}

up() {
  local n=$1 b k ns hv
  b=$(bridge_of)
  down
  # Half a cluster is never left behind.
  trap 'down' ERR
  ip link add "$b" type bridge 2>/dev/null || refuse "cannot create a bridge (ip link add $b type bridge was refused)"
  ip link set "$b" up
  for ((k = 0; k < n; k++)); do
    ns=$(ns_of "$k")
    hv=$(host_veth_of "$k")
    if ! ip netns add "$ns" 2>/dev/null; then
      down
      refuse "network namespaces are not permitted here (ip netns add $ns was refused)"
    fi
    ip link add "$hv" type veth peer name eth0 netns "$ns"
    ip link set "$hv" master "$b"
    ip link set "$hv" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "$(addr_of "$k")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    write_hosts "$ns" "$n"
    shape "$ns"
  done
  # The links are usable once node 0 reaches every node over TCP (no ping
  # here: a listener in node k, a connection from node 0).
  for ((k = 1; k < n; k++)); do
    if ! reach "$k"; then
      trap - ERR
      down
      echo "netns_cluster: node 0 cannot reach node $k ($(addr_of "$k")) over the bridge" >&2
      exit 1
    fi
  done
  trap - ERR
  echo "netns_cluster: $n nodes up ($(ns_of 0) .. $(ns_of $((n - 1))), $(addr_of 0) ..; links ${rate:-unshaped}${delay:+, delay $delay})"
}

positional=()
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --) shift; positional+=("$@"); break ;;
    *) positional+=("$1"); shift ;;
  esac
done
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,11}$ ]] || { echo "netns_cluster: --prefix must be 1-12 lower-case letters and digits" >&2; exit 2; }

case "$cmd" in
  up)
    n=${positional[0]:-}
    [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 64)) || { echo "netns_cluster: up needs a node count 1-64" >&2; exit 2; }
    need_root
    up "$n"
    ;;
  down)
    need_root
    down
    ;;
  exec)
    k=${positional[0]:-}
    [[ "$k" =~ ^[0-9]+$ ]] && ((${#positional[@]} >= 2)) || usage
    need_root
    exec ip netns exec "$(ns_of "$k")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(ns_of "$k")" "${positional[@]:1}"
    ;;
  addr)
    k=${positional[0]:-}
    [[ "$k" =~ ^[0-9]+$ ]] || usage
    addr_of "$k"
    ;;
  *) usage ;;
esac
