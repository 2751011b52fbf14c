#!/bin/bash
# agentbox-managed: the per-launch step. agentbox runs it in the VM's single `limactl shell` call
# from the read-only staging mount; it prepares the session and then execs the agent or a shell.
#   launch.sh [OPTION VALUE | --timing]... [-- PROGRAM ARGS...]
# The options, what each means and the staging folder's files this script reads are listed once,
# on the host side: agentbox/staging.py (LAUNCH_OPTIONS; tests check this parser against it).
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
memory_files=()
timing_start=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wait) wait_sec="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --install) install="$2"; shift 2 ;;
    --guards) guards="$2"; shift 2 ;;
    --workspace) workspace="$2"; shift 2 ;;
    --on-create) on_create+=("$2"); shift 2 ;;
    --on-start) on_start+=("$2"); shift 2 ;;
    --memory-file) memory_files+=("$2"); shift 2 ;;
    --timing) timing_start="${EPOCHREALTIME:-}"; shift ;;
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

# agentbox's own git settings go through the real git, never the readonly-remote wrapper in
# ~/.local/bin: the wrapper refuses every git command while `env:` sets, say, GIT_SSH_COMMAND.
git_config_global() {
  local dir path=""
  local -a dirs
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ "$dir" = "$HOME/.local/bin" ] || path="${path:+$path:}$dir"
  done
  env PATH="$path" git config --global "$@"
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
  if { [ -s "$file" ] && jq "$@" "$program" "$file" > "$file.agentbox-tmp"; } ||
    { [ ! -s "$file" ] && jq -n "$@" "$program" > "$file.agentbox-tmp"; }; then
    chmod 600 "$file.agentbox-tmp"
    mv "$file.agentbox-tmp" "$file"
  else
    rm -f "$file.agentbox-tmp"
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
      jq '.hasCompletedOnboarding = true' "$file" > "$file.agentbox-tmp" && mv "$file.agentbox-tmp" "$file"
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
    (cd "$workspace" && bash -euo pipefail "$script")
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
      "$staged" > "$probed.tmp"; then
    mv -f "$probed.tmp" "$probed"
  else
    rm -f "$probed.tmp"
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

wait_for_boot
check_provisioned
load_env
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
mkdir -p "$state"
apply_credentials
configure_git
mark_claude_onboarded
repair_gemini_settings
[ "$binary" != gemini ] || trust_workspace_for_gemini
case "$guards" in
  on) install_guards ;;
  off) remove_guards ;;
esac
hash -r
bootstrap

if [ -n "$binary" ] && ! command -v "$binary" >/dev/null 2>&1; then
  if [ -z "$install" ]; then
    say "$binary is not installed in the VM and no install command is configured."
    exit 127
  fi
  say "installing $binary in the VM: $install"
  if ! bash -euo pipefail -c "$install" >&2; then
    say "installing $binary failed (command: $install)"
    exit 127
  fi
  hash -r
fi

install_context
keep_memory_block

if [ -n "$timing_start" ] && [ -n "${EPOCHREALTIME:-}" ]; then
  setup_us=$(( ${EPOCHREALTIME/./} - ${timing_start/./} ))
  printf 'agentbox timings (in the VM):\n  %-34s %8d.%d ms\n' "setup step (launch.sh)" $((setup_us / 1000)) $(((setup_us % 1000) / 100)) >&2
fi

if [ $# -eq 0 ]; then
  # The login shell's profile puts ~/.local/bin on PATH again: hand it a PATH without it.
  shell_path=""
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ "$dir" = "$HOME/.local/bin" ] || shell_path="${shell_path:+$shell_path:}$dir"
  done
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
exec "$@"
