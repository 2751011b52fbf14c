"""The tables agentbox prints (tasks, sessions, checkpoints, proposals, base ls, ls, ports) and the one
format of a time in them.

Columns are as wide as their widest cell, measured in terminal columns (a CJK character takes two, a
combining mark none). When the table is wider than the terminal (COLUMNS, else the terminal's width;
no limit when stdout is no terminal, so scripts get whole cells), the flexible columns (the free text:
a prompt, a state, a message, a workspace) are cut, ending in "…" (as gh does), one after the other in the
order the table gives: each down to 12 columns, or from 60 columns up as far as its header. Only when even that
cannot fit (a terminal narrower than about 60 columns) is each row printed as a block of `HEADER  value`
lines, so nothing wraps into the next column.

Times are local, "YYYY-MM-DD HH:MM": absolute (the same on every run, comparable between tables and with
`git log`), always 16 columns, and the time zone the user reads the clock in.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import unicodedata
from collections.abc import Collection, Sequence

import click

ELLIPSIS = "…"
GAP = "  "
MIN_FLEXIBLE = 12  # a flexible column is first cut no narrower than this (or its header)
BLOCKS_BELOW = 60  # from this width up a table stays a table: flexible columns may be cut to their header's width
TIME_FORMAT = "%Y-%m-%d %H:%M"


def local_time(moment: float | str | None) -> str:
    """A time for a table: seconds since the epoch, or a recorded ISO 8601 time (UTC `Z` or with an offset)."""
    if moment is None or moment == "":
        return "-"
    if isinstance(moment, str):

        try:
            parsed = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return moment
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        moment = parsed.timestamp()
    return time.strftime(TIME_FORMAT, time.localtime(moment))


def display_width(text: str) -> int:
    """The terminal columns text takes."""
    if text.isascii():
        return len(text)
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def cut(text: str, width: int) -> str:
    """text in at most width columns; a cut one ends in "…"."""
    if display_width(text) <= width:
        return text
    room = max(width - len(ELLIPSIS), 0)
    kept, used = [], 0
    for char in text:
        size = display_width(char)
        if used + size > room:
            break
        kept.append(char)
        used += size
    return "".join(kept) + ELLIPSIS[: max(width - used, 0)]


def terminal_columns() -> int | None:
    """The width to fit: COLUMNS when set, else stdout's terminal; None (no limit) for a pipe or a file."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        pass
    return None


def render(rows: Sequence[Sequence[str]], flexible: Sequence[int] = (-1,), right: Collection[int] = (),
           width: int | None = None) -> list[str]:
    """The lines of a table; rows[0] is the header. `flexible`: the columns that may be cut, the first given up
    first (negative counts from the end); `right`: the right-aligned ones (numbers). `width`: the room, by default
    terminal_columns()."""
    count = len(rows[0])
    order = list(dict.fromkeys(index % count for index in flexible))
    right = {index % count for index in right}
    sizes = [[display_width(cell) for cell in row] for row in rows]  # once per cell: a listing may have 1,000 rows
    natural = [max(row[i] for row in sizes) for i in range(count)]
    limit = terminal_columns() if width is None else width
    widths: list[int] | None = natural
    if limit is not None:
        widths = _fitted(rows[0], natural, order, limit)
    if widths is None:
        assert limit is not None
        return _blocks(rows, limit)
    lines = []
    for row, row_sizes in zip(rows, sizes, strict=True):
        cells = []
        for index, cell in enumerate(row):
            size = row_sizes[index]
            shown = cell if size <= widths[index] else cut(cell, widths[index])
            pad = " " * (widths[index] - (size if shown is cell else display_width(shown)))
            cells.append(pad + shown if index in right else shown + pad)
        lines.append(GAP.join(cells).rstrip())
    return lines


def echo(rows: Sequence[Sequence[str]], flexible: Sequence[int] = (-1,), right: Collection[int] = ()) -> None:
    """Print a table on stdout (see render)."""
    lines = render(rows, flexible, right)
    if lines:
        click.echo("\n".join(lines))  # one write, not one per row


def _fitted(header: Sequence[str], natural: list[int], flexible: list[int], limit: int) -> list[int] | None:
    """Column widths within limit, the flexible columns cut in their order, each as far as it may go (12 columns,
    then from BLOCKS_BELOW up its header's width) before the next; None when they cannot fit."""
    widths = list(natural)
    excess = sum(widths) + len(GAP) * (len(widths) - 1) - limit
    if excess <= 0:
        return widths
    floors = [MIN_FLEXIBLE, len(ELLIPSIS) + 1] if limit >= BLOCKS_BELOW else [MIN_FLEXIBLE]
    for i in flexible:  # a column is cut as far as it may go before the next one is touched
        for least in floors:
            given = min(excess, max(widths[i] - min(natural[i], max(least, display_width(header[i]))), 0))
            widths[i] -= given
            excess -= given
            if excess <= 0:
                return widths
    return None


def _blocks(rows: Sequence[Sequence[str]], limit: int) -> list[str]:
    """Each row as `HEADER  value` lines, a blank line between rows: for a terminal too narrow for columns."""
    header = rows[0]
    label = max(display_width(name) for name in header)
    room = max(limit - label - len(GAP), len(ELLIPSIS) + 1)
    lines: list[str] = []
    for row in rows[1:]:
        if lines:
            lines.append("")
        for name, cell in zip(header, row, strict=True):
            pad = " " * (label - display_width(name))
            lines.append(f"{name}{pad}{GAP}{cut(cell, room)}".rstrip())
    return lines
