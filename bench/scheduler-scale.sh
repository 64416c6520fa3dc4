#!/usr/bin/env bash
# Control-plane scale: 1,000 simulated nodes, 10,000 instances, on MemStore and a real etcd,
# then rescheduling after 100 nodes are lost. Installs etcd if missing; builds in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
cargo build --release -q -p kat-leader --features sim --example scheduler_scale
./target/release/examples/scheduler_scale | python3 bench/guard.py
