"""HTTP/1.1 as the broker reads it from the VM and from the real hosts: strict, so that nothing the broker judged
can mean something else to the server it goes to (RFC 9110/9112).

A request head is refused (`WireError`) for anything a lenient server might read another way: a method that is not
upper-case letters, a target with a space, a control character or a byte above 0x7E, a fragment, a version other
than HTTP/1.0 and HTTP/1.1, a header name that is not a token, a folded header line, a bare CR or LF, a NUL.
Bodies are framed by a single `Content-Length` of digits or by `Transfer-Encoding: chunked` alone; chunk sizes are
1 to 16 hex digits, extensions are dropped, a request's trailers must be empty. `body()` yields the body's content
(de-chunked), so that what is scanned is what the server reads; `chunk()` frames it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from agentbox import lazyre

CHUNK = 1 << 20  # a body is read in pieces of up to this size (fewer passes through asyncio per MB)
MAX_TRAILERS = 8 * 1024

_METHOD = lazyre.compile(r"[A-Z]{1,20}")
_TOKEN = lazyre.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = lazyre.compile(r"[\x21-\x7e]+")
_VALUE_BAD = lazyre.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value: visible characters, space and tab
_CHUNK_SIZE = lazyre.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[^\r\n]*)?\r\n")


class WireError(Exception):
    """What the broker cannot read; the request is refused with this reason, never forwarded."""


class Head(NamedTuple):
    first: tuple[str, str, str]  # request: method, target, version; response: version, status, reason
    headers: list[tuple[str, str]]  # as sent (names as spelled), values without surrounding whitespace

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]

    def value(self, name: str) -> str | None:
        found = self.values(name)
        return found[0] if found else None


class Framing(NamedTuple):
    chunked: bool
    length: int | None  # None with chunked, or a response delimited by the connection's end


NO_BODY = Framing(False, 0)


def _lines(raw: bytes) -> list[str]:
    if not raw.endswith(b"\r\n\r\n"):
        raise WireError("the head does not end with an empty line")
    text = raw[:-4].decode("latin-1")
    if "\n" in text.replace("\r\n", "") or "\r" in text.replace("\r\n", "") or "\0" in text:
        raise WireError("a bare CR or LF, or a NUL, in the head")
    return text.split("\r\n")


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    headers = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            raise WireError("a folded header line")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise WireError(f"a malformed header line ({name[:40]!r})")
        value = value.strip(" \t")
        if _VALUE_BAD.search(value):
            raise WireError(f"a control character in the {name[:40]} header")
        headers.append((name, value))
    return headers


def parse_request(raw: bytes) -> Head:
    """A request head up to and including its empty line."""
    lines = _lines(raw)
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise WireError("a malformed request line")
    method, target, version = parts
    if not _METHOD.fullmatch(method):
        raise WireError("a method that is not upper-case letters")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise WireError(f"HTTP version {version[:20]!r} (the broker speaks HTTP/1.1)")
    if not _TARGET.fullmatch(target) or "#" in target:
        raise WireError("a request target with a character it may not have")
    return Head((method, target, version), _headers(lines[1:]))


def parse_response(raw: bytes) -> tuple[int, Head]:
    """A response head: its status and the head."""
    lines = _lines(raw)
    version, _, rest = lines[0].partition(" ")
    status_text, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not (len(status_text) == 3 and status_text.isdigit()):
        raise WireError("a malformed status line")
    return int(status_text), Head((version, status_text, reason), _headers(lines[1:]))


def request_framing(head: Head) -> Framing:
    encodings, lengths = head.values("transfer-encoding"), head.values("content-length")
    if encodings:
        if lengths or len(encodings) != 1 or encodings[0].lower() != "chunked":
            raise WireError("a Transfer-Encoding other than chunked alone")
        return Framing(True, None)
    return Framing(False, _length(lengths) if lengths else 0)


def response_framing(method: str, status: int, head: Head) -> Framing:
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return NO_BODY
    encodings, lengths = head.values("transfer-encoding"), head.values("content-length")
    if encodings:
        codings = [c.strip().lower() for value in encodings for c in value.split(",")]
        if codings[-1] != "chunked" or codings.count("chunked") != 1:
            raise WireError("an answer framed by a Transfer-Encoding other than chunked")
        if len(codings) > 1:
            raise WireError(f"an answer with the transfer coding {codings[0]!r}")
        return Framing(True, None)
    if lengths:
        return Framing(False, _length(lengths))
    return Framing(False, None)


def _length(values: list[str]) -> int:
    if len(set(values)) != 1 or not values[0].isdigit() or len(values[0]) > 18:
        raise WireError("a malformed Content-Length")
    return int(values[0])


async def body(reader: asyncio.StreamReader, framing: Framing, trailers_allowed: bool = False
               ) -> AsyncIterator[bytes]:
    """The body's content as it comes (de-chunked). A response's trailers are read and dropped; a request's must be
    empty (a trailer field is a header a server may read after the broker judged the head)."""
    if not framing.chunked:
        if framing.length is None:
            while piece := await reader.read(CHUNK):
                yield piece
            return
        async for piece in _exactly(reader, framing.length):
            yield piece
        return
    while True:
        size = chunk_size(await reader.readuntil(b"\r\n"))
        if size == 0:
            await _trailers(reader, trailers_allowed)
            return
        async for piece in _exactly(reader, size):
            yield piece
        if await reader.readexactly(2) != b"\r\n":
            raise WireError("a chunk not followed by CRLF")


async def _exactly(reader: asyncio.StreamReader, count: int) -> AsyncIterator[bytes]:
    """`count` bytes, in the pieces they come in."""
    left = count
    while left:
        piece = await reader.read(min(CHUNK, left))
        if not piece:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(piece)
        yield piece


async def _trailers(reader: asyncio.StreamReader, allowed: bool) -> None:
    seen = 0
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        seen += len(line)
        if not allowed:
            raise WireError("trailer fields after a chunked request body")
        if seen > MAX_TRAILERS:
            raise WireError("trailers over 8 KB")


def chunk_size(line: bytes) -> int:
    """A chunk's size line: 1 to 16 hex digits, optional extensions (dropped); anything else is refused."""
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise WireError("a malformed chunk size")
    return int(match.group(1), 16)


