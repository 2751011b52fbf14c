# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The attention hooks (--notify on|off).
# Reads launch.sh's staging, state.

# Attention (notify: on): Claude Code's Notification and Stop hooks, in its managed settings (they add to the
# user's own hooks and leave ~/.claude/settings.json alone), run attention.sh: the terminal's bell and title,
# and an event for the host's desktop notification when the session is detached. A managed settings file
# that is not the one agentbox installed is left alone.
claude_managed=/etc/claude-code/managed-settings.json

install_attention() {
  local bin="$state/bin" hooks_copy="$state/claude-hooks.json"
  mkdir -p "$bin"
  cmp -s "$staging/attention.sh" "$bin/attention" || install -m 755 "$staging/attention.sh" "$bin/attention"
  cmp -s "$staging/claude-hooks.json" "$claude_managed" && return 0
  if [ -e "$claude_managed" ] && ! cmp -s "$claude_managed" "$hooks_copy"; then
    say "not installing agentbox's Claude Code hooks: $claude_managed is not agentbox's"
    retry_next_launch  # said again at the next launch
    return 0
  fi
  # shellcheck disable=SC2016 # $1 belongs to the root shell
  if sudo -n /bin/sh -c 'install -d -m 755 /etc/claude-code && install -m 644 "$1" /etc/claude-code/managed-settings.json' \
      sh "$staging/claude-hooks.json"; then
    cp "$staging/claude-hooks.json" "$hooks_copy"
  else
    say "could not install agentbox's Claude Code hooks in $claude_managed (sudo failed)"
    retry_next_launch
  fi
}

remove_attention() {
  local hooks_copy="$state/claude-hooks.json"
  [ -e "$hooks_copy" ] || return 0
  if [ -e "$claude_managed" ] && cmp -s "$claude_managed" "$hooks_copy"; then
    sudo -n rm -f "$claude_managed" || say "could not remove agentbox's Claude Code hooks from $claude_managed"
  fi
  rm -f "$hooks_copy"
}
