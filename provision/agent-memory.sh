#!/bin/bash
# agentbox-managed: keeps agentbox's block in the agents' memory files in the VM (~/.claude/CLAUDE.md, ...).
#   agent-memory.sh put BLOCK FILE...   BLOCK is a file holding the block, its marker lines included. In each
#                                       FILE the block between the markers is replaced in place, or, when FILE
#                                       has none, appended at its end (FILE is created when missing). The text
#                                       before and after it is never changed; an unchanged FILE is not rewritten.
#   agent-memory.sh strip FILE          print FILE without agentbox's block: the text the user wrote.
# A marker is a line that starts with "<!-- BEGIN AGENTBOX" or "<!-- END AGENTBOX" and ends with "-->".
# A FILE whose markers do not pair up (exactly one BEGIN, then one END) is left as it is, and so is a FILE
# that is a symbolic link or not a regular file; each is said on stderr, the others are still updated, and
# `put` exits 1 (so launch.sh tries, and says it, again at the next launch).
# launch.sh runs `put` at every launch (agentbox/session/staging.py lists the staged files).
set -euo pipefail

say() { printf 'agentbox: %s\n' "$*" >&2; }
left_alone=0

# awk program: the file with its block replaced by the lines of the file `block` (or appended when it has
# none; with block="" the block is only removed). Exits 3, printing "BEGINS ENDS", when the markers do not
# pair up. The whole file is read before anything is printed, so a broken file yields no partial output.
# shellcheck disable=SC2016 # awk's own variables
replace='
function marker(kind, line) {
  sub(/[ \t\r]+$/, "", line)
  return index(line, "<!-- " kind " AGENTBOX") == 1 && line ~ /-->$/
}
{ lines[NR] = $0 }
marker("BEGIN", $0) { begins++; if (!first_begin) first_begin = NR }
marker("END", $0) { ends++; if (!first_end) first_end = NR }
END {
  if (begins + ends > 0 && !(begins == 1 && ends == 1 && first_begin < first_end)) {
    print begins + 0, ends + 0
    exit 3
  }
  for (i = 1; i <= NR; i++) {
    if (i == first_begin && first_end > i) {
      if (block != "") while ((getline line < block) > 0) print line
      i = first_end
      continue
    }
    print lines[i]
  }
  if (begins == 0 && block != "") while ((getline line < block) > 0) print line
}'

put_one() {
  local block="$1" file="$2" output status=0 counts
  if [ -L "$file" ]; then
    say "not updating $file: it is a symbolic link (agentbox keeps its block only in a regular file)"
    left_alone=1
    return 0
  fi
  if [ -e "$file" ] && [ ! -f "$file" ]; then
    say "not updating $file: it is not a regular file"
    left_alone=1
    return 0
  fi
  mkdir -p "$(dirname "$file")"
  output="$(mktemp "$file.agentbox-XXXXXX")"
  if [ -e "$file" ]; then
    awk -v block="$block" "$replace" "$file" > "$output" || status=$?
  else
    awk -v block="$block" "$replace" /dev/null > "$output" || status=$?
  fi
  if [ "$status" -eq 3 ]; then
    read -r -a counts < "$output"
    rm -f "$output"
    say "not updating $file: its agentbox markers do not pair up (${counts[0]} BEGIN AGENTBOX and ${counts[1]} END AGENTBOX lines);" \
      "remove the stray marker lines (or the whole block) and launch again"
    left_alone=1
    return 0
  elif [ "$status" -ne 0 ]; then
    rm -f "$output"
    say "could not update $file (awk exited $status)"
    left_alone=1
    return 0
  fi
  if cmp -s "$output" "$file"; then
    rm -f "$output"
    return 0
  fi
  if [ -e "$file" ]; then
    chmod --reference="$file" "$output" 2>/dev/null || chmod 644 "$output"
  else
    chmod 644 "$output"
  fi
  mv -f "$output" "$file"
}

case "${1:-}" in
  put)
    [ $# -ge 2 ] || { say "usage: agent-memory.sh put BLOCK FILE..."; exit 2; }
    block="$2"
    shift 2
    for file in "$@"; do
      put_one "$block" "$file"
    done
    exit "$left_alone"
    ;;
  strip)
    [ $# -eq 2 ] || { say "usage: agent-memory.sh strip FILE"; exit 2; }
    stripped="$(mktemp)"
    trap 'rm -f "$stripped"' EXIT
    status=0
    awk -v block="" "$replace" "$2" > "$stripped" || status=$?
    if [ "$status" -eq 3 ]; then
      read -r -a counts < "$stripped"
      say "$2: its agentbox markers do not pair up (${counts[0]} BEGIN AGENTBOX and ${counts[1]} END AGENTBOX lines)"
      exit 1
    fi
    [ "$status" -eq 0 ] || exit "$status"
    cat "$stripped"
    ;;
  *)
    say "usage: agent-memory.sh put BLOCK FILE... | strip FILE"
    exit 2
    ;;
esac
