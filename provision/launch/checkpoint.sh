# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The start checkpoint: the host takes it while this script does its setup; the program starts only once the host
# has recorded it (or given up on it), so it holds the workspace as it was before the program could write.
# Reads launch.sh's staging, go.

go_limit=60  # seconds (agentbox.staginglayout.GO_LIMIT): the host gives a checkpoint 30
go_timed_out=121  # agentbox.staginglayout.GO_TIMED_OUT

wait_for_go() {
  # --go TOKEN: the host writes staging/go/TOKEN (whole, at once) when the start checkpoint is recorded; its first
  # line is the checkpoint's id. Already there (the usual case): a test and a read, no process.
  [ -n "$go" ] || return 0
  local marker="$staging/go/$go" tries=$((go_limit * 20)) id=""
  while [ ! -e "$marker" ]; do
    if [ "$tries" -le 0 ]; then
      say "the host did not record the workspace's start checkpoint within ${go_limit}s, so the program was not started (it would have run unrecorded); run the command again"
      exit "$go_timed_out"
    fi
    tries=$((tries - 1))
    sleep 0.05
  done
  IFS= read -r id < "$marker" || true
  case "$id" in
    '' | *[!0-9]*) unset AGENTBOX_CHECKPOINT ;;
    *) export AGENTBOX_CHECKPOINT="$id" ;;
  esac
}
