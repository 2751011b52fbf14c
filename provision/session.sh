#!/bin/bash
# agentbox-managed: detachable sessions in the VM (tmux). One tmux server of agentbox's own
# (`tmux -L agentbox`, its settings from the staged tmux.conf) holds every session; each session's
# record lives in ~/.agentbox/sessions/NAME, so it outlasts the session and answers `agentbox sessions`
# and `agentbox attach` after the agent has exited.
#   session.sh start --name BASE --agent AGENT --reply DIR --conf FILE [--dir DIR] [--events DIR] [--live DIR]
#                    [--attach]
#                    -- PROGRAM ARGS...     (launch.sh, last: the session is made, then attached to)
#   session.sh run NAME                     (tmux, inside the new session: the program, then its record)
#   session.sh list                         (the host: one line per record, tab-separated)
#   session.sh attach --reply DIR [NAME]    (the host: attach, or show the last output of an ended one)
# What the host needs back goes to DIR/result (in the outbox) as key=value lines, written last:
#   outcome=started|ended|detached|exited|unknown|ambiguous|none, name=, agent=, code=, names=
# Record files: agent, started and ended (epoch seconds), argv and env (NUL-separated, removed once read),
# dir, exit (the program's exit code), last-output (the end of its screen and history), stopped (the session was
# stopped with its VM: no exit code, no last screen).
set -euo pipefail

records="$HOME/.agentbox/sessions"
tmux_cmd=(tmux -L agentbox)
name_pattern='^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$'

say() { printf 'agentbox: %s\n' "$*" >&2; }

valid_name() { [[ $1 =~ $name_pattern ]]; }

alive() { "${tmux_cmd[@]}" has-session -t "=$1" 2>/dev/null; }

# Write DIR/result from key=value arguments: written whole, then moved into place.
reply() {
  local dir="$1" line
  shift
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  for line in "$@"; do printf '%s\n' "$line"; done > "$dir/result.partial"
  mv -f "$dir/result.partial" "$dir/result"
}

# A terminal tmux can draw on, whatever the caller's TERM said.
ensure_term() {
  case "${TERM:-}" in "" | dumb | unknown) export TERM=xterm-256color ;; esac
}

# Whether the session of record DIR was stopped with its VM (marked so once seen): its program started (run took
# its env) and nothing recorded its end, yet its tmux session is gone, as the whole tmux server goes with the VM.
stopped_with_vm() {
  local dir="$1"
  [ -e "$dir/stopped" ] && return 0
  [ ! -e "$dir/exit" ] && [ ! -e "$dir/env" ] && ! alive "$(basename "$dir")" || return 1
  : > "$dir/stopped" 2>/dev/null || true
}

