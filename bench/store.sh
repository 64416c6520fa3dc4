#!/usr/bin/env bash
# Store benchmark: puts/s and watch latency for MemStore and a real etcd, in one run.
# Usage: bench/store.sh        (installs etcd-server if missing; builds in release mode)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v etcd >/dev/null || { sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo; $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq etcd-server; }
cargo build --release -q -p kat-store --example store_bench
./target/release/examples/store_bench | python3 bench/guard.py
