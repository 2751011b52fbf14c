"""`agentbox update-agents`: the agent CLIs in a VM brought to their latest release, without a new VM.

One `limactl shell` per VM runs provision/update-agents.sh with each agent's binary and update command:
the agent's own update path (npm's `@latest` for the npm ones, installed under the VM user's ~/.local like
the first install), or else its install command again (kiro's installer, an agent you define, a built-in
whose `install` you changed), which fetches the latest release. What the VM sends back is untrusted: it is
read with a size cap and shown through agentbox.safetext.
"""

from __future__ import annotations

from typing import NamedTuple

from agentbox import lazyre, resources
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.config.load import AgentConfig
from agentbox.safetext import visible

SCRIPT = "update-agents.sh"
OUTPUT_LIMIT = 1 << 20
UPDATED, UNCHANGED, MISSING, FAILED = "updated", "unchanged", "missing", "failed"
_VERSION = lazyre.compile(r"\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.+-]*)?")


class Outcome(NamedTuple):
    """One agent's line of the script's output: `old`/`new` are the first line of `BINARY --version`."""

    agent: str
    status: str
    old: str
    new: str

    def describe(self) -> str:
        """`claude: 2.0.1 -> 2.0.14`, `codex: 0.46.0 (already the latest)`."""
        old, new = version_of(self.old), version_of(self.new)
        if self.status == UNCHANGED:
            return visible(f"{self.agent}: {old} (already the latest)")
        return visible(f"{self.agent}: {old} -> {new}")


def update_command(agent: AgentConfig) -> str | None:
    """What brings the agent to its latest release in the VM; None when nothing is configured to."""
    spec = BUILTIN_AGENTS.get(agent.name)
    if agent.builtin and spec is not None and spec.update and agent.install == spec.install:
        return spec.update
    return agent.install


def script_argv(agents: list[AgentConfig], named: bool) -> list[str]:
    """The one command the VM runs: the script, then NAME BINARY COMMAND for each agent (each has a command)."""
    argv = ["bash", "-c", resources.text("provision", SCRIPT), SCRIPT, *(["--named"] if named else [])]
    for agent in agents:
        command = update_command(agent)
        assert command is not None, agent.name
        argv += [agent.name, agent.binary, command]
    return argv


def env_records(env: dict[str, str]) -> bytes:
    """The environment the script exports (read on its stdin): NAME=value records, each ended by a NUL."""
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items())


def parse(stdout: bytes, agents: list[AgentConfig]) -> list[Outcome]:
    """The script's result lines for these agents, in their order; an agent without a line did not finish."""
    found: dict[str, Outcome] = {}
    for line in stdout.decode(errors="replace").splitlines():
        fields = line.split("\t")
        if len(fields) == 4 and fields[1] in (UPDATED, UNCHANGED, MISSING, FAILED):
            found.setdefault(fields[0], Outcome(*fields))
    return [found.get(agent.name, Outcome(agent.name, FAILED, "", "")) for agent in agents]


def version_of(line: str) -> str:
    """The version in a `--version` line (`2.0.14 (Claude Code)` -> `2.0.14`); the line itself when it has none."""
    match = _VERSION.search(line)
    if match:
        return match.group(0)
    return line.strip()[:60] or "unknown version"
