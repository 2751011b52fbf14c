"""agentbox's own options right after an agent's name, read before anything else of a launch is loaded."""

ISOLATED_FLAG = "--isolated"  # right after the agent's name: agentbox's, not the agent's
WORKTREE_FLAG = "--worktree"  # `--worktree NAME` right after the agent's name (or after --isolated): agentbox's
DETACH_FLAGS = ("--detach", "-d")  # the same: start the agent in a tmux session in the VM and return
ON_FLAG = "--on"  # `--on HOST` the same: with --detach, the session runs on that host (agentbox.tasks.hostsession)
# Asked on their own, these are questions about the agent, not work for it.
QUERIES = ("--help", "-h", "--version")
# What a launch's first argument may not be for it to run from a verified plan (agentbox.session.plan): agentbox's
# own options and commands, where the click command line decides.
NOT_PLANNED = (ISOLATED_FLAG, WORKTREE_FLAG, *DETACH_FLAGS, ON_FLAG, "shell", "login")


def plain_launch(args: list[str]) -> bool:
    """The agent with its own arguments only: no option of agentbox's, no command, not a question alone."""
    first = args[0] if args else ""
    return not (first in NOT_PLANNED or first.startswith(f"{ON_FLAG}=") or (len(args) == 1 and first in QUERIES))
