"""What the proxy and the broker logged during one session: its lines of the proxy's log, read from the end back to
the session's start (never the whole log), summed for the session's report (agentbox.session.endreport).

    entries(vm, since) -> the proxy's log entries at or after `since` (ISO 8601 UTC)
    network(entries, window) -> {"window", "hosts": uploads.per_host rows, "requests", "up", "down", "denials",
                                 "leaks", "uploadCapRefusals"}
    broker(vm, since, entries) -> {"substitutions", "answered", "refusals", "pushes": [{"time", "outcome", "refs"}]}
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentbox import paths
from agentbox.net import pushes, uploads

CHUNK = 64 * 1024
MAX_BACK = 32 << 20  # a session that logged more than this is summed over its last MAX_BACK bytes
LEDGER_TAIL = 256 * 1024  # the pushes ledger is read back at most this far for a report


def entries(vm_name: str, since: str) -> list[dict[str, Any]]:
    return lines_since(paths.vm_network_dir(vm_name) / uploads.LOG_FILE, since)


def lines_since(path: Path, since: str, limit: int = MAX_BACK) -> list[dict[str, Any]]:
    """The log's entries whose `time` (ISO 8601 UTC, as the proxy writes it) is at or after `since`, read backwards
    in chunks from the end until a line from before `since`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        position = handle.seek(0, os.SEEK_END)
        data = b""
        while position > 0 and len(data) < limit:
            step = min(CHUNK, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
            start = data.find(b"\n") + 1 if position > 0 else 0
            end = data.find(b"\n", start)
            if (start == 0 and position > 0) or end < 0:
                continue  # no whole line yet
            first = uploads.parsed_line(data[start:end])
            if first is not None and str(first.get("time", "")) < since:
                break
    if position > 0:
        data = data[data.find(b"\n") + 1:]
    found = []
    for raw in data.splitlines():
        entry = uploads.parsed_line(raw)
        if entry is not None and str(entry.get("time", "")) >= since:
            found.append(entry)
    return found


def window(vm_name: str) -> str:
    """The VM's current upload window (agentbox.net.uploads)."""
    return uploads.window(paths.vm_network_dir(vm_name))


def network(found: Sequence[dict[str, Any]], window: str = "") -> dict[str, Any]:
    """The network summary of a session: its log entries (of its upload window, when given)."""
    if window:
        found = [entry for entry in found if entry.get("window") in (window, None)]
    hosts = uploads.per_host_entries(found)
    return {
        "window": window or None,
        "hosts": hosts,
        "requests": sum(row["requests"] for row in hosts),
        "up": sum(row["up"] for row in hosts),
        "down": sum(row["down"] for row in hosts),
        "denials": sum(1 for entry in found if entry.get("decision") == "deny"),
        "leaks": sum(1 for entry in found if entry.get("decision") == "leak"),
        "uploadCapRefusals": sum(1 for entry in found if entry.get("decision") == uploads.DECISION),
    }


def broker(vm_name: str, since: str, found: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The credential broker's part: what it substituted, answered and refused (the log entries it judged), and the
    pushes it let through or refused since `since` (its ledger's tail: agentbox.net.pushes)."""
    judged = [entry for entry in found if "path" in entry]
    made = []
    for entry in lines_since(pushes.ledger_path(vm_name), since, LEDGER_TAIL):
        updates = entry.get("updates") if isinstance(entry.get("updates"), list) else []
        made.append({"time": str(entry.get("time", "")), "outcome": str(entry.get("outcome", "")),
                     "refs": [str(update.get("ref", "")) for update in updates or [] if isinstance(update, dict)]})
    return {
        "substitutions": sum(1 for entry in judged if entry.get("decision") == "substitute"),
        "answered": sum(1 for entry in judged if entry.get("decision") == "answer"),
        "refusals": sum(1 for entry in judged if entry.get("decision") in ("deny", "leak")),
        "pushes": made,
    }

