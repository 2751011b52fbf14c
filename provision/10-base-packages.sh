#!/bin/bash
# agentbox-managed: base packages (runs as root on every boot; idempotent)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
needed=()
for pkg in git curl jq build-essential unzip ca-certificates gnupg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || needed+=("$pkg")
done
if [ ${#needed[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${needed[@]}"
fi
