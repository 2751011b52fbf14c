# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The agents' own setup (--sync AGENT).
# Reads launch.sh's staging, state, sync_agents.

# The agents' own setup (skills, settings, MCP servers; staging/sync/AGENT, made by agentbox.sync.agentsetup).
# A file is copied into the home only when the host's copy changed since the last sync; one changed in
# the VM since then is kept, and the launch says once which host version waits. When the staged
# manifest is the one last applied (the usual launch), nothing else is read.
# A memory file's agentbox block (keep_memory_block) is not the user's edit: prints the digest of FILE
# without it when that is one of WANTED (awk ends the last line with a newline the host's file may
# lack: both are tried), nothing when the block is all FILE holds (a launch wrote it before the host
# had the file: the VM's copy counts as absent), else FALLBACK.
#   digest_without_block FILE FALLBACK WANTED...
digest_without_block() {
  local file="$1" fallback="$2" stripped found="" candidate wanted
  shift 2
  stripped="$(mktemp)" || { printf '%s' "$fallback"; return 0; }
  if bash "$staging/agent-memory.sh" strip "$file" > "$stripped" 2>/dev/null; then
    if ! grep -q '[^[:space:]]' "$stripped"; then
      rm -f "$stripped"
      return 0
    fi
    for candidate in "$(sha256sum < "$stripped")" "$(head -c -1 "$stripped" | sha256sum)"; do
      for wanted in "$@"; do
        [ -z "$found" ] && [ -n "$wanted" ] && [ "${candidate%% *}" = "$wanted" ] && found="$wanted"
      done
    done
  fi
  rm -f "$stripped"
  printf '%s' "${found:-$fallback}"
}

