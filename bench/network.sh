#!/usr/bin/env bash
# Network benchmark on two test hosts (network namespaces on a bridge, tests/cluster/hosts.sh),
# each with a KAT node network (kat-netns: the holder, its boringtun overlay, one container,
# the node's DNS, a published port), measured with iperf3 (Debian):
#   overlay     container on host 1 → container on host 2, through the WireGuard overlay
#   underlay    host 1 → host 2 directly
#   wireguard_go  host 1 → host 2 through wireguard-go (Debian's userspace WireGuard), set up
#               here between the same two hosts, the peer to compare the overlay with
#   hostport    host 2's address:published port → the container on host 2 (the relay)
#   dns         queries from the container on host 1 to its node's DNS (p50)
# Needs root. The last line is exactly:
#   network overlay_gbps=X underlay_gbps=Y wireguard_go_gbps=Z overlay/wireguard_go=R dns_p50_us=D hostport_gbps=H
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
SECONDS_EACH=${KAT_BENCH_SECONDS:-5}
P=kb$(( $$ % 10000 ))
TMP=$(mktemp -d)
cleanup() {
  pkill -f "iperf3 -s -p 5201" 2>/dev/null || true
  pkill -f "bench_node serve" 2>/dev/null || true
  pkill -f "wireguard-go -f wgb" 2>/dev/null || true
  tests/cluster/hosts.sh down "$P" >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT
cargo build --release -q -p kat-netns --bins --examples
HELPER=$PWD/target/release/kat-netns-helper
NODE=$PWD/target/release/examples/bench_node
tests/cluster/hosts.sh up "$P" 2
in_host() { local i=$1; shift; nsenter --net=/run/netns/$P-n$i -- "$@"; }
in_container() { local k=$1; shift; nsenter -t "$k" -U -n --preserve-credentials -- "$@"; }
gbps() { python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.2f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))'; }

# Two node networks: 10.100.0.0/23 on host 1, 10.100.2.0/23 on host 2, overlay on 51820.
declare -A KEEPER CONTAINER KEY
for i in 1 2; do
  mkfifo "$TMP/n$i.in"
  in_host "$i" "$NODE" serve "$HELPER" "$TMP/n$i" "10.100.$(( (i-1)*2 )).0/23" 10.100.0.0/16 51820 18080 \
    < "$TMP/n$i.in" > "$TMP/n$i.out" 2> "$TMP/n$i.err" &
  exec {fd}> "$TMP/n$i.in"   # held open until the script ends: the node runs until then
done
for i in 1 2; do
  for _ in $(seq 100); do grep -q keeper= "$TMP/n$i.out" 2>/dev/null && break; sleep 0.1; done
  line=$(cat "$TMP/n$i.out")
  [ -n "$line" ] || { echo "node $i did not start: $(cat "$TMP/n$i.err")" >&2; exit 1; }
  KEEPER[$i]=$(sed -E 's/.*keeper=([0-9]+).*/\1/' <<<"$line")
  CONTAINER[$i]=$(sed -E 's/.*container=([0-9]+).*/\1/' <<<"$line")
  KEY[$i]=$(sed -E 's/.*key=([^ ]+).*/\1/' <<<"$line")
done
cat > "$TMP/n1/peers.json" <<EOF
[{"node":"n2","publicKey":"${KEY[2]}","endpoint":"10.77.0.12:51820","subnet":"10.100.2.0/23"}]
EOF
cat > "$TMP/n2/peers.json" <<EOF
[{"node":"n1","publicKey":"${KEY[1]}","endpoint":"10.77.0.11:51820","subnet":"10.100.0.0/23"}]
EOF
sleep 1

# iperf3 servers: in the container on host 2 (overlay, hostport) and on host 2 itself.
in_container "${CONTAINER[2]}" iperf3 -s -p 5201 -D
in_host 2 iperf3 -s -p 5202 -D
sleep 0.5
run() { "$@" -t "$SECONDS_EACH" -J | gbps; }
overlay=$(run in_container "${CONTAINER[1]}" iperf3 -c 10.100.2.2 -p 5201); echo "overlay $overlay Gbit/s"
underlay=$(run in_host 1 iperf3 -c 10.77.0.12 -p 5202); echo "underlay $underlay Gbit/s"
hostport=$(run in_host 1 iperf3 -c 10.77.0.12 -p 18080); echo "hostport $hostport Gbit/s"
dns=$(in_container "${CONTAINER[1]}" "$NODE" query 10.100.0.1 bench.default.kat.cluster.local 2000); echo "$dns"

# wireguard-go between the same two hosts (its own TUN, keys and port), same iperf3 server.
# (one interface name per host: wireguard-go's control sockets share /var/run/wireguard)
for i in 1 2; do (umask 077; wg genkey > "$TMP/wg$i.key"); wg pubkey < "$TMP/wg$i.key" > "$TMP/wg$i.pub"; done
for i in 1 2; do
  o=$((3 - i))
  # In the foreground (in the background here): its own daemon mode leaves a zombie behind
  # nsenter and the interface unconfigurable.
  in_host "$i" wireguard-go -f "wgb$i" >/dev/null 2>&1 &
  for _ in $(seq 50); do [ -S "/var/run/wireguard/wgb$i.sock" ] && break; sleep 0.1; done
  in_host "$i" wg set "wgb$i" listen-port 51900 private-key "$TMP/wg$i.key" \
    peer "$(cat "$TMP/wg$o.pub")" endpoint "10.77.0.1$o:51900" allowed-ips "10.99.0.$o/32"
  in_host "$i" ip addr add "10.99.0.$i/24" dev "wgb$i"
  in_host "$i" ip link set "wgb$i" mtu 1420 up
done
wggo=$(run in_host 1 iperf3 -c 10.99.0.2 -p 5202)

ratio=$(python3 -c "print('%.2f' % ($overlay / $wggo))")
echo "overlay: $overlay Gbit/s; underlay: $underlay Gbit/s; wireguard-go: $wggo Gbit/s; hostPort: $hostport Gbit/s; $dns"
echo "network overlay_gbps=$overlay underlay_gbps=$underlay wireguard_go_gbps=$wggo overlay/wireguard_go=$ratio dns_p50_us=$(sed -E 's/dns_p50_us=([0-9]+).*/\1/' <<<"$dns") hostport_gbps=$hostport" \
  | python3 bench/guard.py
