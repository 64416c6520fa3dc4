#!/usr/bin/env bash
# Build benchmark: a cold build of a git commit served by git daemon on loopback, through the
# runtime (git2 clone + buildah in the build slice's user namespace + import) until its
# container starts, against `git clone` + `buildah bud` of the same commit by hand (same
# storage driver and isolation); then the commit pushed to a cache repository on the loopback
# registry and pulled by fresh runtimes (empty image stores) until the container starts
# (cache_hit_s); medians of 3. Last line:
#   build cold_s=X buildah_s=Y kat/buildah=R cache_hit_s=Z
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh >/dev/null
source <(scripts/test-fixtures.sh)
cargo test --release -q -p kat-runtime --test build -- --ignored --nocapture build_benchmark 2>&1 \
  | grep -E "^build " | tail -n 1 | python3 bench/guard.py
