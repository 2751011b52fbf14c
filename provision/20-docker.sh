#!/bin/bash
# agentbox-managed: Docker engine from Ubuntu's archive (runs as root on every boot; idempotent).
# The guest user joins the docker group in the user step; the socket keeps its 0660 mode.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

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

if ! command -v docker >/dev/null 2>&1; then
  apt_update
  apt-get "${apt_wait[@]}" install -y -q docker.io docker-buildx docker-compose-v2
fi
systemctl enable --now docker >/dev/null 2>&1 || true