# The records of sessions stopped with their VM go (they have no last screen), and those of exited sessions
# beyond the newest 20: they only keep a last screen.
prune() {
  local dir
  for dir in "$records"/*/; do
    if valid_name "$(basename "$dir")" && stopped_with_vm "$dir"; then rm -rf -- "${dir:?}"; fi
  done
  # shellcheck disable=SC2012 # names are checked, and ls sorts by time
  ls -1t "$records" 2>/dev/null | while IFS= read -r dir; do
    if valid_name "$dir" && [ -e "$records/$dir/exit" ]; then printf '%s\n' "$dir"; fi
  done | tail -n +21 | while IFS= read -r dir; do rm -rf -- "${records:?}/$dir"; done || true
}

start() {
  local base="" agent="" reply_dir="" conf="" dir="$PWD" events="" live="" attach="" name="" n=1 rec
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) base="$2"; shift 2 ;;
      --agent) agent="$2"; shift 2 ;;
      --reply) reply_dir="$2"; shift 2 ;;
      --conf) conf="$2"; shift 2 ;;
      --dir) dir="$2"; shift 2 ;;
      --events) events="$2"; shift 2 ;;
      --live) live="$2"; shift 2 ;;
      --attach) attach=1; shift ;;
      --) shift; break ;;
      *) say "session.sh start: unknown option $1"; exit 2 ;;
    esac
  done
  valid_name "$base" || { say "session.sh: not a session name: $base"; exit 2; }
  command -v tmux >/dev/null 2>&1 || {
    say "tmux is not installed in the VM, so the session cannot be kept; \`agentbox restart\` provisions it"
    exit 127
  }
  mkdir -p "$records"
  prune
  name="$base"
  while alive "$name"; do
    n=$((n + 1))
    name="$base-$n"
  done
  rec="$records/$name"
  rm -rf -- "$rec"
  mkdir -m 700 "$rec"
  printf '%s\n' "$agent" > "$rec/agent"
  printf '%s\n' "$dir" > "$rec/dir"
  printf '%s\n' "$events" > "$rec/events"
  printf '%s\n' "$live" > "$rec/live"
  printf '%s\0' "$@" > "$rec/argv"
  # The session's environment is this launch's (env:, PATH, BROWSER, ...), not the tmux server's.
  (umask 077 && env -0 > "$rec/env")
  date +%s > "$rec/started"
  # The marker exists before the host hears of the session (run keeps it fresh): its proxy must not stop between.
  [ -z "$live" ] || { mkdir -p "$live" 2>/dev/null && touch "$live/$name" 2>/dev/null; } || true
  # The program and its arguments go through the record, never through tmux's command parser.
  if ! "${tmux_cmd[@]}" -f "$conf" new-session -d -s "$name" -c "$dir" -- bash "${BASH_SOURCE[0]}" run "$name"; then
    rm -rf -- "$rec"
    [ -z "$live" ] || rm -f "$live/$name"
    say "could not start the tmux session $name"
    exit 1
  fi
  if [ -z "$attach" ]; then
    reply "$reply_dir" "outcome=started" "name=$name" "agent=$agent"
    exit 0
  fi
  attach_to "$reply_dir" "$name"
}

run() {
  local name="$1" rec="$records/$1" assignment code=0 events="" live=""
  local -a argv=() environment=()
  while IFS= read -r -d '' assignment; do
    case "$assignment" in TERM=* | TMUX=* | TMUX_PANE=*) ;; *) environment+=("$assignment") ;; esac
  done < "$rec/env"
  rm -f "$rec/env"
  while IFS= read -r -d '' assignment; do argv+=("$assignment"); done < "$rec/argv"
  IFS= read -r events < "$rec/events" || true
  IFS= read -r live < "$rec/live" 2>/dev/null || true
  local heartbeat=""
  if [ -n "$live" ] && mkdir -p "$live" 2>/dev/null; then
    # Kept fresh while the program runs: the host's watcher and network proxy end once no marker is (the VM
    # stopped, too).
    (while touch "$live/$name" 2>/dev/null; do sleep 20; done) </dev/null >/dev/null 2>&1 &
    heartbeat=$!
  fi
  set +e
  env -i "${environment[@]}" TERM="${TERM:-screen}" TMUX="${TMUX:-}" TMUX_PANE="${TMUX_PANE:-}" \
    AGENTBOX_SESSION="$name" AGENTBOX_EVENTS="$events" AGENTBOX_TTY="$(tty 2>/dev/null || true)" "${argv[@]}"
  code=$?
  set -e
  "${tmux_cmd[@]}" capture-pane -p -J -S -2000 -t "${TMUX_PANE:-=$name:}" > "$rec/last-output.partial" 2>/dev/null || true
  mv -f "$rec/last-output.partial" "$rec/last-output" || true
  date +%s > "$rec/ended"
  printf '%s\n' "$code" > "$rec/exit.partial"
  mv -f "$rec/exit.partial" "$rec/exit"
  [ -z "$heartbeat" ] || kill "$heartbeat" 2>/dev/null || true
  if [ -n "$events" ]; then
    if [ "$(attached_clients "$name")" = 0 ]; then
      event "$events" exit "$name" "$(cat "$rec/agent" 2>/dev/null || true)" "exited with code $code"
    fi
  fi
  [ -z "$live" ] || rm -f "$live/$name"
  exit "$code"
}

attached_clients() {
  "${tmux_cmd[@]}" display-message -p -t "=$1:" '#{session_attached}' 2>/dev/null || echo 0
}

# An event for the host's watcher (agentbox.session.attention): KIND, session, agent, then the message.
event() {
  local events="$1" file
  [ -d "$events" ] || mkdir -p "$events" 2>/dev/null || return 0
  file="$events/$(date +%s%N)-$$"
  printf '%s\n%s\n%s\n%s\n' "$2" "$3" "$4" "${5:0:300}" > "$file.partial" 2>/dev/null && mv -f "$file.partial" "$file.event"
}

attach_to() {
  local reply_dir="$1" name="$2" rec="$records/$2"
  ensure_term
  set +e
  "${tmux_cmd[@]}" attach-session -t "=$name"
  set -e
  if [ -e "$rec/exit" ]; then
    [ ! -e "$rec/last-output" ] || cp "$rec/last-output" "$reply_dir/last-output" 2>/dev/null || true
    reply "$reply_dir" "outcome=ended" "name=$name" "agent=$(cat "$rec/agent")" "code=$(cat "$rec/exit")"
  else
    reply "$reply_dir" "outcome=detached" "name=$name" "agent=$(cat "$rec/agent" 2>/dev/null || true)"
  fi
}

list() {
  local dir name attached="" state code ended
  local -A clients=()
  while IFS=' ' read -r name attached; do
    clients["$name"]="$attached"
  done < <("${tmux_cmd[@]}" list-sessions -F '#{session_name} #{session_attached}' 2>/dev/null || true)
  [ -d "$records" ] || return 0
  for dir in "$records"/*/; do
    name="$(basename "$dir")"
    valid_name "$name" || continue
    code="" ended=""
    if [ -e "$dir/exit" ]; then
      state=exited
      code="$(cat "$dir/exit")"
      ended="$(cat "$dir/ended" 2>/dev/null || true)"
    elif [ -n "${clients[$name]:-}" ]; then
      state=running
    elif stopped_with_vm "$dir"; then
      state=stopped
    else
      state=exited  # not started yet, or its start failed: no exit code
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$(head -c 100 "$dir/agent" 2>/dev/null | head -n 1)" \
      "$(cat "$dir/started" 2>/dev/null || true)" "${clients[$name]:-0}" "$state" "$code" "$ended"
  done
}

