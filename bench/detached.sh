#!/usr/bin/env bash
# Detached mode on test hosts (network namespaces on a bridge, each agent its own user): n1
# leads, n4 is a laptop worker (--parent-cluster-name trio --node-type laptop). n4 is cut off
# from n1 with iptables in its namespace (its LAN kept), goes detached, takes a workload on
# its own API, and rejoins through the signed multicast exchange once the link is back. The
# test suite runs the same scenario (agent/tests/cluster/, detached_laptop_rejoins).
#   detached_after_s: from the cut until the node leads its own cluster (the timeout,
#                     nodeLossTimeoutSeconds, is 8 s; the rest is its local etcd starting);
#   rejoined_after_s: from the link's return until the node is the parent's worker again,
#                     its workload submitted.
# Needs root. The last line is exactly:
#   detached_laptop detached_after_s=T rejoined_after_s=T
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
source <(scripts/test-fixtures.sh)
cargo build -q -p kat-agent -p katcall
cargo test -q -p kat-agent --test cluster -- --test-threads 1 --nocapture --exact detached::detached_laptop_rejoins 2>&1 \
  | grep -E "^detached_laptop " | tail -n 1 | python3 bench/guard.py
