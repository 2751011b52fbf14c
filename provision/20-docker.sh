#!/bin/bash
# agentbox-managed: Docker engine from Ubuntu's archive (runs as root on every boot; idempotent).
# The guest user joins the docker group in the user step; the socket keeps its 0660 mode.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v docker >/dev/null 2>&1; then
  apt-get update -q
  apt-get install -y -q docker.io docker-buildx docker-compose-v2
fi
systemctl enable --now docker >/dev/null 2>&1 || true
