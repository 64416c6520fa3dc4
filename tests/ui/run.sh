#!/usr/bin/env bash
# The dashboard in a real browser. Brings up a one-node cluster (kat-agent init with its own
# etcd; the loopback registry and busybox image of scripts/test-fixtures.sh), then
# tests/ui/browser.py drives Debian's Chromium through chromedriver (WebDriver) against
# https://127.0.0.1:PORT/ui: sign in, the example workload becoming ready, its output
# followed, a change applied with katcall showing up without a reload, a rollback from the
# page, a read-only token's page without buttons (and its forged POST refused), a phone's
# width and the dark scheme. Screenshots (and the agent's log) go to target/ui-screenshots/.
#
# scripts/test.sh runs it after the fixtures are up; alone it starts them itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${CARGO_INCREMENTAL+x}" ] || export CARGO_INCREMENTAL=0

# The registries this script starts itself go with it; those of the suite that runs it stay.
own_registries=
if [ -z "${KAT_TEST_REGISTRY:-}" ]; then
    source <(scripts/test-fixtures.sh)
    own_registries=${KAT_TEST_REGISTRY_PIDS:-}
    trap '[ -z "$own_registries" ] || kill $own_registries 2>/dev/null || true' EXIT
fi
for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null || { echo "tests/ui: $tool is missing: run scripts/install-deps.sh" >&2; exit 1; }
done
# Debian's selenium, whatever python3 comes first on PATH.
PYTHON=/usr/bin/python3
"$PYTHON" -c 'import selenium' 2>/dev/null || { echo "tests/ui: python3-selenium is missing: run scripts/install-deps.sh" >&2; exit 1; }

echo "==> tests/ui: building kat-agent and katcall"
cargo build -q --locked -p kat-agent -p katcall
BIN=$PWD/target/debug
SHOTS=$PWD/target/ui-screenshots
rm -rf "$SHOTS" && mkdir -p "$SHOTS"

dir=$(mktemp -d /tmp/kat-ui-XXXXXX)
chmod 0711 "$dir"
read -r api_port etcd_port peer_port host_port < <("$PYTHON" - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
cat > "$dir/cluster.kat" <<KAT
apiVersion: kat.dws.rip/v1alpha1
kind: ClusterConfiguration
metadata:
  name: ui
spec:
  clusterCIDR: 10.120.0.0/16
  serviceCIDR: 10.220.0.0/16
  apiPort: $api_port
  etcdClientPort: $etcd_port
  etcdPeerPort: $peer_port
  agentTickSeconds: 2
  volumeBasePath: $dir/volumes
  backupPath: $dir/backups
KAT
# The example as shipped, from this run's registry and on a free host port.
mkdir -p "$dir/hello"
for f in examples/hello/*.kat; do
    sed -e "s#127.0.0.1:5000/kat/busybox:latest#$KAT_TEST_REGISTRY/kat/busybox:latest#" \
        -e "s#hostPort: 8080#hostPort: $host_port#" "$f" > "$dir/hello/$(basename "$f")"
done

agent_pid=
cleanup() {
    local rc=$?
    if [ -n "$agent_pid" ]; then
        "$BIN/katcall" --config "$dir/katcall.yaml" delete workload hello >/dev/null 2>&1 || true
        # Containers outlive their agent: let it stop them before it goes.
        # The instance leaves the API before its container has stopped: wait for the node's
        # container records too (stopping the agent at once left the example's container
        # running after every run).
        for _ in $(seq 1 60); do
            if ! "$BIN/katcall" --config "$dir/katcall.yaml" get instances -o json 2>/dev/null | grep -q '"hello"' \
                && [ -z "$(ls -A "$dir/data/runtime/containers" 2>/dev/null)" ]; then
                break
            fi
            sleep 0.5
        done
        kill -TERM "$agent_pid" 2>/dev/null || true
        wait "$agent_pid" 2>/dev/null || true
    fi
    cp "$dir/agent.log" "$SHOTS/agent.log" 2>/dev/null || true
    if [ "$rc" != 0 ]; then
        echo "==> tests/ui failed; the agent's log ends:" >&2
        tail -n 40 "$dir/agent.log" >&2 || true
    fi
    rm -rf "$dir" 2>/dev/null || true
    [ -z "$own_registries" ] || kill $own_registries 2>/dev/null || true
    exit "$rc"
}
trap cleanup EXIT

echo "==> tests/ui: starting a one-node cluster on https://127.0.0.1:$api_port"
cgroup_args=()
[ -z "${KAT_TEST_CGROUP_PARENT:-}" ] || cgroup_args=(--cgroup-parent "$KAT_TEST_CGROUP_PARENT")
KAT_INIT=$KAT_INIT "$BIN/kat-agent" init --config "$dir/cluster.kat" --data-dir "$dir/data" \
    --node-name ui-node --client-config "$dir/katcall.yaml" --insecure-registry "$KAT_TEST_REGISTRY" \
    --stop-grace-seconds 2 --api-bind 127.0.0.1 "${cgroup_args[@]}" >"$dir/agent.log" 2>&1 &
agent_pid=$!
ready=
for _ in $(seq 1 300); do
    if [ -s "$dir/katcall.yaml" ] && "$BIN/katcall" --config "$dir/katcall.yaml" get nodes 2>/dev/null | grep -q Ready; then
        ready=1
        break
    fi
    kill -0 "$agent_pid" 2>/dev/null || { echo "tests/ui: the agent exited" >&2; exit 1; }
    sleep 0.2
done
[ -n "$ready" ] || { echo "tests/ui: the node was not Ready within 60 s" >&2; exit 1; }

echo "==> tests/ui: Chromium through WebDriver"
KAT_UI_URL="https://127.0.0.1:$api_port" \
KAT_UI_CONFIG="$dir/katcall.yaml" \
KAT_UI_KATCALL="$BIN/katcall" \
KAT_UI_EXAMPLE="$dir/hello" \
KAT_UI_SCREENSHOTS="$SHOTS" \
    "$PYTHON" tests/ui/browser.py
