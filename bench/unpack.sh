#!/usr/bin/env bash
# Layer unpack: KAT in the agent's process, KAT in its unpack sandbox (as the reserved id
# slice, then shifted to the store's owner) and GNU tar, on one generated layer (3,000
# files, ~90 MiB), median of RUNS (5). As root; KAT_BENCH_ROOTLESS=USER runs it as USER
# (who needs a subuid range of two slices or more). Last line:
#   unpack_ms in_process=X sandboxed=Y tar=Z sandboxed/in_process=R1 sandboxed/tar=R2
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release --locked -p kat-runtime --bin kat-runtime-helper --example unpack_bench
export BENCH_DIR=${BENCH_DIR:-$(mktemp -d /var/tmp/kat-unpack.XXXXXX)}
export KAT_RUNTIME_HELPER=$PWD/target/release/kat-runtime-helper
trap 'rm -rf "$BENCH_DIR"' EXIT
if [ -n "${KAT_BENCH_ROOTLESS:-}" ]; then
  chown "$KAT_BENCH_ROOTLESS" "$BENCH_DIR"
  runuser -u "$KAT_BENCH_ROOTLESS" -- env BENCH_DIR="$BENCH_DIR" KAT_RUNTIME_HELPER="$KAT_RUNTIME_HELPER" \
    RUNS="${RUNS:-5}" ./target/release/examples/unpack_bench | python3 bench/guard.py
else
  RUNS=${RUNS:-5} ./target/release/examples/unpack_bench | python3 bench/guard.py
fi
