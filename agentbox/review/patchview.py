"""Printing a diff the agent's files went into: safe on a terminal, exact in a pipe.

On a terminal every line is made visible (agentbox.safetext: an escape sequence or a carriage
return in a file the agent wrote must not recolour, move or erase anything) and coloured: added
lines green, removed lines red, hunk headers cyan, file headers bold. Anywhere else (a file, a
pipe, `git apply`) the bytes go out exactly as git produced them, so `agentbox diff > x.patch`
followed by `git apply x.patch` reproduces the change.
"""

from __future__ import annotations

import os
import sys
from typing import BinaryIO

from agentbox.safetext import visible

_RESET = "\033[0m"
_STYLES = (
    ("diff --git ", "\033[1m"),
    ("+++ ", "\033[1m"),
    ("--- ", "\033[1m"),
    ("@@", "\033[36m"),
    ("+", "\033[32m"),
    ("-", "\033[31m"),
)


def is_terminal(stream: BinaryIO | None = None) -> bool:
    stream = stream or sys.stdout.buffer
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def render(data: bytes, colour: bool) -> bytes:
    """data (a patch, a --stat, a list of names) made safe for a terminal, coloured when colour is True."""
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    shown = []
    for line in lines:
        text = visible(line, keep_tab=True)
        style = next((code for prefix, code in _STYLES if line.startswith(prefix)), None) if colour else None
        shown.append(f"{style}{text}{_RESET}" if style and text else text)
    return "\n".join(shown).encode("utf-8", "surrogateescape")


def write(data: bytes, stream: BinaryIO | None = None) -> None:
    """data to stream (stdout): rendered on a terminal, the exact bytes elsewhere."""
    stream = stream or sys.stdout.buffer
    if is_terminal(stream):
        data = render(data, colour=_colour_wanted())
    stream.write(data)
    stream.flush()


def _colour_wanted() -> bool:
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM", "") != "dumb"
