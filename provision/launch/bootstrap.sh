# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The bootstrap scripts (--on-create, --on-start).
# Reads launch.sh's state, workspace, on_create, on_start.

run_scripts() {
  local kind="$1" script code
  shift
  for script in "$@"; do
    say "running $kind $script"
    set +e
    (cd "$workspace" && bash -euo pipefail "$script") 9>&-  # a service it starts must not hold the copy's lock
    code=$?
    set -e
    if [ "$code" -ne 0 ]; then
      say "$kind $script failed with exit code $code; the agent was not started."
      exit "$code"
    fi
  done
}

bootstrap() {
  mkdir -p "$state"
  if [ ${#on_create[@]} -gt 0 ] && [ ! -e "$state/on-create-done" ]; then
    run_scripts onCreateScript "${on_create[@]}"
    touch "$state/on-create-done"
  fi
  local boot
  boot="$(cat /run/lima-boot-done 2>/dev/null || true)"
  if [ ${#on_start[@]} -gt 0 ] && [ "$(cat "$state/on-start-boot" 2>/dev/null || true)" != "$boot" ]; then
    run_scripts onStartScript "${on_start[@]}"
    printf '%s' "$boot" > "$state/on-start-boot"
  fi
}
