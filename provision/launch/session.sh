# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# How the program runs: in a worktree, a kept session, a background task, or as a child whose results are handed back.
# Reads launch.sh's staging, workspace, outbox, isolated_from, creds_outbox, task, isolated_task, worktree,
# worktree_branch, worktree_base, session, session_attach, session_reply, session_events, session_live.

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

# Run the program on the copy, then leave its changes in the outbox; exits with the program's code.
# When something must happen after the program, it runs as a child: an isolated session's changes go
# to the outbox (write_outbox), the logins it changed are handed back (return_credentials). Exits with
# the program's code (a signal's death as 128+N).
run_then_hand_back() {
  local code
  if [ -n "$isolated_from" ]; then
    enter_copy
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
    collect_changes
  fi
  if [ -n "$creds_outbox" ]; then
    return_credentials || say "could not hand the session's login files back to the host"
  fi
  exit "$code"
}

run_login_shell() {
  # The login shell's profile puts ~/.local/bin on PATH again: hand it a PATH without it.
  local shell_path
  shell_path="$(path_without_local_bin)"
  [ -z "$isolated_from$creds_outbox" ] || run_then_hand_back env PATH="$shell_path" bash -l
  PATH="$shell_path" exec bash -l
}

# Say what a shell would, not where this script failed to exec it.
check_program() {
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
}

start_session() {
  # A session outlives this shell: nothing can be handed back when it ends (the host never asks both).
  if [ -n "$isolated_from$creds_outbox" ]; then
    say "launch.sh: --session does not go with --isolated-from or --creds-outbox"
    exit 2
  fi
  exec bash "$staging/session.sh" start --name "$session" --agent "$session" --reply "$session_reply" \
    --conf "$staging/tmux.conf" --events "$session_events" --live "$session_live" ${session_attach:+--attach} -- "$@"
}

start_task() {
  # A background task: its runner outlives this shell (a session of its own, no terminal), and says it
  # took the task by writing its state; then this step is done.
  # An isolated task (--isolated-task) runs on a copy the runner makes: the runner checks its spec says so too.
  local mode=()
  [ -z "$isolated_task" ] || mode=(--isolated)
  setsid bash "$staging/task-runner.sh" "${mode[@]}" "$task" "$@" < /dev/null > /dev/null 2> "$task/runner.log" 9>&- &
  for _ in $(seq 1 200); do
    [ ! -e "$task/state" ] || exit 0
    sleep 0.05
  done
  say "the task runner did not start (see $task/runner.log)"
  exit 1
}
