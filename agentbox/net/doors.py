"""Leaks caught at the allowed doors: canaries and private files' content in what the proxy and the broker see.

Two files in the VM's network folder (beside log.jsonl) say what must not leave; the proxy rereads them when they
change (`Watch`):
  canaries.json  the canary secrets planted in the VM, per session (agentbox.session.canaries; 0600):
                 {"sessions": [{"id", "started", "values": {KIND: [VALUE, ...]}}]}
  private.json   fingerprints of the workspace's private files (agentbox.session.privatefiles; 0600):
                 {"window": 64, "files": [{"path", "crc": base64 of uint32s, "check": base64 of uint64s}]}

A fingerprint is every WINDOW-byte run of a private file: crc32 finds a candidate fast, an 8-byte blake2b confirms
it. The proxy hashes a request body's windows every STRIDE bytes (from the body's first byte, across the pieces it
arrives in), so a run of WINDOW + STRIDE - 1 bytes (95) of a private file is always caught, a shorter one from 64
bytes on sometimes, anything shorter never. Each body is looked at as sent, gzip/deflate-decoded (its
Content-Encoding, and each gzip stream found inside it), and base64-decoded (standard and url-safe, a run of at least
MIN_BASE64 base64 characters, line breaks allowed, decoded from where the run starts); canaries are looked for in
each view, and in the request line and headers (with their base64 runs: Basic credentials).

`Doors.head(text)` and `Doors.body(encoding)` (a `BodyCheck`: `feed(piece)` before the piece goes on, `end()`) give
a `Hit` (what: the canary's kind, or `private` with the file) or None.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import gc
import json
import os
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import lazyre
from agentbox.net.fingerprints import CANARIES_FILE, PRIVATE_FILE, STRIDE, WINDOW, confirm
from agentbox.net.placement import Refusal

MIN_BASE64 = 24
GRAM = 8  # canaries are found by pieces of this many bytes, looked up every GRAM_STRIDE bytes
GRAM_STRIDE = 12
MAX_EMBEDDED = 8  # gzip streams looked into per body
KINDS = {"aws": "the cloud-credentials file (~/.aws/credentials)", "env": "the session's environment",
         "dotenv": "the .env file in the home (~/.env)"}
# base64 runs are found on a mask of the data (translate and find run in C; a regular expression tries every byte)
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-\r\n"
_MASK = bytes(ord("a") if byte in _ALPHABET else ord("=") if byte == ord("=") else ord(" ") for byte in range(256))
_RUN_START = b"a" * MIN_BASE64
_RUN_END = lazyre.compile(rb"[^a]")
_PADDING_END = lazyre.compile(rb"[^=]")
_BASE64_CHAR = lazyre.compile(rb"[A-Za-z0-9+/_\-\r\n]*")
_WORD = lazyre.compile(rb"[A-Za-z0-9_]+")
_WORD_RUN = lazyre.compile(rb"[A-Za-z0-9_]{%d,}" % (GRAM + GRAM_STRIDE - 1))  # long enough to hold a long canary
_URLSAFE = bytes.maketrans(b"-_", b"+/")
_GZIP_MAGIC = b"\x1f\x8b\x08"


class Hit(NamedTuple):
    what: str  # a canary's kind (KINDS) or "private"
    file: str | None = None  # a private file's workspace-relative path

    def reason(self, host: str) -> str:
        """What the log says: which secret, never its value."""
        if self.what == "private":
            return f"attempted leak: content of the private file {self.file} in a request to {host}"
        return f"attempted leak: a canary secret from {KINDS.get(self.what, self.what)} in a request to {host}"


class LeakRefused(Refusal):
    """A request refused as an attempted leak (403): the log line's decision is `leak`."""

    def __init__(self, hit: Hit, host: str) -> None:
        super().__init__(403, "attempted leak: the request carried a secret that may not leave the VM; it was not "
                              "sent")
        self.hit = hit
        self.logged = hit.reason(host)


