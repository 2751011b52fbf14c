#!/bin/bash
# agentbox-managed: the guest user's own setup (runs as the user on every boot; idempotent).
# Global npm packages go to ~/.local so agents install and update themselves without root.
set -euo pipefail
mkdir -p "$HOME/.local/bin"
if command -v npm >/dev/null 2>&1 && [ "$(npm config get prefix)" != "$HOME/.local" ]; then
  npm config set prefix "$HOME/.local"
fi
if getent group docker >/dev/null && ! id -nG "$USER" | tr ' ' '\n' | grep -qx docker; then
  sudo usermod -aG docker "$USER"
fi
