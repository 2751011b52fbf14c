#!/bin/bash
# agentbox-managed: the per-launch step. agentbox runs it in the VM's single `limactl shell` call
# from the read-only staging mount; it prepares the session and then execs the agent or a shell
# (or, with --creds-outbox, runs it as a child and hands changed login files back when it exits).
#   launch.sh [OPTION VALUE | --timing]... [-- PROGRAM ARGS...]
# The options, what each means and the staging folder's files this script reads are listed once,
# on the host side: agentbox/contract.py (LAUNCH_OPTIONS; tests check this parser against it).
# An option this script does not know is an error (exit 2), never the program to run.
set -euo pipefail

staging="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="$HOME/.agentbox"
wait_sec=30
binary=""
install=""
guards=""
workspace="$PWD"
on_create=()
on_start=()
sync_agents=()
memory_files=()
timing_start=""
isolated_from=""
base=""
outbox=""
chdir=""
creds_outbox=""
creds_return=()
task=""
worktree=""
worktree_branch=""
worktree_base=""
notify=""
session=""
session_attach=""
session_reply=""
session_events=""
session_live=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wait) wait_sec="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --install) install="$2"; shift 2 ;;
    --guards) guards="$2"; shift 2 ;;
    --workspace) workspace="$2"; shift 2 ;;
    --on-create) on_create+=("$2"); shift 2 ;;
    --on-start) on_start+=("$2"); shift 2 ;;
    --sync) sync_agents+=("$2"); shift 2 ;;
    --memory-file) memory_files+=("$2"); shift 2 ;;
    --timing) timing_start="${EPOCHREALTIME:-}"; shift ;;
    --isolated-from) isolated_from="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --outbox) outbox="$2"; shift 2 ;;
    --chdir) chdir="$2"; shift 2 ;;
    --creds-outbox) creds_outbox="$2"; shift 2 ;;
    --creds-return) creds_return+=("$2"); shift 2 ;;
    --worktree) worktree="$2"; shift 2 ;;
    --worktree-branch) worktree_branch="$2"; shift 2 ;;
    --worktree-base) worktree_base="$2"; shift 2 ;;
    --task) task="$2"; shift 2 ;;
    --notify) notify="$2"; shift 2 ;;
    --session) session="$2"; shift 2 ;;
    --session-attach) session_attach=1; shift ;;
    --session-reply) session_reply="$2"; shift 2 ;;
    --session-events) session_events="$2"; shift 2 ;;
    --session-live) session_live="$2"; shift 2 ;;
    --) shift; break ;;
    -*)
      # A host newer than this staged copy: stop rather than run the option as the program.
      printf 'agentbox: launch.sh: unknown option %s (agentbox and its staged launch.sh disagree; run the command again)\n' "$1" >&2
      exit 2
      ;;
    *) break ;;
  esac
done

say() { printf 'agentbox: %s\n' "$*" >&2; }

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
  [ "$(cat "$state/provisioned" 2>/dev/null || true)" = "$(cat /proc/sys/kernel/random/boot_id)" ] && return 0
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

