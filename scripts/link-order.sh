#!/usr/bin/env bash
# Regenerates agent/link-order.txt: the functions of the agent's binary that a working node
# runs, which the release link places side by side (agent/build.rs, lld's
# --symbol-ordering-file).
#
# Why: the kernel maps a binary's code 64 KiB around each page a process runs (fault-around),
# so functions that run once here and once there keep most of the 16 MB of text resident in
# the agent. Side by side, what a node runs fills a few MiB (docs/benchmarks.md, "link order").
#
# How: build the binary instrumented (`-Cprofile-generate`, its own target directory), run the
# one-node benchmark's measuring half with it (a node comes up, 3-replica services are
# applied, 10 containers run idle, everything is deleted), and list with the toolchain's
# llvm-profdata (rustup's `llvm-tools`) every function whose counters moved: the network
# holder's first, then the agent's, then the helpers'. The names are the instrumented build's;
# cargo gives the plain release build the same ones (scripts/link_order.py matches the rest).
# A name the linker does not find (code changed since) is skipped: a stale list places less
# code and breaks nothing. Run it after large changes; the benchmark guard shows when the
# agent's RSS drifts.
#
#   scripts/link-order.sh        # ~15 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
source <(scripts/test-fixtures.sh)
rustup component add llvm-tools >/dev/null
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
WORK=$PWD/target/link-order
rm -rf "$WORK/raw" && mkdir -p "$WORK/raw"
# Build scripts and proc macros are instrumented too and write into the baked-in directory
# as they run; the node's processes write where LLVM_PROFILE_FILE says, one file each.
RUSTFLAGS="-Cprofile-generate=$WORK/build-raw" CARGO_TARGET_DIR="$WORK/target" \
    cargo build -q --release --locked -p kat-agent -p katcall
cargo build -q --release --locked -p kat-agent
LLVM_PROFILE_FILE="$WORK/raw/%p.profraw" KAT_BENCH_BIN="$WORK/target/release" RUNS=5 \
    python3 -u bench/apply_to_running.py
# The holder writes its counters when it exits, once the benchmark's directory is gone.
sleep 3
python3 scripts/link_order.py "$PROFDATA" "$WORK/raw" target/release/kat-agent agent/link-order.txt
