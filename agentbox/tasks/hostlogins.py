"""What a remote task gets of this machine's logins: placeholders, and the way back to the broker.

A remote VM reaches credential hosts only through this machine's proxy and credential broker (agentbox.net.guard,
agentbox.credentials.broker.process), over an ssh reverse forward of the proxy's port on the host's connection: the
remote host's 127.0.0.1:R reaches this machine's 127.0.0.1:P, and the VM's proxy variables name
host.lima.internal:R. The logins the VM gets are the broker's placeholder versions; a login the broker does not
keep (Kiro's, OpenCode's, Copilot CLI's, an agent you define, .netrc, or every login with
`credentials.broker: false`) would have to be written on the remote host, so the task is refused with that reason
before anything is made. After staging, every staged login is checked again against the placeholders.

The keeper (agentbox.tasks.keeper) holds the proxy for the task's life and makes the forward again, on the
same remote port, when the connection to the host was remade; it ends both when the task ended.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox.credentials import loginfiles
from agentbox.errors import StateError

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.credentials.broker.brokered import Prepared

# Staged beside the logins but holding no secret: the GitHub CLI's settings (editor, aliases).
NOT_SECRET = ("~/.config/gh/config.yml",)


PORTS = (20000, 60000)  # where a task's remote port is chosen (its key's digest picks one)


def remote_port(key: str) -> int:
    """The host's 127.0.0.1 port a task's forward listens on: fixed for the task (the VM's proxy variables name
    it, and the forward is made again on it after a lost connection), spread by the task's key."""
    low, high = PORTS
    return low + int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % (high - low)


def refused_logins(config: Config, agent: AgentConfig, prepared: Prepared | None) -> list[str]:
    """The host login files this launch would stage as they are (each would be written on the remote host)."""
    if not config.credentials.enabled:
        return []
    found = []
    for spec in loginfiles.launch_files(config, agent):
        path = Path(os.path.expanduser(spec))
        if spec in NOT_SECRET or not os.path.lexists(path):
            continue
        if prepared is not None and prepared.replaces(path):
            continue
        found.append(spec)
    return found


def refusal(agent: AgentConfig, logins: list[str], host: str, broker_on: bool) -> StateError:
    shown = ", ".join(logins[:4]) + (f" and {len(logins) - 4} more" if len(logins) > 4 else "")
    why = ("the credential broker keeps only Claude Code's, Codex's, Gemini CLI's and the GitHub CLI's logins on "
           "this machine" if broker_on else "the credential broker is off (credentials.broker: false)")
    return StateError(f"{agent.name}'s launch would stage your login files ({shown}) on {host}, and agentbox never "
                      f"writes a login on another machine: {why}",
                      hint="Run it here (`--on local`), turn the broker on, or leave those logins out for this "
                           "project (`credentials: false`, or the agent's `credentials: []` in agentbox.yml).")


def check_staged(staged: list[object], prepared: Prepared | None, host: str) -> None:
    """After staging: every staged login is a placeholder version (or holds no secret), else nothing is sent."""
    allowed = set(prepared.files) if prepared is not None else set()
    allowed |= {spec[2:] for spec in NOT_SECRET}
    leaked = [str(getattr(item, "guest_path", item)) for item in staged
              if str(getattr(item, "guest_path", item)) not in allowed]
    if leaked:
        raise StateError(f"the staging for {host} holds host login files that are not placeholders "
                         f"({', '.join(leaked[:4])}); nothing was sent",
                         hint="Please report this: agentbox refused it before it left this machine.")
