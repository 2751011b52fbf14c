# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# Settings in the guest home: the browser, git, Claude Code's and Gemini CLI's.
# Reads launch.sh's staging, state, workspace, binary, worktree.

setup_browser() {
  # The VM has no browser: an agent that opens a login page gets the address printed for the user
  # (open-url.sh, which writes to the session's terminal even when the agent detached it).
  local bin="$state/bin"
  mkdir -p "$bin"
  cmp -s "$staging/open-url" "$bin/open-url" || install -m 755 "$staging/open-url" "$bin/open-url"
  browser_env
}

browser_env() {
  [ -n "${BROWSER:-}" ] || export BROWSER="$state/bin/open-url"
  [ -t 2 ] || return 0
  AGENTBOX_TTY=""
  # The terminal on stderr by bash alone: the controlling terminal's number (/proc/$$/stat's tty_nr) names a
  # /dev/pts/N; taken when that is the very file on fd 2 (-ef: the same device and inode). Else readlink.
  local stat tty_nr major minor candidate
  local -a fields=()
  if { read -r stat < "/proc/$$/stat"; } 2>/dev/null; then
    read -r -a fields <<< "${stat##*) }"
    tty_nr="${fields[4]:-0}"
    major=$(((tty_nr >> 8) & 0xfff))
    minor=$(((tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00)))
    candidate="/dev/pts/$(((major - 136) * 256 + minor))"
    if [ "$major" -ge 136 ] && [ "$major" -le 143 ] && [ "/proc/$$/fd/2" -ef "$candidate" ]; then
      AGENTBOX_TTY="$candidate"
    fi
  fi
  [ -n "$AGENTBOX_TTY" ] || AGENTBOX_TTY="$(readlink "/proc/$$/fd/2" 2>/dev/null || true)"
  export AGENTBOX_TTY
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
  # Claude Code asks once per folder whether to trust it, once per home for its onboarding (the theme, the
  # login), and once whether auto mode should replace bypass permissions (hasSeenAutoDefaultNudge): a detached
  # session or a task must never wait there. The workspace (and the worktree the session works in) is marked
  # trusted, the nudge seen; onboarding done when a login is there (without one, its onboarding is how the
  # user logs in). Skipped without a process when done for the same folders since apply_credentials
  # last installed ~/.claude.json (it removes the stamp); Claude Code keeps the keys when it rewrites the file.
  [ -z "${binary:-}" ] || [ "$binary" = claude ] || return 0
  claude_onboarded_is_current && return 0
  # shellcheck disable=SC2016 # jq's variables
  json_edit "$HOME/.claude.json" '(if $login then .hasCompletedOnboarding = true else . end) | .hasSeenAutoDefaultNudge = true
    | reduce ([$workspace, $worktree] | map(select(. != "")) | .[]) as $folder (.;
        .projects[$folder] = ((.projects[$folder] // {}) + {hasTrustDialogAccepted: true, hasCompletedProjectOnboarding: true}))' \
    --argjson login "$claude_login" --arg workspace "$workspace" --arg worktree "${worktree:-}"
  [ ! -s "$HOME/.claude.json" ] || printf '%s\n' "$claude_key" > "$state/claude-onboarded"
}

claude_login=false
claude_key=""

# bash's read and test only: marked for the same login state and folders since ~/.claude.json was installed.
claude_onboarded_is_current() {
  [ -z "${binary:-}" ] || [ "$binary" = claude ] || return 0
  local marked=""
  claude_login=false
  if [ -n "${CLAUDE_CODE_OAUTH_TOKEN:-}${ANTHROPIC_API_KEY:-}" ] || [ -s "$HOME/.claude/.credentials.json" ]; then
    claude_login=true
  fi
  claude_key="$claude_login $workspace ${worktree:-}"
  [ -s "$HOME/.claude.json" ] && [ -r "$state/claude-onboarded" ] || return 1
  IFS= read -r marked < "$state/claude-onboarded" || true
  [ "$marked" = "$claude_key" ]
}
