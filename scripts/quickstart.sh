#!/usr/bin/env bash
# The newcomer's command: install what is needed, build KAT, check the example workloads and
# run KAT's state store against a real etcd that KAT starts and supervises itself.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh

echo "==> building (release)"
cargo build --release -q -p katcall -p kat-store --example store_bench

echo "==> validating the example Quadlets"
for dir in examples/*/; do
    ./target/release/katcall validate -f "$dir"
done
./target/release/katcall validate --cluster examples/cluster.kat

echo "==> a deliberately broken workload, to show what errors look like"
broken=$(mktemp -d)
trap 'rm -rf "$broken"' EXIT
sed -e 's/memory: 64Mi/memory: 64MB/' -e 's/name: hello/name: Hello/' examples/hello/workload.kat > "$broken/workload.kat"
./target/release/katcall validate -f "$broken" || true

echo "==> starting a supervised etcd and measuring the state store on it"
./target/release/examples/store_bench

echo
echo "Done. Try: ./target/release/katcall validate -f examples/hello"
echo "Shell completions: ./target/release/katcall completion bash > ~/.local/share/bash-completion/completions/katcall"
