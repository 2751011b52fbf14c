# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The sandbox's description for the agent, the block in the agents' memory files (--memory-file).
# Reads launch.sh's staging, state, memory_files.

context_file=/run/agentbox/context.json
context_digest=""
memory_digest=""

context_key=""

# bash's read and hash only: the description staged and each tool's path are those of the last install.
context_is_current() {
  local staged="$staging/context/context.json" found="" name path previous=""
  context_key=""
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
  context_key="$context_digest"$'\n'"$found"
  IFS= read -r -d '' previous 2>/dev/null < "$state/context.key" || true
  [ "$context_key" = "$previous" ] && [ -e "$context_file" ] || return 1
  export AGENTBOX_CONTEXT_FILE="$context_file"
}

install_context() {
  # The host's description of the sandbox, with the path of each tool found here (bash's hash: no process),
  # as root's read-only /run/agentbox/context.json (/run is emptied at every boot). When neither the
  # document nor a tool's path changed since the last launch, nothing runs at all.
  local staged="$staging/context/context.json" probed="$state/context.json" key found
  context_is_current && return 0
  key="$context_key"
  found="${key#*$'\n'}"
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

memory_targets=()

# bash's read and test only: the block is the one kept last time and no memory file changed since.
memory_block_is_current() {
  local relative previous="" file
  memory_targets=()
  [ -r "$staging/context/memory.md" ] || return 0
  for relative in "${memory_files[@]}"; do
    case "$relative" in /* | *..*) continue ;; esac
    memory_targets+=("$HOME/$relative")
  done
  [ ${#memory_targets[@]} -gt 0 ] || return 0
  IFS= read -r previous 2>/dev/null < "$state/memory.key" || true
  [ -n "$memory_digest" ] && [ "$memory_digest" = "$previous" ] && [ -e "$state/memory.stamp" ] || return 1
  for file in "${memory_targets[@]}"; do
    [ -e "$file" ] && [ ! "$file" -nt "$state/memory.stamp" ] || return 1
  done
}

keep_memory_block() {
  # agentbox's short block in each agent's memory file (~/.claude/CLAUDE.md, ...), the user's text around it
  # kept. Skipped without starting a process when the block is the one kept last time and no file changed since.
  local block="$staging/context/memory.md" stamp="$state/memory.stamp"
  memory_block_is_current && return 0
  [ ${#memory_targets[@]} -gt 0 ] || return 0
  local status=0
  bash "$staging/agent-memory.sh" put "$block" "${memory_targets[@]}" || status=$?
  if [ "$status" -eq 0 ]; then
    : > "$stamp"
    printf '%s\n' "$memory_digest" > "$state/memory.key"
  elif [ "$status" -ne 1 ]; then  # 1: a file was left alone, and agent-memory.sh said why
    say "could not update the agents' memory files (agent-memory.sh exited $status)"
  fi
}
