# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The sandbox's description for the agent, the block in the agents' memory files (--memory-file).
# Reads launch.sh's staging, state, memory_files.

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
      "$staged" > "$probed.tmp.$$"; then
    mv -f "$probed.tmp.$$" "$probed"
  else
    rm -f "$probed.tmp.$$"
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