def mark(entry: dict[str, Any], error: BaseException) -> None:
    """A refused request's log entry, when it was refused as a leak: decision `leak`, `what` (and `file`)."""
    if isinstance(error, LeakRefused):
        entry["decision"], entry["reason"], entry["what"] = "leak", error.logged, error.hit.what
        if error.hit.file is not None:
            entry["file"] = error.hit.file


class Doors:
    """What must not leave: canary values (with their kind) and private files' fingerprints."""

    def __init__(self, canaries: dict[bytes, str] | None = None,
                 crcs: dict[int, int] | None = None, checks: set[int] | None = None,
                 files: list[str] | None = None) -> None:
        self.needles = sorted((canaries or {}).items())
        self.longest = max((len(needle) for needle, _ in self.needles), default=0)
        # Canaries are word characters (agentbox.session.canaries.make): only runs of them long enough to hold one
        # need their pieces looked up, and ordinary text and code have few (a value of another kind: every piece).
        self.wordy = all(_WORD.fullmatch(needle) for needle, _ in self.needles)
        self.grams = _grams(self.needles)
        self.lowered = _grams([(needle.lower(), kind) for needle, kind in self.needles])  # a host name: any case
        self.crcs = crcs or {}
        self.checks = checks or set()
        self.files = files or []

    @property
    def empty(self) -> bool:
        return not self.needles and not self.crcs

    def head(self, text: bytes) -> Hit | None:
        """A canary in a request's line and headers (as sent, in any case, and in their base64 runs)."""
        if not self.needles:
            return None
        check = BodyCheck(self, None, fingerprints=False)
        return check.feed(text) or check.end() or self.canary(text.lower(), self.lowered)

    def body(self, encoding: str | None) -> BodyCheck:
        return BodyCheck(self, encoding)

    def canary(self, data: bytes, grams: _Grams | None = None) -> Hit | None:
        """A canary in `data`: its GRAM-byte pieces every GRAM_STRIDE bytes looked up, a candidate compared whole
        (every value is at least GRAM + GRAM_STRIDE - 1 bytes long, so one of its pieces is always looked up)."""
        index, short = grams or self.grams
        for needle, kind in short:
            if needle in data:
                return Hit(kind)
        if not index:
            return None
        if not self.wordy:
            return _pieces(data, 0, len(data), index)
        for run in _WORD_RUN.finditer(data):
            hit = _pieces(data, run.start(), run.end(), index)
            if hit is not None:
                return hit
        return None


def _pieces(data: bytes, start: int, end: int, index: dict[bytes, list[tuple[bytes, str]]]) -> Hit | None:
    """The canary among data[start:end]'s GRAM-byte pieces every GRAM_STRIDE bytes, compared whole."""
    for at in range(start, end - GRAM + 1, GRAM_STRIDE):
        found = index.get(data[at:at + GRAM])
        if found is not None:
            for needle, kind in found:
                if needle in data[max(0, at - len(needle)):at + len(needle) + GRAM]:
                    return Hit(kind)
    return None


_Grams = tuple[dict[bytes, list[tuple[bytes, str]]], list[tuple[bytes, str]]]


def _grams(needles: list[tuple[bytes, str]]) -> _Grams:
    """Each value's GRAM-byte pieces (at every offset) to the values they are in; values too short for them."""
    index: dict[bytes, list[tuple[bytes, str]]] = {}
    short = []
    for needle, kind in needles:
        if len(needle) < GRAM + GRAM_STRIDE - 1:
            short.append((needle, kind))
            continue
        for at in range(len(needle) - GRAM + 1):
            index.setdefault(needle[at:at + GRAM], []).append((needle, kind))
    return index, short


NONE = Doors()


