#!/bin/bash
# agentbox-managed: checks a freshly provisioned base VM before it is sealed (agentbox.vm.golden).
# Runs as the VM's user. Arguments: `agent:BINARY` for each agent the base should hold, `file:PATH`
# (~ for the home) for each login file that must not be there. Prints `tool NAME: VERSION`,
# `agent NAME: VERSION` and one `FAIL: ...` line per problem; exits 1 when there is one.
set -uo pipefail
exec 2>&1
status=0
fail() {
  echo "FAIL: $*"
  status=1
}
for tool in git curl docker node npm gh; do
  if ! command -v "$tool" >/dev/null; then
    fail "$tool is not installed"
  elif version="$("$tool" --version 2>&1 | head -n 1)"; then
    echo "tool $tool: $version"
  else
    fail "$tool --version failed: $version"
  fi
done
for item in "$@"; do
  case "$item" in
    agent:*)
      binary="${item#agent:}"
      if ! command -v "$binary" >/dev/null; then
        echo "agent $binary: not installed"
      elif version="$("$binary" --version 2>&1 | head -n 1)"; then
        echo "agent $binary: $version"
      else
        fail "$binary --version failed: $version"
      fi
      ;;
    file:*)
      path="${item#file:}"
      path="${path/#\~/$HOME}"
      if [ -e "$path" ] || [ -L "$path" ]; then
        fail "a login file is present: $path"
      fi
      ;;
  esac
done
for history in "$HOME"/.bash_history "$HOME"/.zsh_history "$HOME"/.python_history "$HOME"/.node_repl_history \
    /root/.bash_history /root/.zsh_history; do
  if sudo -n test -e "$history"; then
    fail "a shell history file is present: $history"
  fi
done
exit "$status"
