# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# Settings in the guest home: the browser, git, Claude Code's and Gemini CLI's.
# Reads launch.sh's staging, state, workspace.

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
