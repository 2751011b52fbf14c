"""Looking for secrets in a stream the broker relays, across the pieces it arrives in.

- `placeholders_in(data)`: the placeholders (any VM's) a piece of a request holds; `PlaceholderScan` does the same
  across pieces (with an overlap of one placeholder's length).
- `Scanner`: the real values the broker holds, in a response as it streams to the VM. Each piece is checked with
  the tail of the one before it, and the end of what was seen is held back only while it could be the start of a
  real value (so a secret is never sent in part; a model's answer is not delayed, since its pieces do not end
  in the start of a token). `variants()` gives the spellings a value may be echoed in (percent-encoded, with
  JSON's escaped slash).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from agentbox import lazyre
from agentbox.net.broker import PLACEHOLDER_MARK

PLACEHOLDER = lazyre.compile(re.escape(PLACEHOLDER_MARK).encode() + rb"[0-9a-f]{24}")
PLACEHOLDER_LENGTH = len(PLACEHOLDER_MARK) + 24
ANCHOR = 8  # the bytes a value's start is looked for by before it is compared whole
MIN_SECRET = 8  # a shorter value is not scanned for (it would match ordinary text)


def placeholders_in(data: bytes) -> list[str]:
    return [match.group().decode() for match in PLACEHOLDER.finditer(data)]


class PlaceholderScan:
    """The placeholders in a stream, found however it is cut into pieces."""

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, piece: bytes) -> list[str]:
        data = self.tail + piece
        self.tail = data[-(PLACEHOLDER_LENGTH - 1):]
        return placeholders_in(data)


def variants(values: Iterable[str]) -> list[bytes]:
    """Each value as it may be echoed: as it is, percent-encoded (a URL), with JSON's escaped slash; distinct, each
    at least MIN_SECRET bytes."""
    found: dict[bytes, None] = {}
    for value in values:
        if not value or len(value) < MIN_SECRET:
            continue
        for form in (value, quote(value, safe=""), quote(value, safe="/"), value.replace("/", "\\/")):
            found[form.encode("utf-8", "surrogateescape")] = None
    return list(found)


class Leak(Exception):
    """A real value in a response: the response is ended, never sent on."""


class Scanner:
    """Checks a response's bytes for `needles` before they are sent on."""

    def __init__(self, needles: Iterable[bytes]) -> None:
        self.needles = [needle for needle in needles if len(needle) >= MIN_SECRET]
        self.longest = max((len(needle) for needle in self.needles), default=0)
        self.held = b""

    def feed(self, piece: bytes) -> bytes:
        """What may be sent of `piece` now (the rest is held); Leak when a needle is in what was seen."""
        if not self.needles:
            return piece
        data = self.held + piece
        for needle in self.needles:
            if needle in data:
                raise Leak()
        keep = self._partial_start(data)
        self.held = data[keep:]
        return data[:keep]

    def flush(self) -> bytes:
        held, self.held = self.held, b""
        return held

    def _partial_start(self, data: bytes) -> int:
        """Where the longest end of `data` that is the start of a needle begins (len(data): none)."""
        size = len(data)
        keep = size
        window = max(0, size - self.longest + 1)
        for needle in self.needles:
            anchor = needle[:ANCHOR]
            at = data.find(anchor, window)
            while at != -1 and at < keep:
                if needle.startswith(data[at:]):
                    keep = at
                    break
                at = data.find(anchor, at + 1)
            for length in range(1, min(ANCHOR - 1, size) + 1):  # an end shorter than the anchor
                if size - length < keep and data.endswith(needle[:length]):
                    keep = size - length
        return keep
