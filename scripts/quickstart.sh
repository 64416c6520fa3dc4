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

if [ "$(id -u)" = 0 ]; then
    : "${KAT_DATA_DIR:=/var/lib/kat}"
else
    : "${KAT_DATA_DIR:=$HOME/.local/share/kat}"
fi
export KAT_DATA_DIR
export KAT_CONFIG="${KAT_CONFIG:-$HOME/.config/kat/config.yaml}"
mkdir -p "$KAT_DATA_DIR"

echo "==> building kat-agent and katcall (release), a static kat-init, the example image"
# test-fixtures.sh builds the static kat-init and the busybox image, and serves the image at
# 127.0.0.1:5000/kat/busybox:latest, the image examples/hello uses.
source <(scripts/test-fixtures.sh)
cargo build --release -q -p kat-agent -p katcall
BIN=$PWD/target/release
install -m 0755 "$KAT_INIT" "$BIN/kat-init"

echo "==> validating the example Quadlets"
for dir in examples/*/; do "$BIN/katcall" validate -f "$dir"; done
"$BIN/katcall" validate --cluster examples/cluster.kat

cluster=examples/cluster.kat
if [ "$(id -u)" != 0 ]; then
    # Not root: keep volumes under the data directory.
    cluster="$KAT_DATA_DIR/quickstart-cluster.kat"
    sed "/^  agentTickSeconds/i\\  volumeBasePath: $KAT_DATA_DIR/volumes" examples/cluster.kat > "$cluster"
fi

if "$BIN/katcall" get nodes >/dev/null 2>&1; then
    echo "==> a node is already running"
else
    echo "==> starting the node: kat-agent init --config $cluster (log: $KAT_DATA_DIR/agent.log)"
    setsid "$BIN/kat-agent" init --config "$cluster" --data-dir "$KAT_DATA_DIR" \
        --client-config "$KAT_CONFIG" --insecure-registry 127.0.0.1:5000 \
        >>"$KAT_DATA_DIR/agent.log" 2>&1 < /dev/null &
    echo $! > "$KAT_DATA_DIR/agent.pid"
    for _ in $(seq 1 150); do
        "$BIN/katcall" get nodes 2>/dev/null | grep -q Ready && break
        sleep 0.2
    done
    "$BIN/katcall" get nodes || { tail -20 "$KAT_DATA_DIR/agent.log"; exit 1; }
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
cat <<EOT

KAT is running one node with the example Service. Try:
  export PATH=$BIN:\$PATH KAT_CONFIG=$KAT_CONFIG
  katcall describe workload hello
  katcall logs hello
  katcall exec -it hello -- sh
  katcall events
  katcall delete workload hello
Shell completions: katcall completion bash > ~/.local/share/bash-completion/completions/katcall
Stop the node:     kill \$(cat $KAT_DATA_DIR/agent.pid)
EOT