apply_credentials() {
  # Copy a staged file into the guest home only when the host's copy changed since the last launch,
  # so a token the agent refreshed here is kept until the host logs in anew.
  local manifest="$staging/creds/manifest" entry digest relative applied
  [ -r "$manifest" ] || return 0
  while IFS= read -r -d '' entry; do
    digest="${entry%% *}"
    relative="${entry#* }"
    case "$relative" in /* | *..*) continue ;; esac
    applied="$state/applied/$relative"
    if [ ! -e "$HOME/$relative" ] || [ "$(cat "$applied" 2>/dev/null || true)" != "$digest" ]; then
      mkdir -p "$(dirname "$HOME/$relative")" "$(dirname "$applied")"
      install -m 600 "$staging/creds/home/$relative" "$HOME/$relative"
      printf '%s' "$digest" > "$applied"
    fi
  done < "$manifest"
}

# The agents' own setup (skills, settings, MCP servers; staging/sync/AGENT, made by agentbox.sync.stage).
# A file is copied into the home only when the host's copy changed since the last sync; one changed in
# the VM since then is kept, and the launch says once which host version waits. When the staged
# manifest is the one last applied (the usual launch), nothing else is read.
# A memory file's agentbox block (keep_memory_block) is not the user's edit: prints the digest of FILE
# without it when that is one of WANTED (awk ends the last line with a newline the host's file may
# lack: both are tried), else FALLBACK.
#   digest_without_block FILE FALLBACK WANTED...
digest_without_block() {
  local file="$1" fallback="$2" stripped found="" candidate wanted
  shift 2
  stripped="$(mktemp)" || { printf '%s' "$fallback"; return 0; }
  if bash "$staging/agent-memory.sh" strip "$file" > "$stripped" 2>/dev/null; then
    for candidate in "$(sha256sum < "$stripped")" "$(head -c -1 "$stripped" | sha256sum)"; do
      for wanted in "$@"; do
        [ -z "$found" ] && [ -n "$wanted" ] && [ "${candidate%% *}" = "$wanted" ] && found="$wanted"
      done
    done
  fi
  rm -f "$stripped"
  printf '%s' "${found:-$fallback}"
}

apply_sync() {
  local agent
  for agent in "${sync_agents[@]}"; do
    case "$agent" in "" | */* | .*) continue ;; esac
    if [ -r "$staging/sync/$agent/manifest" ] && ! cmp -s "$staging/sync/$agent/manifest" "$state/sync/$agent/staged"; then
      # A problem here (a folder where a file goes, a full disk) must not stop the session: say so and go on.
      sync_agent "$agent" || say "could not bring all of $agent's own setup into the VM (see above); the next launch tries again"
    fi
  done
}

