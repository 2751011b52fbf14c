"""Lima's log lines on stderr (logrus text or JSON), read as a level and a message."""

from __future__ import annotations

import json
from typing import NamedTuple

from agentbox import lazyre

_LOGRUS = lazyre.compile(r'level=(\w+)\s+msg=("(?:[^"\\]|\\.)*"|\S+)')
_JSON_LEVEL = lazyre.compile(r'^\{.*"level"')


class LogLine(NamedTuple):
    """One line of limactl's stderr: logrus level ("" for a line that is not a log line) and message."""

    level: str
    message: str


def parse_log_line(line: str) -> LogLine:
    """`time=... level=warning msg="x"` (or its JSON form) -> ("warning", "x"); other text -> ("", text)."""
    line = line.strip()
    if _JSON_LEVEL.match(line):
        try:
            data = json.loads(line)
            return LogLine(_level(str(data.get("level", ""))), str(data.get("msg", line)))
        except (json.JSONDecodeError, AttributeError):
            pass
    match = _LOGRUS.search(line)
    if not match:
        return LogLine("", line)
    level, msg = match.groups()
    if msg.startswith('"'):
        try:
            msg = json.loads(msg)  # Go's %q escapes are JSON's, for the characters logrus quotes
        except json.JSONDecodeError:
            msg = msg.strip('"')
    return LogLine(_level(level), msg)


def _level(name: str) -> str:
    return "warning" if name == "warn" else name