attach() {
  local reply_dir="" name="" candidate latest="" newest=0 ended
  local -a running=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --reply) reply_dir="$2"; shift 2 ;;
      *) name="$1"; shift ;;
    esac
  done
  if [ -z "$name" ]; then
    for candidate in "$records"/*/; do
      candidate="$(basename "$candidate")"
      valid_name "$candidate" || continue
      if [ ! -e "$records/$candidate/exit" ] && alive "$candidate"; then
        running+=("$candidate")
      elif [ -e "$records/$candidate/exit" ]; then
        ended="$(cat "$records/$candidate/ended" 2>/dev/null || echo 0)"
        if [ "$ended" -ge "$newest" ] 2>/dev/null; then
          newest="$ended"
          latest="$candidate"
        fi
      fi
    done
    if [ ${#running[@]} -gt 1 ]; then
      reply "$reply_dir" "outcome=ambiguous" "names=${running[*]}"
      exit 2
    elif [ ${#running[@]} -eq 1 ]; then
      name="${running[0]}"
    elif [ -n "$latest" ]; then
      name="$latest"
    else
      reply "$reply_dir" "outcome=none"
      exit 1
    fi
  fi
  if ! valid_name "$name" || [ ! -d "$records/$name" ]; then
    reply "$reply_dir" "outcome=unknown" "name=$name"
    exit 2
  fi
  if [ ! -e "$records/$name/exit" ] && alive "$name"; then
    attach_to "$reply_dir" "$name"
    return 0
  fi
  [ ! -e "$records/$name/last-output" ] || cp "$records/$name/last-output" "$reply_dir/last-output" 2>/dev/null || true
  reply "$reply_dir" "outcome=exited" "name=$name" "agent=$(cat "$records/$name/agent" 2>/dev/null || true)" \
    "code=$(cat "$records/$name/exit" 2>/dev/null || true)" "ended=$(cat "$records/$name/ended" 2>/dev/null || true)"
}

command="${1:-}"
shift || true
case "$command" in
  start) start "$@" ;;
  run) run "$@" ;;
  list) list ;;
  attach) attach "$@" ;;
  *) say "session.sh: unknown command ${command:-(none)}"; exit 2 ;;
esac
