#!/usr/bin/env bash
# Runs the runtime and kat-init test suites again as an unprivileged user, the way
# kat-agent runs in production: a user with a subuid/subgid range, newuidmap/newgidmap,
# and (on cgroup v1/hybrid hosts like CI) cgroup directories root created and handed over
# once, as `kat-agent setup` does. Needs root to create the user; run scripts/test-fixtures.sh
# first (scripts/test.sh does both). KAT_ROOTLESS_ONLY=NAME runs only the test binaries whose
# name starts with NAME (e.g. `survival`), and not the end-to-end test.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
USER_NAME=${KAT_ROOTLESS_USER:-kat-test}
CGROUP_PARENT=/kat-rootless
[ "$(id -u)" = 0 ] || { echo "test-rootless.sh must run as root (it creates $USER_NAME)" >&2; exit 1; }
source target/kat-fixtures/env

if ! id "$USER_NAME" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash "$USER_NAME"
fi
# 16 workload slices of 65536 ids (a user made by an older checkout had one: replaced), away
# from the 300000.. range the root runs use.
RANGE=2000000-3048575
for f in subuid subgid; do
  if ! grep -q "^$USER_NAME:2000000:1048576$" /etc/$f; then
    sed -i "/^$USER_NAME:/d" /etc/$f
    usermod "--add-${f}s" "$RANGE" "$USER_NAME"
  fi
done
uid=$(id -u "$USER_NAME"); gid=$(id -g "$USER_NAME")

# cgroup v1/hybrid: the one-time root step. (On a delegated v2 host systemd does this.)
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  # libcontainer's v1 manager joins every controller it knows, so each gets a parent.
  for ctrl in blkio cpu cpuacct cpuset devices freezer hugetlb memory net_cls net_prio perf_event pids; do
    [ -d "/sys/fs/cgroup/$ctrl" ] || continue
    dir="/sys/fs/cgroup/$ctrl$CGROUP_PARENT"
    mkdir -p "$dir"
    if [ "$ctrl" = cpuset ]; then   # a cpuset child is unusable until it has cpus and mems
      cat /sys/fs/cgroup/cpuset/cpuset.cpus > "$dir/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems > "$dir/cpuset.mems"
    fi
    chown -R "$uid:$gid" "$dir"
  done
fi

TMP=/tmp/kat-rootless-tests
rm -rf "$TMP"; mkdir -p "$TMP"; chown "$uid:$gid" "$TMP"; chmod 0711 "$TMP"

mapfile -t bins < <(cargo test -q -p kat-runtime -p kat-init -p kat-netns --no-run --locked --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
if [ -n "${KAT_ROOTLESS_ONLY:-}" ]; then
  mapfile -t bins < <(printf '%s\n' "${bins[@]}" | grep "/${KAT_ROOTLESS_ONLY}[^/]*$" || true)
fi
[ ${#bins[@]} -gt 0 ] || { echo "no test binaries found" >&2; exit 1; }
status=0
for bin in "${bins[@]}"; do
  echo "== rootless: $(basename "$bin")"
  (cd "$(dirname "$bin")/../.." && runuser -u "$USER_NAME" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$TMP" \
    KAT_INIT="$KAT_INIT" KAT_TEST_PROBE_DIR="$KAT_TEST_PROBE_DIR" KAT_TEST_REGISTRY="$KAT_TEST_REGISTRY" KAT_TEST_LAYOUT="$KAT_TEST_LAYOUT" \
    KAT_TEST_AUTH_REGISTRY="$KAT_TEST_AUTH_REGISTRY" KAT_TEST_AUTH_CREDS="$KAT_TEST_AUTH_CREDS" \
    KAT_TEST_TMP="$TMP" KAT_TEST_CGROUP_PARENT="$CGROUP_PARENT" CARGO_MANIFEST_DIR="$ROOT/runtime" \
    "$bin" --test-threads 2) || status=1
done

[ -z "${KAT_ROOTLESS_ONLY:-}" ] || exit $status
# The one-node end-to-end test again, with the agent as a user `kat-agent setup` prepared.
AGENT_USER=kat-e2e
SETUP=(--user "$AGENT_USER" --prefix /tmp/kat-e2e-setup/prefix --config-dir /tmp/kat-e2e-setup/etc
       --state-dir /tmp/kat-e2e-setup/home --cgroup-parent /kat-e2e --init-binary "$KAT_INIT")
echo "== rootless: one-node end to end, kat-agent as $AGENT_USER (prepared by kat-agent setup)"
target/debug/kat-agent setup "${SETUP[@]}" >/dev/null
KAT_TEST_AGENT_USER=$AGENT_USER KAT_TEST_CGROUP_PARENT=/kat-e2e \
  cargo test -q -p kat-agent --locked --test one_node || status=1
target/debug/kat-agent setup --uninstall "${SETUP[@]}" >/dev/null || status=1
exit $status
