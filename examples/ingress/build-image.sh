#!/usr/bin/env bash
# Build the ingress recipe's image, kat/ingress: Debian's Caddy and this project's
# kat-ingress in a FROM scratch image (each binary with the shared libraries it links, the
# CA bundle for ACME), and push it to REGISTRY.
#
#   examples/ingress/build-image.sh REGISTRY [KAT_INGRESS_BINARY] [--tls-verify=false]
#
# REGISTRY is HOST:PORT (the image is REGISTRY/kat/ingress:latest). KAT_INGRESS_BINARY
# defaults to target/release/kat-ingress, else target/debug/kat-ingress.
set -euo pipefail
registry=${1:?usage: build-image.sh REGISTRY [KAT_INGRESS_BINARY] [--tls-verify=false]}
here=$(cd "$(dirname "$0")/../.." && pwd)
binary=${2:-}
if [ -z "$binary" ]; then
    for b in "$here/target/release/kat-ingress" "$here/target/debug/kat-ingress"; do
        [ -x "$b" ] && { binary=$b; break; }
    done
fi
[ -x "${binary:-}" ] || { echo "build-image.sh: no kat-ingress binary (cargo build -p kat-ingress)" >&2; exit 1; }
caddy=$(command -v caddy) || { echo "build-image.sh: caddy is not installed (scripts/install-deps.sh)" >&2; exit 1; }
verify=${3:---tls-verify=true}

ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$(buildah mount "$ctr")
mkdir -p "$mnt/usr/bin" "$mnt/etc/ssl/certs" "$mnt/tmp" "$mnt/var/lib/kat-ingress"
chmod 1777 "$mnt/tmp"
install -m 0755 "$caddy" "$mnt/usr/bin/caddy"
install -m 0755 "$binary" "$mnt/usr/bin/kat-ingress"
# The shared libraries both link, and the dynamic loader, at the paths they were found.
for lib in $( (ldd "$caddy"; ldd "$binary") | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | sort -u); do
    mkdir -p "$mnt$(dirname "$lib")"
    cp -L "$lib" "$mnt$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
printf 'root:x:0:0:root:/var/lib/kat-ingress:/usr/bin/kat-ingress\n' > "$mnt/etc/passwd"
printf 'root:x:0:\n' > "$mnt/etc/group"
buildah umount "$ctr" >/dev/null
buildah config --entrypoint '["/usr/bin/kat-ingress"]' --cmd '' --workingdir /var/lib/kat-ingress "$ctr"
buildah commit -q "$ctr" kat-ingress >/dev/null
buildah push -q "$verify" kat-ingress "docker://$registry/kat/ingress:latest"
echo "pushed $registry/kat/ingress:latest"
