#!/usr/bin/env bash
# The whole test suite: unit, property, conformance (MemStore and a real etcd), the managed
# etcd process, the CLI, the hostile-input properties of the fuzz targets, the container
# runtime on the real kernel (a loopback registry, images built with buildah) — as root and
# again as an unprivileged user with a subuid range — the dashboard in Chromium
# (tests/ui/run.sh), and, where ../shared/vm is beside the checkout, the systemd VM stage
# (tests/vm/run.sh; KAT_SKIP_VM=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
# A test run gains nothing from incremental state (gigabytes in target/); iterate with cargo itself.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> the benchmarks' regression guard parses (bench/guard.py --check)"
python3 bench/guard.py --check
echo "==> cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -q -- -D warnings
# What a developer's machine often has: a registry on 127.0.0.1:5000 (the quickstart's,
# Docker's registry:2) and a page on 8080 (the quickstart's hello). The suite runs beside
# them: where those ports are free, it starts foreign ones of its own first, so a test that
# reaches for them by accident fails here, not only on a developer's machine.
FOREIGN_PIDS=()
FOREIGN_DIR=$(mktemp -d)
if ! ss -Hltn 'sport = :5000' | grep -q .; then
    printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: 127.0.0.1:5000}\n' \
        "$FOREIGN_DIR/registry" > "$FOREIGN_DIR/registry.yml"
    docker-registry serve "$FOREIGN_DIR/registry.yml" >/dev/null 2>&1 &
    FOREIGN_PIDS+=($!)
fi
if ! ss -Hltn 'sport = :8080' | grep -q .; then
    mkdir -p "$FOREIGN_DIR/www"
    echo "hello from hello-foreign" > "$FOREIGN_DIR/www/index.html"
    python3 -m http.server 8080 --bind 127.0.0.1 --directory "$FOREIGN_DIR/www" >/dev/null 2>&1 &
    FOREIGN_PIDS+=($!)
fi
for port in 5000 8080; do
    for _ in $(seq 1 50); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
done
echo "==> test fixtures: static kat-init, busybox image, loopback registry"
source <(scripts/test-fixtures.sh)
# The registries this run started (on ports no other checkout's registry holds) and the
# foreign services go with it.
trap '[ -z "${KAT_TEST_REGISTRY_PIDS:-}" ] || kill $KAT_TEST_REGISTRY_PIDS 2>/dev/null || true
      [ ${#FOREIGN_PIDS[@]} = 0 ] || kill "${FOREIGN_PIDS[@]}" 2>/dev/null || true
      rm -rf "$FOREIGN_DIR"' EXIT
echo "==> cargo build --workspace --bins"
# The end-to-end tests run the workspace's binaries (kat-agent, katcall, kat-ingress) from
# target/debug; cargo test builds only those of packages that have integration tests, so a
# clean clone needs them built first.
cargo build --workspace --bins --locked
echo "==> cargo test --workspace"
cargo test --workspace --all-targets --locked
echo "==> the dashboard in a real browser (tests/ui/run.sh)"
tests/ui/run.sh
if [ "$(id -u)" = 0 ]; then
    echo "==> runtime and kat-init suites again, rootless"
    scripts/test-rootless.sh
else
    echo "==> (the suite ran unprivileged; run as root to also run it as root)"
fi
VM_DIR=${KAT_VM_DIR:-../shared/vm}
if [ "${KAT_SKIP_VM:-0}" = 1 ]; then
    echo "==> VM stage skipped (KAT_SKIP_VM=1)"
elif [ "$(id -u)" != 0 ] || [ ! -x "$VM_DIR/run-in-vm.sh" ]; then
    echo "==> VM stage skipped: it needs root and $VM_DIR/run-in-vm.sh (see tests/vm/run.sh)"
else
    echo "==> VM stage: systemd + cgroup v2 guest, kat-agent as a user service"
    KAT_VM_DIR=$VM_DIR tests/vm/run.sh
fi
