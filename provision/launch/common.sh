# shellcheck shell=bash
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# What every part uses: messages, agentbox's own git settings, JSON edits.

say() { printf 'agentbox: %s\n' "$*" >&2; }

# A step that did not finish its job, or says something at every launch: the setup is not recorded
# (launch/current.sh), so the next launch runs it again.
# shellcheck disable=SC2034 # launch.sh reads it
retry_next_launch() { setup_incomplete=1; }

# agentbox's own git settings go through the real git, never the readonly-remote wrapper in
# ~/.local/bin: the wrapper refuses every git command while `env:` sets, say, GIT_SSH_COMMAND.
path_without_local_bin() {
  local dir path=""
  local -a dirs
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ "$dir" = "$HOME/.local/bin" ] || path="${path:+$path:}$dir"
  done
  printf '%s' "$path"
}

git_config_global() {
  env PATH="$(path_without_local_bin)" git config --global "$@"
}

# Rewrite a JSON file with a jq program (an absent file counts as {}), keeping its mode.
json_edit() {
  local file="$1" program="$2"
  shift 2
  if ! command -v jq >/dev/null 2>&1; then
    say "cannot update $file: jq is not installed in the VM"
    retry_next_launch  # tried again at the next launch
    return 0
  fi
  if { [ -s "$file" ] && jq "$@" "$program" "$file" > "$file.agentbox-tmp.$$"; } ||
    { [ ! -s "$file" ] && jq -n "$@" "$program" > "$file.agentbox-tmp.$$"; }; then
    chmod 600 "$file.agentbox-tmp.$$"
    mv "$file.agentbox-tmp.$$" "$file"
  else
    rm -f "$file.agentbox-tmp.$$"
    say "cannot update $file (is it valid JSON?)"
    retry_next_launch
  fi
}
