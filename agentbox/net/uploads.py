"""Bytes sent per host, and the upload cap (`network.uploadLimit`): what the proxy counts, and when it refuses.

The proxy counts, per host, every byte a client sends towards it: the bytes through a CONNECT tunnel it does not
look into (TLS records: request heads and handshakes included), a plain-HTTP request's body, and a brokered
(TLS-terminated) request's head and body. The count is per *upload window*: a window begins when a session starts
while no other session of the VM holds its proxy (agentbox.net.guard writes its start in policy.json), so sessions
that overlap share one count, and a session that starts alone begins from zero (a brokered VM's proxy, which stays
between sessions, starts the new window too).

Past the cap a host gets nothing more: a CONNECT to it is refused (403), a request with a body 413, a tunnel or a
body crossing the cap is cut where it stands; each is one log line with decision `cap`. The first refusal per host
and window is also one line in `network/caps.jsonl`, which the session's end reports once (guard.Lease.release).
Downloads are not capped: a plain-HTTP or brokered request without a body still passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentbox import sizes

DEFAULT_LIMIT = 50 << 20
DEFAULT_TEXT = "50MiB"  # network.uploadLimit's default as the config writes it
CAPS_FILE = "caps.jsonl"
LOG_FILE = "log.jsonl"  # the proxy's decisions, one JSON line each, in the VM's network folder
WINDOW_FILE = "window"  # when the current upload window began, there
DECISION = "cap"


def limit_hint(limit: int) -> str:
    """What raises the cap, for the refusal's JSON body and the session's end."""
    return (f"network.uploadLimit in agentbox.yml (now {sizes.shown(limit)} per host and session; a larger size, or "
            "false for no cap; a project's file needs `agentbox trust` to raise it above the global config's)")


class Counter:
    """The proxy's per-host counts in the current window, against `limit` bytes (None: no cap)."""

    def __init__(self, limit: int | None = DEFAULT_LIMIT, window: str = "", caps_path: Path | None = None) -> None:
        self.limit = limit
        self.window = window
        self.caps_path = caps_path
        self.sent: dict[str, int] = {}
        self.reported: set[str] = set()

    def configure(self, limit: int | None, window: str) -> None:
        """A new policy: the cap it says, and a new window's counts from zero."""
        self.limit = limit
        if window != self.window:
            self.window = window
            self.sent.clear()
            self.reported.clear()

    def full(self, host: str) -> bool:
        """Whether `host` reached the cap already (nothing more may be sent to it)."""
        return self.limit is not None and self.sent.get(host, 0) >= self.limit

    def add(self, host: str, count: int) -> bool:
        """Count `count` bytes about to go to `host`; False when they would pass the cap (then they are not sent)."""
        now = self.sent.get(host, 0) + count
        if self.limit is not None and now > self.limit:
            self.sent[host] = max(self.sent.get(host, 0), self.limit)
            return False
        self.sent[host] = now
        return True

    def refusal(self, host: str) -> tuple[str, dict[str, Any]]:
        """The log reason and the JSON body's fields of a refusal at the cap; the first per host and window is
        recorded for the session's end."""
        limit = self.limit or 0
        reason = f"upload cap: {sizes.shown(limit)} sent to {host} in this session (network.uploadLimit)"
        if host not in self.reported:
            self.reported.add(host)
            self._record(host, limit)
        return reason, {"cap": limit, "capText": sizes.shown(limit), "raise": limit_hint(limit)}

    def _record(self, host: str, limit: int) -> None:
        if self.caps_path is None:
            return
        line = json.dumps({"time": time.time(), "window": self.window, "host": host, "limit": limit}) + "\n"
        with contextlib.suppress(OSError):
            fd = os.open(self.caps_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)


def window(folder: Path) -> str:
    """When the current upload window of the VM whose network folder this is began ("" before the first session)."""
    try:
        return (folder / WINDOW_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def capped_since(folder: Path, since: float) -> list[dict[str, Any]]:
    """The hosts whose cap was reached at or after `since` (seconds since the epoch), each once, from the proxy's
    caps file in the VM's network folder; [] when there is none (one stat)."""
    try:
        data = (folder / CAPS_FILE).read_bytes()[-(1 << 20):]
    except OSError:
        return []
    found: dict[str, dict[str, Any]] = {}
    for raw in data.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("time"), (int, float)) and entry["time"] >= since \
                and isinstance(entry.get("host"), str) and isinstance(entry.get("limit"), int):
            found.setdefault(entry["host"], entry)
    return list(found.values())


def notice(entry: dict[str, Any]) -> str:
    """The session's end line for one host whose cap was reached."""
    return (f"uploads to {entry['host']} were stopped at {sizes.shown(entry['limit'])} (network.uploadLimit); "
            f"`agentbox net log --hosts` shows what each host was sent")


def per_host(lines: Iterable[bytes], window: str = "") -> list[dict[str, Any]]:
    """The proxy's log lines of the upload window `window` ("": all of them) summed per host: requests, bytes up
    and down, refusals at the cap; the host sent the most first."""
    return per_host_entries(_parsed(lines), window)


def per_host_entries(entries: Iterable[dict[str, Any]], window: str = "") -> list[dict[str, Any]]:
    """per_host of log lines already parsed."""
    hosts: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry.get("host"), str) or (window and entry.get("window") != window):
            continue
        row = hosts.setdefault(entry["host"], {"host": entry["host"], "requests": 0, "up": 0, "down": 0, "capped": 0})
        row["requests"] += 1
        for key, field in (("up", "bytes_up"), ("down", "bytes_down")):
            value = entry.get(field)
            row[key] += value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
        row["capped"] += entry.get("decision") == DECISION
    return sorted(hosts.values(), key=lambda row: (-row["up"], row["host"]))


def _parsed(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    for raw in lines:
        entry = parsed_line(raw)
        if entry is not None:
            yield entry


def parsed_line(raw: bytes) -> dict[str, Any] | None:
    """One line of the proxy log as its entry (None: not a JSON object, as a line cut short)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None
