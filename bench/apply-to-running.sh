#!/usr/bin/env bash
# Apply to running: start a one-node cluster (release build, own etcd, loopback registry),
# then 20 times `katcall apply` a 3-replica Service and poll the API until all 3 instances
# are Running; then run 10 containers and measure kat-agent's idle memory and CPU (leader
# and agent roles in one process; etcd reported separately). Last line:
#   apply_to_running_p50_ms=X agent_idle_rss_mib=Y agent_idle_cpu_pct=Z
# KAT_BENCH_KEEP=1 keeps the work directory (agent.log; with KAT_LOG=info,kat_runtime::phases=debug
# it has each create's phases); KAT_BENCH_BIN=DIR runs kat-agent and katcall from DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
source <(scripts/test-fixtures.sh)
cargo build -q --release --locked -p kat-agent -p katcall
# Every run starts from the same kernel state (see bench/cluster.sh): as root, the memory
# cgroups earlier runs' containers left dying go with the page cache they hold.
if [ "$(id -u)" = 0 ]; then sync && echo 3 > /proc/sys/vm/drop_caches; fi
RUNS=${RUNS:-20} python3 -u bench/apply_to_running.py | python3 bench/guard.py
