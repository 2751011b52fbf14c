#!/bin/bash
# agentbox-managed: the per-launch step. agentbox runs it in the VM's single `limactl shell` call
# from the read-only staging mount; it prepares the session and then execs the agent or a shell.
#   launch.sh [--wait SECONDS] [--binary NAME --install CMD] [-- PROGRAM ARGS...]
set -euo pipefail

staging="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wait_sec=30
binary=""
install=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wait) wait_sec="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --install) install="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

# A start that was interrupted leaves Lima booting in the background: wait for its boot scripts.
if [ ! -e /run/lima-boot-done ]; then
  echo "agentbox: waiting for the VM to finish provisioning (up to ${wait_sec}s)..." >&2
  waited=0
  while [ ! -e /run/lima-boot-done ]; do
    if [ "$waited" -ge "$wait_sec" ]; then
      echo "agentbox: the VM has not finished provisioning after ${wait_sec}s." >&2
      echo "agentbox: see /var/log/cloud-init-output.log in the VM, or run 'agentbox restart'." >&2
      exit 125
    fi
    sleep 1
    waited=$((waited + 1))
  done
fi

# Environment from config: NAME=value records separated by NUL bytes, so any value arrives intact.
if [ -r "$staging/env" ]; then
  while IFS= read -r -d '' assignment; do
    export "${assignment?}"
  done < "$staging/env"
fi

case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac

if [ -n "$binary" ] && ! command -v "$binary" >/dev/null 2>&1; then
  if [ -z "$install" ]; then
    echo "agentbox: $binary is not installed in the VM and no install command is configured." >&2
    exit 127
  fi
  echo "agentbox: installing $binary in the VM: $install" >&2
  if ! bash -euo pipefail -c "$install" >&2; then
    echo "agentbox: installing $binary failed (command: $install)" >&2
    exit 127
  fi
  hash -r
fi

if [ $# -eq 0 ]; then
  exec bash -l
fi
exec "$@"
