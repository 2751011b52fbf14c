"""What `agentbox sync --show` reports, as plain data: one record per agent, one entry per line of the text.

The text and `--json` are both printed from these records (agentbox.cli.commands.sync), so they cannot disagree.
Every string is as the text shows it (through agentbox.safetext.visible): file names come from the host's
home and may hold anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import paths
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.safetext import visible
from agentbox.sync import agentsetup
from agentbox.sync.transform import LOGIN_TRANSFORMS, Context, Note, Unusable

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config

LABELS = {"dropped": "drop", "changed": "edit", "kept": "keep"}
GOES_ON = " (the launch goes on without it)"


def login_files() -> list[str]:
    """The login files that also hold an agent's setup (~/.claude.json): with sync.agentConfig false they reach
    the VM without it."""
    return [f"~/{relative}" for spec in BUILTIN_AGENTS.values() for relative, _ in spec.login_transforms]


def unknown_agent(agent: AgentConfig) -> dict[str, Any]:
    """An agent agentbox knows no setup folder of: nothing of it is synced."""
    return {"agent": agent.name, "vm": agent.vm_name, "folder": None, "guestFolder": None, "onHost": False,
            "entries": []}


def agent_record(config: Config, agent: AgentConfig, guest_home: str, staging_folder: Path) -> dict[str, Any]:
    """What a launch brings of one agent's setup and what it leaves out, in the order `sync --show` prints it.

    Each entry has the same keys: `action` (copy, drop, edit, keep), `path` (`~/...`, a folder ends in `/`),
    `where` (the key inside the file, or null), `why` (null for a copy), and for a copy `files`, `bytes` (what
    the VM gets) and `names` (a folder's top-level names; null for a file).
    """
    spec = agentsetup.spec_of(agent)
    assert spec is not None and spec.folder is not None
    home = paths.home()
    collected = agentsetup.collect(agent, spec, home)
    context = agentsetup.context_for(config, agent, guest_home, staging_folder)
    entries: list[dict[str, Any]] = []
    builtin = [entry.rstrip("/") for entry in spec.sync_items]
    groups: dict[str, list[agentsetup.FileView]] = {}
    for item in collected.items:
        entry = next((e for e in builtin if item.inner == e or item.inner.startswith(e + "/")),
                     item.inner.split("/")[0])
        groups.setdefault(entry, []).append(agentsetup.view_of(item, context))
    for entry, group in groups.items():
        good = [view for view in group if view.problem is None]
        path = visible(f"~/{spec.folder}/{entry}")
        if len(group) == 1 and group[0].item.inner == entry:
            if good:
                entries.append(_copy(path, 1, good[0].size, None))
        elif good:
            names = sorted({view.item.inner[len(entry) + 1:].split("/")[0] for view in good})
            entries.append(_copy(path + "/", len(good), sum(view.size for view in good),
                                 [visible(name) for name in names]))
        for view in group:
            shown = visible(f"~/{view.item.relative}")
            if view.problem:
                entries.append(_note("drop", shown, "", view.problem + GOES_ON))
            entries.extend(_note(LABELS.get(note.what, note.what), shown, note.where, note.why) for note in view.notes)
    for relative, transform in spec.login_transforms:
        entries.extend(_login_file(config, agent, spec.title, relative, transform, context))
    entries.extend(_note("drop", dropped.shown, "", dropped.why) for dropped in collected.dropped)
    return {"agent": agent.name, "vm": agent.vm_name, "folder": f"~/{spec.folder}",
            "guestFolder": f"{guest_home}/{spec.folder}", "onHost": (home / spec.folder).is_dir(), "entries": entries}


def _copy(path: str, files: int, size: int, names: list[str] | None) -> dict[str, Any]:
    return {"action": "copy", "path": path, "where": None, "why": None, "files": files, "bytes": size, "names": names}


def _note(action: str, path: str, where: str, why: str) -> dict[str, Any]:
    return {"action": action, "path": path, "where": visible(where) if where else None, "why": visible(why),
            "files": None, "bytes": None, "names": None}


def _login_file(config: Config, agent: AgentConfig, title: str, relative: str, transform: str,
                context: Context) -> list[dict[str, Any]]:
    """A login file that also holds the agent's setup (AgentSpec.login_transforms: ~/.claude.json)."""
    path = paths.home() / relative
    shown = f"~/{relative}"
    if not path.is_file():
        return []
    if not config.credentials.enabled or shown not in agent.credentials:
        return [_note("drop", shown, "", f"it is one of {title}'s login files, which this config does not bring "
                                         "(credentials), so its MCP servers stay on the host too")]
    notes: list[Note] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            LOGIN_TRANSFORMS[transform](handle.read(agentsetup.MAX_FILE), context, notes, True)
    except Unusable as exc:
        return [_note("drop", shown, "", str(exc) + GOES_ON)]
    except OSError as exc:
        return [_note("drop", shown, "", f"cannot read it ({exc.strerror})")]
    return [_note(LABELS.get(note.what, note.what), shown, note.where, note.why) for note in notes]
