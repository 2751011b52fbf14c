#!/bin/bash
# agentbox-managed: the per-launch step. agentbox runs it in the VM's single `limactl shell` call
# from the read-only staging mount; it prepares the session and then execs the agent or a shell
# (or, with --creds-outbox, runs it as a child and hands changed login files back when it exits).
#   launch.sh [OPTION VALUE | --timing]... [-- PROGRAM ARGS...]
# The options, what each means and the staging folder's files this script reads are listed once,
# on the host side: agentbox/staginglayout.py (LAUNCH_OPTIONS; tests check this parser against it).
# An option this script does not know is an error (exit 2), never the program to run.
# The steps themselves live in its parts, launch/*.sh, sourced below from this script's own folder.
# shellcheck source-path=SCRIPTDIR # the parts below, as staged beside this script
set -euo pipefail

case "${BASH_SOURCE[0]}" in
  /*/*) staging="${BASH_SOURCE[0]%/*}" ;;  # the absolute path the host runs: no process
  *) staging="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" ;;
esac
state="$HOME/.agentbox"
wait_sec=30
binary=""
install=""
guards=""
push_namespace=""
workspace="$PWD"
on_create=()
on_start=()
sync_agents=()
memory_files=()
timing_start=""
isolated_from=""
base=""
outbox=""
chdir=""
copy_aside=""
creds_outbox=""
creds_return=()
task=""
isolated_task=""
worktree=""
worktree_branch=""
worktree_base=""
notify=""
session=""
session_attach=""
session_reply=""
session_events=""
session_live=""
go=""
canaries=""
setup_digest=""
setup_only=""
setup_incomplete=""  # set by a step that tries again at the next launch: the setup is then not recorded
while [ $# -gt 0 ]; do
  case "$1" in
    --wait) wait_sec="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --install) install="$2"; shift 2 ;;
    --guards) guards="$2"; shift 2 ;;
    --push-namespace) push_namespace="$2"; shift 2 ;;
    --workspace) workspace="$2"; shift 2 ;;
    --on-create) on_create+=("$2"); shift 2 ;;
    --on-start) on_start+=("$2"); shift 2 ;;
    --sync) sync_agents+=("$2"); shift 2 ;;
    --memory-file) memory_files+=("$2"); shift 2 ;;
    --timing) timing_start="${EPOCHREALTIME:-}"; shift ;;
    --isolated-from) isolated_from="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --outbox) outbox="$2"; shift 2 ;;
    --chdir) chdir="$2"; shift 2 ;;
    --copy-aside) copy_aside=1; shift ;;
    --creds-outbox) creds_outbox="$2"; shift 2 ;;
    --creds-return) creds_return+=("$2"); shift 2 ;;
    --worktree) worktree="$2"; shift 2 ;;
    --worktree-branch) worktree_branch="$2"; shift 2 ;;
    --worktree-base) worktree_base="$2"; shift 2 ;;
    --task) task="$2"; shift 2 ;;
    --isolated-task) isolated_task=1; shift ;;
    --notify) notify="$2"; shift 2 ;;
    --session) session="$2"; shift 2 ;;
    --session-attach) session_attach=1; shift ;;
    --session-reply) session_reply="$2"; shift 2 ;;
    --session-events) session_events="$2"; shift 2 ;;
    --session-live) session_live="$2"; shift 2 ;;
    --go) go="$2"; shift 2 ;;
    --canaries) canaries="$2"; shift 2 ;;
    --setup-digest) setup_digest="$2"; shift 2 ;;
    --setup-only) setup_only=1; shift ;;
    --) shift; break ;;
    -*)
      # A host newer than this staged copy: stop rather than run the option as the program.
      printf 'agentbox: launch.sh: unknown option %s (agentbox and its staged launch.sh disagree; run the command again)\n' "$1" >&2
      exit 2
      ;;
    *) break ;;
  esac
done

# The parts, staged read-only beside this script in launch/ (agentbox.session.staging stages every provision/launch/*.sh;
# tests/test_launch_parts.py checks that this script names each once). They define functions and a few names.
# A launch with nothing changed reads only the parts it runs: bash parses a part as it sources it (about 2 ms for them
# all on a quiet host, five times that under load), and the staging mount may make each read a round trip.
# shellcheck source=launch/common.sh
source "$staging/launch/common.sh"
# shellcheck source=launch/vm.sh
source "$staging/launch/vm.sh"
# shellcheck source=launch/credentials.sh
source "$staging/launch/credentials.sh"
# shellcheck source=launch/broker.sh
source "$staging/launch/broker.sh"
# shellcheck source=launch/home.sh
source "$staging/launch/home.sh"
# shellcheck source=launch/guards.sh
source "$staging/launch/guards.sh"
# shellcheck source=launch/context.sh
source "$staging/launch/context.sh"
# shellcheck source=launch/session.sh
source "$staging/launch/session.sh"
# shellcheck source=launch/checkpoint.sh
source "$staging/launch/checkpoint.sh"
# shellcheck source=launch/current.sh
source "$staging/launch/current.sh"
# shellcheck source=launch/canary.sh
source "$staging/launch/canary.sh"

# The parts only the setup runs (and an isolated launch, which always sets up).
source_setup_parts() {
  # shellcheck source=launch/sync.sh
  source "$staging/launch/sync.sh"
  # shellcheck source=launch/bootstrap.sh
  source "$staging/launch/bootstrap.sh"
  # shellcheck source=launch/isolated.sh
  source "$staging/launch/isolated.sh"
  # shellcheck source=launch/notify.sh
  source "$staging/launch/notify.sh"
}

load_env
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
if setup_is_current; then
  # The setup last applied in this boot is this one (current.sh): what each launch needs, by bash alone.
  check_provisioned
  apply_broker_ca
  browser_env
  if ! launch_steps_current; then  # a new checkpoint in the description, a tool installed: only those steps
    exec 7>>"$state/launch.lock"
    flock 7
    install_context
    keep_memory_block
    mark_claude_onboarded
    flock -u 7
    exec 7>&-
  fi
  [ -z "$worktree" ] || cd "$worktree"  # setup_is_current saw its .git: an earlier enter_worktree made it (and the exclude)
else
  source_setup_parts
  wait_for_boot
  check_provisioned
  apply_network
  mkdir -p "$state"
  # Launches at once (several `agentbox run`, a session beside them) take turns for the setup: it installs
  # files in the home. The program itself runs after the lock is let go.
  exec 7>>"$state/launch.lock"
  flock 7
  forget_setup
  apply_credentials
  apply_broker_ca
  apply_sync
  setup_browser
  configure_git
  mark_claude_onboarded
  repair_gemini_settings
  [ "$binary" != gemini ] || trust_workspace_for_gemini
  case "$guards" in
    on) install_guards "" ;;
    push-scoped) install_guards "$push_namespace" ;;
    off) remove_guards ;;
  esac
  hash -r
  [ -z "$isolated_from" ] || prepare_copy
  bootstrap

  # agentbox start (--setup-only) installs no agent: the one a launch runs is installed at its first launch.
  if [ -n "$binary" ] && [ -z "$setup_only" ] && ! command -v "$binary" >/dev/null 2>&1; then
    if [ -z "$install" ]; then
      say "$binary is not installed in the VM and no install command is configured."
      exit 127
    fi
    say "installing $binary in the VM: $install"
    if ! bash -euo pipefail -c "$install" >&2 9>&-; then
      say "installing $binary failed (command: $install)"
      exit 127
    fi
    hash -r
  fi

  install_context
  keep_memory_block
  case "$notify" in
    on) install_attention ;;
    off) remove_attention ;;
  esac
  record_setup
  [ -z "$worktree" ] || enter_worktree
  flock -u 7
  exec 7>&-
fi

if [ -n "$timing_start" ] && [ -n "${EPOCHREALTIME:-}" ]; then
  setup_us=$(( ${EPOCHREALTIME/./} - ${timing_start/./} ))
  printf 'agentbox timings (in the VM):\n  %-34s %8d.%d ms\n' "setup step (launch.sh)" $((setup_us / 1000)) $(((setup_us % 1000) / 100)) >&2
fi

[ -z "$setup_only" ] || exit 0  # agentbox start: the setup done ahead of the first launch, which then skips it
place_canaries
wait_for_go
[ $# -gt 0 ] || run_login_shell
check_program "$1"
[ -z "$session" ] || start_session "$@"
[ -z "$isolated_from$creds_outbox" ] || run_then_hand_back "$@"
[ -z "$task" ] || start_task "$@"
exec "$@"
