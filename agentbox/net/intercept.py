"""The broker's side of a CONNECT to a credential host: TLS as that host, every request checked, placeholders
swapped for the real values, and the request sent on to the real host over TLS verified as usual.

One client connection gets one upstream connection, opened at its first forwarded request and reused while
both sides keep it alive (HTTP/1.1). Request and response bodies stream through (a model's answer arrives as
it is written); a request body is scanned for placeholders as it passes, with an overlap across chunks, and
a leak found mid-body ends both connections before the request is complete. A 101 answer (a WebSocket)
turns the connection into a plain relay. The rules are agentbox.net.broker's docstring.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from agentbox.net.broker import MAX_EXCHANGE, PLACEHOLDER_MARK, Brokering, Exchange, Reply, Secret

MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0
# Headers that carry a credential; a request may carry one of them, once.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")
# Query parameters that carry one (Google's APIs take ?key=, OAuth ?access_token=).
CREDENTIAL_PARAMS = ("key", "api_key", "access_token")
_DROPPED = ("proxy-connection", "proxy-authorization", "expect")
GITHUB_WEB = "github.com"
GITHUB_API = frozenset({"api.github.com", "uploads.github.com"})
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

Log = Callable[[dict[str, Any]], None]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Opener = Callable[[str, int], Awaitable[Streams]]
POOL_PER_HOST = 4
POOL_IDLE_SEC = 30.0


class Pool:
    """Upstream connections a session left open and idle, kept for the next session to the same host: an agent
    CLI opening a new connection then pays one TLS handshake (with the broker), not two."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list[tuple[float, Streams]]] = {}

    def take(self, host: str, port: int) -> Streams | None:
        kept = self.idle.get((host, port), [])
        while kept:
            since, streams = kept.pop()
            if time.monotonic() - since < POOL_IDLE_SEC and not streams[0].at_eof():
                return streams
            streams[1].close()
        return None

    def give(self, host: str, port: int, streams: Streams) -> None:
        kept = self.idle.setdefault((host, port), [])
        kept.append((time.monotonic(), streams))
        while len(kept) > POOL_PER_HOST:
            kept.pop(0)[1][1].close()

    def close(self) -> None:
        for kept in self.idle.values():
            for _, streams in kept:
                streams[1].close()
        self.idle.clear()


class Refusal(Exception):
    def __init__(self, status: int, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.detail = detail or {}


@dataclass
class _Request:
    method: str
    target: str  # origin-form: path and query
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def sni_guard(host: str) -> Callable[[Any, str | None, ssl.SSLContext], int | None]:
    """An sni_callback for `host`'s leaf: a client that asks for another name (or none) gets no certificate."""

    def check(_obj: Any, name: str | None, _context: ssl.SSLContext) -> int | None:
        if name is None or name.lower().rstrip(".") != host:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        return None

    return check


async def start_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext,
                    server_hostname: str | None = None, timeout: float = HANDSHAKE_TIMEOUT) -> asyncio.StreamWriter:
    """Upgrade an open connection to TLS: its server side, or with `server_hostname` its client side (to the
    company proxy's tunnel); the same reader goes on reading the decrypted bytes."""
    if hasattr(writer, "start_tls"):  # Python 3.11+: the stream knows which side it is
        await writer.start_tls(context, server_hostname=server_hostname, ssl_handshake_timeout=timeout)
        return writer
    loop = asyncio.get_running_loop()
    protocol = writer.transport.get_protocol()
    side: dict[str, Any] = {"server_hostname": server_hostname} if server_hostname else {"server_side": True}
    transport = await loop.start_tls(writer.transport, protocol, context, ssl_handshake_timeout=timeout, **side)
    return asyncio.StreamWriter(transport, protocol, reader, loop)  # type: ignore[arg-type]


