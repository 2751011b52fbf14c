"""An agent's command line, from its binary, default args, model and the user's args: its own module, so that a
launch from its verified plan (agentbox.session.planned) loads none of the agents' records."""

from __future__ import annotations

MODEL_FLAGS = ("--model", "-m")
# The built-in agents' names, in agentbox.agents.builtin's order (tests/test_launch_plan.py holds them equal): what
# agentbox's entry point needs to know of them before it loads anything.
BUILTIN_NAMES = ("codex", "claude", "gemini", "kiro", "opencode", "copilot")


def agent_argv(
    binary: str,
    default_args: list[str],
    user_args: list[str],
    model: str | None,
    after: int | None,
    subcommands: tuple[str, ...] | None = None,
) -> list[str]:
    """binary, default args (with --model at `after`), user args. With `subcommands` (see
    AgentSpec.flag_subcommands) a leading bare word is a sub-command: the default args and the model
    follow it when it is one of them, and are left out for any other."""
    lead: list[str] = []
    rest = list(user_args)
    if subcommands is not None and rest and not rest[0].startswith("-"):
        if rest[0] not in subcommands:
            return [binary, *rest]
        lead, rest = rest[:1], rest[1:]
    args = [*default_args, *rest]
    if model and after is not None and not any(a in MODEL_FLAGS or a.startswith("--model=") for a in rest):
        args[after:after] = ["--model", model]
    return [binary, *lead, *args]
