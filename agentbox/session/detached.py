"""Detachable sessions: an agent in a tmux session in the VM that outlives the terminal that started it.

provision/session.sh does the work in the VM (agentbox's own tmux server, `tmux -L agentbox`, and a record
per session in ~/.agentbox/sessions). A launch reaches it through launch.sh's --session options; `agentbox
sessions` and `agentbox attach` send the same script inline in their one `limactl shell` (so they work
whatever the staged copy is). What comes back is written by the VM and read as untrusted: the answer of a
start or an attach in a fresh folder of the outbox (outbox/sessions/reply-ID/result, key=value lines, and
an ended session's last-output), the list on stdout (tab-separated, size-capped); names are checked
against NAME_PATTERN and numbers parsed, anything else is dropped.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import lazyre, livemarkers, paths, resources, staginglayout, vmread
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.safetext import visible

if TYPE_CHECKING:
    from agentbox.config.load import Config

NAME_PATTERN = lazyre.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
REPLY_PREFIX = "reply"
EVENTS = "events"
RESULT_LIMIT = 16 * 1024
LAST_OUTPUT_LIMIT = 256 * 1024
LIST_LIMIT = 1 << 20  # what `sessions` reads of the VM's answer
RUNNING = "running"
EXITED = "exited"
STOPPED = "stopped"  # stopped with its VM: no exit code, and session.sh drops its record at the next session's start


class Reply(NamedTuple):
    """session.sh's answer to a start or an attach."""

    outcome: str  # started, ended, detached, exited, unknown, ambiguous, none
    name: str | None
    agent: str | None
    code: int | None
    names: tuple[str, ...]
    ended: int | None
    last_output: str | None


class Row(NamedTuple):
    """One session of `agentbox sessions`."""

    name: str
    agent: str
    started: int | None
    attached: bool
    state: str  # RUNNING, EXITED or STOPPED
    exit_code: int | None
    ended: int | None

    def to_json(self, vm_name: str) -> dict[str, Any]:
        return {"name": self.name, "agent": self.agent, "vm": vm_name, "started": iso_time(self.started),
                "attached": self.attached, "state": self.state, "exitCode": self.exit_code,
                "ended": iso_time(self.ended)}


def base_name(agent: str) -> str:
    """The session name a launch of `agent` starts from (session.sh adds -2, -3, ... when it is taken)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", agent).lstrip("-_")[:40]
    return name if NAME_PATTERN.match(name) else "agent"


def script(command: str, *args: str) -> list[str]:
    """The argv that runs session.sh's COMMAND in the VM, the script sent inline."""
    script = staginglayout.SESSION_SCRIPT
    return ["bash", "-c", resources.text("provision", script), script, command, *args]


def outbox_folder(vm_name: str) -> Path:
    return paths.vm_outbox(vm_name) / staginglayout.OUTBOX_SESSIONS


def events_folder(vm_name: str) -> Path:
    return outbox_folder(vm_name) / EVENTS


def live_folder(vm_name: str) -> Path:
    """Where running sessions and waiting or running tasks keep a marker fresh (agentbox.livemarkers)."""
    return livemarkers.folder(vm_name)


def new_reply(vm_name: str) -> Path:
    """A fresh folder for one start's or attach's answer (the host removes it once read)."""
    return vmread.fresh_folder(paths.vm_outbox(vm_name), staginglayout.OUTBOX_SESSIONS, prefix=REPLY_PREFIX)


def take_reply(vm_name: str, folder: Path) -> Reply | None:
    """Read and remove the answer in `folder`; None when there is none (the VM did not get that far)."""
    outbox = paths.vm_outbox(vm_name)
    try:
        with vmread.folder(outbox, staginglayout.OUTBOX_SESSIONS, folder.name) as fd:
            result = vmread.read(fd, "result", RESULT_LIMIT)
            last = vmread.read_tail(fd, "last-output", LAST_OUTPUT_LIMIT)
    except OSError:
        return None
    finally:
        vmread.remove_folder(outbox, folder)
    if result is None:
        return None
    return parse_reply(result, last)


def parse_reply(result: bytes, last_output: bytes | None = None) -> Reply | None:
    fields: dict[str, str] = {}
    for line in result.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields.setdefault(key, value)
    outcome = fields.get("outcome", "")
    if outcome not in ("started", "ended", "detached", "exited", "unknown", "ambiguous", "none"):
        return None
    names = tuple(sorted(name for name in fields.get("names", "").split() if NAME_PATTERN.match(name)))
    return Reply(outcome, _name(fields.get("name")), _agent(fields.get("agent")), _int(fields.get("code")), names,
                 _int(fields.get("ended")), last_output.decode(errors="replace") if last_output is not None else None)


def parse_list(output: bytes) -> list[Row]:
    """session.sh list's lines: NAME, AGENT, STARTED, ATTACHED CLIENTS, STATE, EXIT CODE, ENDED (tab-separated)."""
    rows = []
    for line in output.decode(errors="replace").splitlines():
        fields = line.split("\t")
        if len(fields) != 7:
            continue
        name, agent, started, attached, state, code, ended = fields
        if not NAME_PATTERN.match(name) or state not in (RUNNING, EXITED, STOPPED):
            continue
        rows.append(Row(name, _agent(agent) or "", _int(started), (_int(attached) or 0) > 0, state, _int(code),
                        _int(ended)))
    return sorted(rows, key=lambda row: (row.started or 0, row.name))


def resume_command(config: Config | None, agent: str | None) -> str | None:
    """`agentbox AGENT <resume flag>` from the agent registry, when the agent has one."""
    if not agent:
        return None
    known = config.agents if config is not None else {}
    spec = BUILTIN_AGENTS.get(agent)
    if spec is None or spec.resume is None or (known and agent not in known):
        return None
    return shlex.join(["agentbox", agent, *spec.resume])


def iso_time(epoch: int | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))  # UTC, as datetime would (not imported for it)


def local_time(epoch: int | None) -> str:
    # deferred: start-up (tables imports click, which a launch never loads)
    from agentbox import tables

    return tables.local_time(epoch)


def shown(text: str) -> str:
    return visible(text)


def _name(value: str | None) -> str | None:
    return value if value is not None and NAME_PATTERN.match(value) else None


def _agent(value: str | None) -> str | None:
    if not value:
        return None
    return value if re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", value) else None


def _int(value: str | None) -> int | None:
    if value is None or not re.match(r"^-?[0-9]{1,18}$", value.strip()):
        return None
    return int(value.strip())
