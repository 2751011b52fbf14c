# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The VM ready for a session: its boot, its provisioning, its firewall, the session's env.
# Reads launch.sh's staging, state, wait_sec.

wait_for_boot() {
  # A start that was interrupted leaves Lima booting in the background: wait for its boot scripts.
  [ -e /run/lima-boot-done ] && return 0
  say "waiting for the VM to finish provisioning (up to ${wait_sec}s)..."
  local waited=0
  while [ ! -e /run/lima-boot-done ]; do
    if [ "$waited" -ge "$wait_sec" ]; then
      say "the VM has not finished provisioning after ${wait_sec}s."
      say "see /var/log/cloud-init-output.log in the VM, or run 'agentbox restart'."
      exit 125
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

check_provisioned() {
  # VMs whose provisioning marks its end (the marker note is a data file) say when it did not finish:
  # the start that ran it failed or was cut short, and the tools it installs may be missing.
  [ -e /etc/agentbox/provisioning ] || return 0
  local finished="" boot=""
  { read -r finished < "$state/provisioned"; } 2>/dev/null || true
  { read -r boot < /proc/sys/kernel/random/boot_id; } 2>/dev/null || true
  [ "$finished" = "$boot" ] && return 0
  say "the VM's provisioning did not finish at its last start, so tools it installs (node, npm, gh, docker) may be missing."
  say "its log: agentbox shell -- sudo tail -n 50 /var/log/cloud-init-output.log"
  say "\`agentbox restart\` runs the provisioning again."
}

apply_network() {
  # The VM's firewall (agentbox.net.policy's ruleset: the host's localhost closed; in allowlist and offline
  # mode nothing leaves but through agentbox's proxy), set when it differs from the one in place (root's
  # copy in /run goes with the rules at the next boot). The agent is root here: this only stops mistakes.
  local rules="$staging/network.nft" applied=/run/agentbox/network.nft output
  [ -r "$rules" ] || return 0
  ! cmp -s "$rules" "$applied" 2>/dev/null || return 0
  if output="$(sudo -n nft -f "$rules" 2>&1)" &&
    sudo -n /bin/sh -c 'install -d -m 755 /run/agentbox && install -m 644 "$1" "$2"' sh "$rules" "$applied"; then
    return 0
  fi
  retry_next_launch  # tried again at the next launch
  # Said once per boot and ruleset (an older VM without nft would say it at every launch).
  local boot key
  boot="$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || true)"
  key="$boot $(cksum < "$rules")"
  [ "$(cat "$state/network-warned" 2>/dev/null || true)" != "$key" ] || return 0
  say "the VM's firewall could not be set (${output%%$'\n'*}): inside the VM, nothing stops a program that"
  say "ignores the proxy variables, or a connection to your localhost; \`agentbox restart\` provisions nftables."
  mkdir -p "$state" && printf '%s\n' "$key" > "$state/network-warned"
}

load_env() {
  # NAME=value records separated by NUL bytes, so any value arrives intact.
  [ -r "$staging/env" ] || return 0
  local assignment
  while IFS= read -r -d '' assignment; do
    export "${assignment?}"
  done < "$staging/env"
}
