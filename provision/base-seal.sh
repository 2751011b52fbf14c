#!/bin/bash
# agentbox-managed: seals the base VM before it is stopped and cloned (agentbox.vm.golden). Runs as root;
# argument: the VM user's home. Every clone then makes its own SSH host keys and machine-id at its
# first boot, and carries no package caches or shell history of the build.
set -euo pipefail
user_home="$1"

# SSH host keys: removed here, made again before sshd starts (cloud-init does it too on a new instance).
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
mkdir -p /etc/systemd/system/ssh.service.d
cat > /etc/systemd/system/ssh.service.d/agentbox-host-keys.conf <<'CONF'
# agentbox-managed: a clone of agentbox's base VM makes its own SSH host keys.
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
CONF

# An empty machine-id makes systemd generate a new one at the next boot.
: > /etc/machine-id
if [ -e /var/lib/dbus/machine-id ] && [ ! -L /var/lib/dbus/machine-id ]; then
  rm -f /var/lib/dbus/machine-id
fi

# Package caches (the provisioning checks what is installed, not the lists), and npm's logs of the installs.
rm -rf /var/cache/apt/archives/*.deb /var/cache/apt/*.bin /var/lib/apt/lists/* \
  "$user_home/.npm/_cacache" /root/.npm/_cacache "$user_home/.npm/_logs" /root/.npm/_logs

# Shell history.
rm -f /root/.bash_history /root/.zsh_history /root/.python_history \
  "$user_home/.bash_history" "$user_home/.zsh_history" "$user_home/.python_history" "$user_home/.node_repl_history"
echo "sealed"
