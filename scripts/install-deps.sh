#!/usr/bin/env bash
# Install what KAT needs to build and test on Debian/Ubuntu. Idempotent: installs only what is
# missing. Sourced by quickstart.sh and test.sh; run it alone to prepare a machine.
set -euo pipefail

need_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v curl >/dev/null 2>&1 || missing+=(curl)
# The runtime's tests: images built with buildah from busybox-static, served by a loopback
# registry; newuidmap/newgidmap for rootless user namespaces.
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v newuidmap >/dev/null 2>&1 || missing+=(uidmap)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
# htpasswd (bcrypt) for the registry that tests basic auth.
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# Container networking: links and routes, NAT, egress, and for tests and benchmarks a
# packet capture, iperf3 and a userspace WireGuard peer to compare with.
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v tcpdump >/dev/null 2>&1 || missing+=(tcpdump)
command -v iperf3 >/dev/null 2>&1 || missing+=(iperf3)
command -v wireguard-go >/dev/null 2>&1 || missing+=(wireguard-go)
command -v wg >/dev/null 2>&1 || missing+=(wireguard-tools)
# Builds from Git: libgit2 is compiled in (git2) with the system's OpenSSL for https; the
# tests serve repositories with git daemon; setpriv/unshare are util-linux.
dpkg -s libssl-dev >/dev/null 2>&1 || missing+=(libssl-dev)
command -v git >/dev/null 2>&1 || missing+=(git)
# promtool checks that /metrics is valid exposition text (the Prometheus server itself is not
# started: without systemd as PID 1 nothing starts it, and on systemd hosts it is stopped below).
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# The ingress recipe (examples/ingress/): Caddy, put in its image beside kat-ingress.
command -v caddy >/dev/null 2>&1 || missing+=(caddy)
# The dashboard's browser test (tests/ui/run.sh): Chromium, its WebDriver and selenium.
if grep -qs '^ID=ubuntu' /etc/os-release; then
    # Ubuntu's come as one snap (chromium-browser and its chromedriver).
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-chromedriver)
else
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
fi
/usr/bin/python3 -c 'import selenium' >/dev/null 2>&1 || missing+=(python3-selenium)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# An unprivileged agent opens /dev/net/tun for egress and the overlay; most distributions
# ship it 0666 (the kernel checks CAP_NET_ADMIN in the namespace that owns the device's
# network, not the file mode), a few 0600.
if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
    echo "==> /dev/net/tun is $(stat -c %a /dev/net/tun); making it 0666 so an unprivileged agent can use it"
    need_root chmod 0666 /dev/net/tun
fi
# Debian's etcd-server package starts a system etcd on 2379; KAT runs its own, so stop that one.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    echo "==> stopping the distribution's etcd service (KAT starts and supervises its own etcd)"
    need_root systemctl disable --now etcd >/dev/null 2>&1 || true
fi
# Likewise its registry (with auth, on :5000): the tests start their own on loopback.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
    need_root systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
# And Caddy's (on :80): the ingress recipe runs its own Caddy in a container.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet caddy 2>/dev/null; then
    need_root systemctl disable --now caddy >/dev/null 2>&1 || true
fi
# And the Prometheus server that comes with promtool (it would listen on :9090).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    need_root systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "==> installing the Rust toolchain with rustup (https://rustup.rs)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi
