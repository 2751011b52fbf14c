#!/bin/bash
# agentbox-managed: runs one background task (`agentbox run`) in the VM, detached from the `limactl shell`
# that started it (launch.sh --task starts it in a session of its own and returns).
#   task-runner.sh [--isolated] DIR PROGRAM ARGS...
# DIR is the task's folder in agentbox's outbox (shared with the host). The host wrote there:
#   spec     NAME=value records, each ended by a NUL: id, max (tasks.maxConcurrent), timeout and grace
#            (seconds; timeout 0: none), cwd, agent, and for a worktree task worktree, branch, base, repo;
#            events (the host's attention folder, when notify is on: the task's end is left there for the
#            host's watcher), live (the outbox folder where a marker, kept fresh while the task waits or
#            runs, keeps the host's watcher and network proxy)
#            An isolated task (`agentbox run --on`, --isolated, which the spec must say too: isolated=1) has
#            format (sha1|sha256), bundle (repeated: the files of this staging folder's bundles/ to fetch, in
#            order), base (the commit its copy starts from), copy (the copy's folder name) and subdir (where in
#            the copy the program starts): the program runs on a copy made under ~/.agentbox/tasks/ID/ from a
#            cache repository of the guest's own, never in the workspace
#            An isolated task may be a session (`agentbox AGENT --on HOST --detach`): session=NAME runs the
#            program, without the prompt, in the tmux session NAME of a tmux server of its own (`tmux -L NAME`,
#            so it gets this runner's environment), on a terminal `agentbox attach` joins; the task ends when
#            that session does. Its output is on that terminal, not in stdout/stderr.
#   prompt   the prompt, byte for byte: the program's last argument (not a session's)
# This script writes there, each file replaced whole (written aside, then renamed):
#   state    state=queued|running|completed|failed|timeout|cancelled and its times (epoch seconds), exit,
#            reason, one NAME=value a line
#   stdout, stderr   the program's output;   heartbeat   the time, every second while it runs
#   changes.patch, summary.md   an isolated task's changes against its base (and the agent's summary, when it
#            left one at $AGENTBOX_SUMMARY), written before the final state; not after a cancel
# and reads `cancel`, which the host creates to cancel the task.
# Slots: a task waits (queued) until fewer than `max` run, no other task of its tree runs (the live tree,
# or the same worktree), and no older waiting task could start instead: one whose tree is busy does not
# hold back the others (a worktree task starts beside a live-tree task while a slot is free). The waiting
# runners coordinate through ~/.agentbox/tasks (one file per task, under a flock: "STATE TREE BOOT PID",
# TREE 1 for the live tree, w<checksum of its path> for a worktree); a finishing runner frees its slot
# and the oldest waiting one that can start takes it.
set -uo pipefail

isolated_flag=""
if [ "${1:-}" = --isolated ]; then
  isolated_flag=1
  shift
fi
dir="$1"
shift
registry="$HOME/.agentbox/tasks"
case "${BASH_SOURCE[0]}" in
  */*) staging="${BASH_SOURCE[0]%/*}" ;;
  *) staging="." ;;
esac
boot="$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)"

id="" max=2 timeout=0 grace=5 cwd="" agent="" events="" marker_dir="" worktree="" branch="" base="" repo=""
isolated="" format=sha1 copy_name="" subdir="." bundles=() session=""
while IFS= read -r -d '' record; do
  case "$record" in
    id=*) id="${record#id=}" ;;
    max=*) max="${record#max=}" ;;
    timeout=*) timeout="${record#timeout=}" ;;
    grace=*) grace="${record#grace=}" ;;
    cwd=*) cwd="${record#cwd=}" ;;
    agent=*) agent="${record#agent=}" ;;
    events=*) events="${record#events=}" ;;
    live=*) marker_dir="${record#live=}" ;;
    worktree=*) worktree="${record#worktree=}" ;;
    branch=*) branch="${record#branch=}" ;;
    base=*) base="${record#base=}" ;;
    repo=*) repo="${record#repo=}" ;;
    isolated=*) isolated="${record#isolated=}" ;;
    format=*) format="${record#format=}" ;;
    bundle=*) bundles+=("${record#bundle=}") ;;
    copy=*) copy_name="${record#copy=}" ;;
    subdir=*) subdir="${record#subdir=}" ;;
    session=*) session="${record#session=}" ;;
  esac
done < "$dir/spec"
for number in "$id" "$max" "$timeout" "$grace"; do
  case "$number" in '' | *[!0-9]*) echo "task-runner: bad spec in $dir" >&2; exit 2 ;; esac
done
case "$session" in
  '') ;;
  *[!A-Za-z0-9_-]* | -*) echo "task-runner: bad session name in $dir" >&2; exit 2 ;;
  *) [ -n "$isolated" ] || { echo "task-runner: a session must be an isolated task ($dir)" >&2; exit 2; } ;;
esac
if [ "$isolated" != "$isolated_flag" ]; then
  echo "task-runner: the spec in $dir and launch.sh disagree about an isolated task (run the task again)" >&2
  exit 2
fi

now_precise() {
  # EPOCHREALTIME with a dot, whatever the locale's decimal separator
  local t="$EPOCHREALTIME"
  printf '%s' "${t/,/.}"
}

beat="" marked=0
heartbeat() {
  # once a second at most: the host counts a runner silent for long as lost
  if [ "$EPOCHSECONDS" != "$beat" ]; then
    beat="$EPOCHSECONDS"
    printf '%s\n' "$beat" > "$dir/heartbeat"
    if [ -n "$marker_dir" ] && [ $((beat - marked)) -ge 20 ]; then
      marked="$beat"
      mkdir -p "$marker_dir" 2>/dev/null && touch "$marker_dir/task-$id" 2>/dev/null
    fi
  fi
}

tell_host() {
  # tell_host STATE: the task's end as an event for the host's watcher (agentbox.session.attention), which shows it
  [ -z "$marker_dir" ] || rm -f "$marker_dir/task-$id"
  [ -n "$events" ] || return 0
  [ "$1" != cancelled ] || return 0  # the user asked for that one
  local file message="$1"
  [ -z "$reason" ] || message="$1: $reason"
  file="$events/$(date +%s%N)-$$"
  printf 'task\n%s\n%s\n%s\n' "$id" "$agent" "${message:0:300}" > "$file.partial" 2>/dev/null &&
    mv -f "$file.partial" "$file.event" 2>/dev/null
}

queued_at="$(now_precise)" started_at="" ended_at="" exit_code="" reason="" state=""
me="$(printf '%012d' "$id")"
tree=1
[ -z "$worktree" ] || tree="w$(printf '%s' "$worktree" | cksum | cut -d' ' -f1)"
[ -z "$isolated" ] || tree="i$id"  # a copy of its own: it waits for no other tree

put_state() {
  state="$1"
  {
    printf 'state=%s\nqueued_at=%s\n' "$state" "$queued_at"
    [ -z "$started_at" ] || printf 'started_at=%s\n' "$started_at"
    [ -z "$ended_at" ] || printf 'ended_at=%s\n' "$ended_at"
    [ -z "$exit_code" ] || printf 'exit=%s\n' "$exit_code"
    [ -z "$reason" ] || printf 'reason=%s\n' "$reason"
  } > "$dir/.state.new" && mv -f "$dir/.state.new" "$dir/state"
}

finish() {
  # finish STATE REASON: the end, the slot freed
  ended_at="$(now_precise)"
  reason="$2"
  put_state "$1"
  rm -f "$registry/$me"
  tell_host "$1"
  exit 0
}

enter_registry() {
  mkdir -p "$registry"
  printf 'queued %s %s %s\n' "$tree" "$boot" "$$" > "$registry/$me"
}

may_start() {
  # Under the lock: a slot free, this task's tree free, and no older waiting task that could start now.
  local entry name e_state e_tree e_boot e_pid running=0 busy=" " older=()
  for entry in "$registry"/*; do
    [ -f "$entry" ] || continue
    name="${entry##*/}"
    [ "$name" != "$me" ] || continue
    read -r e_state e_tree e_boot e_pid < "$entry" || continue
    if [ "$e_boot" != "$boot" ] || ! kill -0 "$e_pid" 2>/dev/null; then
      rm -f "$entry"  # a runner of an earlier boot, or one that died
      continue
    fi
    if [ "$e_state" = running ]; then
      running=$((running + 1))
      [ "$e_tree" = 0 ] || busy+="$e_tree "  # 0: a worktree task of an older runner, its tree its own
    elif [[ $name < $me ]]; then
      older+=("$e_tree")
    fi
  done
  [ "$running" -lt "$max" ] || return 1
  [[ $busy != *" $tree "* ]] || return 1
  for e_tree in "${older[@]}"; do
    # an older task whose tree is free goes first; one waiting for its tree holds back no one
    [ "$e_tree" != 0 ] && [[ $busy == *" $e_tree "* ]] || return 1
  done
  return 0
}

wait_for_slot() {
  local lock
  exec {lock}>"$registry/.lock"
  while :; do
    [ ! -e "$dir/cancel" ] || finish cancelled "cancelled while queued"
    heartbeat
    flock "$lock"
    if may_start; then
      printf 'running %s %s %s\n' "$tree" "$boot" "$$" > "$registry/$me"
      flock -u "$lock"
      exec {lock}>&-
      return 0
    fi
    flock -u "$lock"
    sleep 0.3
  done
}

make_worktree() {
  # The task's checkout on its branch, in a folder git ignores (the repository's info/exclude); a named
  # worktree (`run --worktree NAME`) that exists already, or its branch, is used again.
  local common exclude
  common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>>"$dir/stderr")" || return 1
  exclude="$common/info/exclude"
  mkdir -p "$common/info"
  grep -qxF '/.agentbox/' "$exclude" 2>/dev/null || printf '/.agentbox/\n' >> "$exclude"
  [ ! -e "$worktree/.git" ] || return 0
  mkdir -p "$(dirname "$worktree")"
  if git -C "$repo" show-ref --verify --quiet "refs/heads/$branch"; then
    git -C "$repo" worktree add -q "$worktree" "$branch" >/dev/null 2>>"$dir/stderr"
  else
    git -C "$repo" worktree add -q -b "$branch" "$worktree" "$base" >/dev/null 2>>"$dir/stderr"
  fi
}

commit_worktree() {
  # What the agent left uncommitted becomes a commit on the task's branch, ready to merge.
  [ -n "$worktree" ] && [ -d "$worktree" ] || return 0
  git -C "$worktree" add -A >/dev/null 2>&1 || return 0
  git -C "$worktree" diff --cached --quiet 2>/dev/null && return 0
  local message="agentbox task $id"
  git -C "$worktree" commit -q --no-verify -m "$message" >/dev/null 2>&1 ||
    git -C "$worktree" -c user.name="agentbox task" -c user.email="agentbox@localhost" \
      commit -q --no-verify -m "$message" >/dev/null 2>&1 || true
}

# -- an isolated task's copy ------------------------------------------------------------------------
cache="$HOME/.agentbox/tasks-repo.git"
[ "$format" = sha1 ] || cache="$HOME/.agentbox/tasks-repo-$format.git"
copy_root="$registry/$id"
case "$copy_name" in '' | */* | . | ..) copy_name=workspace ;; esac
copy="$copy_root/$copy_name"

# git for the runner's own steps: no user, system or `env:` settings, no hooks, no pager, and not the
# readonly-remote guard of ~/.local/bin (it refuses core.hooksPath).
git_path=""
IFS=: read -r -a path_dirs <<<"$PATH"
for path_dir in "${path_dirs[@]}"; do
  [ "$path_dir" = "$HOME/.local/bin" ] || git_path="${git_path:+$git_path:}$path_dir"
done
task_git() {
  local -a assignments=()
  while [ $# -gt 0 ] && [[ "$1" == GIT_*=* ]]; do
    assignments+=("$1")
    shift
  done
  env -i PATH="$git_path" HOME="$copy_root" LC_ALL=C GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
    GIT_TERMINAL_PROMPT=0 GIT_PAGER=cat "${assignments[@]}" \
    git --no-pager -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.autocrlf=false \
    -c core.safecrlf=false -c safe.directory='*' -c user.name="agentbox task" -c user.email=agentbox@localhost "$@"
}

make_copy() {
  # The bundles the host staged, fetched in order into the guest's cache (those it has already skipped), then
  # the copy: a clone sharing the cache's objects, with the base checked out.
  local name file lock
  case "$base" in '' | *[!0-9a-f]*) echo "task-runner: no base commit in the spec" >&2; return 1 ;; esac
  mkdir -p "$copy_root" || return 1
  exec {lock}>>"$registry/.cache.lock"
  flock "$lock"
  [ -d "$cache/objects" ] || task_git init -q --bare --object-format="$format" "$cache" || { exec {lock}>&-; return 1; }
  for name in "${bundles[@]}"; do
    case "${name%.bundle}" in '' | *[!0-9a-f]* | "$name") echo "task-runner: bad bundle name $name" >&2; exec {lock}>&-; return 1 ;; esac
    if task_git -C "$cache" cat-file -e "${name%.bundle}^{commit}" 2>/dev/null; then
      continue
    fi
    file="$staging/bundles/$name"
    if ! task_git -C "$cache" fetch -q --no-tags "$file" "+refs/agentbox/*:refs/fetched/*" ||
      ! task_git -C "$cache" update-ref "refs/keep/${name%.bundle}" "${name%.bundle}"; then
      echo "task-runner: could not fetch $file" >&2
      exec {lock}>&-
      return 1
    fi
  done
  flock -u "$lock"
  exec {lock}>&-
  rm -rf "$copy"
  task_git clone -q --shared --no-checkout "$cache" "$copy" &&
    task_git -C "$copy" checkout -q --detach "$base"
}

write_changes() {
  # What the agent changed in its copy against the base (its commits included), for the host's proposal; the
  # agent's summary beside it, left out of the patch.
  local index="$copy_root/index" summary="$copy/.agentbox-summary.md"
  [ -d "$copy" ] || return 1
  if [ -f "$summary" ] && [ ! -L "$summary" ]; then
    cp -- "$summary" "$dir/.summary.partial" && mv -f "$dir/.summary.partial" "$dir/summary.md"
  fi
  rm -f "$summary"
  rm -f "$index"
  task_git GIT_INDEX_FILE="$index" -C "$copy" read-tree "$base" &&
    task_git GIT_INDEX_FILE="$index" -C "$copy" add -A &&
    task_git GIT_INDEX_FILE="$index" -C "$copy" diff --cached --binary --full-index --no-renames --no-ext-diff \
      --no-textconv --no-color "$base" -- > "$dir/.changes.partial" &&
    mv -f "$dir/.changes.partial" "$dir/changes.patch"
}

remove_copy() {
  # The agent may have left root-owned files in it (it has sudo).
  [ -d "$copy_root" ] || return 0
  rm -rf --one-file-system "$copy_root" 2>/dev/null || sudo -n rm -rf --one-file-system "$copy_root" 2>/dev/null || true
}

# -- a session: the program in tmux -----------------------------------------------------------------
start_session() {
  # The program in a new tmux session of a server of its own, its exit status left in the copy's folder; child
  # is the pane's process (a session leader: cancel signals its group).
  if ! command -v tmux >/dev/null 2>&1; then
    remove_copy
    finish failed "tmux is not installed in the VM (a session needs it)"
  fi
  rm -f "$copy_root/exit"
  # shellcheck disable=SC2016 # expanded by the pane's bash
  child="$(PYTHONUNBUFFERED=1 tmux -L "$session" new-session -d -P -F '#{pane_pid}' -s "$session" -c "$cwd" \
    -x 200 -y 50 -- bash -c '"$@"; printf "%s\n" "$?" > "$0"' "$copy_root/exit" "$@" 2>>"$dir/stderr")"
  case "$child" in
    '' | *[!0-9]*)
      remove_copy
      finish failed "tmux could not start the session $session (see the task's stderr)"
      ;;
  esac
}

session_exit() {
  local code=""
  [ ! -f "$copy_root/exit" ] || read -r code < "$copy_root/exit"
  case "$code" in '' | *[!0-9]*) code=129 ;; esac  # ended by a signal (the session killed)
  tmux -L "$session" kill-server 2>/dev/null
  printf '%s' "$code"
}

beat_until() {
  # beat_until PID: beat while that background step runs (a large tree takes a while); its status
  while kill -0 "$1" 2>/dev/null; do
    heartbeat
    sleep 0.2
  done
  wait "$1"
}

: > "$dir/stdout"
: > "$dir/stderr"
enter_registry
# The marker exists before the host hears of the task: the host's proxy must not stop in between.
[ -z "$marker_dir" ] || { mkdir -p "$marker_dir" 2>/dev/null && touch "$marker_dir/task-$id" 2>/dev/null; } || true
put_state queued
if [ -n "$worktree" ] && ! make_worktree; then
  finish failed "could not create the worktree $worktree (see the task's stderr)"
fi
wait_for_slot

IFS= read -r -d '' prompt < "$dir/prompt" || true
[ -z "$worktree" ] || cwd="$worktree"
if [ -n "$isolated" ]; then
  [ ! -e "$dir/cancel" ] || finish cancelled "cancelled while queued"
  make_copy 2>>"$dir/stderr" &
  if ! beat_until $!; then
    remove_copy &
    beat_until $!
    finish failed "could not make the task's copy of the workspace (see the task's stderr)"
  fi
  cwd="$copy"
  [ "$subdir" = . ] || [ ! -d "$copy/$subdir" ] || cwd="$copy/$subdir"
  export AGENTBOX_SUMMARY="$copy/.agentbox-summary.md"
fi
cd "$cwd" 2>>"$dir/stderr" || finish failed "cannot enter $cwd"
started_at="$(now_precise)"
put_state running
# A session of its own: cancel and timeout signal its whole process group. Its output goes straight to
# the files `agentbox logs -f` follows; a program that leaves buffering to stdio would hold it back until
# it ends (a file is not a terminal), so stdio is line-buffered where stdbuf can (glibc) and Python's too.
line_buffered=()
! command -v stdbuf >/dev/null 2>&1 || line_buffered=(stdbuf -oL -eL)
if [ -n "$session" ]; then
  start_session "$@"
else
  PYTHONUNBUFFERED=1 setsid "${line_buffered[@]}" "$@" "$prompt" < /dev/null > "$dir/stdout" 2> "$dir/stderr" &
  child=$!
fi

ending="" kill_at=0
deadline=0
[ "$timeout" -eq 0 ] || deadline=$((EPOCHSECONDS + timeout))
while kill -0 "$child" 2>/dev/null; do
  now="$EPOCHSECONDS"
  heartbeat
  if [ -z "$ending" ]; then
    if [ -e "$dir/cancel" ]; then
      ending=cancelled
    elif [ "$deadline" -gt 0 ] && [ "$now" -ge "$deadline" ]; then
      ending=timeout
    fi
    if [ -n "$ending" ]; then
      [ -z "$session" ] || tmux -L "$session" kill-server 2>/dev/null
      kill -TERM -- "-$child" 2>/dev/null
      kill_at=$((now + grace))
    fi
  elif [ "$now" -ge "$kill_at" ]; then
    kill -KILL -- "-$child" 2>/dev/null
  fi
  sleep 0.2
done
if [ -n "$session" ]; then
  exit_code="$(session_exit)"
else
  wait "$child"
  exit_code=$?
fi
commit_worktree &
committing=$!
while kill -0 "$committing" 2>/dev/null; do  # a large tree takes a while: keep beating meanwhile
  heartbeat
  sleep 0.2
done
if [ -n "$isolated" ]; then
  cd / || true
  if [ "$ending" != cancelled ]; then
    write_changes 2>>"$dir/stderr" &
    if ! beat_until $!; then
      rm -f "$dir/.changes.partial"
      printf 'task-runner: the copy'"'"'s changes could not be written\n' >> "$dir/stderr"
    fi
  fi
  remove_copy &
  beat_until $!
fi
case "$ending" in
  cancelled) finish cancelled "cancelled (agentbox cancel)" ;;
  timeout) finish timeout "stopped after its timeout of ${timeout}s" ;;
esac
if [ "$exit_code" -eq 0 ]; then
  finish completed ""
fi
finish failed "exited with $exit_code"