class Session:
    """One intercepted connection to `host`."""

    def __init__(self, broker: Brokering, host: str, port: int, client: str, open_upstream: Opener, log: Log,
                 idle_timeout: float, pool: Pool | None = None) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.client = client
        self.open_upstream = open_upstream
        self.log = log
        self.idle = idle_timeout
        self.pool = pool
        self.up: Streams | None = None
        self.reusable = False  # the upstream connection ended its last answer cleanly and stays open
        self.ours = {secret.placeholder: secret for secret in broker.secrets}
        self.longest = max((len(p) for p in self.ours), default=0)

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                entry = {"client": self.client, "method": request.method, "host": self.host, "port": self.port,
                         "path": request.path, "agent": None, "decision": "deny", "reason": ""}
                try:
                    keep = await self._one(request, reader, writer, entry)
                except Refusal as refusal:
                    entry["decision"], entry["reason"] = "deny", refusal.reason
                    await _send_refusal(writer, refusal, self.host, self.port)
                    keep = False
                finally:
                    entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    with contextlib.suppress(OSError):
                        self.log(entry)
                if not keep:
                    return
        finally:
            if self.up is not None and self.reusable and self.pool is not None and not self.up[0].at_eof():
                self.pool.give(self.host, self.port, self.up)
            elif self.up is not None:
                self.up[1].close()

    # -- one request -------------------------------------------------------------------------------------

    async def _one(self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   entry: dict[str, Any]) -> bool:
        """Decide and serve one request; False when the client connection must end after it."""
        if self.broker.down is not None:
            raise Refusal(503, f"agentbox's credential broker is not serving: {self.broker.down}",
                          {"fix": "fix that on the host, then `agentbox stop` and launch again (the broker restarts "
                                  "with the VM's next launch)"})
        self._check_target(request)
        framing = _request_framing(request)
        expects = (request.header("expect") or "").lower() == "100-continue"
        endpoint = self.broker.endpoints.get((self.host, request.path))
        # A token endpoint's handler judges the request's credentials itself (a refresh token is not a Secret).
        headers, query, agent = ([], "", None) if endpoint is not None else self._credentials(request)
        entry["agent"] = agent
        small_body: bytes | None = None
        graphql = self.host in GITHUB_API and request.method == "POST" and request.path == "/graphql"
        if endpoint is not None or graphql:
            if expects:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                expects = False
            small_body = await _read_whole(reader, framing, MAX_EXCHANGE)
            if endpoint is None:
                self._scan(small_body)
        self._check_push(request, small_body)
        if endpoint is not None:
            assert small_body is not None
            exchange = Exchange(self.host, request.method, request.target, tuple(request.headers), small_body)
            reply = await asyncio.get_running_loop().run_in_executor(None, endpoint, exchange)
            entry["decision"], entry["reason"] = "answer", "token endpoint answered on the host"
            await _send_reply(writer, reply, request.method)
            return _keep_alive(request)
        entry["decision"] = "substitute" if agent else "pass"
        entry["reason"] = f"{agent}'s credential" if agent else "no credential"
        return await self._forward(request, headers, query, framing, small_body, expects, reader, writer, entry)

    def _check_target(self, request: _Request) -> None:
        if not request.target.startswith("/"):
            parts = urlsplit(request.target)
            if parts.scheme != "https" or (parts.hostname or "").lower() != self.host:
                raise Refusal(403, f"a request inside the tunnel to {self.host} names another host")
            request.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        names = [value for key, value in request.headers if key.lower() == "host"]
        if len(names) != 1 or _authority_host(names[0], self.port) != self.host:
            raise Refusal(403, f"the Host header does not name {self.host}")

    def _credentials(self, request: _Request) -> tuple[list[tuple[str, str]], str, str | None]:
        """The request's headers and query with our placeholder replaced by its real value, and its agent.

        Refuses a foreign credential, a second one, and a placeholder that is not for this host."""
        found: list[tuple[str, Secret]] = []
        headers: list[tuple[str, str]] = []
        for key, value in request.headers:
            lower = key.lower()
            if lower in _DROPPED:
                continue
            if lower in CREDENTIAL_HEADERS:
                secret, value = self._swap_header(lower, value)
                found.append((lower, secret))
            else:
                self._scan(value.encode("latin-1"))
            headers.append((key, value))
        _, sep, query = request.target.partition("?")
        if sep:
            pairs = parse_qsl(query, keep_blank_values=True)
            changed = False
            for index, (name, value) in enumerate(pairs):
                if name.lower() in CREDENTIAL_PARAMS:
                    secret = self._own(value, f"the {name} parameter")
                    found.append((name, secret))
                    pairs[index] = (name, self._real(secret))
                    changed = True
                else:
                    self._scan(value.encode())
            if changed:
                query = "&".join(f"{quote(n, safe='')}={quote(v, safe='')}" for n, v in pairs)
        if len(found) > 1:
            raise Refusal(403, f"the request carries {len(found)} credentials ({', '.join(n for n, _ in found)}); "
                          "only one is passed")
        agent = found[0][1].agent if found else None
        return headers, query if sep else "", agent

    def _swap_header(self, name: str, value: str) -> tuple[Secret, str]:
        scheme, space, token = value.strip().partition(" ")
        if name == "authorization" and space and scheme.lower() == "basic":
            try:
                user, colon, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise Refusal(403, "a malformed Basic authorization") from None
            secret = self._own(password if colon else user, "Basic authorization")
            real = self._real(secret)
            pair = f"{user}:{real}" if password == secret.placeholder else f"{real}:{password}"
            return secret, f"{scheme} {base64.b64encode(pair.encode()).decode()}"
        if name == "authorization" and space:
            secret = self._own(token.strip(), "the Authorization header")
            return secret, f"{scheme} {self._real(secret)}"
        secret = self._own(value.strip(), f"the {name} header")
        return secret, self._real(secret)

    def _own(self, value: str, where: str) -> Secret:
        secret = self.ours.get(value)
        if secret is None:
            kind = "another VM's placeholder" if PLACEHOLDER_MARK in value else "a credential that is not this VM's"
            raise Refusal(403, f"{where} carries {kind}: only the VM's own login is passed to {self.host}")
        if self.host not in secret.hosts:
            raise Refusal(403, f"attempted leak: {secret.agent}'s placeholder sent to {self.host}, "
                          f"which is not one of its hosts")
        return secret

    def _real(self, secret: Secret) -> str:
        try:
            real = secret.real()
        except Exception as error:  # a host login file that turned unreadable or malformed: nothing goes out
            reason = getattr(error, "message", None) or str(error) or type(error).__name__
            raise Refusal(503, f"the host's {secret.agent} login cannot be read: {reason}",
                          {"fix": "fix or log in again on the host; the next request reads it again"}) from None
        if not real:
            raise Refusal(403, f"the host has no {secret.agent} login now: log in on the host, then try again")
        return real

    def _scan(self, data: bytes) -> None:
        """Refuse a placeholder of ours in a place other than a credential header (or bound for a foreign host)."""
        if PLACEHOLDER_MARK.encode() not in data:
            return
        for placeholder, secret in self.ours.items():
            if placeholder.encode() in data and self.host not in secret.hosts:
                raise Refusal(403, f"attempted leak: {secret.agent}'s placeholder sent to {self.host}, "
                              f"which is not one of its hosts")

    def _check_push(self, request: _Request, body: bytes | None) -> None:
        if self.broker.allow_push:
            return
        what = None
        if self.host == GITHUB_WEB:
            query = dict(parse_qsl(request.target.partition("?")[2]))
            if request.path.endswith("/git-receive-pack") or (
                    request.path.endswith("/info/refs") and query.get("service") == "git-receive-pack"):
                what = "a git push"
        elif self.host in GITHUB_API and request.method not in _SAFE_METHODS:
            if request.path == "/graphql" and request.method == "POST" and body is not None:
                if _graphql_writes(body):
                    what = "a GraphQL mutation"
            else:
                what = f"a write through GitHub's API ({request.method} {request.path})"
        if what:
            raise Refusal(403, f"{what} is refused: the VM's GitHub access is read-only",
                          {"allow": self.broker.push_hint})

    # -- forwarding --------------------------------------------------------------------------------------

    async def _forward(self, request: _Request, headers: list[tuple[str, str]], query: str, framing: _Framing,
                       body: bytes | None, expects: bool, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, entry: dict[str, Any]) -> bool:
        target = request.path + (f"?{query}" if query else "")
        head = (f"{request.method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
                + "\r\n").encode("latin-1")
        replayable = body is not None or (not framing.chunked and framing.length == 0)
        if self.up is not None and self.up[0].at_eof():
            self.up[1].close()
            self.up = None
        pooled = None
        if self.up is None and replayable and self.pool is not None:
            pooled = self.up = self.pool.take(self.host, self.port)
        self.reusable = False
        if expects:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            status, response_head, response_headers = await self._send(head, body, framing, reader)
        except (Refusal, ConnectionError, asyncio.IncompleteReadError):
            if pooled is None or self.up is not pooled:
                raise
            pooled[1].close()  # the host closed the kept connection meanwhile: once more on a new one
            self.up = None
            status, response_head, response_headers = await self._send(head, body, framing, reader)
        up_reader, up_writer = self.up  # type: ignore[misc]
        while 100 <= status < 200 and status != 101:  # interim answers (100 Continue, 103) pass on
            writer.write(response_head)
            status, response_head, response_headers = await _read_response_head(up_reader, self.idle)
        entry["status"] = status
        writer.write(response_head)
        if status == 101:
            await writer.drain()
            await _relay(reader, writer, up_reader, up_writer, self.idle)
            return False
        ends = await _copy_response_body(up_reader, writer, request.method, status, response_headers)
        await writer.drain()
        self.reusable = not ends and _keep_alive(request) and _keep_alive_headers(response_headers)
        return self.reusable

    async def _send(self, head: bytes, body: bytes | None, framing: _Framing, reader: asyncio.StreamReader
                    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        if self.up is None:
            self.up = await self.open_upstream(self.host, self.port)
        up_reader, up_writer = self.up
        up_writer.write(head)
        if body is not None:
            up_writer.write(_reframe(body, framing))
        else:
            await self._stream_body(reader, up_writer, framing)
        await up_writer.drain()
        return await _read_response_head(up_reader, self.idle)

    async def _stream_body(self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter,
                           framing: _Framing) -> None:
        tail = b""
        async for piece in _body_pieces(reader, framing):
            self._scan(tail + piece)
            tail = (tail + piece)[-self.longest:] if self.longest else b""
            up_writer.write(piece)
            await up_writer.drain()

    async def _read_request(self, reader: asyncio.StreamReader) -> _Request | None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle)
        except asyncio.IncompleteReadError as error:
            if error.partial.strip():
                raise Refusal(400, "incomplete request") from None
            return None
        except asyncio.LimitOverrunError:
            raise Refusal(431, "request head over 64 KB") from None
        try:
            method, target, version, headers = parse_head(raw)
        except ValueError:
            raise Refusal(400, "malformed request") from None
        return _Request(method, target, version, headers)


