#!/usr/bin/env bash
# Cluster benchmark: 3 nodes on test hosts (network namespaces, tests/cluster/hosts.sh), the
# time two nodes take to join as etcd peers, 5 leader failovers in a row (kill -9 of the
# leader's agent and etcd, the killed node restarted each time), and apply-to-running of a
# 6-replica Service across the 3 nodes (5 runs looking with katcall, 5 polling one kept-alive
# connection like bench/apply-to-running.sh). Needs root. KAT_BENCH_KEEP=DIR keeps the agents'
# logs there (KAT_LOG=info,kat_runtime::phases=debug adds the phases of each create). Last line:
#   cluster nodes_ready=N join_s=X failover_p50_s=Y failover_max_s=Z apply_to_running_3nodes_p50_ms=W apply_to_running_3nodes_polled_p50_ms=V
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
source <(scripts/test-fixtures.sh)
cargo build --release -q -p kat-agent -p katcall
# Every run starts from the same kernel state: a removed container's memory cgroup lives on
# (dying) while page cache is charged to it, and on this hybrid-cgroup host a few hundred of
# them, left by earlier runs, made creates twice as slow (docs/benchmarks.md, three nodes).
sync && echo 3 > /proc/sys/vm/drop_caches
log=$(mktemp /tmp/kat-cluster-bench.XXXXXX.log)
status=0
cargo test --release -q -p kat-agent --test cluster -- --ignored --nocapture cluster_benchmark \
  >"$log" 2>&1 || status=$?
{ grep -E "^(failover|apply to running|cluster )" "$log" || true; } | tail -n 20 | python3 bench/guard.py
if [ "$status" != 0 ]; then
  echo "the benchmark failed (exit $status); the end of its output ($log):" >&2
  grep -v -E '^ +([0-9]+: |at )' "$log" | tail -n 60 >&2
  exit "$status"
fi
rm -f "$log"
