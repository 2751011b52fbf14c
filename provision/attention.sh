#!/bin/bash
# agentbox-managed: an agent waits for the user (Claude Code's Notification and Stop hooks run it, from
# the managed settings launch.sh installs when `notify` is on; installed as ~/.agentbox/bin/attention).
#   attention notification|stop      (the hook's JSON on stdin: its "message" is shown when there is one)
# It rings the bell and sets the title of the session's terminal (AGENTBOX_TTY: the tmux pane in a
# session, whose bell and title tmux passes to an attached terminal), and for a session no one is
# attached to it leaves an event in AGENTBOX_EVENTS (the outbox), which the host's watcher
# (agentbox.session.attention) turns into a desktop notification. It never fails the hook and never waits.
set -u
kind="${1:-notification}"
case "$kind" in notification | stop) ;; *) kind=notification ;; esac
input=""
[ -t 0 ] || input="$(timeout 2 head -c 65536 2>/dev/null || true)"
message=""
if [ -n "$input" ] && command -v jq >/dev/null 2>&1; then
  message="$(printf '%s' "$input" | jq -r '.message // empty | tostring' 2>/dev/null | head -n 1 | head -c 300)"
fi
if [ -z "$message" ]; then
  if [ "$kind" = stop ]; then message="finished and waits for your input"; else message="needs your input"; fi
fi
message="$(printf '%s' "$message" | tr -d '\000-\037\177')"
session="${AGENTBOX_SESSION:-}"
tty="${AGENTBOX_TTY:-}"
if [ -n "$tty" ] && [ -w "$tty" ] && [ -c "$tty" ]; then
  printf '\a\033]2;%s\007' "${session:+$session: }$message" > "$tty" 2>/dev/null || true
fi
events="${AGENTBOX_EVENTS:-}"
if [ -n "$session" ] && [ -n "$events" ] && [ -d "$events" ]; then
  clients="$(tmux -L agentbox display-message -p -t "=$session:" '#{session_attached}' 2>/dev/null || echo 0)"
  if [ "$clients" = 0 ]; then
    agent="$(head -n 1 "$HOME/.agentbox/sessions/$session/agent" 2>/dev/null || true)"
    file="$events/$(date +%s%N)-$$"
    printf '%s\n%s\n%s\n%s\n' "$kind" "$session" "$agent" "$message" > "$file.partial" 2>/dev/null &&
      mv -f "$file.partial" "$file.event" 2>/dev/null
  fi
fi
exit 0
