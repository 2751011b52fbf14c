#!/bin/bash
# agentbox-managed: GitHub CLI from its signed apt repository (root; idempotent).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v gh >/dev/null 2>&1; then
  exit 0
fi
keyring=/etc/apt/keyrings/githubcli-archive-keyring.gpg
install -d -m 0755 /etc/apt/keyrings
curl -fsSL -o "$keyring" https://cli.github.com/packages/githubcli-archive-keyring.gpg
chmod 0644 "$keyring"
echo "deb [arch=$(dpkg --print-architecture) signed-by=$keyring] https://cli.github.com/packages stable main" \
  > /etc/apt/sources.list.d/github-cli.list
apt-get update -q
apt-get install -y -q gh
