#!/bin/bash
# agentbox-managed: the guest user's own setup (runs as the user on every boot; idempotent).
# Global npm packages go to ~/.local so agents install and update themselves without root.
# It runs last: it checks what the root scripts installed and then marks this boot provisioned
# (~/.agentbox/provisioned holds the boot id), which the readiness probe and every launch check.
set -euo pipefail
mkdir -p "$HOME/.local/bin" "$HOME/.agentbox"
rm -f "$HOME/.agentbox/provisioned"
if command -v npm >/dev/null 2>&1 && [ "$(npm config get prefix)" != "$HOME/.local" ]; then
  npm config set prefix "$HOME/.local"
fi
if getent group docker >/dev/null && ! id -nG "$USER" | tr ' ' '\n' | grep -qx docker; then
  sudo usermod -aG docker "$USER"
fi
for tool in git curl docker node npm gh; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "agentbox: provisioning did not install $tool" >&2
    exit 1
  fi
done
cat /proc/sys/kernel/random/boot_id > "$HOME/.agentbox/provisioned"
