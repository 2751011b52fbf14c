"""`agentbox --help` without click: the same text as click's command line prints, for less than half its time.

The text's parts live here and agentbox.cli.commandline builds its click group from them (the help, the options'
help, the command groups); this module renders them as click's HelpFormatter would (the same wrapping, the same
width: the terminal's, at most 100, at least 50). tests/test_own_time.py compares the two outputs, with and
without agents defined in a config and at several widths. agentbox.cli.main sends exactly `agentbox --help` (or
`-h`) here; anything else goes to click.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.errors import AgentboxError

USAGE = "Usage: agentbox [OPTIONS] COMMAND [ARGS]..."
ROOT_HELP = """Run AI coding agents in a per-project Lima VM.

In a project folder, `agentbox claude` (or codex, gemini, kiro, opencode, copilot) finds or
creates the project's VM, mounts the project at the same path and starts the agent there with its
approval prompts off: the VM is the sandbox.

Every argument after the agent's name goes to the agent: `agentbox AGENT --help` shows the
agent's own help, run inside the VM (when the VM is not running, agentbox describes the agent
instead and creates nothing). `agentbox AGENT shell` opens a shell in the agent's VM.
`agentbox help COMMAND` shows agentbox's help for any command, agents included.
"""
# agentbox.cli.commandline.cli's options in click's order, each as --help shows it (click's own for -V and -h)
OPTIONS = (
    ("-V, --version", "Show the version and exit."),
    ("-C DIR", "Run as if agentbox was started in DIR."),
    ("-v, --verbose", "Stream limactl's own output."),
    ("-q, --quiet", "Print only warnings and errors on stderr (no progress, no notes)."),
    ("--debug", "Print every limactl call with its duration and exit code."),
    ("--timings", "Print how long each phase took (same as AGENTBOX_TIMING=1)."),
    ("-h, --help", "Show this message and exit."),
)
OPTION_HELP = {names.split(",")[0].split()[0]: text for names, text in OPTIONS}
AGENTS_TITLE = "Agents (agentbox AGENT [ARGS]... runs it in the project's VM)"
MAX_WIDTH = 100  # agentbox.cli.commandline's max_content_width

# `agentbox --help` lists the commands in these groups, each with this line: written here so that the
# listing imports no command's module (tests/test_cli_help.py keeps the table whole).
COMMAND_GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("The VM", (
        ("start", "Create and start the project's VM."),
        ("stop", "Stop the project's VM (or all agentbox VMs)."),
        ("restart", "Stop the project's VM if it runs, then start it."),
        ("rm", "Delete the project's VM and its disk."),
        ("status", "Show the project's VM: status, workspace, resources."),
        ("ls", "List agentbox's VMs."),
        ("shell", "Open a login shell in the VM, or run `-- CMD ...` there."),
        ("port", "Forward a VM port to the host's 127.0.0.1; print its URL."),
        ("ports", "List the ports the running VMs forward to the host."),
    )),
    ("Review and undo", (
        ("diff", "Show what changed in the workspace since a checkpoint."),
        ("checkpoints", "List the workspace's checkpoints and what each changed."),
        ("checkpoint", "Take a checkpoint of the workspace now."),
        ("undo", "Put the workspace's files back to a checkpoint."),
        ("proposals", "List the proposals of isolated sessions."),
        ("review", "Show a proposal: summary, files, the patch."),
        ("apply", "Apply a proposal to the workspace."),
        ("reject", "Reject a proposal."),
        ("instructions", "Changes to CLAUDE.md, .claude/ and the like, held for you."),
    )),
    ("Background work", (
        ("run", "Run an agent on PROMPT in the background; print the task's id."),
        ("tasks", "List the background tasks (`tasks prune` forgets ended ones)."),
        ("logs", "Print a task's output."),
        ("wait", "Wait for a task to end; exit with its exit code."),
        ("cancel", "Cancel a queued or running task."),
        ("sessions", "List the detached sessions of the project's VM."),
        ("attach", "Attach to a session started with `agentbox AGENT --detach`."),
        ("hosts", "Other machines that run isolated tasks (`run --on NAME`)."),
    )),
    ("The agent's setup", (
        ("config", "Show the merged config and where each value came from."),
        ("init", "Write a commented config file to start from."),
        ("trust", "Trust this project's agentbox.yml as it is now."),
        ("sync", "Your agents' own setup in the VM: show it, bring back changes."),
        ("update-agents", "Update the agent CLIs in the project's VM."),
        ("base", "The base VM new project VMs are cloned from."),
        ("describe", "Print what the agent is told about its sandbox."),
        ("template", "Print the lima.yaml agentbox would create the VM from."),
    )),
    ("Network", (
        ("net", "The VM's network policy: what it allows, what was decided."),
        ("ca", "Show or add extra CA certificates for the VM."),
    )),
    ("Diagnostics", (
        ("doctor", "Check Lima, config, VM, logins and guards; say what to fix."),
        ("audit", "Show unacknowledged changes to files your host runs."),
        ("report", "Show and verify the signed report each session leaves."),
        ("help", "Show agentbox's help, or the help of COMMAND."),
        ("completion", "Print the shell completion script."),
    )),
)


def configured_agents(start: Path) -> dict[str, Any]:
    """The agents the config found from `start` defines; none when no config file can define one (no YAML read) or
    the config is broken (its error is for the commands that use it)."""
    # deferred: start-up (peek: not on `agentbox --help`)
    from agentbox.config import peek

    if not peek.may_define_agents(start):
        return {}
    # deferred: start-up (load: not on `agentbox --help`)
    from agentbox.config import load
    try:
        return load.load(start).agents
    except AgentboxError:
        return {}


def agent_names(configured: dict[str, Any]) -> list[str]:
    """Built-in agents, then those defined in config."""
    return [*BUILTIN_AGENTS, *sorted(n for n in configured if n not in BUILTIN_AGENTS)]


def agent_summary(configured: dict[str, Any], name: str) -> str:
    builtin = BUILTIN_AGENTS.get(name)
    if builtin:
        return f"Run {builtin.summary} ({builtin.binary}) in the VM"
    agent = configured.get(name)
    binary = agent.binary if agent else name
    return f"Run {binary} in the VM (defined in your config)"


def sections(configured: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The agents, then each group of COMMAND_GROUPS."""
    agents = [(name, agent_summary(configured, name)) for name in agent_names(configured)]
    return [(AGENTS_TITLE, agents), *((title, list(rows)) for title, rows in COMMAND_GROUPS)]


