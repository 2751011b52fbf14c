#!/bin/bash
# agentbox-managed: base packages (runs as root on every boot; idempotent)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# On a first boot Ubuntu's unattended-upgrades holds the dpkg lock for minutes: wait for it.
# `apt-get update` ignores DPkg::Lock::Timeout (the package lists have their own lock): retry it.
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

needed=()
for pkg in git curl jq build-essential unzip ca-certificates gnupg tmux nftables; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || needed+=("$pkg")
done
if [ ${#needed[@]} -gt 0 ]; then
  apt_update
  apt-get "${apt_wait[@]}" install -y -q --no-install-recommends "${needed[@]}"
fi
