#!/bin/bash
# agentbox-managed: GitHub CLI from its signed apt repository (root; idempotent).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v gh >/dev/null 2>&1; then
  exit 0
fi

# Wait for another apt (unattended-upgrades on a first boot) instead of failing; see 10-base-packages.sh.
apt_wait=(-o DPkg::Lock::Timeout=600)
apt_update() {
  local waited=0 output
  until output="$(apt-get "${apt_wait[@]}" update -q 2>&1)"; do
    printf '%s\n' "$output" >&2
    case "$output" in *"Could not get lock"*) ;; *) return 1 ;; esac
    [ "$waited" -lt 600 ] || return 1
    sleep 2
    waited=$((waited + 2))
  done
  printf '%s\n' "$output"
}

keyring=/etc/apt/keyrings/githubcli-archive-keyring.gpg
install -d -m 0755 /etc/apt/keyrings
curl -fsSL -o "$keyring" https://cli.github.com/packages/githubcli-archive-keyring.gpg
chmod 0644 "$keyring"
echo "deb [arch=$(dpkg --print-architecture) signed-by=$keyring] https://cli.github.com/packages stable main" \
  > /etc/apt/sources.list.d/github-cli.list
apt_update
apt-get "${apt_wait[@]}" install -y -q gh