sync_agent() {
  local agent="$1"
  local dir="$staging/sync/$agent" records="$state/sync/$agent"
  local -A applied=() announced=() defaults=() listed=() waiting=()
  local -a copy=() announce=()
  local entry rest digest mode relative target last current fd
  mkdir -p "$records" || return 1
  if [ -r "$records/applied" ]; then
    while IFS= read -r -d '' entry; do  # "DIGEST MODE PATH"
      rest="${entry#* }"
      applied["${rest#* }"]="${entry%% *} ${rest%% *}"
    done < "$records/applied"
  fi
  if [ -r "$records/announced" ]; then
    while IFS= read -r -d '' entry; do announced["${entry#* }"]="${entry%% *}"; done < "$records/announced"
  fi
  if [ -r "$staging/sync/defaults" ]; then
    while IFS= read -r -d '' entry; do defaults["${entry#* }"]="${entry%% *}"; done < "$staging/sync/defaults"
  fi
  exec {fd}>"$records/applied.tmp.$$" || return 1
  while IFS= read -r -d '' entry; do  # "DIGEST MODE PATH"
    digest="${entry%% *}"
    rest="${entry#* }"
    mode="${rest%% *}"
    relative="${rest#* }"
    case "$mode" in 600 | 700) ;; *) continue ;; esac
    case "/$relative/" in //* | */../* | */./*) continue ;; esac
    listed["$relative"]=1
    last="${applied[$relative]:-}"
    if [ "$last" = "$digest $mode" ]; then
      printf '%s %s\0' "$last" "$relative" >&"$fd"  # the host's copy is the one last applied: the VM's stays
      continue
    fi
    target="$HOME/$relative"
    if [ -L "$target" ] || [ -d "$target" ]; then
      current="not a file"
    elif [ -e "$target" ]; then
      current="$(sha256sum < "$target" 2>/dev/null)" || current="unreadable"
      current="${current%% *}"
    else
      current=""
    fi
    if [ -n "$current" ] && [ "$current" != "$digest" ] && [ "$current" != "${last%% *}" ] &&
      grep -qs '^<!-- BEGIN AGENTBOX' "$target"; then
      current="$(digest_without_block "$target" "$current" "$digest" "${last%% *}")"
    fi
    if [ "$current" = "$digest" ]; then
      chmod "$mode" "$target" || true
    elif [ -z "$current" ] || { [ -n "$last" ] && [ "$current" = "${last%% *}" ]; } ||
      { [ -z "$last" ] && [ "$current" = "${defaults[$relative]:-}" ]; }; then
      copy+=("$relative")  # absent, unchanged since the last sync, or the settings a new VM gets
    else
      waiting["$relative"]="$digest"  # changed in the VM since the last sync: kept; the host's copy waits
      [ "${announced[$relative]:-}" = "$digest" ] || announce+=("$relative")
      [ -z "$last" ] || printf '%s %s\0' "$last" "$relative" >&"$fd"
      continue
    fi
    printf '%s %s %s\0' "$digest" "$mode" "$relative" >&"$fd"
  done < "$dir/manifest"
  exec {fd}>&-
  for relative in "${!waiting[@]}"; do
    printf '%s %s\0' "${waiting[$relative]}" "$relative"
  done > "$records/announced.tmp.$$" && mv "$records/announced.tmp.$$" "$records/announced"
  if [ ${#announce[@]} -gt 0 ]; then
    local files
    # shellcheck disable=SC2088 # the ~ is shown to the user, not expanded
    files="$(printf '~/%s, ' "${announce[@]}")"
    say "kept ${files%, } as changed in this VM; the host's newer version waits in $dir/home (delete the VM's copy to take it at the next launch)"
  fi
  if [ ${#copy[@]} -gt 0 ]; then
    # A copied memory file has lost agentbox's block, and tar gives it the host's mtime (whole seconds),
    # which may not be newer than the block's stamp: keep_memory_block puts it back whatever the times.
    rm -f "$state/memory.stamp"
    if ! printf '%s\0' "${copy[@]}" | tar -C "$dir/home" --null -T - -cf - | tar -C "$HOME" -xf -; then
      rm -f "$records/applied.tmp.$$"  # nothing recorded: the next launch compares again
      return 1
    fi
  fi
  for relative in "${!applied[@]}"; do
    # No longer brought from the host: removed, unless it was changed in the VM.
    [ -z "${listed[$relative]:-}" ] || continue
    target="$HOME/$relative"
    if [ -f "$target" ] && [ ! -L "$target" ]; then
      current="$(sha256sum < "$target" 2>/dev/null)" || continue
      if [ "${current%% *}" = "${applied[$relative]%% *}" ]; then
        rm -f "$target"
        (cd "$HOME" && rmdir -p --ignore-fail-on-non-empty "$(dirname "$relative")" 2>/dev/null) || true
      fi
    fi
  done
  mv "$records/applied.tmp.$$" "$records/applied" || return 1
  if [ ${#waiting[@]} -eq 0 ]; then
    cp "$dir/manifest" "$records/staged" || return 1
  else
    rm -f "$records/staged"  # look again next time: deleting the VM's copy takes the host's
  fi
}

setup_browser() {
  # The VM has no browser: an agent that opens a login page gets the address printed for the user
  # (open-url.sh, which writes to the session's terminal even when the agent detached it).
  local bin="$state/bin"
  mkdir -p "$bin"
  cmp -s "$staging/open-url" "$bin/open-url" || install -m 755 "$staging/open-url" "$bin/open-url"
  [ -n "${BROWSER:-}" ] || export BROWSER="$bin/open-url"
  if [ -t 2 ]; then
    AGENTBOX_TTY="$(readlink "/proc/$$/fd/2" 2>/dev/null || true)"
    export AGENTBOX_TTY
  fi
}

# Credential write-back: copy each --creds-return file the session changed (it differs from what
# apply_credentials last installed, or there was none) into the session's outbox folder as its
# position; the host checks each and writes it back.
return_credentials() {
  local index=0 relative file digest
  [ -d "$creds_outbox" ] || return 1
  for relative in ${creds_return[@]+"${creds_return[@]}"}; do
    file="$HOME/$relative"
    case "$relative" in /* | *..*) file="" ;; esac
    if [ -n "$file" ] && [ -f "$file" ] && [ ! -L "$file" ]; then
      digest="$(sha256sum < "$file")"
      digest="${digest%% *}"
      if [ "$digest" != "$(cat "$state/applied/$relative" 2>/dev/null || true)" ]; then
        rm -rf "$creds_outbox/$index.partial"
        cp -p "$file" "$creds_outbox/$index.partial" && mv -f "$creds_outbox/$index.partial" "$creds_outbox/$index"
      fi
    fi
    index=$((index + 1))
  done
}

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

trust_workspace_for_gemini() {
  # Gemini CLI resets --approval-mode=yolo to "default" in a folder it does not trust.
  local file="$HOME/.gemini/trustedFolders.json"
  if [ -s "$file" ] && grep -qF "\"$workspace\": \"TRUST_FOLDER\"" "$file"; then
    return 0
  fi
  mkdir -p "$HOME/.gemini"
  # shellcheck disable=SC2016 # $dir is jq's variable
  json_edit "$file" '.[$dir] = "TRUST_FOLDER"' --arg dir "$workspace"
}

repair_gemini_settings() {
  # Settings an earlier agentbox wrote hold keys current Gemini CLI rejects on every run:
  # tools.approvalMode, and the general.defaultApprovalMode "yolo" it migrates that key to.
  local file="$HOME/.gemini/settings.json"
  if [ ! -s "$file" ] || ! grep -q '"approvalMode"\|"defaultApprovalMode": *"yolo"' "$file"; then
    return 0
  fi
  json_edit "$file" 'del(.tools.approvalMode) | if .general.defaultApprovalMode == "yolo" then del(.general.defaultApprovalMode) else . end
    | if .tools == {} then del(.tools) else . end | if .general == {} then del(.general) else . end'
}

# Rewrite a JSON file with a jq program (an absent file counts as {}), keeping its mode.
json_edit() {
  local file="$1" program="$2"
  shift 2
  if ! command -v jq >/dev/null 2>&1; then
    say "cannot update $file: jq is not installed in the VM"
    return 0
  fi
  if { [ -s "$file" ] && jq "$@" "$program" "$file" > "$file.agentbox-tmp.$$"; } ||
    { [ ! -s "$file" ] && jq -n "$@" "$program" > "$file.agentbox-tmp.$$"; }; then
    chmod 600 "$file.agentbox-tmp.$$"
    mv "$file.agentbox-tmp.$$" "$file"
  else
    rm -f "$file.agentbox-tmp.$$"
    say "cannot update $file (is it valid JSON?)"
  fi
}

configure_git() {
  command -v git >/dev/null 2>&1 || return 0
  local identity="$staging/creds/gitconfig"
  if [ -r "$identity" ]; then
    if ! git_config_global --get-all include.path 2>/dev/null | grep -qxF "$identity"; then
      git_config_global --add include.path "$identity"
    fi
  elif git_config_global --get-all include.path 2>/dev/null | grep -qxF "$identity"; then
    git_config_global --unset-all include.path "^$(printf '%s' "$identity" | sed 's/[.[\*^$/]/\\&/g')\$" || true
  fi
  if { [ -r "$HOME/.config/gh/hosts.yml" ] || [ -n "${GH_TOKEN:-}" ]; } &&
    [ -z "$(git_config_global --get credential.https://github.com.helper 2>/dev/null || true)" ]; then
    git_config_global credential.https://github.com.helper '!gh auth git-credential'
  fi
}

mark_claude_onboarded() {
  # With a token from `claude setup-token` there is no interactive login to complete.
  [ -n "${CLAUDE_CODE_OAUTH_TOKEN:-}" ] || return 0
  local file="$HOME/.claude.json"
  if [ ! -s "$file" ]; then
    printf '{"hasCompletedOnboarding": true}\n' > "$file"
  elif ! grep -q '"hasCompletedOnboarding": *true' "$file"; then
    if command -v jq >/dev/null 2>&1; then
      jq '.hasCompletedOnboarding = true' "$file" > "$file.agentbox-tmp.$$" && mv "$file.agentbox-tmp.$$" "$file"
    elif command -v python3 >/dev/null 2>&1; then
      python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["hasCompletedOnboarding"]=True; json.dump(d,open(p,"w"))' "$file"
    fi
  fi
}

readonly_marker="agentbox-managed: readonly-remote"
hooks_dir="$HOME/.config/agentbox/hooks"
# The repository's own hooks keep running through the dispatcher (core.hooksPath replaces .git/hooks).
forwarded_hooks=(applypatch-msg pre-applypatch post-applypatch pre-commit pre-merge-commit prepare-commit-msg
  commit-msg post-commit pre-rebase post-checkout post-merge post-rewrite reference-transaction push-to-checkout)

install_guards() {
  local name
  mkdir -p "$HOME/.local/bin" "$hooks_dir"
  for name in git gh; do
    if ! cmp -s "$staging/guards/$name" "$HOME/.local/bin/$name"; then
      if [ -e "$HOME/.local/bin/$name" ] && ! grep -q "$readonly_marker" "$HOME/.local/bin/$name"; then
        say "not replacing $HOME/.local/bin/$name: it is not agentbox's"
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

remove_guards() {
  local name
  for name in git gh; do
    if [ -e "$HOME/.local/bin/$name" ] && grep -q "$readonly_marker" "$HOME/.local/bin/$name"; then
      rm -f "$HOME/.local/bin/$name"
    fi
  done
  rm -f "$hooks_dir/pre-push"
  for name in "${forwarded_hooks[@]}"; do
    rm -f "$hooks_dir/$name"
  done
  if command -v git >/dev/null 2>&1 && [ "$(git_config_global --get core.hooksPath 2>/dev/null || true)" = "$hooks_dir" ]; then
    git_config_global --unset core.hooksPath
  fi
}

run_scripts() {
  local kind="$1" script code
  shift
  for script in "$@"; do
    say "running $kind $script"
    set +e
    (cd "$workspace" && bash -euo pipefail "$script") 9>&-  # a service it starts must not hold the copy's lock
    code=$?
    set -e
    if [ "$code" -ne 0 ]; then
      say "$kind $script failed with exit code $code; the agent was not started."
      exit "$code"
    fi
  done
}

bootstrap() {
  mkdir -p "$state"
  if [ ${#on_create[@]} -gt 0 ] && [ ! -e "$state/on-create-done" ]; then
    run_scripts onCreateScript "${on_create[@]}"
    touch "$state/on-create-done"
  fi
  local boot
  boot="$(cat /run/lima-boot-done 2>/dev/null || true)"
  if [ ${#on_start[@]} -gt 0 ] && [ "$(cat "$state/on-start-boot" 2>/dev/null || true)" != "$boot" ]; then
    run_scripts onStartScript "${on_start[@]}"
    printf '%s' "$boot" > "$state/on-start-boot"
  fi
}

# -- isolated mode --------------------------------------------------------------------------------
# The host workspace is mounted read-only at $isolated_from. The agent works on a copy at the
# workspace's own path, local to the VM: a git clone of that mount checked out at $base (the host's
# checkpoint of HEAD plus uncommitted and untracked files, made here from the outbox's base.fi). The copy is kept while the host sends the
# same base, so a later session goes on with it. When the program exits, the copy's changes against
# its base go to $outbox as changes.patch (the agent may add summary.md at $AGENTBOX_SUMMARY), and
# `base` is written last: the host takes only a finished outbox.
# Several sessions may share the copy; it is remade only when no other session uses it.
isolated_state="$state/isolated"
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
  local probe="$workspace" fstype
  if mountpoint -q "$workspace" 2>/dev/null; then
    printf '%s is a mount in this VM (was the VM created live? agentbox start --recreate makes it isolated)' "$workspace"
    return 0
  fi
  while [ ! -e "$probe" ]; do probe="$(dirname "$probe")"; done
  fstype="$(findmnt -n -o FSTYPE --target "$probe" 2>/dev/null || true)"
  case "$fstype" in
    virtiofs | 9p | fuse.sshfs | sshfs)
      printf '%s lies in a folder shared with the host (%s), where a copy would land on the host' "$workspace" "$fstype"
      return 0
      ;;
  esac
  if [ -e "$workspace" ] && [ "$(cat "$isolated_state/copy" 2>/dev/null || true)" != "$workspace" ] &&
    [ -n "$(ls -A "$workspace" 2>/dev/null)" ]; then
    printf '%s exists in this VM and is not a copy agentbox made; move it away (agentbox shell) or recreate the VM' "$workspace"
    return 0
  fi
  return 1
}

remove_copy() {
  # The agent may have left root-owned files in it (it has sudo).
  find "$workspace" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system -- {} + 2>/dev/null ||
    sudo -n find "$workspace" -mindepth 1 -maxdepth 1 -exec rm -rf --one-file-system -- {} +
}

make_copy() {
  local problem branch parent
  if problem="$(copy_place_problem)"; then
    say "isolated mode: not making the workspace copy: $problem."
    exit 1
  fi
  say "isolated mode: copying the workspace into the VM at $workspace (base ${base:0:12})"
  rm -f "$isolated_state/base"
  printf '%s' "$workspace" > "$isolated_state/copy"
  if [ -e "$workspace" ]; then
    remove_copy
  elif ! mkdir -p "$workspace" 2>/dev/null; then
    sudo -n mkdir -p "$workspace"
    sudo -n chown "$(id -u):$(id -g)" "$workspace"
  fi
  copy_git clone -q --shared --no-checkout "$isolated_from" "$workspace"
  branch="$(copy_git -C "$workspace" symbolic-ref -q HEAD || true)"
  # The base lives in agentbox's store on the host: it comes as a fast-import stream (base.fi) making one
  # commit whose id the host computed beforehand.
  if [ ! -f "$outbox/base.fi" ] || ! copy_git -C "$workspace" fast-import --quiet < "$outbox/base.fi" ||
    [ "$(copy_git -C "$workspace" rev-parse -q --verify refs/agentbox/base 2>/dev/null || true)" != "$base" ]; then
    say "isolated mode: the workspace's base (${base:0:12}) could not be made in the copy from $outbox/base.fi"
    exit 1
  fi
  copy_git -C "$workspace" update-ref -d refs/agentbox/base
  copy_git -C "$workspace" checkout -q --detach "$base"
  # HEAD back where the user's is, the files as in the base: the uncommitted changes show as such.
  if parent="$(copy_git -C "$workspace" rev-parse -q --verify "$base^" 2>/dev/null)"; then
    if [ -n "$branch" ] && [ "$(copy_git -C "$workspace" rev-parse -q --verify "$branch" 2>/dev/null || true)" = "$parent" ]; then
      copy_git -C "$workspace" symbolic-ref HEAD "$branch"
    else
      copy_git -C "$workspace" update-ref --no-deref HEAD "$parent"
    fi
    copy_git -C "$workspace" reset -q
  else
    [ -z "$branch" ] || copy_git -C "$workspace" symbolic-ref HEAD "$branch"
    copy_git -C "$workspace" read-tree --empty
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
    if [ ! -d "$workspace/.git" ] || [ "$(cat "$isolated_state/copy" 2>/dev/null || true)" != "$workspace" ] ||
      [ "$(cat "$isolated_state/base" 2>/dev/null || true)" != "$base" ]; then
      make_copy
    fi
  elif [ ! -d "$workspace/.git" ] || [ ! -s "$isolated_state/base" ]; then
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

# Run the program on the copy, then leave its changes in the outbox; exits with the program's code.
# When something must happen after the program, it runs as a child: an isolated session's changes go
# to the outbox (write_outbox), the logins it changed are handed back (return_credentials). Exits with
# the program's code (a signal's death as 128+N).
run_then_hand_back() {
  local code
  if [ -n "$isolated_from" ]; then
    cd "$chdir" 2>/dev/null || cd "$workspace"
    export AGENTBOX_SUMMARY="$outbox/summary.md"
  fi
  # A trap that runs a command (not '') is reset in the program: Ctrl-C still reaches it (and it may
  # handle it and go on), while this script lives on to hand back what it must.
  trap 'true' INT TERM HUP QUIT
  set +e
  "$@" 9>&-
  code=$?
  set -e
  trap - INT TERM HUP QUIT
  if [ -n "$isolated_from" ]; then
    write_outbox || say "isolated mode: the session's changes could not be collected; they stay in the copy at $workspace"
  fi
  if [ -n "$creds_outbox" ]; then
    return_credentials || say "could not hand the session's login files back to the host"
  fi
  exit "$code"
}

write_outbox() {
  local index="$isolated_state/index" patch="$outbox/changes.patch.partial"
  [ -d "$outbox" ] || return 1
  rm -f "$index"
  copy_git GIT_INDEX_FILE="$index" -C "$workspace" read-tree "$copy_base" || return 1
  copy_git GIT_INDEX_FILE="$index" -C "$workspace" add -A || return 1
  copy_git GIT_INDEX_FILE="$index" -C "$workspace" diff --cached --binary --full-index --no-renames \
    --no-ext-diff --no-textconv --no-color "$copy_base" -- > "$patch" || return 1
  rm -f "$index"
  mv -f "$patch" "$outbox/changes.patch"
  printf '%s\n' "$copy_base" > "$outbox/base.partial"
  mv -f "$outbox/base.partial" "$outbox/base"
}

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
    return 0
  fi
  # shellcheck disable=SC2016 # $1 belongs to the root shell
  if sudo -n /bin/sh -c 'install -d -m 755 /etc/claude-code && install -m 644 "$1" /etc/claude-code/managed-settings.json' \
      sh "$staging/claude-hooks.json"; then
    cp "$staging/claude-hooks.json" "$hooks_copy"
  else
    say "could not install agentbox's Claude Code hooks in $claude_managed (sudo failed)"
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

context_file=/run/agentbox/context.json
context_digest=""
memory_digest=""

install_context() {
  # The host's description of the sandbox, with the path of each tool found here (bash's hash: no process),
  # as root's read-only /run/agentbox/context.json (/run is emptied at every boot). When neither the
  # document nor a tool's path changed since the last launch, nothing runs at all.
  local staged="$staging/context/context.json" probed="$state/context.json" found="" name path key previous=""
  [ -r "$staged" ] || return 0
  { read -r context_digest && read -r memory_digest; } 2>/dev/null < "$staging/context/digests" || true
  while IFS= read -r name; do
    path=""
    if [[ $name == */* ]]; then
      [ ! -x "$name" ] || path="$name"
    elif hash -- "$name" 2>/dev/null; then
      path="${BASH_CMDS[$name]-}"
    fi
    found+="$name"$'\t'"$path"$'\n'
  done < "$staging/context/tools"
  key="$context_digest"$'\n'"$found"
  IFS= read -r -d '' previous 2>/dev/null < "$state/context.key" || true
  if [ "$key" = "$previous" ] && [ -e "$context_file" ]; then
    export AGENTBOX_CONTEXT_FILE="$context_file"
    return 0
  fi
  # shellcheck disable=SC2016 # $found is jq's variable
  if command -v jq >/dev/null 2>&1 && jq --arg found "$found" '
      ([$found | split("\n")[] | select(length > 0) | split("\t") | {key: .[0], value: (.[1] // "")}]
        | from_entries) as $paths
      | .tools.checkedInVm = true
      | .tools.list |= map(.path = (if ($paths[.name] // "") == "" then null else $paths[.name] end))' \
      "$staged" > "$probed.tmp.$$"; then
    mv -f "$probed.tmp.$$" "$probed"
  else
    rm -f "$probed.tmp.$$"
    cp "$staged" "$probed"  # no jq yet (provisioning did not finish): the tools stay unchecked
    key=""
  fi
  if ! cmp -s "$probed" "$context_file"; then
    # shellcheck disable=SC2016 # $1 and $$ belong to the root shell
    if ! sudo -n /bin/sh -c 'install -d -m 755 /run/agentbox && install -m 644 "$1" "/run/agentbox/.context.json.$$" &&
        mv -f "/run/agentbox/.context.json.$$" /run/agentbox/context.json' sh "$probed"; then
      say "could not write $context_file (sudo failed); the agent reads the description from $probed instead"
      export AGENTBOX_CONTEXT_FILE="$probed"
      return 0
    fi
  fi
  printf '%s' "$key" > "$state/context.key"
  export AGENTBOX_CONTEXT_FILE="$context_file"
}

keep_memory_block() {
  # agentbox's short block in each agent's memory file (~/.claude/CLAUDE.md, ...), the user's text around it
  # kept. Skipped without starting a process when the block is the one kept last time and no file changed since.
  local block="$staging/context/memory.md" stamp="$state/memory.stamp" relative previous="" file stale=""
  local -a files=()
  [ -r "$block" ] || return 0
  for relative in "${memory_files[@]}"; do
    case "$relative" in /* | *..*) continue ;; esac
    files+=("$HOME/$relative")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  IFS= read -r previous 2>/dev/null < "$state/memory.key" || true
  if [ -n "$memory_digest" ] && [ "$memory_digest" = "$previous" ] && [ -e "$stamp" ]; then
    for file in "${files[@]}"; do
      if [ ! -e "$file" ] || [ "$file" -nt "$stamp" ]; then
        stale=1
      fi
    done
    [ -n "$stale" ] || return 0
  fi
  local status=0
  bash "$staging/agent-memory.sh" put "$block" "${files[@]}" || status=$?
  if [ "$status" -eq 0 ]; then
    : > "$stamp"
    printf '%s\n' "$memory_digest" > "$state/memory.key"
  elif [ "$status" -ne 1 ]; then  # 1: a file was left alone, and agent-memory.sh said why
    say "could not update the agents' memory files (agent-memory.sh exited $status)"
  fi
}

enter_worktree() {
  # agentbox AGENT --worktree NAME: the session's own checkout of the workspace, on its own branch, in a
  # folder git ignores; made here (in the VM) when missing, used again when it exists.
  local common
  if ! common="$(git -C "$workspace" rev-parse --path-format=absolute --git-common-dir)"; then
    say "--worktree: $workspace is not a git work tree"
    exit 1
  fi
  mkdir -p "$common/info"
  grep -qxF '/.agentbox/' "$common/info/exclude" 2>/dev/null || printf '/.agentbox/\n' >> "$common/info/exclude"
  if [ ! -e "$worktree/.git" ]; then
    mkdir -p "$(dirname "$worktree")"
    if git -C "$workspace" show-ref --verify --quiet "refs/heads/$worktree_branch"; then
      git -C "$workspace" worktree add -q "$worktree" "$worktree_branch" >&2 || exit 1
    else
      git -C "$workspace" worktree add -q -b "$worktree_branch" "$worktree" "$worktree_base" >&2 || exit 1
    fi
    say "made the worktree $worktree on the branch $worktree_branch"
  fi
  cd "$worktree"
}

wait_for_boot
check_provisioned
apply_network
load_env
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
mkdir -p "$state"
# Launches at once (several `agentbox run`, a session beside them) take turns for the setup: it installs
# files in the home. The program itself runs after the lock is let go.
exec 7>>"$state/launch.lock"
flock 7
apply_credentials
apply_sync
setup_browser
configure_git
mark_claude_onboarded
repair_gemini_settings
[ "$binary" != gemini ] || trust_workspace_for_gemini
case "$guards" in
  on) install_guards ;;
  off) remove_guards ;;
esac
hash -r
[ -z "$isolated_from" ] || prepare_copy
bootstrap

if [ -n "$binary" ] && ! command -v "$binary" >/dev/null 2>&1; then
  if [ -z "$install" ]; then
    say "$binary is not installed in the VM and no install command is configured."
    exit 127
  fi
  say "installing $binary in the VM: $install"
  if ! bash -euo pipefail -c "$install" >&2 9>&-; then
    say "installing $binary failed (command: $install)"
    exit 127
  fi
  hash -r
fi

install_context
keep_memory_block
case "$notify" in
  on) install_attention ;;
  off) remove_attention ;;
esac
[ -z "$worktree" ] || enter_worktree
flock -u 7
exec 7>&-

if [ -n "$timing_start" ] && [ -n "${EPOCHREALTIME:-}" ]; then
  setup_us=$(( ${EPOCHREALTIME/./} - ${timing_start/./} ))
  printf 'agentbox timings (in the VM):\n  %-34s %8d.%d ms\n' "setup step (launch.sh)" $((setup_us / 1000)) $(((setup_us % 1000) / 100)) >&2
fi

if [ $# -eq 0 ]; then
  # The login shell's profile puts ~/.local/bin on PATH again: hand it a PATH without it.
  shell_path="$(path_without_local_bin)"
  [ -z "$isolated_from$creds_outbox" ] || run_then_hand_back env PATH="$shell_path" bash -l
  PATH="$shell_path" exec bash -l
fi
# Say what a shell would, not where this script failed to exec it.
case "$1" in
  */*)
    if [ ! -e "$1" ]; then
      printf '%s: No such file or directory\n' "$1" >&2
      exit 127
    elif [ -d "$1" ] || [ ! -x "$1" ]; then
      printf '%s: Permission denied\n' "$1" >&2
      exit 126
    fi
    ;;
  *)
    if ! command -v -- "$1" >/dev/null 2>&1; then
      printf '%s: command not found\n' "$1" >&2
      exit 127
    fi
    ;;
esac
if [ -n "$session" ]; then
  # A session outlives this shell: nothing can be handed back when it ends (the host never asks both).
  if [ -n "$isolated_from$creds_outbox" ]; then
    say "launch.sh: --session does not go with --isolated-from or --creds-outbox"
    exit 2
  fi
  exec bash "$staging/session.sh" start --name "$session" --agent "$session" --reply "$session_reply" \
    --conf "$staging/tmux.conf" --events "$session_events" --live "$session_live" ${session_attach:+--attach} -- "$@"
fi
[ -z "$isolated_from$creds_outbox" ] || run_then_hand_back "$@"
if [ -n "$task" ]; then
  # A background task: its runner outlives this shell (a session of its own, no terminal), and says it
  # took the task by writing its state; then this step is done.
  setsid bash "$staging/task-runner.sh" "$task" "$@" < /dev/null > /dev/null 2> "$task/runner.log" 9>&- &
  for _ in $(seq 1 200); do
    [ ! -e "$task/state" ] || exit 0
    sleep 0.05
  done
  say "the task runner did not start (see $task/runner.log)"
  exit 1
fi
exec "$@"
