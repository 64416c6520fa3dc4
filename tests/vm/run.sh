#!/usr/bin/env bash
# The VM test stage: KAT on a real systemd host with pure cgroup v2, as an unprivileged user.
#
# Builds release binaries here, boots the Debian guest of ../shared/vm (systemd PID 1, cgroup
# v2, a lingering sudo user `tester`; the image is built once, ~3 min, and cached in
# /var/tmp/vm-guest), copies in the binaries, etcd, a registry and the test image, and runs
# tests/vm/scenarios.sh there as `tester`:
#   runtime-v2 (the runtime's lifecycle suite, unprivileged, on delegated cgroup v2 and as
#   systemd scopes), setup, cluster-up, network, build (a git workload built by buildah in
#   the guest: VM_EXTRA_PKGS adds buildah to the image), limits (memory OOMKilled, cpu.max and throttling, pids.max vs a fork
#   bomb), agent-restart (containers survive, re-adopted), reboot (workloads back, logs
#   intact), backup-restore (a backup, `kat-agent restore` by the operations guide's steps:
#   workloads adopted, a later one gone), uninstall (nothing left).
# Prints one PASS/FAIL line per scenario; exits non-zero if any failed.
# Env: KAT_VM_KEEP=1 leaves the VM running afterwards; KAT_VM_SCENARIOS="setup cluster-up
# limits" runs only those (setup first when any later one is named); VM_* as in
# ../shared/vm/run-in-vm.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VM=${KAT_VM_DIR:-$ROOT/../shared/vm}
[ -x "$VM/run-in-vm.sh" ] || { echo "tests/vm/run.sh: $VM/run-in-vm.sh not found (set KAT_VM_DIR)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "tests/vm/run.sh must run as root (it builds and boots the VM image)" >&2; exit 1; }

echo "==> fixtures: static kat-init, busybox image, loopback registry"
source <(scripts/test-fixtures.sh)
STAGE=
# The registries this stage started (none when test.sh's are running) go with it.
trap '[ -z "$STAGE" ] || rm -rf "$STAGE"; [ -z "${KAT_TEST_REGISTRY_PIDS:-}" ] || kill $KAT_TEST_REGISTRY_PIDS 2>/dev/null || true' EXIT
echo "==> release build"
cargo build --release --locked -q -p kat-agent -p katcall
echo "==> the runtime's lifecycle, escape, reserved directory and layer confinement tests, to run on cgroup v2 in the guest"
test_binary() {
  cargo test -q -p kat-runtime --test "$1" --no-run --locked --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
LIFECYCLE=$(test_binary lifecycle)
ESCAPE=$(test_binary escape)
RESERVED=$(test_binary reserved_dir)
LAYERS=$(test_binary layer_confinement)
for b in "$LIFECYCLE" "$ESCAPE" "$RESERVED" "$LAYERS"; do
  [ -x "$b" ] || { echo "tests/vm/run.sh: a runtime test binary was not built" >&2; exit 1; }
done

STAGE=$(mktemp -d /tmp/kat-vm-stage.XXXXXX)
mkdir -p "$STAGE/kat-vm/bin" "$STAGE/kat-vm/registry" "$STAGE/kat-vm/tests"
cp "$LIFECYCLE" "$STAGE/kat-vm/tests/lifecycle"
cp "$ESCAPE" "$STAGE/kat-vm/tests/escape"
cp "$RESERVED" "$STAGE/kat-vm/tests/reserved_dir"
cp "$LAYERS" "$STAGE/kat-vm/tests/layer_confinement"
cp -a "$KAT_TEST_PROBE_DIR" "$STAGE/kat-vm/probe"
cp target/debug/kat-runtime-helper "$STAGE/kat-vm/tests/"
cp target/release/kat-agent target/release/katcall "$KAT_INIT" "$(command -v etcd)" \
   "$(command -v etcdctl)" \
   "$(command -v docker-registry)" "$STAGE/kat-vm/bin/"
cp -a target/kat-fixtures/registry/. "$STAGE/kat-vm/registry/"
cp tests/vm/scenarios.sh "$STAGE/kat-vm/"
echo "${KAT_VM_SCENARIOS:-}" > "$STAGE/kat-vm/only"

# The build scenario runs buildah in the guest (part of the image's cache key).
export VM_EXTRA_PKGS="${VM_EXTRA_PKGS:-buildah}"
echo "==> booting the VM and running the scenarios (software emulation: minutes)"
t0=$SECONDS
set +e
"$VM/run-in-vm.sh" -c "$STAGE/kat-vm" -- bash scenarios.sh
rc=$?
set -e
[ "${KAT_VM_KEEP:-0}" = 1 ] || "$VM/run-in-vm.sh" --stop
echo "==> VM stage: $((SECONDS - t0)) s, exit $rc"
exit $rc