class _Stream:
    """One view of a body: canaries looked for with an overlap, windows hashed every STRIDE bytes from its start."""

    def __init__(self, doors: Doors, fingerprints: bool) -> None:
        self.doors = doors
        self.fingerprints = fingerprints and bool(doors.crcs)
        self.tail = b""
        self.pending = b""  # from the next window's start on

    def feed(self, data: bytes) -> Hit | None:
        if not data:
            return None
        doors = self.doors
        if doors.needles:
            seen = self.tail + data
            hit = doors.canary(seen)
            if hit is not None:
                return hit
            self.tail = seen[-(doors.longest - 1):] if doors.longest > 1 else b""
        if not self.fingerprints:
            return None
        buffer = self.pending + data
        last = len(buffer) - WINDOW
        if last < 0:
            self.pending = buffer
            return None
        view, crc, crcs = memoryview(buffer), zlib.crc32, doors.crcs
        found = [at for at in range(0, last + 1, STRIDE) if crc(view[at:at + WINDOW]) in crcs]
        for at in found:
            window = view[at:at + WINDOW]
            if confirm(window) in doors.checks:
                return Hit("private", doors.files[crcs[crc(window)]])
        self.pending = buffer[(last // STRIDE + 1) * STRIDE:]
        return None


class _Base64:
    """The base64 runs of a stream, decoded as they arrive (standard and url-safe alphabets, line breaks allowed)."""

    def __init__(self, doors: Doors, fingerprints: bool) -> None:
        self.doors = doors
        self.fingerprints = fingerprints
        self.carry = b""  # a short run at the end of the last piece, which the next may make long enough
        self.open: _Stream | None = None  # the decoded view of a run the last piece ended in
        self.quad = b""  # that run's characters not decoded yet (fewer than 4)

    def feed(self, data: bytes) -> Hit | None:
        data = self.carry + data
        self.carry = b""
        start = 0
        if self.open is not None:
            run = _BASE64_CHAR.match(data)
            length = run.end() if run is not None else 0
            hit = self._decode(data[:length], final=length < len(data))
            if hit is not None or length == len(data):
                return hit
            start = length
        for begin, end in _runs(data, start):
            self.open = _Stream(self.doors, self.fingerprints)
            self.quad = b""
            hit = self._decode(data[begin:end], final=end < len(data))
            if hit is not None:
                return hit
        tail = _BASE64_CHAR.match(data[-(MIN_BASE64 - 1):][::-1]) if self.open is None and data else None
        if tail is not None and tail.end():
            self.carry = data[len(data) - tail.end():]
        return None

    def end(self) -> Hit | None:
        if self.open is None:
            return None
        return self._decode(b"", final=True)

    def _decode(self, chars: bytes, final: bool) -> Hit | None:
        assert self.open is not None
        text = self.quad + chars.replace(b"\r", b"").replace(b"\n", b"").rstrip(b"=").translate(_URLSAFE)
        whole = len(text) // 4 * 4
        self.quad = text[whole:]
        try:
            decoded = binascii.a2b_base64(text[:whole]) if whole else b""
            if final and len(self.quad) > 1:
                decoded += binascii.a2b_base64(self.quad + b"=" * (4 - len(self.quad)))
        except binascii.Error:
            decoded = b""
        hit = self.open.feed(decoded)
        if hit is None and decoded.startswith(_GZIP_MAGIC):
            hit = _Gzip(self.doors, self.fingerprints, 31).feed(decoded)
        if final:
            self.open, self.quad = None, b""
        return hit


def _runs(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of at least MIN_BASE64 base64 characters (with its padding) from `start` on."""
    mask = data.translate(_MASK)
    at = mask.find(_RUN_START, start)
    while at != -1:
        stop = _RUN_END.search(mask, at + MIN_BASE64)
        end = stop.start() if stop is not None else len(data)
        padding = _PADDING_END.search(mask, end)
        end = padding.start() if padding is not None else len(data)
        yield at, end
        at = mask.find(_RUN_START, end)


class _Gzip:
    """A compressed stream's decoded view (gzip or zlib/deflate: wbits), checked as it decompresses."""

    def __init__(self, doors: Doors, fingerprints: bool, wbits: int) -> None:
        self.inner = zlib.decompressobj(wbits)
        self.stream = _Stream(doors, fingerprints)
        self.broken = False

    def feed(self, data: bytes) -> Hit | None:
        if self.broken or self.inner.eof:
            return None
        try:
            out = self.inner.decompress(data, 1 << 24)
        except zlib.error:
            self.broken = True
            return None
        return self.stream.feed(out)


class BodyCheck:
    """A request body's views, fed piece by piece before each piece is sent on."""

    def __init__(self, doors: Doors, encoding: str | None, fingerprints: bool = True) -> None:
        self.doors = doors
        self.raw = _Stream(doors, fingerprints)
        self.base64 = _Base64(doors, fingerprints)
        self.fingerprints = fingerprints
        coding = (encoding or "").strip().lower()
        self.decoded = _Gzip(doors, fingerprints, 47 if coding in ("gzip", "x-gzip") else 15) \
            if coding in ("gzip", "x-gzip", "deflate") else None
        self.embedded: list[_Gzip] = []
        self.offset = 0
        self.tail = b""
        self.starts: set[int] = set()

    def feed(self, piece: bytes) -> Hit | None:
        if self.doors.empty or not piece:
            return None
        for embedded in self.embedded:
            hit = embedded.feed(piece)
            if hit is not None:
                return hit
        hit = self.raw.feed(piece) or self.base64.feed(piece) or self._embedded(piece)
        if hit is None and self.decoded is not None:
            hit = self.decoded.feed(piece)
        self.offset += len(piece)
        return hit

    def end(self) -> Hit | None:
        if self.doors.empty:
            return None
        return self.base64.end()

    def _embedded(self, piece: bytes) -> Hit | None:
        """gzip streams that start in this piece (or across its start): each decoded from its magic on."""
        seen = self.tail + piece
        base = self.offset - len(self.tail)
        at = seen.find(_GZIP_MAGIC)
        hit = None
        while at != -1 and len(self.embedded) < MAX_EMBEDDED:
            if base + at not in self.starts:
                self.starts.add(base + at)
                stream = _Gzip(self.doors, self.fingerprints, 31)
                self.embedded.append(stream)
                hit = hit or stream.feed(seen[at:])
            at = seen.find(_GZIP_MAGIC, at + 1)
        self.tail = seen[-(len(_GZIP_MAGIC) - 1):]
        return hit


def load(folder: Path) -> Doors:
    """The doors as the folder's files say; a file that is missing or unreadable adds nothing."""
    canaries: dict[bytes, str] = {}
    for session in read_json(folder / CANARIES_FILE).get("sessions", []):
        values = session.get("values", {}) if isinstance(session, dict) else {}
        for kind, items in values.items():
            for value in items if isinstance(items, list) else []:
                if isinstance(value, str) and len(value) >= 8:
                    canaries[value.encode()] = str(kind)
    crcs: dict[int, int] = {}
    checks: set[int] = set()
    files: list[str] = []
    private = read_json(folder / PRIVATE_FILE)
    if private.get("window") == WINDOW:
        for record in private.get("files", []):
            try:
                crc = array("I", base64.b64decode(record["crc"]))
                check = array("Q", base64.b64decode(record["check"]))
            except (KeyError, TypeError, ValueError, binascii.Error):
                continue
            files.append(str(record.get("path")))
            crcs.update(dict.fromkeys(crc, len(files) - 1))
            checks.update(check)
    return Doors(canaries, crcs, checks, files)


def read_json(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Watch:
    """The folder's doors, read again when one of its files changed. Looked at for every request (two stats): a
    session's canaries are new when it starts, and its first request may come at once."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.doors = NONE
        self.seen: tuple[int, ...] = ()

    def current(self) -> Doors:
        if self.folder is None:
            return NONE
        stamps = tuple(_mtime(self.folder / name) for name in (CANARIES_FILE, PRIVATE_FILE))
        if stamps != self.seen:
            self.seen = stamps
            self.doors = load(self.folder)
            gc.freeze()  # a million fingerprints are never garbage: no collection walks them again
        return self.doors


def _mtime(path: Path) -> int:
    with contextlib.suppress(OSError):
        st = path.stat()
        return st.st_mtime_ns ^ st.st_size ^ st.st_ino
    return 0
