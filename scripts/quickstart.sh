#!/usr/bin/env bash
# The newcomer's command: install what is needed, build KAT, and bring up a one-node cluster
# on this machine running the example Service in examples/hello (a busybox web greeter from a
# registry on loopback, published on port 8080), show `katcall get workloads` and fetch its
# page through the published port.
#
# Run it again at any time: the node resumes (kat-agent init does not re-initialize).
# Stop the node with: kill $(cat "$KAT_DATA_DIR/agent.pid")   (containers keep running and
# are adopted at the next start; `katcall delete workload hello` removes them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh

# Run as root, the agent still runs unprivileged: `kat-agent setup` prepares a `kat` user
# (subordinate ids, its home /var/lib/kat, cgroup directories on v1/hybrid hosts, a systemd
# user service where systemd runs) and the agent runs as kat. KAT_QUICKSTART_ROOT_AGENT=1
# runs it as root instead (possible, not recommended: docs/security.md). Run as any other
# user, the agent runs as that user.
mode=self
if [ "$(id -u)" = 0 ] && [ "${KAT_QUICKSTART_ROOT_AGENT:-0}" != 1 ]; then
    mode=kat
    : "${KAT_DATA_DIR:=/var/lib/kat}"
elif [ "$(id -u)" = 0 ]; then
    : "${KAT_DATA_DIR:=/var/lib/kat-root}"
else
    : "${KAT_DATA_DIR:=$HOME/.local/share/kat}"
fi
export KAT_DATA_DIR
export KAT_CONFIG="${KAT_CONFIG:-$HOME/.config/kat/config.yaml}"

echo "==> building kat-agent and katcall (release), a static kat-init, the example image"
# test-fixtures.sh builds the static kat-init and the busybox image, and serves the image at
# 127.0.0.1:5000/kat/busybox:latest, the image examples/hello uses (so port 5000 it must be).
source <(KAT_TEST_REGISTRY_PORT=5000 scripts/test-fixtures.sh)
cargo build --release -q -p kat-agent -p katcall
BIN=$PWD/target/release
install -m 0755 "$KAT_INIT" "$BIN/kat-init"

