#!/usr/bin/env bash
# Builds what the runtime tests and benchmarks need, from local parts only:
#   - kat-init as a static binary;
#   - a busybox image (busybox-static in a FROM scratch image, built with buildah);
#   - a loopback registry (Debian's docker-registry) serving it as kat/busybox:latest;
#   - the same image as an OCI layout directory;
#   - a second registry, on the next port, that wants basic auth (htpasswd, test-only
#     credentials) and serves the same image.
# The registries are this checkout's own: started from configs under target/, their pids
# recorded beside them. One left by another checkout (or anything else on the port) is never
# used: 127.0.0.1:5000/5001 when free, else the first free pair from 5100 up
# (KAT_TEST_REGISTRY_PORT=N asks for N and N+1 and fails if they are taken).
# Idempotent: a second run only checks. Prints the environment the tests read, including
# KAT_TEST_REGISTRY_PIDS: the registries this run started (empty if they were running).
# `test-fixtures.sh --stop` stops this checkout's registries.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FIX=${KAT_FIXTURES:-$ROOT/target/kat-fixtures}
mkdir -p "$FIX"

# Ours: the recorded pid is alive and serves our config.
ours() {
  local pid
  pid=$(cat "$FIX/$1.pid" 2>/dev/null) || return 1
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$FIX/$1.yml"
}
stop() {
  local pid
  for name in registry registry-auth; do
    if ours "$name"; then pid=$(cat "$FIX/$name.pid"); kill "$pid" 2>/dev/null || true; fi
    rm -f "$FIX/$name.pid"
  done
}
if [ "${1:-}" = --stop ]; then stop; exit 0; fi

listening() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }
free_pair() { ! listening "$1" && ! listening "$(($1 + 1))"; }
if ours registry && ours registry-auth && [ -s "$FIX/registry.port" ] \
    && { [ -z "${KAT_TEST_REGISTRY_PORT:-}" ] || [ "$(cat "$FIX/registry.port")" = "$KAT_TEST_REGISTRY_PORT" ]; }; then
  PORT=$(cat "$FIX/registry.port")
else
  stop
  if [ -n "${KAT_TEST_REGISTRY_PORT:-}" ]; then
    PORT=$KAT_TEST_REGISTRY_PORT
    free_pair "$PORT" || { echo "ports $PORT and $((PORT + 1)) are taken by something this checkout did not start (ss -ltnp 'sport = :$PORT'): stop it, or unset KAT_TEST_REGISTRY_PORT" >&2; exit 1; }
  elif free_pair 5000; then
    PORT=5000
  else
    PORT=5100
    while ! free_pair "$PORT"; do
      PORT=$((PORT + 2))
      [ "$PORT" -lt 5200 ] || { echo "no free pair of ports for the test registries in 5000, 5100-5199" >&2; exit 1; }
    done
  fi
  echo "$PORT" > "$FIX/registry.port"
fi
REGISTRY=127.0.0.1:$PORT
STARTED=()
# A fixture that fails half-way takes down the registries it started: the caller never
# learns their pids.
trap 'rc=$?; [ $rc = 0 ] || [ ${#STARTED[@]} = 0 ] || kill "${STARTED[@]}" 2>/dev/null || true; exit $rc' EXIT

need() { command -v "$1" >/dev/null 2>&1 || { echo "missing $1: run scripts/install-deps.sh" >&2; exit 1; }; }
need buildah; need docker-registry; need curl; need htpasswd
AUTH_REGISTRY=127.0.0.1:$((PORT + 1))
AUTH_CREDS=kat-test:kat-test-secret
export STORAGE_DRIVER=vfs

# kat-init, static, so it runs in a FROM scratch container.
# The escape probe too: the runtime's escape tests mount it into containers.
RUSTFLAGS="-C target-feature=+crt-static" cargo build -q -p kat-init -p kat-escape-probe --release --target x86_64-unknown-linux-gnu
INIT=$ROOT/target/x86_64-unknown-linux-gnu/release/kat-init

# The registry, on loopback, storing under target/.
if ! ours registry; then
  mkdir -p "$FIX/registry"
  cat > "$FIX/registry.yml" <<YML
version: 0.1
log: {level: error}
storage:
  filesystem: {rootdirectory: $FIX/registry}
  delete: {enabled: true}
