#!/usr/bin/env bash
# Container start latency: create request → the workload's first byte of output, 100 runs
# each, for KAT's runtime, `crun run` and `podman run --rm`, in the same run on the same
# image. Installs what it needs. Last line:
#   start_p50_ms kat=X crun=Y podman=Z kat/crun=R1 kat/podman=R2
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
need_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
peers=()
command -v crun >/dev/null 2>&1 || peers+=(crun)
command -v runc >/dev/null 2>&1 || peers+=(runc)
command -v podman >/dev/null 2>&1 || peers+=(podman)
if [ ${#peers[@]} -gt 0 ]; then
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${peers[@]}" >/dev/null
fi
source <(scripts/test-fixtures.sh)
podman pull -q --tls-verify=false "$KAT_TEST_REGISTRY/kat/busybox:latest" >/dev/null
export BENCH_DIR=${BENCH_DIR:-$(mktemp -d /tmp/kat-bench.XXXXXX)}
chmod 0711 "$BENCH_DIR"
cargo build -q --release --locked -p kat-runtime --example start_bench
RUNS=${RUNS:-100} ./target/release/examples/start_bench | python3 bench/guard.py
rm -rf "$BENCH_DIR"
