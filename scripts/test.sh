#!/usr/bin/env bash
# The whole test suite: unit, property, conformance (MemStore and a real etcd), the managed
# etcd process, the CLI, and the hostile-input properties of the fuzz targets.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo test --workspace"
cargo test --workspace --all-targets --locked
