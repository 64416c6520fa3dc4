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
# Then a second pass (scripts/link_order_uprobes.py, root: uprobes) runs the node again on
# the release binary so linked, with a uprobe on every function the list does not name, and
# appends those that ran: the standard library's, C and assembly, and generic instances the
# two builds placed differently, which the counters cannot name.
# A name the linker does not find (code changed since) is skipped: a stale list places less
# code and breaks nothing. Run it after large changes; the benchmark guard shows when the
# agent's RSS drifts.
#
#   sudo scripts/link-order.sh   # ~45 min on 2 cores, 20 of them the kernel removing uprobes
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "link-order.sh places uprobes: run it as root" >&2; exit 1; }
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
# A node runs without RUST_BACKTRACE (with it, anyhow captures a backtrace at each error).
env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE LLVM_PROFILE_FILE="$WORK/raw/%p.profraw" \
    KAT_BENCH_BIN="$WORK/target/release" RUNS=5 python3 -u bench/apply_to_running.py
# The holder writes its counters when it exits, once the benchmark's directory is gone.
sleep 3
python3 scripts/link_order.py "$PROFDATA" "$WORK/raw" target/release/kat-agent agent/link-order.txt
cargo build -q --release --locked -p kat-agent -p katcall
# Probes attach to a file: this copy is the binary the benchmark runs, and nothing else.
mkdir -p "$WORK/plain" && cp target/release/kat-agent target/release/katcall "$WORK/plain/"
python3 -u scripts/link_order_uprobes.py "$WORK/plain/kat-agent" agent/link-order.txt -- \
    env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE KAT_BENCH_BIN="$WORK/plain" RUNS=5 \
    python3 -u bench/apply_to_running.py
cargo build -q --release --locked -p kat-agent
