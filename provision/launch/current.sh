# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The setup's record (--setup-digest, agentbox.session.setupdigest): a launch whose setup is the one that last
# finished, in this boot of the VM, skips it and starts no process before the program.
# Reads launch.sh's state, staging, setup_digest, setup_incomplete, isolated_from, binary, guards, notify, worktree.

setup_record="$state/setup.applied"  # "DIGEST BOOT-ID", written after a setup that finished and left nothing to retry

# bash's read, test and command -v only: this runs at every launch.
setup_is_current() {
  local recorded="" boot=""
  [ -n "$setup_digest" ] && [ -z "$isolated_from" ] || return 1
  # The boot: /run (the firewall, the sandbox's description, Lima's boot marker), the onStart scripts and the
  # provisioning check are per boot.
  { read -r boot < /proc/sys/kernel/random/boot_id; } 2>/dev/null || return 1
  { read -r recorded < "$setup_record"; } 2>/dev/null || return 1
  [ "$recorded" = "$setup_digest $boot" ] || return 1
  # What the VM may change while the digest stays: the agent removed, a file the setup installed changed or gone,
  # a login removed, a new worktree (launch_steps_current: a tool installed, a memory file edited).
  [ -z "$binary" ] || command -v -- "$binary" >/dev/null 2>&1 || return 1
  [ -z "$worktree" ] || [ -e "$worktree/.git" ] || return 1
  installed_files_unchanged || return 1
  credentials_present || return 1
}

# The steps that may change between launches while the rest of the setup stays: the sandbox's description (its
# start checkpoint, the tools found), the memory files' block, Claude Code's trust of a new worktree.
launch_steps_current() {
  context_is_current && memory_block_is_current && claude_onboarded_is_current
}

# The files the setup installed are there and no newer than the record; the git settings it made (in the files
# git config --global writes) and gh's login (which configure_git reads) did not change since.
installed_files_unchanged() {
  local file
  local -a installed=("$state/bin/open-url") watched=("$HOME/.gitconfig" "$HOME/.config/git/config"
    "$HOME/.config/gh/hosts.yml")
  [ "$guards" != on ] || guards_in_place "$setup_record" || return 1
  [ "$notify" != on ] || installed+=("$state/bin/attention")
  for file in "${installed[@]}"; do
    [ -f "$file" ] && [ ! "$file" -nt "$setup_record" ] || return 1
  done
  for file in "${watched[@]}"; do
    [ ! "$file" -nt "$setup_record" ] || return 1
  done
}

credentials_present() {
  # A login file removed in the VM is installed again, as at every launch before the record.
  local entry relative
  [ -r "$staging/creds/manifest" ] || return 0
  while IFS= read -r -d '' entry; do
    relative="${entry#* }"
    case "$relative" in /* | *..*) continue ;; esac
    [ -e "$HOME/$relative" ] || return 1
  done < "$staging/creds/manifest"
}

# Before the setup: a setup cut short is never taken for the one recorded.
forget_setup() {
  : > "$setup_record"
}

# After the setup: recorded only when no step left something to try again at the next launch (setup_incomplete).
record_setup() {
  local boot=""
  [ -n "$setup_digest" ] && [ -z "$setup_incomplete" ] && [ -z "$isolated_from" ] || return 0
  { read -r boot < /proc/sys/kernel/random/boot_id; } 2>/dev/null || return 0
  printf '%s %s\n' "$setup_digest" "$boot" > "$setup_record"
}
