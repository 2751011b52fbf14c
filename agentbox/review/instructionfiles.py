"""The one list of workspace files that steer an agent: what a session may not change for the next one unasked.

An agent reads its project instructions (CLAUDE.md, AGENTS.md, ...), settings that run hooks, slash commands,
subagents, skills and MCP servers from the workspace, and obeys them. Each agent's record names its own
(AgentSpec.instruction_files, `agents.<name>.instructionFiles` for an agent a config defines); SHARED are read
by several agents, or by the user's editor agents on the host. Every built-in's files are always in the list:
any of them may be launched in the workspace next, or run on the host.

Entries are relative to the workspace; a trailing / marks a folder (everything in it, at any depth); `**/NAME`
is a file of that name in any folder (AgentSpec.instruction_names: Claude Code loads src/CLAUDE.md when it works
in src/), found by agentbox.review.instructionscan's bounded walk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.review.instructionscan import ANYWHERE

if TYPE_CHECKING:
    from agentbox.config.load import Config

SHARED = (
    "AGENTS.md",
    ".mcp.json",  # MCP servers the host's Claude Code (and others) start
    ".github/copilot-instructions.md",
    ".cursor/rules/",
    ".cursorrules",
    ".cursor/mcp.json",
    ".vscode/mcp.json",
)


def instruction_files(custom: Iterable[Iterable[str]] = ()) -> tuple[str, ...]:
    """Every built-in agent's files, then the shared ones, then `custom` (each configured agent's own
    instructionFiles), without repeats, in that order."""
    found: dict[str, None] = {}
    for spec in BUILTIN_AGENTS.values():
        found.update(dict.fromkeys(spec.instruction_files))
    for spec in BUILTIN_AGENTS.values():
        found.update(dict.fromkeys(ANYWHERE + name for name in spec.instruction_names))
    found.update(dict.fromkeys(SHARED))
    for files in custom:
        found.update(dict.fromkeys(files))
    return tuple(found)


def quarantined(config: Config) -> tuple[str, ...]:
    """The files whose changes a session with this config holds (instructions.quarantine on), or () when off."""
    if not config.instructions_quarantine:
        return ()
    return instruction_files(agent.instruction_files for agent in config.agents.values())


def matcher(files: Iterable[str]) -> Callable[[str], bool]:
    """Whether a workspace-relative path (as a patch or a listing names it) is one of `files` or lies in one of
    their folders. Names are compared as a case-insensitive file system sees them: on macOS `claude.md` is the
    file Claude Code reads as CLAUDE.md."""
    # deferred: start-up (review.patchcheck: a launch reads the list, only a review or a new list matches it)
    from agentbox.review.patchcheck import fold

    listed = list(files)
    anywhere = {fold(entry[len(ANYWHERE):]) for entry in listed if entry.startswith(ANYWHERE)}
    names = {fold(entry) for entry in listed if not entry.endswith("/")}
    prefixes = tuple(fold(entry) for entry in listed if entry.endswith("/"))

    def steers(path: str) -> bool:
        folded = fold(path.strip("/"))
        return (folded in names or folded.startswith(prefixes) or f"{folded}/" in prefixes
                or folded.rpartition("/")[2] in anywhere)

    return steers
