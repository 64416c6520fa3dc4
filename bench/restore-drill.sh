#!/usr/bin/env bash
# The disaster drill on three test hosts (network namespaces on a bridge, each agent its own
# user): a Service, a Job and a DaemonService; a backup (`katcall backup create`); a workload
# applied after it; every agent killed and every node's etcd data destroyed; `kat-agent
# restore` on n1, `kat-agent rejoin` on n2 and n3. restore_s runs from the restore command
# until every workload of the backup runs again (3 Ready nodes). The test suite runs the same
# drill (agent/tests/cluster/, restore_drill). Needs root. The last line is exactly:
#   restore_drill workloads_back=N/M duplicates=D restore_s=T
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
source <(scripts/test-fixtures.sh)
cargo build --release -q -p kat-agent -p katcall
cargo test --release -q -p kat-agent --test cluster -- --test-threads 1 --nocapture --exact restore::restore_drill 2>&1 \
  | grep -E "^restore_drill " | tail -n 1 | python3 bench/guard.py