def parse_head(raw: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    """An HTTP/1.x request head (up to its blank line): method (upper case), target, version, headers as sent;
    ValueError when malformed."""
    lines = raw.decode("latin-1").split("\r\n")[:-2]
    method, target, version = lines[0].split(" ")
    if not version.startswith("HTTP/1.") or not method.isalpha():
        raise ValueError
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError
        headers.append((name, value.strip()))
    return method.upper(), target, version, headers


# -- HTTP/1.1 framing ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Framing:
    chunked: bool
    length: int


def _request_framing(request: _Request) -> _Framing:
    encodings = [v for k, v in request.headers if k.lower() == "transfer-encoding"]
    lengths = [v for k, v in request.headers if k.lower() == "content-length"]
    if encodings:
        if lengths or len(encodings) > 1 or encodings[0].strip().lower() != "chunked":
            raise Refusal(400, "unsupported request framing")
        return _Framing(True, 0)
    if len(lengths) > 1 or (lengths and not lengths[0].strip().isdigit()):
        raise Refusal(400, "malformed Content-Length")
    return _Framing(False, int(lengths[0]) if lengths else 0)


async def _body_pieces(reader: asyncio.StreamReader, framing: _Framing) -> Any:
    """The body's bytes as they come, re-framed exactly as they were sent (chunk headers included)."""
    if not framing.chunked:
        async for piece in _exactly(reader, framing.length):
            yield piece
        return
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = _chunk_size(size_line)
        yield size_line
        if size == 0:
            while True:  # trailers, then the empty line
                line = await reader.readuntil(b"\r\n")
                yield line
                if line == b"\r\n":
                    return
        async for piece in _exactly(reader, size + 2):  # the chunk and its CRLF
            yield piece


def _chunk_size(line: bytes) -> int:
    """The size a chunk's first line gives (hex, extensions after ';' ignored)."""
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise Refusal(400, "malformed chunk") from None


async def _exactly(reader: asyncio.StreamReader, count: int) -> Any:
    """`count` bytes as they come."""
    left = count
    while left:
        piece = await reader.read(min(CHUNK, left))
        if not piece:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(piece)
        yield piece


async def _read_whole(reader: asyncio.StreamReader, framing: _Framing, limit: int) -> bytes:
    """The body, de-chunked (for a handler or a check that needs it whole)."""
    if not framing.chunked:
        if framing.length > limit:
            raise Refusal(413, "request body too large for this endpoint")
        return await reader.readexactly(framing.length)
    parts: list[bytes] = []
    total = 0
    while True:
        size = _chunk_size(await reader.readuntil(b"\r\n"))
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        total += size
        if total > limit:
            raise Refusal(413, "request body too large for this endpoint")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _reframe(body: bytes, framing: _Framing) -> bytes:
    if framing.chunked:
        return (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    return body


async def _read_response_head(reader: asyncio.StreamReader, idle: float) -> tuple[int, bytes, list[tuple[str, str]]]:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), idle)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise Refusal(502, "the upstream ended or sent a malformed answer") from None
    lines = raw.decode("latin-1").split("\r\n")[:-2]
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise Refusal(502, "the upstream sent a malformed status line") from None
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return status, raw, headers


