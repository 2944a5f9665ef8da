#!/usr/bin/env bash
# Fetches ggml's CPU libraries (llama.cpp's backend) for the benchmark's
# ggml peer (benchmarks/peer_ggml.h) into third_party/ggml/.
#
#   bash scripts/fetch-ggml.sh     (then: build/cli/posbias-bench attention)
#
# ggml is not a Debian package; the npm package @node-llama-cpp/linux-x64
# carries llama.cpp's prebuilt x86-64 libraries (libggml-base.so and one
# libggml-cpu-<core>.so per core generation; the bench loads the one this
# CPU scores highest, as llama.cpp does). The version and the tarball's
# SHA-512 are pinned below; nothing is built, nothing else is kept. Optional:
# without these libraries the bench runs every case without the peer. Not
# called by scripts/demo.sh or scripts/test.sh.
set -euo pipefail

package="@node-llama-cpp/linux-x64"
version="3.22.1"  # ggml 0.25.1 (commit 0ad4a86), as ggml_version() reports it
sha512="e6e0820cda9608d7da026f1a47f533c5ba381c1a4a80d17dd640873dea4a86032057638099ab6879f6ce94c8a1b2a0a21f639ddf913f7941d00856df44126e3a"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/third_party/ggml"

if ! command -v npm >/dev/null 2>&1; then
  if ((EUID != 0)); then
    echo "fetch-ggml: npm is missing; run as root to install it (apt-get install npm)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$package@$version" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
if [[ "$(sha512sum "$tarball" | cut -d' ' -f1)" != "$sha512" ]]; then
  echo "fetch-ggml: $tarball does not have the pinned SHA-512" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$work"
rm -rf "$dest"
mkdir -p "$dest"
cp "$work"/package/bins/linux-x64/libggml-base.so "$work"/package/bins/linux-x64/libggml-cpu-*.so \
  "$dest"/
echo "$package@$version" > "$dest/SOURCE"
echo "fetch-ggml: $(ls "$dest" | grep -c '\.so$') libraries of $package@$version in $dest"