echo "==> validating the example Quadlets"
for dir in examples/*/; do "$BIN/katcall" validate -f "$dir"; done
"$BIN/katcall" validate --cluster examples/cluster.kat

# Where the node keeps its volumes: under its data directory unless it runs as root.
# The node's address: the one its default route leaves from (containers reach the API
# there, e.g. the ingress recipe's updater; never through loopback), else loopback.
node_ip=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}')
: "${node_ip:=127.0.0.1}"

cluster_for() {
    sed "/^  agentTickSeconds/i\\  volumeBasePath: $1/volumes" examples/cluster.kat
}

if "$BIN/katcall" get nodes >/dev/null 2>&1; then
    echo "==> a node is already running"
elif [ "$mode" = kat ]; then
    echo "==> preparing user kat: kat-agent setup (the agent runs unprivileged)"
    cluster=$(mktemp)
    cluster_for "$KAT_DATA_DIR" > "$cluster"
    "$BIN/kat-agent" setup --config "$cluster" --init-binary "$BIN/kat-init" \
        --state-dir "$KAT_DATA_DIR" --agent-arg --insecure-registry --agent-arg 127.0.0.1:5000 \
        --agent-arg --advertise-address --agent-arg "$node_ip"
    rm -f "$cluster"
    admin="$KAT_DATA_DIR/katcall.yaml"
    if ! { [ -d /run/systemd/system ] && systemctl --user -M kat@ is-active --quiet kat-agent 2>/dev/null; }; then
        # No systemd: start it as kat ourselves, as setup said (setpriv runs it in place).
        echo "==> starting the node as kat (log: $KAT_DATA_DIR/agent.log)"
        ( cd "$KAT_DATA_DIR" && HOME="$KAT_DATA_DIR" exec setsid setpriv --reuid kat --regid kat --init-groups -- \
            /usr/local/bin/kat-agent init --config /etc/kat/cluster.kat --data-dir "$KAT_DATA_DIR/node" \
            --client-config "$admin" --init-binary /usr/local/lib/kat/kat-init \
            --etcd-binary /usr/local/lib/kat/etcd --cgroup-parent /kat --insecure-registry 127.0.0.1:5000 \
            --advertise-address "$node_ip" \
            >>"$KAT_DATA_DIR/agent.log" 2>&1 < /dev/null ) &
        echo $! > "$KAT_DATA_DIR/agent.pid"
    fi
    for _ in $(seq 1 300); do [ -s "$admin" ] && break; sleep 0.2; done
    # katcall for the admin here: a private copy of the node's admin config.
    mkdir -p "$(dirname "$KAT_CONFIG")"
    install -m 0600 "$admin" "$KAT_CONFIG"
else
    cluster=examples/cluster.kat
    if [ "$(id -u)" != 0 ]; then
        cluster="$KAT_DATA_DIR/quickstart-cluster.kat"
        mkdir -p "$KAT_DATA_DIR"
        cluster_for "$KAT_DATA_DIR" > "$cluster"
    else
        echo "==> KAT_QUICKSTART_ROOT_AGENT=1: the agent runs as root (not recommended; see docs/security.md)"
        mkdir -p "$KAT_DATA_DIR"
    fi
    echo "==> starting the node: kat-agent init --config $cluster (log: $KAT_DATA_DIR/agent.log)"
    setsid "$BIN/kat-agent" init --config "$cluster" --data-dir "$KAT_DATA_DIR" \
        --client-config "$KAT_CONFIG" --insecure-registry 127.0.0.1:5000 --advertise-address "$node_ip" \
        >>"$KAT_DATA_DIR/agent.log" 2>&1 < /dev/null &
    echo $! > "$KAT_DATA_DIR/agent.pid"
fi
for _ in $(seq 1 150); do
    "$BIN/katcall" get nodes 2>/dev/null | grep -q Ready && break
    sleep 0.2
done
"$BIN/katcall" get nodes || { tail -20 "$KAT_DATA_DIR/agent.log" 2>/dev/null; exit 1; }
if [ "$mode" = kat ]; then
    echo "==> the agent runs as: $(ps -o user= -p "$(pgrep -f -o 'kat-agent init')" 2>/dev/null || echo '?')"
fi

echo "==> katcall apply -f examples/hello"
"$BIN/katcall" apply -f examples/hello
for _ in $(seq 1 150); do
    "$BIN/katcall" get workloads 2>/dev/null | grep -Eq '^hello +Service +1/1' && break
    sleep 0.2
done
echo "==> katcall get workloads"
"$BIN/katcall" get workloads
echo
"$BIN/katcall" get instances -o wide
echo
echo "==> curl http://127.0.0.1:8080/ (examples/hello's published port)"
for _ in $(seq 1 50); do curl -fsS --max-time 2 http://127.0.0.1:8080/ 2>/dev/null && break; sleep 0.2; done
curl -fsS --max-time 2 http://127.0.0.1:8080/ >/dev/null || { echo "the page did not answer; see $KAT_DATA_DIR/agent.log" >&2; exit 1; }
if [ "$node_ip" = 127.0.0.1 ]; then
    echo "==> no address besides loopback: the ingress recipe needs one its container can reach the API at; skipped (docs/ingress.md)"
    skip_ingress=1
fi
if [ -z "${skip_ingress:-}" ]; then
echo "==> the ingress recipe (examples/ingress): Caddy on this node routes hello.example.com to examples/hello"
cargo build --release -q -p kat-ingress
examples/ingress/build-image.sh 127.0.0.1:5000 "$BIN/kat-ingress" --tls-verify=false
read -r node_name node_addr < <("$BIN/katcall" get nodes -o json \
    | python3 -c 'import json, sys; n = json.load(sys.stdin)[0]; print(n["metadata"]["name"], n["addresses"][0])')
"$BIN/katcall" label "$node_name" kat.dws.rip/role=ingress >/dev/null
# The updater reads the API from inside its container, at the node's address, with an
# ingress token (made once; it reads the route table and the event stream, nothing else).
# A config from an earlier cluster (its token unknown here) is made again.
if ! "$BIN/katcall" --config /srv/kat-ingress/client.yaml get ingress >/dev/null 2>&1; then
    ingress_dir=$(mktemp -d)
    "$BIN/katcall" create token --ingress --description "ingress updater" \
        --client-config "$ingress_dir/client.yaml" --endpoint "https://$node_addr:9115" -o json >/dev/null
    need_root mkdir -p /srv/kat-ingress
    need_root install -m 0644 "$ingress_dir/client.yaml" /srv/kat-ingress/client.yaml
    rm -rf "$ingress_dir"
fi
# An unprivileged agent publishes ports 80 and 443 only where unprivileged processes may
# bind them (rootless podman asks the same).
if [ "$mode" = kat ] || [ "$(id -u)" != 0 ]; then
    if [ "$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)" -gt 80 ]; then
        echo "==> sysctl net.ipv4.ip_unprivileged_port_start=80 (the unprivileged agent publishes the ingress on 80 and 443)"
        need_root sysctl -qw net.ipv4.ip_unprivileged_port_start=80
    fi
fi
"$BIN/katcall" apply -f examples/ingress
echo "==> curl -H 'Host: hello.example.com' http://127.0.0.1/ (through the ingress)"
for _ in $(seq 1 300); do
    curl -fsS --max-time 2 -H 'Host: hello.example.com' http://127.0.0.1/ 2>/dev/null && break
    sleep 0.2
done
curl -fsS --max-time 2 -H 'Host: hello.example.com' http://127.0.0.1/ >/dev/null \
    || { echo "the ingress did not answer; see katcall describe workload ingress -n kat-core" >&2; exit 1; }
fi
dashboard=$(awk '/^endpoint:/ {print $2}' "$KAT_CONFIG" | tr -d "'\"")/ui
echo "==> the dashboard: $dashboard"
curl -fsSk --max-time 5 -o /dev/null "$dashboard/login" || { echo "the dashboard did not answer; see $KAT_DATA_DIR/agent.log" >&2; exit 1; }
cat <<EOT

KAT is running one node with the example Service, behind the ingress. Try:
  the dashboard at $dashboard (the browser will ask about the cluster's own CA; sign in
  with the token in $KAT_CONFIG, or one from \`katcall create token --read-only\`)
  export PATH=$BIN:\$PATH KAT_CONFIG=$KAT_CONFIG
  katcall describe workload hello
  katcall logs hello
  katcall exec -it hello -- sh
  katcall events
  katcall delete workload hello
  curl -H 'Host: hello.example.com' http://127.0.0.1/    # through the ingress (docs/ingress.md)
Shell completions: katcall completion bash > ~/.local/share/bash-completion/completions/katcall
Stop the node:     kill \$(cat $KAT_DATA_DIR/agent.pid)   (under systemd: systemctl --user -M kat@ stop kat-agent)
Remove it all:     sudo kat-agent setup --uninstall --state-dir $KAT_DATA_DIR   (when it ran as kat)
EOT