async def _copy_response_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                              status: int, headers: list[tuple[str, str]]) -> bool:
    """Copy the body as it comes; True when its end is the connection's end."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return False
    encodings = [v.strip().lower() for k, v in headers if k.lower() == "transfer-encoding"]
    lengths = [v.strip() for k, v in headers if k.lower() == "content-length"]
    if encodings and encodings[-1] == "chunked":
        framing = _Framing(True, 0)
    elif lengths and lengths[0].isdigit():
        framing = _Framing(False, int(lengths[0]))
    else:
        while piece := await reader.read(CHUNK):
            writer.write(piece)
            await writer.drain()
        return True
    async for piece in _body_pieces(reader, framing):
        writer.write(piece)
        await writer.drain()
    return False


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                 up_writer: asyncio.StreamWriter, idle: float) -> None:
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while piece := await asyncio.wait_for(src.read(CHUNK), idle):
            dst.write(piece)
            await dst.drain()

    tasks = [asyncio.ensure_future(pipe(reader, up_writer)), asyncio.ensure_future(pipe(up_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _keep_alive(request: _Request) -> bool:
    connection = (request.header("connection") or "").lower()
    if request.version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


def _keep_alive_headers(headers: list[tuple[str, str]]) -> bool:
    return not any(k.lower() == "connection" and "close" in v.lower() for k, v in headers)


def _authority_host(authority: str, port: int) -> str:
    host, _, given = authority.strip().lower().rpartition(":") if authority.count(":") == 1 else (
        authority.strip().lower(), "", "")
    if given and given != str(port):
        return ""
    return host.rstrip(".")


_GRAPHQL_NOISE = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|"(?:[^"\\\n]|\\.)*"|#[^\n]*')


def _graphql_writes(body: bytes) -> bool:
    """Whether a GraphQL request could write: any mutation or subscription in it, or a body it cannot read."""
    try:
        data = json.loads(body)
    except ValueError:
        return True
    documents = data if isinstance(data, list) else [data]
    for document in documents:
        query = document.get("query") if isinstance(document, dict) else None
        if not isinstance(query, str):
            return True
        text = _GRAPHQL_NOISE.sub(" ", query)
        depth = 0
        for token in re.finditer(r"[{}()]|[A-Za-z_][A-Za-z0-9_]*", text):
            word = token.group()
            if word in "{(":
                depth += 1
            elif word in "})":
                depth -= 1
            elif depth == 0 and word in ("mutation", "subscription"):
                return True
    return False


# -- answers of the broker's own -----------------------------------------------------------------------------

_STATUS = {400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable"}


async def _send_refusal(writer: asyncio.StreamWriter, refusal: Refusal, host: str, port: int) -> None:
    # `message` is what GitHub's clients (gh, Octokit) show from an error's JSON ("gh: HTTP 403" without it).
    allow = refusal.detail.get("allow")
    message = f"agentbox credential broker: {refusal.reason}" + (f" (allowed by {allow})" if allow else "")
    body = {"blocked": host, "port": port, "reason": refusal.reason, "by": "agentbox credential broker",
            "message": message, **refusal.detail}
    data = json.dumps(body).encode() + b"\n"
    head = (f"HTTP/1.1 {refusal.status} {_STATUS.get(refusal.status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(ConnectionError, asyncio.TimeoutError, RuntimeError):
        writer.write(head + data)
        await asyncio.wait_for(writer.drain(), 5)


async def _send_reply(writer: asyncio.StreamWriter, reply: Reply, method: str) -> None:
    kept = [(k, v) for k, v in reply.headers if k.lower() not in ("content-length", "connection",
                                                                    "transfer-encoding")]
    head = f"HTTP/1.1 {reply.status} {_STATUS.get(reply.status, 'OK' if reply.status < 400 else 'Error')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in kept) + f"Content-Length: {len(reply.body)}\r\n\r\n"
    writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else reply.body))
    await writer.drain()
