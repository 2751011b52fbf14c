# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# Isolated mode's copy of the workspace (--isolated-from, --base, --outbox).
# Reads launch.sh's state, workspace, chdir, isolated_from, base, outbox, copy_aside.

# -- isolated mode --------------------------------------------------------------------------------
# The host workspace is mounted read-only at $isolated_from. The agent works on a copy at the
# workspace's own path, local to the VM: a git clone of that mount checked out at $base (the host's
# checkpoint of HEAD plus uncommitted and untracked files, made here from the outbox's base.fi). The copy is kept while the host sends the
# same base, so a later session goes on with it. When the program exits, the copy's changes against
# its base go to $outbox as changes.patch (the agent may add summary.md at $AGENTBOX_SUMMARY), and
# `base` is written last: the host takes only a finished outbox.
# Several sessions may share the copy; it is remade only when no other session uses it.
# In a VM created live (--copy-aside: `--isolated` asked of a live VM) the workspace's own path is the
# user's files, mounted: the copy goes aside, under $state/copies/, and $isolated_from is that mount.
isolated_state="$state/isolated"
copy_dir="$workspace"
[ -z "${copy_aside:-}" ] || copy_dir="$state/copies/$(basename -- "$workspace")"
copy_base=""

# git for agentbox's own steps in the copy: no user, system or `env:` settings, no hooks, no pager.
#   copy_git [GIT_NAME=VALUE...] ARGS...
copy_git() {
  local -a assignments=()
  while [ $# -gt 0 ] && [[ "$1" == GIT_*=* ]]; do
    assignments+=("$1")
    shift
  done
  env -i PATH="$(path_without_local_bin)" HOME="$isolated_state/home" LC_ALL=C GIT_CONFIG_NOSYSTEM=1 \
    GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 GIT_PAGER=cat "${assignments[@]}" \
    git --no-pager -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.autocrlf=false \
    -c core.safecrlf=false -c safe.directory='*' "$@"
}

# Why the workspace path must not be replaced by a copy, or nothing: a host share there (a VM created
# live, or a mount covering the path) would turn "remove the old copy" into deleting the user's files.
copy_place_problem() {
  local probe="$copy_dir" fstype
  if mountpoint -q "$copy_dir" 2>/dev/null; then
    printf '%s is a mount in this VM (was the VM created live? agentbox start --recreate makes it isolated)' "$copy_dir"
    return 0
  fi
  while [ ! -e "$probe" ]; do probe="$(dirname "$probe")"; done
  fstype="$(findmnt -n -o FSTYPE --target "$probe" 2>/dev/null || true)"
  case "$fstype" in
    virtiofs | 9p | fuse.sshfs | sshfs)
      printf '%s lies in a folder shared with the host (%s), where a copy would land on the host' "$copy_dir" "$fstype"
      return 0
      ;;
  esac
  if [ -e "$copy_dir" ] && [ "$(cat "$isolated_state/copy" 2>/dev/null || true)" != "$copy_dir" ] &&
    [ -n "$(ls -A "$copy_dir" 2>/dev/null)" ]; then
    printf '%s exists in this VM and is not a copy agentbox made; move it away (agentbox shell) or recreate the VM' "$copy_dir"
    return 0
  fi
  return 1
}

remove_copy() {
  # The agent may have left root-owned files in it (it has sudo).
  find "$copy_dir" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system -- {} + 2>/dev/null ||
    sudo -n find "$copy_dir" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system -- {} +
}

