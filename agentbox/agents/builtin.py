"""The agents agentbox knows how to run: built-in ones and the ones a config defines."""

from collections.abc import Iterable

from agentbox.agents import claude, codex, copilot, gemini, kiro, opencode
from agentbox.agents.record import NEVER_SYNC, AgentSpec, LoginFormat, Prompt, Settings

__all__ = ["BUILTIN_AGENTS", "DEFAULT_AGENT", "NEVER_SYNC", "AgentSpec", "LoginFormat", "Prompt", "Settings"]

# One module per agent holds its record (agents/claude.py, ...); this order is the order agentbox lists them in.
BUILTIN_AGENTS: dict[str, AgentSpec] = {
    spec.name: spec for spec in (codex.RECORD, claude.RECORD, gemini.RECORD, kiro.RECORD, opencode.RECORD,
                                 copilot.RECORD)
}
DEFAULT_AGENT = "claude"  # `agentbox run`'s agent when the config defines no single agent of its own


def default_agent(names: Iterable[str]) -> str:
    """The agent when none is named (`agentbox run`, and the one `agentbox start` sets up for): the config's only
    agent of its own, else DEFAULT_AGENT."""
    custom = [name for name in names if name not in BUILTIN_AGENTS]
    return custom[0] if len(custom) == 1 else DEFAULT_AGENT


def endpoints(agent_name: str, configured: Iterable[str] | None) -> tuple[str, ...]:
    """An agent's API endpoints: `agents.<name>.endpoints` when set, else the built-in ones."""
    if configured is not None:
        return tuple(configured)
    spec = BUILTIN_AGENTS.get(agent_name)
    return spec.endpoints if spec else ()


def guest_paths() -> dict[str, str]:
    """Host path prefixes that live elsewhere in the Linux guest, for every built-in agent."""
    return {host: guest for spec in BUILTIN_AGENTS.values() for host, guest in spec.guest_paths}


def model_after(name: str, default_args: tuple[str, ...]) -> int | None:
    """Where --model goes: first, or right after the agent's anchor argument (kiro's `chat`).

    None when the anchor is missing (custom kiro args without `chat`): like the previous agentbox,
    no model is added then, since kiro's other subcommands take no --model.
    """
    spec = BUILTIN_AGENTS.get(name)
    anchor = spec.model_after_arg if spec else None
    if anchor is None:
        return 0
    return default_args.index(anchor) + 1 if anchor in default_args else None


def flag_subcommands(name: str) -> tuple[str, ...] | None:
    spec = BUILTIN_AGENTS.get(name)
    return spec.flag_subcommands if spec else None
