#!/usr/bin/env bash
# Rollout benchmark (issue 28): 3 nodes on test hosts (network namespaces,
# tests/cluster/hosts.sh), a 3-replica Service with a health check and a hostPort (18080), a
# client on every node asking it by name (a DaemonService) and one on every test host through
# the published port, each about 10 requests/s; a Rolling update, then a rollback. Counts every
# request from the update's apply until the rollback's old instances have stopped; the gap is
# the longest time any client went without a successful answer. Needs root. Last line:
#   rollout requests=N failed=F max_gap_ms=G
# (target: F = 0, G < 1000). The same test runs in the suite and asserts F = 0.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
source <(scripts/test-fixtures.sh)
cargo build -q -p kat-agent -p katcall
cargo test -q -p kat-agent --test cluster -- --nocapture --exact rollout::rollout_loses_no_request 2>&1 \
  | grep -E "^(rolling update|rollback|rollout )|panicked|failed requests" | tail -n 10 | python3 bench/guard.py
