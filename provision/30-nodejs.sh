#!/bin/bash
# agentbox-managed: Node.js LTS from nodejs.org, checked against its SHASUMS256 (root; idempotent).
set -euo pipefail
NODE_VERSION="v22.22.0"
if command -v node >/dev/null 2>&1 && [ "$(node --version)" = "$NODE_VERSION" ]; then
  exit 0
fi
case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64) arch=arm64 ;;
  *) echo "agentbox: no Node.js build for $(uname -m)" >&2; exit 1 ;;
esac
top="node-${NODE_VERSION}-linux-${arch}"
tarball="${top}.tar.xz"
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
curl -fsSL -o "$workdir/$tarball" "https://nodejs.org/dist/${NODE_VERSION}/${tarball}"
curl -fsSL -o "$workdir/SHASUMS256.txt" "https://nodejs.org/dist/${NODE_VERSION}/SHASUMS256.txt"
(cd "$workdir" && grep " ${tarball}\$" SHASUMS256.txt | sha256sum -c -)
# Only the install tree: the README, LICENSE and CHANGELOG beside it do not belong in /usr/local.
tar -xJf "$workdir/$tarball" -C /usr/local --strip-components=1 --no-same-owner \
  "$top/bin" "$top/include" "$top/lib" "$top/share"