def width() -> int:
    """click's HelpFormatter's width for agentbox's max_content_width."""
    # deferred: start-up (shutil: not on `agentbox --help`)
    import shutil

    return max(min(shutil.get_terminal_size().columns, MAX_WIDTH) - 2, 50)


class _NotPlain(Exception):
    """A text this module does not render as click would: a word longer than its line (click breaks it its own
    way), a character that is not printable."""


def wrap(text: str, columns: int, indent: str = "") -> str:
    """click.formatting.wrap_text(text, columns, indent, indent, preserve_paragraphs=True) for plain text: each
    paragraph (lines between empty ones) joined and filled. Raises _NotPlain for any other text."""
    if any(len(word) + len(indent) >= columns for word in text.split()) or not text.replace("\n", "").isprintable():
        raise _NotPlain(text)

    wrapper = textwrap.TextWrapper(columns, replace_whitespace=False)
    paragraphs: list[tuple[int, str]] = []
    lines: list[str] = []
    for line in [*text.expandtabs().splitlines(), ""]:
        if line:
            lines.append(line.lstrip() if not lines else line)
            if len(lines) == 1:
                paragraphs.append((len(line) - len(line.lstrip()), ""))
            continue
        if lines:
            paragraphs[-1] = (paragraphs[-1][0], " ".join(lines))
            lines = []
    filled = []
    for extra, paragraph in paragraphs:
        wrapper.initial_indent = wrapper.subsequent_indent = indent + " " * extra
        filled.append(wrapper.fill(paragraph))
    return "\n\n".join(filled)


def definition_list(rows: list[tuple[str, str]], columns: int, indent: int) -> str:
    """click's HelpFormatter.write_dl (col_max 30, col_spacing 2) at this indent."""
    first_col = min(max(len(first) for first, _ in rows), 30) + 2
    out = []
    for first, second in rows:
        out.append(" " * indent + first)
        if not second:
            out.append("\n")
            continue
        out.append(" " * (first_col - len(first)) if len(first) <= first_col - 2 else "\n" + " " * (first_col + indent))
        lines = wrap(second, max(columns - first_col - 2, 10)).splitlines()
        out.append("".join(f"{line}\n" if index == 0 else f"{' ' * (first_col + indent)}{line}\n"
                           for index, line in enumerate(lines)) or "\n")
    return "".join(out)


def render(configured: dict[str, Any], columns: int) -> str | None:
    """The text of `agentbox --help`, as click prints it (without the last newline); None when a part would need
    what this module does not do (see _NotPlain: click's own rules then)."""
    try:
        return _render(configured, columns)
    except _NotPlain:
        return None


def _render(configured: dict[str, Any], columns: int) -> str:
    listed = sections(configured)
    names_width = max(len(name) for _, rows in listed for name, _ in rows)
    parts = [f"{USAGE}\n", "\n", wrap(ROOT_HELP, columns, "  "), "\n"]
    for title, rows in [("Options", list(OPTIONS)),
                        *((title, [(name.ljust(names_width), text) for name, text in rows]) for title, rows in listed)]:
        parts += ["\n", f"{title}:\n", definition_list(rows, columns, 2)]
    return "".join(parts).rstrip("\n")


def show(start: Path | None = None, write: Callable[[str], Any] | None = None) -> int:
    """Print `agentbox --help` for the folder `start` (the working directory); the exit code, or -1 when click
    must print it (see render)."""
    text = render(configured_agents(start or Path(os.getcwd())), width())
    if text is None:
        return -1
    (write or sys.stdout.write)(text + "\n")
    sys.stdout.flush()
    return 0
