#!/bin/bash
# agentbox-managed: doctor's look inside the VM. `agentbox doctor` runs this text in its one
# `limactl shell` call, as `bash -c TEXT agentbox-doctor GUEST_PATH...`: doctor writes nothing, so it
# works for a VM whose staging folder is stale, and nothing here changes the VM.
# Each GUEST_PATH is a credential file relative to the guest home. Each output line is
# "agentbox-doctor KIND VALUE [NAME]" (agentbox/cli/diagnosis.py parse_probe reads them):
#   cred yes|no PATH                  PATH exists in the guest home
#   wrapper guard|foreign|none NAME   ~/.local/bin/NAME (git, gh) is launch.sh's guard, someone else's, or absent
#   firewall yes|no yes|no            nft is installed; launch.sh's firewall (network.*) is in place this boot
#   provisioned yes|no|unknown        agentbox's provisioning marked this boot done (~/.agentbox/provisioned)
#   hooks yes|no                      git's core.hooksPath is launch.sh's hooks folder, with its pre-push hook
# The hooks line comes last: without it, the probe did not finish.

tag="agentbox-doctor"
marker="agentbox-managed: readonly-remote"  # launch.sh's readonly_marker
hooks_dir="$HOME/.config/agentbox/hooks"    # launch.sh's hooks_dir

for file in "$@"; do
  if [ -e "$HOME/$file" ]; then found=yes; else found=no; fi
  echo "$tag cred $found $file"
done
for name in git gh; do
  wrapper="$HOME/.local/bin/$name"
  if [ ! -e "$wrapper" ]; then
    kind=none
  elif grep -q "$marker" "$wrapper"; then
    kind=guard
  else
    kind=foreign
  fi
  echo "$tag wrapper $kind $name"
done
if [ -x /usr/sbin/nft ] || command -v nft >/dev/null 2>&1; then nft_found=yes; else nft_found=no; fi
if [ -e /run/agentbox/network.nft ]; then applied=yes; else applied=no; fi
echo "$tag firewall $nft_found $applied"
# launch.sh's check_provisioned: a VM whose provisioning marks its end (/etc/agentbox/provisioning) wrote
# this boot's id when it finished.
provisioned=unknown
if [ -e /etc/agentbox/provisioning ]; then
  if [ "$(cat "$HOME/.agentbox/provisioned" 2>/dev/null || true)" = "$(cat /proc/sys/kernel/random/boot_id)" ]; then
    provisioned=yes
  else
    provisioned=no
  fi
fi
echo "$tag provisioned $provisioned"
hooks_path="$(git config --global --get core.hooksPath 2>/dev/null || true)"
if [ "$hooks_path" = "$hooks_dir" ] && [ -e "$hooks_dir/pre-push" ]; then found=yes; else found=no; fi
echo "$tag hooks $found"
