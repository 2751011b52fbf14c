#!/bin/sh
# agentbox-managed: open-url. The VM has no browser, so launch.sh points BROWSER here: an agent that
# "opens" a login page (xdg-open and the `open` npm package call $BROWSER, as does Codex) gets the
# address printed for the user to open on the host. Lima forwards the VM's localhost ports to the
# host's, so the page's redirect to http://localhost:PORT/... reaches the agent in the VM.
# The agent may run this detached from the terminal (no /dev/tty): launch.sh passes the session's
# terminal in AGENTBOX_TTY.
url=$(printf '%s' "$*" | tr -d '\000-\037\177')
[ -n "$url" ] || exit 1
mkdir -p "$HOME/.agentbox" && printf '%s\n' "$url" > "$HOME/.agentbox/last-url"
message=$(printf '\nagentbox: open this address in a browser on your computer (the VM has none):\n\n  %s\n\n' "$url")
# On the terminal each line ends in CR LF: a full-screen agent keeps it in raw mode, where LF alone
# does not return to the first column.
if [ -n "${AGENTBOX_TTY:-}" ] && { printf '%s\n' "$message" | sed 's/$/\r/' > "$AGENTBOX_TTY"; } 2>/dev/null; then
  exit 0
fi
printf '%s\n' "$message" >&2