async def whole(reader: asyncio.StreamReader, framing: Framing, limit: int) -> bytes:
    """The whole body (at most `limit` bytes, else WireError)."""
    if framing.length is not None and framing.length > limit:
        raise WireError(f"a body over {limit:,} bytes where the broker must read it whole")
    parts: list[bytes] = []
    total = 0
    async for piece in body(reader, framing):
        total += len(piece)
        if total > limit:
            raise WireError(f"a body over {limit:,} bytes where the broker must read it whole")
        parts.append(piece)
    return b"".join(parts)


def chunk(data: bytes) -> bytes:
    """`data` as one chunk (nothing for no data: an empty chunk would end the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""


LAST_CHUNK = b"0\r\n\r\n"


def head_bytes(first: str, headers: list[tuple[str, str]]) -> bytes:
    return (first + "\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n").encode("latin-1")


_ESCAPE = lazyre.compile(r"%([0-9A-Fa-f]{2})")


def normal_path(path: str) -> str:
    """The path as the broker decides by it: percent-escapes decoded once (an escaped slash or dot counts as one),
    a segment's `;parameters` dropped, dot segments resolved, repeated and trailing slashes dropped. A server may
    route a path in any of these spellings; the broker's rules are allow-lists, and what it refuses by name (a
    push, GraphQL, Copilot's token exchange) it must see however spelled, so the widest reading is the safe one.
    WireError for a path that is not absolute, a malformed escape, a backslash or a control character."""
    if not path.startswith("/"):
        raise WireError("a request path that does not start with /")
    if "%" in _ESCAPE.sub("", path):
        raise WireError("a malformed percent-escape in the path")
    decoded = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)
    if "\\" in decoded or any(ord(char) < 0x20 or ord(char) == 0x7F for char in decoded):
        raise WireError("a backslash or a control character in the path")
    segments: list[str] = []
    for segment in decoded.split("/"):
        segment = segment.partition(";")[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)