http: {addr: $REGISTRY}
YML
  setsid docker-registry serve "$FIX/registry.yml" >"$FIX/registry.log" 2>&1 < /dev/null &
  echo $! > "$FIX/registry.pid"
  STARTED+=($!)
  for _ in $(seq 50); do curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS "http://$REGISTRY/v2/" >/dev/null || { cat "$FIX/registry.log"; exit 1; }
fi

# The image's config digest in the registry and in the layout: they differ when either is
# missing or stale (then both are made again, the same).
registry_config() {
  curl -fsS -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REGISTRY/v2/kat/busybox/manifests/latest" 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null
}
layout_config() {
  python3 - "$FIX/busybox-oci" 2>/dev/null <<'PY'
import json, os, sys
d = sys.argv[1]
manifest = json.load(open(os.path.join(d, "index.json")))["manifests"][0]["digest"]
blob = os.path.join(d, "blobs", *manifest.split(":"))
print(json.load(open(blob))["config"]["digest"])
PY
}

# The image: busybox and its applet links, nothing else; User root, Cmd sh.
have=$(registry_config || true)
if [ -z "$have" ] || [ "$have" != "$(layout_config || true)" ]; then
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  mkdir -p "$mnt/bin" "$mnt/etc" "$mnt/tmp" "$mnt/root"
  cp "$(readlink -f /bin/busybox)" "$mnt/bin/busybox"
  for applet in $("$mnt/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$mnt/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\napp:x:1000:1000:app:/tmp:/bin/sh\n' > "$mnt/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\napp:x:1000:\n' > "$mnt/etc/group"
  chmod 1777 "$mnt/tmp"
  buildah umount "$ctr" >/dev/null
  buildah config --cmd /bin/sh --env PATH=/bin --workingdir / "$ctr"
  buildah commit -q "$ctr" kat-busybox >/dev/null
  buildah rm "$ctr" >/dev/null
  buildah push -q --tls-verify=false kat-busybox "docker://$REGISTRY/kat/busybox:latest"
  rm -rf "$FIX/busybox-oci"
  buildah push -q kat-busybox "oci:$FIX/busybox-oci:latest"
fi

# The same image behind basic auth.
if ! ours registry-auth; then
  mkdir -p "$FIX/registry-auth"
  htpasswd -Bbn "${AUTH_CREDS%%:*}" "${AUTH_CREDS#*:}" > "$FIX/htpasswd"
  cat > "$FIX/registry-auth.yml" <<YML
version: 0.1
log: {level: error}
storage:
  filesystem: {rootdirectory: $FIX/registry-auth}
auth:
  htpasswd: {realm: kat-test, path: $FIX/htpasswd}
http: {addr: $AUTH_REGISTRY}
YML
  setsid docker-registry serve "$FIX/registry-auth.yml" >"$FIX/registry-auth.log" 2>&1 < /dev/null &
  echo $! > "$FIX/registry-auth.pid"
  STARTED+=($!)
  for _ in $(seq 50); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$AUTH_REGISTRY/v2/")" = 401 ] && break; sleep 0.1; done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$AUTH_REGISTRY/v2/")" = 401 ] || { cat "$FIX/registry-auth.log"; exit 1; }
fi
if ! curl -fsS -u "$AUTH_CREDS" "http://$AUTH_REGISTRY/v2/kat/busybox/manifests/latest" -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' 2>/dev/null; then
  buildah inspect kat-busybox >/dev/null 2>&1 || {
    buildah pull -q --tls-verify=false "docker://$REGISTRY/kat/busybox:latest" >/dev/null
    buildah tag "$REGISTRY/kat/busybox:latest" kat-busybox
  }
  buildah push -q --tls-verify=false --creds "$AUTH_CREDS" kat-busybox "docker://$AUTH_REGISTRY/kat/busybox:latest"
fi

# The escape probe in a directory of its own (mounted read-only into test containers).
mkdir -p "$FIX/probe"
install -m 0755 "$ROOT/target/x86_64-unknown-linux-gnu/release/kat-escape-probe" "$FIX/probe/"
chmod 0755 "$FIX" "$FIX/probe"

cat > "$FIX/env" <<ENV
export KAT_INIT=$INIT
export KAT_TEST_PROBE_DIR=$FIX/probe
export KAT_TEST_REGISTRY=$REGISTRY
export KAT_TEST_LAYOUT=$FIX/busybox-oci
export KAT_TEST_AUTH_REGISTRY=$AUTH_REGISTRY
export KAT_TEST_AUTH_CREDS=$AUTH_CREDS
export KAT_TEST_REGISTRY_PIDS="${STARTED[*]}"
ENV
cat "$FIX/env"
