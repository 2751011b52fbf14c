# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The readonly-remote guards (--guards on|off|push-scoped): the git and gh wrappers, the hooks folder, and
# under git.allowPush: session the ref prefix pushes may go to (push_scope_file: the git wrapper then lets
# `git push` through, and the pre-push hook refuses every ref outside it and every delete).
# Reads launch.sh's staging.

readonly_marker="agentbox-managed: readonly-remote"
hooks_dir="$HOME/.config/agentbox/hooks"
push_scope_file="$HOME/.config/agentbox/push-namespace"  # agentbox.staginglayout.PUSH_SCOPE_FILE
# The repository's own hooks keep running through the dispatcher (core.hooksPath replaces .git/hooks).
forwarded_hooks=(applypatch-msg pre-applypatch post-applypatch pre-commit pre-merge-commit prepare-commit-msg
  commit-msg post-commit pre-rebase post-checkout post-merge post-rewrite reference-transaction push-to-checkout)

# install_guards NAMESPACE: the guards; NAMESPACE (refs/heads/agentbox/VM/) lets pushes go there, "" none.
install_guards() {
  local name namespace="${1:-}" current=""
  mkdir -p "$HOME/.local/bin" "$hooks_dir"
  if [ -n "$namespace" ]; then
    [ ! -f "$push_scope_file" ] || IFS= read -r current <"$push_scope_file" || true
    [ "$current" = "$namespace" ] || printf '%s\n' "$namespace" >"$push_scope_file"
  elif [ -e "$push_scope_file" ] || [ -L "$push_scope_file" ]; then
    rm -f "$push_scope_file"
  fi
  for name in git gh; do
    if ! cmp -s "$staging/guards/$name" "$HOME/.local/bin/$name"; then
      if [ -e "$HOME/.local/bin/$name" ] && ! grep -q "$readonly_marker" "$HOME/.local/bin/$name"; then
        say "not replacing $HOME/.local/bin/$name: it is not agentbox's"
        retry_next_launch  # said again at the next launch
        continue
      fi
      install -m 755 "$staging/guards/$name" "$HOME/.local/bin/$name"
    fi
  done
  cmp -s "$staging/guards/pre-push" "$hooks_dir/pre-push" || install -m 755 "$staging/guards/pre-push" "$hooks_dir/pre-push"
  for name in "${forwarded_hooks[@]}"; do
    cmp -s "$staging/guards/hook-dispatch" "$hooks_dir/$name" || install -m 755 "$staging/guards/hook-dispatch" "$hooks_dir/$name"
  done
  if command -v git >/dev/null 2>&1 && [ "$(git_config_global --get core.hooksPath 2>/dev/null || true)" != "$hooks_dir" ]; then
    git_config_global core.hooksPath "$hooks_dir"
  fi
}

# bash's test only: each guard is there, a file no newer than SINCE (the setup's record).
guards_in_place() {
  local since="$1" file
  for file in "$HOME/.local/bin/git" "$HOME/.local/bin/gh" "$hooks_dir/pre-push" "${forwarded_hooks[@]/#/$hooks_dir/}"; do
    [ -f "$file" ] && [ ! "$file" -nt "$since" ] || return 1
  done
}

remove_guards() {
  local name
  for name in git gh; do
    if [ -e "$HOME/.local/bin/$name" ] && grep -q "$readonly_marker" "$HOME/.local/bin/$name"; then
      rm -f "$HOME/.local/bin/$name"
    fi
  done
  rm -f "$hooks_dir/pre-push" "$push_scope_file"
  for name in "${forwarded_hooks[@]}"; do
    rm -f "$hooks_dir/$name"
  done
  if command -v git >/dev/null 2>&1 && [ "$(git_config_global --get core.hooksPath 2>/dev/null || true)" = "$hooks_dir" ]; then
    git_config_global --unset core.hooksPath
  fi
}
