#!/usr/bin/env bash
# Test hosts on this machine: network namespaces joined by a bridge, one per node, each
# with its own address. Root only (CI runs as root). Reused by the cluster and networking
# tests and by bench/cluster.sh.
#
#   tests/cluster/hosts.sh up PREFIX N     bridge PREFIX-br at 10.77.0.1/24 and namespaces
#                                          PREFIX-n1..N at 10.77.0.11.., loopback up in each
#   tests/cluster/hosts.sh cut PREFIX I    take host I's link down (a partition)
#   tests/cluster/hosts.sh heal PREFIX I   bring it back
#   tests/cluster/hosts.sh down PREFIX     remove everything PREFIX made (safe to repeat)
#
# PREFIX is at most 6 characters (interface names are limited to 15).
set -euo pipefail
cmd=${1:?usage: hosts.sh up|cut|heal|down PREFIX [N|I]}
prefix=${2:?PREFIX}
[ ${#prefix} -le 6 ] || { echo "hosts.sh: PREFIX must be at most 6 characters" >&2; exit 2; }
bridge="${prefix}-br"
# Name the command that failed: "RTNETLINK answers: File exists" alone says nothing.
trap 'echo "hosts.sh $cmd $prefix: failed at: $BASH_COMMAND" >&2' ERR

case "$cmd" in
up)
  n=${3:?N}
  # Every run uses 10.77.0.0/24: a run killed before its cleanup leaves a bridge holding it,
  # and every address below would route there (seen: etcdctl reaching nothing, "RTNETLINK
  # answers: File exists"). Remove what such a run left.
  for stale in $(ip -o addr show to 10.77.0.1/24 | awk '{print $2}'); do
    other=${stale%-br}
    if [ "$other" != "$prefix" ] && [ "$other" != "$stale" ]; then
      echo "hosts.sh: removing the test hosts a killed run left ($other)" >&2
      "$0" down "$other"
    fi
  done
  # No IGMP snooping: detached nodes' rejoin requests (multicast) reach every host at once.
  ip link add "$bridge" type bridge mcast_snooping 0
  ip addr add 10.77.0.1/24 dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq "$n"); do
    ns="${prefix}-n$i"
    ip netns add "$ns"
    ip link add "${prefix}-v$i" type veth peer name eth0 netns "$ns"
    ip link set "${prefix}-v$i" master "$bridge" up
    ip -n "$ns" addr add "10.77.0.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via 10.77.0.1
  done
  ;;
cut) ip link set "${prefix}-v${3:?I}" down ;;
heal) ip link set "${prefix}-v${3:?I}" up ;;
down)
  # Containers outlive their agents by design: kill what is left in the nodes' cgroups
  # (agents started with --cgroup-parent /PREFIX-nI), then remove the cgroups.
  for dir in /sys/fs/cgroup/*/"${prefix}"-n*; do
    [ -d "$dir" ] || continue
    find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  sleep 0.2
  for dir in /sys/fs/cgroup/*/"${prefix}"-n*; do
    [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep "^${prefix}-n" || true); do
    # Anything still running in the namespace goes with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
  done
  # A namespace outlives its deletion while anything still holds it (a process dying, the
  # kernel's asynchronous cleanup, a socket opened there), and its veth pair with it: delete
  # the host ends, which takes each pair down whatever holds the namespace.
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${prefix}-v" || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip link delete "$bridge" 2>/dev/null || true
  ;;
*) echo "hosts.sh: unknown command $cmd (up, cut, heal, down)" >&2; exit 2 ;;
esac
