# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# Login files: applied from the staging folder, handed back after the session (--creds-outbox).
# Reads launch.sh's staging, state, creds_outbox, creds_return.

apply_credentials() {
  # Copy a staged file into the guest home only when the host's copy changed since the last launch,
  # so a token the agent refreshed here is kept until the host logs in anew.
  local manifest="$staging/creds/manifest" entry digest relative applied
  [ -r "$manifest" ] || return 0
  while IFS= read -r -d '' entry; do
    digest="${entry%% *}"
    relative="${entry#* }"
    case "$relative" in /* | *..*) continue ;; esac
    applied="$state/applied/$relative"
    if [ ! -e "$HOME/$relative" ] || [ "$(cat "$applied" 2>/dev/null || true)" != "$digest" ]; then
      mkdir -p "$(dirname "$HOME/$relative")" "$(dirname "$applied")"
      install -m 600 "$staging/creds/home/$relative" "$HOME/$relative"
      printf '%s' "$digest" > "$applied"
      [ "$relative" != .claude.json ] || rm -f "$state/claude-onboarded"  # mark_claude_onboarded again
    fi
  done < "$manifest"
}

# Credential write-back: copy each --creds-return file the session changed (it differs from what
# apply_credentials last installed, or there was none) into the session's outbox folder as its
# position; the host checks each and writes it back.
return_credentials() {
  local index=0 relative file digest
  [ -d "$creds_outbox" ] || return 1
  for relative in ${creds_return[@]+"${creds_return[@]}"}; do
    file="$HOME/$relative"
    case "$relative" in /* | *..*) file="" ;; esac
    if [ -n "$file" ] && [ -f "$file" ] && [ ! -L "$file" ]; then
      digest="$(sha256sum < "$file")"
      digest="${digest%% *}"
      if [ "$digest" != "$(cat "$state/applied/$relative" 2>/dev/null || true)" ]; then
        rm -rf "$creds_outbox/$index.partial"
        cp -p "$file" "$creds_outbox/$index.partial" && mv -f "$creds_outbox/$index.partial" "$creds_outbox/$index"
      fi
    fi
    index=$((index + 1))
  done
}