apply_sync() {
  local agent
  for agent in "${sync_agents[@]}"; do
    case "$agent" in "" | */* | .*) continue ;; esac
    if [ -r "$staging/sync/$agent/manifest" ] && ! cmp -s "$staging/sync/$agent/manifest" "$state/sync/$agent/staged"; then
      # A problem here (a folder where a file goes, a full disk) must not stop the session: say so and go on.
      sync_agent "$agent" || { retry_next_launch; say "could not bring all of $agent's own setup into the VM (see above); the next launch tries again"; }
    fi
  done
}

sync_agent() {
  local agent="$1"
  local dir="$staging/sync/$agent" records="$state/sync/$agent"
  local -A applied=() inherited=() announced=() defaults=() listed=() waiting=()
  local -a copy=() announce=()
  local entry rest digest mode relative target last current fd
  mkdir -p "$records" || return 1
  if [ -r "$records/applied" ]; then
    while IFS= read -r -d '' entry; do  # "DIGEST MODE PATH"
      rest="${entry#* }"
      applied["${rest#* }"]="${entry%% *} ${rest%% *}"
    done < "$records/applied"
  fi
  if [ "$agent" = memory-files ] && [ ! -e "$records/applied" ]; then
    # A memory file was its agent's own setup before: what that agent's records say was applied last.
    for last in "$state"/sync/*/applied; do
      [ -r "$last" ] || continue
      while IFS= read -r -d '' entry; do
        rest="${entry#* }"
        inherited["${rest#* }"]="${entry%% *} ${rest%% *}"
      done < "$last"
    done
  fi
  if [ -r "$records/announced" ]; then
    while IFS= read -r -d '' entry; do announced["${entry#* }"]="${entry%% *}"; done < "$records/announced"
  fi
  if [ -r "$staging/sync/defaults" ]; then
    while IFS= read -r -d '' entry; do defaults["${entry#* }"]="${entry%% *}"; done < "$staging/sync/defaults"
  fi
  exec {fd}>"$records/applied.tmp.$$" || return 1
  while IFS= read -r -d '' entry; do  # "DIGEST MODE PATH"
    digest="${entry%% *}"
    rest="${entry#* }"
    mode="${rest%% *}"
    relative="${rest#* }"
    case "$mode" in 600 | 700) ;; *) continue ;; esac
    case "/$relative/" in //* | */../* | */./*) continue ;; esac
    listed["$relative"]=1
    last="${applied[$relative]:-${inherited[$relative]:-}}"
    if [ "$last" = "$digest $mode" ]; then
      printf '%s %s\0' "$last" "$relative" >&"$fd"  # the host's copy is the one last applied: the VM's stays
      continue
    fi
    target="$HOME/$relative"
    if [ -L "$target" ] || [ -d "$target" ]; then
      current="not a file"
    elif [ -e "$target" ]; then
      current="$(sha256sum < "$target" 2>/dev/null)" || current="unreadable"
      current="${current%% *}"
    else
      current=""
    fi
    if [ -n "$current" ] && [ "$current" != "$digest" ] && [ "$current" != "${last%% *}" ] &&
      grep -qs '^<!-- BEGIN AGENTBOX' "$target"; then
      current="$(digest_without_block "$target" "$current" "$digest" "${last%% *}")"
    fi
    if [ "$current" = "$digest" ]; then
      chmod "$mode" "$target" || true
    elif [ -z "$current" ] || { [ -n "$last" ] && [ "$current" = "${last%% *}" ]; } ||
      { [ -z "$last" ] && [ "$current" = "${defaults[$relative]:-}" ]; }; then
      copy+=("$relative")  # absent, unchanged since the last sync, or the settings a new VM gets
    else
      waiting["$relative"]="$digest"  # changed in the VM since the last sync: kept; the host's copy waits
      [ "${announced[$relative]:-}" = "$digest" ] || announce+=("$relative")
      [ -z "$last" ] || printf '%s %s\0' "$last" "$relative" >&"$fd"
      continue
    fi
    printf '%s %s %s\0' "$digest" "$mode" "$relative" >&"$fd"
  done < "$dir/manifest"
  exec {fd}>&-
  for relative in "${!waiting[@]}"; do
    printf '%s %s\0' "${waiting[$relative]}" "$relative"
  done > "$records/announced.tmp.$$" && mv "$records/announced.tmp.$$" "$records/announced"
  if [ ${#announce[@]} -gt 0 ]; then
    local files
    # shellcheck disable=SC2088 # the ~ is shown to the user, not expanded
    files="$(printf '~/%s, ' "${announce[@]}")"
    say "kept ${files%, } as changed in this VM; the host's newer version waits in $dir/home (delete the VM's copy to take it at the next launch)"
  fi
  if [ ${#copy[@]} -gt 0 ]; then
    # A copied memory file has lost agentbox's block, and tar gives it the host's mtime (whole seconds),
    # which may not be newer than the block's stamp: keep_memory_block puts it back whatever the times.
    rm -f "$state/memory.stamp"
    if ! printf '%s\0' "${copy[@]}" | tar -C "$dir/home" --null -T - -cf - | tar -C "$HOME" -xf -; then
      rm -f "$records/applied.tmp.$$"  # nothing recorded: the next launch compares again
      return 1
    fi
  fi
  for relative in "${!applied[@]}"; do
    # No longer brought from the host: removed, unless it was changed in the VM.
    [ -z "${listed[$relative]:-}" ] || continue
    [ ! -e "$staging/sync/memory-files/home/$relative" ] || continue  # now brought as a memory file
    target="$HOME/$relative"
    if [ -f "$target" ] && [ ! -L "$target" ]; then
      current="$(sha256sum < "$target" 2>/dev/null)" || continue
      if [ "${current%% *}" = "${applied[$relative]%% *}" ]; then
        rm -f "$target"
        (cd "$HOME" && rmdir -p --ignore-fail-on-non-empty "$(dirname "$relative")" 2>/dev/null) || true
      fi
    fi
  done
  mv "$records/applied.tmp.$$" "$records/applied" || return 1
  if [ ${#waiting[@]} -eq 0 ]; then
    cp "$dir/manifest" "$records/staged" || return 1
  else
    rm -f "$records/staged"  # look again next time: deleting the VM's copy takes the host's
    retry_next_launch
  fi
}