make_copy() {
  local problem branch parent
  if problem="$(copy_place_problem)"; then
    say "isolated mode: not making the workspace copy: $problem."
    exit 1
  fi
  say "isolated mode: copying the workspace into the VM at $copy_dir (base ${base:0:12})"
  rm -f "$isolated_state/base"
  printf '%s' "$copy_dir" > "$isolated_state/copy"
  if [ -e "$copy_dir" ]; then
    remove_copy
  elif ! mkdir -p "$copy_dir" 2>/dev/null; then
    sudo -n mkdir -p "$copy_dir"
    sudo -n chown "$(id -u):$(id -g)" "$copy_dir"
  fi
  copy_git clone -q --shared --no-checkout "$isolated_from" "$copy_dir"
  branch="$(copy_git -C "$copy_dir" symbolic-ref -q HEAD || true)"
  # The base lives in agentbox's store on the host: it comes as a fast-import stream (base.fi) making one
  # commit whose id the host computed beforehand.
  if [ ! -f "$outbox/base.fi" ] || ! copy_git -C "$copy_dir" fast-import --quiet < "$outbox/base.fi" ||
    [ "$(copy_git -C "$copy_dir" rev-parse -q --verify refs/agentbox/base 2>/dev/null || true)" != "$base" ]; then
    say "isolated mode: the workspace's base (${base:0:12}) could not be made in the copy from $outbox/base.fi"
    exit 1
  fi
  copy_git -C "$copy_dir" update-ref -d refs/agentbox/base
  copy_git -C "$copy_dir" checkout -q --detach "$base"
  # HEAD back where the user's is, the files as in the base: the uncommitted changes show as such.
  if parent="$(copy_git -C "$copy_dir" rev-parse -q --verify "$base^" 2>/dev/null)"; then
    if [ -n "$branch" ] && [ "$(copy_git -C "$copy_dir" rev-parse -q --verify "$branch" 2>/dev/null || true)" = "$parent" ]; then
      copy_git -C "$copy_dir" symbolic-ref HEAD "$branch"
    else
      copy_git -C "$copy_dir" update-ref --no-deref HEAD "$parent"
    fi
    copy_git -C "$copy_dir" reset -q
  else
    [ -z "$branch" ] || copy_git -C "$copy_dir" symbolic-ref HEAD "$branch"
    copy_git -C "$copy_dir" read-tree --empty
  fi
  printf '%s' "$base" > "$isolated_state/base"
}

prepare_copy() {
  mkdir -p "$isolated_state"
  if [ -z "$base" ] || [ -z "$outbox" ]; then
    say "isolated mode needs --base and --outbox (agentbox and its staged launch.sh disagree; run the command again)"
    exit 2
  fi
  # fd 8: one session at a time decides about the copy; fd 9: held shared by every session using it.
  exec 8>>"$isolated_state/maker.lock" 9>>"$isolated_state/users.lock"
  flock 8
  if flock -n -x 9; then
    if [ ! -d "$copy_dir/.git" ] || [ "$(cat "$isolated_state/copy" 2>/dev/null || true)" != "$copy_dir" ] ||
      [ "$(cat "$isolated_state/base" 2>/dev/null || true)" != "$base" ]; then
      make_copy
    fi
  elif [ ! -d "$copy_dir/.git" ] || [ ! -s "$isolated_state/base" ]; then
    say "isolated mode: another session in this VM is using a workspace copy that is not ready; try again."
    exit 1
  elif [ "$(cat "$isolated_state/base")" != "$base" ]; then
    say "isolated mode: another session in this VM works on the copy, so this one joins it as it is (its base is older than your workspace now)"
  fi
  flock -s 9
  flock -u 8
  exec 8>&-
  copy_base="$(cat "$isolated_state/base")"
}

write_outbox() {
  local index="$isolated_state/index" patch="$outbox/changes.patch.partial"
  [ -d "$outbox" ] || return 1
  rm -f "$index"
  copy_git GIT_INDEX_FILE="$index" -C "$copy_dir" read-tree "$copy_base" || return 1
  copy_git GIT_INDEX_FILE="$index" -C "$copy_dir" add -A || return 1
  copy_git GIT_INDEX_FILE="$index" -C "$copy_dir" diff --cached --binary --full-index --no-renames \
    --no-ext-diff --no-textconv --no-color "$copy_base" -- > "$patch" || return 1
  rm -f "$index"
  mv -f "$patch" "$outbox/changes.patch"
  printf '%s\n' "$copy_base" > "$outbox/base.partial"
  mv -f "$outbox/base.partial" "$outbox/base"
}

# Where the program starts: in the copy, the folder of the host's (--chdir) in the workspace.
enter_copy() {
  local folder="$copy_dir"
  case "$chdir" in
    "$workspace" | "$workspace"/*) folder="$copy_dir${chdir#"$workspace"}" ;;
  esac
  cd "$folder" 2>/dev/null || cd "$copy_dir" || return 1
}

collect_changes() {
  write_outbox || say "isolated mode: the session's changes could not be collected; they stay in the copy at $copy_dir"
}
