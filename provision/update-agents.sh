#!/bin/bash
# agentbox-managed: `agentbox update-agents`. agentbox runs it in the VM with one `limactl shell`; it updates
# each agent's CLI by the agent's own update path, as the VM's user (npm's global prefix is ~/.local, so
# no root), one after the other, and goes on after a failure.
#   update-agents.sh [--named] NAME BINARY COMMAND [NAME BINARY COMMAND]...
# --named: the agents were named on the command line, so one that is not installed is a failure.
# stdin: the environment a launch gives (CA, the config's env, the proxy's variables), NAME=value records each
# ended by a NUL, exported before anything runs (on stdin, so that no secret is on a command line).
# stdout, one line per agent, tab-separated: NAME STATUS OLD NEW, STATUS one of updated, unchanged, missing,
# failed; OLD and NEW are the first line of `BINARY --version`. stderr: the last lines a failed update printed,
# each after `NAME: `.
# Exit 0 when every agent was updated or was current, 1 otherwise.
set -uo pipefail

while IFS= read -r -d '' assignment; do
  export "${assignment?}"
done
named=""
if [ "${1:-}" = --named ]; then
  named=1
  shift
fi
export NPM_CONFIG_PREFIX="$HOME/.local"
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
mkdir -p "$HOME/.local/bin" "$HOME/.agentbox"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# A launch installs agents under this lock too: the two take turns.
exec 7>>"$HOME/.agentbox/launch.lock"
flock 7

version() {
  timeout 60 "$1" --version </dev/null 2>/dev/null | head -n 1 | tr -d '\t\r'
}

failed=0
while [ $# -ge 3 ]; do
  name="$1" binary="$2" command="$3"
  shift 3
  if ! command -v "$binary" >/dev/null 2>&1; then
    printf '%s\tmissing\t\t\n' "$name"
    [ -z "$named" ] || failed=1
    continue
  fi
  old="$(version "$binary")"
  if bash -euo pipefail -c "$command" >"$log" 2>&1 </dev/null 7>&-; then
    hash -r
    new="$(version "$binary")"
    if [ "$old" = "$new" ]; then status=unchanged; else status=updated; fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$old" "$new"
  else
    printf '%s\tfailed\t%s\t\n' "$name" "$old"
    tail -n 20 "$log" | while IFS= read -r line; do printf '%s: %s\n' "$name" "$line"; done >&2
    failed=1
  fi
done
exit "$failed"
