"""The broker's side of a CONNECT to a credential host: TLS as that host, every request judged, this VM's placeholder
swapped for the real value where its service takes it, and the answer checked on its way back.

One client connection gets one upstream connection, opened at its first forwarded request and reused while both
sides keep it alive (HTTP/1.1), and kept for the next connection to the same host (`Pool`). Per request:
1. The head is read strictly (agentbox.net.httpwire); what the broker cannot read is refused (403 JSON, logged),
   never forwarded. The target (origin- or absolute-form), the Host header and the TLS name must all be the host.
2. A token endpoint's request goes to its handler, answered on the host (agentbox.credentials.tokens).
3. Otherwise agentbox.net.placement puts the real value in its place (or refuses), agentbox.net.github keeps GitHub
   read-only (or scoped), and the body streams through with every piece scanned for placeholders (de-chunked, so a
   chunk boundary hides nothing); GraphQL, LFS and push bodies are read first where GitHub's rules need them.
4. The answer's head and body are scanned for every real value the broker holds (and for what this request was
   given): the broker asks for identity encoding, decodes gzip and deflate when it gets them anyway, and a hit ends
   the answer where it stands (logged as an attempted leak) — a secret is never sent in part (agentbox.net.scan).
5. A WebSocket upgrade (Codex streams over one) is relayed frame by frame, both ways checked
   (agentbox.net.websocket).
6. Leaks at the door (agentbox.net.doors): a request whose line, headers or body carries one of the VM's canary
   secrets or a chunk of a private file is refused (403, logged as decision `leak`); a streamed body is checked piece
   by piece before each piece is sent on.
The rules are agentbox.net.broker's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

from agentbox.net import doors, github, httpwire, placement, scan, uploads, websocket
from agentbox.net.broker import MAX_EXCHANGE, Brokering, Exchange, Reply
from agentbox.net.httpwire import Framing, Head, WireError
from agentbox.net.placement import Refusal
from agentbox.net.scan import Leak, Scanner

MAX_HEAD = 64 * 1024
CHUNK = httpwire.CHUNK
HANDSHAKE_TIMEOUT = 10.0
PREFETCH = 1 << 20  # a request body up to this size is read whole and judged before anything is sent
# Never sent on: the proxy's own, and hop-by-hop headers the broker sets itself.
_DROPPED = frozenset({"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "trailer",
                      "upgrade", "expect", "accept-encoding", "sec-websocket-extensions", "transfer-encoding",
                      "content-length", "host"})
_RESPONSE_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "trailer"})
_DECODED = ("gzip", "x-gzip", "deflate")

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


class Cut(Exception):
    """An answer ended where it stood (the client has part of it): why, for the log."""


class Capped(Refusal):
    """A request to a host past its upload cap (agentbox.net.uploads): logged as decision `cap`."""


class _FrameJudge:
    """A relayed WebSocket's client frames, one stream of messages: what must not leave (agentbox.net.doors) and
    the host's upload cap (agentbox.net.uploads), judged before each frame goes on."""

    def __init__(self, session: Session, entry: dict[str, Any]) -> None:
        self.session, self.entry = session, entry
        self.check = session.doors.body(None)
        self.decision = ""

    def __call__(self, frame: websocket.Frame) -> str | None:
        hit = self.check.feed(frame.payload) if not self.session.doors.empty else None
        if hit is not None:
            refused = doors.LeakRefused(hit, self.session.host)
            doors.mark(self.entry, refused)
            self.decision = "leak"
            return refused.logged
        try:
            self.session._count(len(frame.raw))
        except Capped as capped:
            self.decision = uploads.DECISION
            return capped.reason
        return None


class Session:
    """One intercepted connection to `host`."""

    doors = doors.NONE  # what must not leave (agentbox.net.doors): the proxy sets the VM's

    def __init__(self, broker: Brokering, host: str, port: int, client: str, open_upstream: Opener, log: Log,
                 idle_timeout: float, pool: Pool | None = None, counter: uploads.Counter | None = None) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.client = client
        self.open_upstream = open_upstream
        self.log = log
        self.idle = idle_timeout
        self.pool = pool
        self.counter = counter or uploads.Counter(None)
        self.sent = [0, 0]  # the current request's bytes up (head and body as forwarded) and down (its answer)
        self.view = placement.host_view(host, broker.secrets)
        self.up: Streams | None = None
        self.reusable = False  # the upstream connection ended its last answer cleanly and stays open

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                entry: dict[str, Any] = {"client": self.client, "method": None, "host": self.host, "port": self.port,
                                         "path": None, "agent": None, "decision": "deny", "reason": ""}
                keep = False
                self.sent = [0, 0]
                try:
                    head = await self._read_head(reader)
                    if head is None:
                        return
                    entry["method"] = head.first[0]
                    entry["path"] = _shown_path(head.first[1])
                    keep = await self._one(head, reader, writer, entry)
                except (Refusal, WireError) as error:
                    refusal = error if isinstance(error, Refusal) else Refusal(
                        403, f"a request the broker cannot read: {error}")
                    entry["decision"], entry["reason"] = "deny", refusal.reason
                    if isinstance(refusal, Capped):
                        entry["decision"] = uploads.DECISION
                    doors.mark(entry, refusal)
                    self._drop_upstream()
                    await _send_refusal(writer, refusal, self.host, self.port)
                except Cut as cut:
                    entry["decision"], entry["reason"] = "deny", str(cut)
                    self._drop_upstream()
                    writer.transport.abort()
                finally:
                    if entry["method"] is not None or entry["reason"]:
                        entry["bytes_up"], entry["bytes_down"] = self.sent
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

    def _drop_upstream(self) -> None:
        """The upstream connection is in an unknown state (a request cut short): it is closed, never reused."""
        if self.up is not None:
            self.up[1].close()
            self.up = None
        self.reusable = False

    async def _read_head(self, reader: asyncio.StreamReader) -> Head | None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle)
        except asyncio.IncompleteReadError as error:
            if error.partial.strip():
                raise WireError("an incomplete request") from None
            return None
        except asyncio.LimitOverrunError:
            raise WireError("a request head over 64 KB") from None
        return httpwire.parse_request(raw)

    # -- one request -------------------------------------------------------------------------------------

    async def _one(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   entry: dict[str, Any]) -> bool:
        """Decide and serve one request; False when the client connection must end after it."""
        if self.broker.down is not None:
            raise Refusal(503, f"agentbox's credential broker is not serving: {self.broker.down}",
                          {"fix": "fix that on the host, then `agentbox stop` and launch again (the broker restarts "
                                  "with the VM's next launch)"})
        method, target, _ = head.first
        self._no_leak_in_head(head)
        path, query = self._target(target, head)
        normal = httpwire.normal_path(path)
        framing = httpwire.request_framing(head)
        if self.counter.full(self.host):
            raise self._capped(bool(framing.chunked or framing.length))
        upgrade = _websocket_upgrade(head, method, framing)
        endpoint = self.broker.endpoints.get((self.host, normal))
        if endpoint is not None:
            return await self._answer(endpoint, head, path, query, framing, reader, writer, entry)
        placed = placement.place(self.view, method, path, normal, query, head.headers, self._real)
        agent = placed.secret.agent if placed.secret is not None else None
        entry["agent"] = agent
        verdict = github.judge(self.host, method, normal, query, placed.secret is not None,
                               self.broker.allow_push or self.host in self.broker.inspected,
                               self.broker.push_namespace)
        if verdict.refused:
            raise self._read_only(verdict.refused)
        whole: bytes | None = None
        source: Any = None
        push: tuple[github.Update, ...] = ()
        if verdict.body in (github.BODY_GRAPHQL, github.BODY_LFS):
            self._identity_body(head)
            _continue(writer, head)
            whole = await httpwire.whole(reader, framing, MAX_EXCHANGE)
            _scan_body(whole)
            why = github.check_body(verdict.body, whole)
            if why:
                raise self._read_only(why)
        elif verdict.body == github.BODY_PUSH:
            self._identity_body(head)
            _continue(writer, head)
            source, push = await self._read_push(reader, framing)
        elif framing.chunked or framing.length:
            _continue(writer, head)
            whole, source = await _prefetch(httpwire.body(reader, framing), PREFETCH)
            self._scan_prefetched(whole if whole is not None else b"")
        entry["decision"] = "substitute" if agent else "pass"
        entry["reason"] = f"{agent}'s credential" if agent else "no credential"
        if push:
            entry["pushed"] = [{"ref": u.ref, "old": u.old, "new": u.new} for u in push]
        return await self._forward(head, path, placed, framing, whole, source, upgrade, push, reader, writer, entry)

    def _target(self, target: str, head: Head) -> tuple[str, str]:
        """The request's path and raw query, the target and the Host header checked against the host."""
        if not target.startswith("/"):
            parts = urlsplit(target)
            if parts.scheme != "https" or parts.username is not None or parts.password is not None or \
                    (parts.hostname or "").rstrip(".") != self.host or parts.port not in (None, self.port):
                raise Refusal(403, f"a request inside the tunnel to {self.host} names another host")
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        names = head.values("host")
        if len(names) != 1 or _authority_host(names[0], self.port) != self.host:
            raise Refusal(403, f"the Host header does not name {self.host}")
        path, _, query = target.partition("?")
        return path, query

    def _real(self, secret: Any) -> str:
        try:
            real = secret.real()
        except Exception as error:  # a host login file that turned unreadable or malformed: nothing goes out
            reason = getattr(error, "message", None) or str(error) or type(error).__name__
            raise Refusal(503, f"the host's {secret.agent} login cannot be read: {reason}",
                          {"fix": "fix or log in again on the host; the next request reads it again"}) from None
        if not real:
            raise Refusal(403, f"the host has no {secret.agent} login now: log in on the host, then try again")
        return str(real)

    def _read_only(self, what: str) -> Refusal:
        if self.broker.push_namespace is not None and what.startswith("a push"):
            return Refusal(403, f"{what} is refused: the VM may push only to new branches under "
                                f"{self.broker.push_namespace} (git.allowPush: session)",
                           {"allow": self.broker.push_hint})
        return Refusal(403, f"{what} is refused: the VM's GitHub access is read-only", {"allow": self.broker.push_hint})

    async def _read_push(self, reader: asyncio.StreamReader, framing: Framing
                         ) -> tuple[Any, tuple[github.Update, ...]]:
        """A push's commands, read before anything is sent, and checked; the body to send (what was read first)."""
        pieces = httpwire.body(reader, framing)
        read = b""
        commands = None
        async for piece in pieces:
            read += piece
            try:
                commands = github.read_commands(read)
            except ValueError as error:
                raise self._read_only(f"a push the broker cannot read ({error})") from None
            if commands is not None or len(read) > github.MAX_COMMANDS:
                break
        if commands is None:
            raise self._read_only("a push the broker cannot read (no command list)")
        namespace = self.broker.push_namespace
        assert namespace is not None
        created = self.broker.pushes.created() if self.broker.pushes is not None else {}
        why = github.check_push(commands.updates, namespace, created)
        if why:
            if self.broker.pushes is not None:
                self.broker.pushes.record(commands.updates, f"refused: {why}")
            raise self._read_only(why)

        async def source() -> Any:
            yield read
            async for rest in pieces:
                yield rest

        return source(), commands.updates

    async def _answer(self, endpoint: Any, head: Head, path: str, query: str, framing: Framing,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter, entry: dict[str, Any]) -> bool:
        """A token endpoint's request, answered on the host by its handler (which judges the body's credentials)."""
        for name, value in head.headers:
            if scan.placeholders_in(value.encode("latin-1")):
                raise placement.leak("a placeholder", f"the {name} header", self.host)
        if scan.placeholders_in(f"{path}?{query}".encode()):
            raise placement.leak("a placeholder", "the request's target", self.host)
        _continue(writer, head)
        body = await httpwire.whole(reader, framing, MAX_EXCHANGE)
        target = path + (f"?{query}" if query else "")
        exchange = Exchange(self.host, head.first[0], target, tuple(head.headers), body)
        reply = await asyncio.get_running_loop().run_in_executor(None, endpoint, exchange)
        if _carries(reply.body, self._needles(())):
            raise Refusal(502, "attempted leak: the token endpoint's answer carried a real credential; it was not "
                               "sent on")
        if reply.refused:
            entry["decision"], entry["reason"] = "deny", reply.refused
        else:
            entry["decision"], entry["reason"] = "answer", "token endpoint answered on the host"
        entry["status"] = reply.status
        await _send_reply(writer, reply, head.first[0])
        return _keep_alive(head)

    def _needles(self, sent: Iterable[str]) -> list[bytes]:
        """What no answer may carry: every real value the broker holds now, and what this request was given."""
        if self.broker.held is not None:
            try:
                held = tuple(value for value in self.broker.held() if value)
            except Exception as error:  # without the real values no answer can be checked: nothing goes out
                raise Refusal(503, f"the broker cannot read the host's logins to check answers: "
                                   f"{type(error).__name__}: {error}") from None
        else:
            values = []
            for secret in self.broker.secrets:
                with contextlib.suppress(Exception):
                    values.append(secret.real())
            held = tuple(value for value in values if value)
        return _variants(held + tuple(sent))

    # -- forwarding --------------------------------------------------------------------------------------

    async def _forward(self, head: Head, path: str, placed: placement.Placed, framing: Framing,
                       whole: bytes | None, source: Any, upgrade: bool, push: tuple[github.Update, ...],
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter, entry: dict[str, Any]) -> bool:
        method = head.first[0]
        headers = [("Host", self.host)] + [(k, v) for k, v in placed.headers if k.lower() not in _DROPPED]
        if whole is not None:
            headers.append(("Content-Length", str(len(whole))))
        elif framing.chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        elif framing.length:
            headers.append(("Content-Length", str(framing.length)))
        headers.append(("Accept-Encoding", "identity"))
        if upgrade:
            headers += [("Connection", "Upgrade"), ("Upgrade", "websocket")]
        target = path + (f"?{placed.query}" if placed.query else "")
        raw_head = httpwire.head_bytes(f"{method} {target} HTTP/1.1", headers)
        if whole is not None:
            self._no_leak_in_body(head, [whole])
        elif source is not None:
            source = self._checked(head, source)
        replayable = source is None
        if self.up is not None and self.up[0].at_eof():
            self._drop_upstream()
        pooled = None
        if self.up is None and replayable and self.pool is not None:
            pooled = self.up = self.pool.take(self.host, self.port)
        self.reusable = False
        needles = self._needles(placed.sent)
        self._count(len(raw_head) + len(whole or b""))  # once: a retry on a new connection sends the same bytes
        try:
            status, raw, response = await self._send(raw_head, whole, framing, source, needles)
        except (ConnectionError, asyncio.IncompleteReadError, _UpstreamClosed):
            if pooled is None or self.up is not pooled:
                self._drop_upstream()
                raise Refusal(502, "the upstream closed the connection") from None
            self._drop_upstream()  # the host closed the kept connection meanwhile: once more on a new one
            status, raw, response = await self._send(raw_head, whole, framing, source, needles)
        while 100 <= status < 200 and status != 101:  # interim answers (100 Continue, 103) pass on
            writer.write(raw)
            status, raw, response = await self._response_head(needles)
        entry["status"] = status
        if status == 101:
            if not upgrade or response.value("sec-websocket-extensions") is not None:
                self._drop_upstream()
                raise Refusal(502, "the upstream switched protocols in a way the broker cannot read")
            writer.write(raw)
            await writer.drain()
            assert self.up is not None
            judge = _FrameJudge(self, entry)
            why = await websocket.relay((reader, writer), self.up, Scanner(needles), self._placeholder_reason,
                                        self.idle, judge)
            self._drop_upstream()
            if why:
                entry["decision"], entry["reason"] = judge.decision or "deny", why
            return False
        if push and self.broker.pushes is not None:
            return await self._relay_push(head, status, response, push, writer, needles)
        return await self._relay(head, status, response, writer, needles)

    def _capped(self, with_body: bool) -> Capped:
        reason, detail = self.counter.refusal(self.host)
        return Capped(413 if with_body else 403, reason, detail)

    def _count(self, size: int) -> None:
        """Count bytes about to go upstream against the host's upload cap; past it the request is refused."""
        if not self.counter.add(self.host, size):
            raise self._capped(True)
        self.sent[0] += size

    async def _send(self, raw_head: bytes, whole: bytes | None, framing: Framing, source: Any,
                    needles: list[bytes]) -> tuple[int, bytes, Head]:
        if self.up is None:
            self.up = await self.open_upstream(self.host, self.port)
        up_writer = self.up[1]
        up_writer.write(raw_head)
        if whole is not None:
            up_writer.write(whole)
        elif source is not None:
            # a long body streams: room for a few of its pieces in flight, so a drain waits less often
            up_writer.transport.set_write_buffer_limits(high=4 * CHUNK)
            scanned = scan.PlaceholderScan()
            async for piece in source:
                found = scanned.feed(piece)
                if found:
                    raise Refusal(403, self._placeholder_reason(found))
                self._count(len(piece))
                up_writer.write(httpwire.chunk(piece) if framing.chunked else piece)
                await up_writer.drain()
            if framing.chunked:
                up_writer.write(httpwire.LAST_CHUNK)
        await up_writer.drain()
        return await self._response_head(needles)

    def _no_leak_in_head(self, head: Head) -> None:
        if not self.doors.needles:
            return
        target = head.first[1]
        text = f"{head.first[0]} {target} {unquote(target)}\n" + "\n".join(f"{k}: {v}" for k, v in head.headers)
        hit = self.doors.head(text.encode("utf-8", "surrogateescape"))
        if hit is not None:
            raise doors.LeakRefused(hit, self.host)

    def _no_leak_in_body(self, head: Head, pieces: list[bytes]) -> None:
        check = self.doors.body(head.value("content-encoding"))
        for piece in pieces:
            hit = check.feed(piece)
            if hit is not None:
                raise doors.LeakRefused(hit, self.host)
        hit = check.end()
        if hit is not None:
            raise doors.LeakRefused(hit, self.host)

    async def _checked(self, head: Head, source: Any) -> Any:
        """A streamed body's pieces, each checked before it is sent on."""
        check = self.doors.body(head.value("content-encoding"))
        async for piece in source:
            hit = check.feed(piece)
            if hit is not None:
                raise doors.LeakRefused(hit, self.host)
            yield piece
        hit = check.end()
        if hit is not None:
            raise doors.LeakRefused(hit, self.host)

    def _identity_body(self, head: Head) -> None:
        encodings = [c.strip().lower() for v in head.values("content-encoding") for c in v.split(",") if c.strip()]
        if encodings and encodings != ["identity"]:
            raise self._read_only(f"a {'/'.join(encodings)}-encoded request body (the broker must read it)")

    def _scan_prefetched(self, data: bytes) -> None:
        found = scan.placeholders_in(data)
        if found:
            raise Refusal(403, self._placeholder_reason(found))

    def _placeholder_reason(self, found: list[str]) -> str:
        ours = [self.view.secrets[p].agent for p in found if p in self.view.secrets]
        whose = f"{ours[0]}'s placeholder" if ours else "another VM's placeholder"
        return (f"attempted leak: {whose} in the body of a request to {self.host}, where no service takes it (if "
                "the conversation quoted a login file, start a new one)")

    async def _response_head(self, needles: list[bytes]) -> tuple[int, bytes, Head]:
        assert self.up is not None
        try:
            raw = await asyncio.wait_for(self.up[0].readuntil(b"\r\n\r\n"), self.idle)
        except asyncio.IncompleteReadError as error:
            if not error.partial:
                raise _UpstreamClosed() from None
            raise Refusal(502, "the upstream ended its answer early") from None
        except asyncio.LimitOverrunError:
            raise Refusal(502, "the upstream sent an answer head over 64 KB") from None
        if len(raw) > MAX_HEAD:
            raise Refusal(502, "the upstream sent an answer head over 64 KB")
        try:
            status, head = httpwire.parse_response(raw)
        except WireError as error:
            raise Refusal(502, f"the upstream sent an answer the broker cannot read: {error}") from None
        if _carries(raw, needles):
            raise Refusal(502, "attempted leak: the answer's head carried a real credential; it was not sent on")
        return status, raw, head

    async def _relay(self, head: Head, status: int, response: Head, writer: asyncio.StreamWriter,
                     needles: list[bytes], collect: list[bytes] | None = None) -> bool:
        """The answer's head and body, scanned (its first MB kept in `collect`); whether the client connection stays
        open."""
        method, _, version = head.first
        try:
            framing = httpwire.response_framing(method, status, response)
        except WireError as error:
            raise Refusal(502, f"the upstream sent an answer the broker cannot read: {error}") from None
        decoder = _decoder(response) if framing != httpwire.NO_BODY else None
        has_body = framing != httpwire.NO_BODY
        same_length = has_body and decoder is None and not framing.chunked and framing.length is not None
        chunked_out = has_body and not same_length and version == "HTTP/1.1"
        keep = _keep_alive(head) and (not has_body or same_length or chunked_out)
        if has_body:  # framed again by the broker (and decoded when it came encoded)
            dropped = _RESPONSE_DROPPED | ({"content-encoding"} if decoder is not None else set())
        else:  # its framing headers describe a body it does not carry (HEAD, 304): passed on as they are
            dropped = frozenset({"connection", "keep-alive"})
        headers = [(k, v) for k, v in response.headers if k.lower() not in dropped]
        if same_length:
            headers.append(("Content-Length", str(framing.length)))
        elif chunked_out:
            headers.append(("Transfer-Encoding", "chunked"))
        if not keep:
            headers.append(("Connection", "close"))
        _, code, reason = response.first
        writer.write(httpwire.head_bytes(f"HTTP/1.1 {code} {reason}".rstrip(), headers))
        if has_body:
            await self._copy_body(framing, decoder, chunked_out, writer, needles, collect)
        await writer.drain()
        self.reusable = (framing.chunked or framing.length is not None) and _keep_alive_headers(response)
        return keep

    async def _copy_body(self, framing: Framing, decoder: Any, chunked_out: bool, writer: asyncio.StreamWriter,
                         needles: list[bytes], collect: list[bytes] | None = None) -> None:
        assert self.up is not None
        scanner = Scanner(needles)

        def send(data: bytes) -> None:
            if data:
                self.sent[1] += len(data)
                writer.write(httpwire.chunk(data) if chunked_out else data)

        try:
            async for piece in httpwire.body(self.up[0], framing, trailers_allowed=True):
                data = decoder.decompress(piece) if decoder is not None else piece
                while decoder is not None and decoder.eof and decoder.unused_data:  # gzip members one after another
                    rest, decoder = decoder.unused_data, _Decoder(decoder.wbits)
                    data += decoder.decompress(rest)
                if collect is not None and sum(map(len, collect)) < MAX_EXCHANGE:
                    collect.append(data)
                send(scanner.feed(data))
                await writer.drain()
            if decoder is not None:
                send(scanner.feed(decoder.flush()))
            send(scanner.flush())
        except Leak:
            raise Cut("attempted leak: the answer carried a real credential; it was cut off where it stood") from None
        except (WireError, zlib.error, asyncio.IncompleteReadError) as error:
            raise Cut(f"the upstream's answer broke off or could not be read ({type(error).__name__}); it was cut "
                      "off") from None
        if chunked_out:
            writer.write(httpwire.LAST_CHUNK)

    async def _relay_push(self, head: Head, status: int, response: Head, push: tuple[github.Update, ...],
                          writer: asyncio.StreamWriter, needles: list[bytes]) -> bool:
        """A scoped push's answer: relayed like any other, and what GitHub took recorded."""
        ledger = self.broker.pushes
        assert ledger is not None
        collected: list[bytes] = []
        keep = await self._relay(head, status, response, writer, needles, collected)
        outcome = github.report_status(b"".join(collected)) if status == 200 else {}
        taken = [u for u in push if outcome.get(u.ref) == "ok"]
        failed = [u for u in push if outcome.get(u.ref) != "ok"]
        if taken:
            ledger.record(taken, "ok")
        if failed:
            why = next((outcome[u.ref] for u in push if u.ref in outcome and outcome[u.ref] != "ok"),
                       f"GitHub answered {status}")
            ledger.record(failed, f"failed: {why}")
        return keep


class _UpstreamClosed(Exception):
    """The upstream closed a kept connection before answering (the request may be sent again on a new one)."""


@functools.lru_cache(maxsize=64)
def _variants(values: tuple[str, ...]) -> list[bytes]:
    """The spellings of these real values an answer is scanned for (the same values each request, mostly)."""
    return scan.variants(values)


def _carries(data: bytes, needles: list[bytes]) -> bool:
    return any(needle in data for needle in needles)


def _shown_path(target: str) -> str:
    """The path for the log: without the query (it may hold anything), of an absolute-form target too."""
    if not target.startswith("/"):
        target = urlsplit(target).path or "/"
    return target.split("?", 1)[0]


def _scan_body(body: bytes) -> None:
    found = scan.placeholders_in(body)
    if found:
        raise Refusal(403, "attempted leak: a placeholder in the body of a request, where no service takes it")


async def _prefetch(pieces: Any, limit: int) -> tuple[bytes | None, Any]:
    """A body read whole when it is at most `limit` bytes (then judged before anything is sent: (body, None)); else
    (None, the pieces again, from the first), the first `limit` bytes read (and scanned by the caller's stream)."""
    read: list[bytes] = []
    total = 0
    async for piece in pieces:
        read.append(piece)
        total += len(piece)
        if total > limit:
            async def again() -> Any:
                for first in read:
                    yield first
                async for rest in pieces:
                    yield rest

            return None, again()
    return b"".join(read), None


def _continue(writer: asyncio.StreamWriter, head: Head) -> None:
    """Answer `Expect: 100-continue` before the body is read (the broker reads it before the upstream sees it)."""
    if (head.value("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _websocket_upgrade(head: Head, method: str, framing: Framing) -> bool:
    upgrades = head.values("upgrade")
    if not upgrades:
        return False
    tokens = {t.strip().lower() for v in head.values("connection") for t in v.split(",")}
    if upgrades != [upgrades[0]] or upgrades[0].strip().lower() != "websocket" or "upgrade" not in tokens \
            or method != "GET" or framing.chunked or framing.length or head.value("sec-websocket-key") is None:
        raise Refusal(403, "an upgrade to a protocol other than a WebSocket, or a malformed WebSocket upgrade")
    return True


def _decoder(response: Head) -> Any:
    """A decompressor for an answer that came encoded though identity was asked for; None for identity."""
    encodings = [c.strip().lower() for v in response.values("content-encoding") for c in v.split(",") if c.strip()]
    if not encodings or encodings == ["identity"]:
        return None
    if len(encodings) != 1 or encodings[0] not in _DECODED:
        raise Refusal(502, f"an answer in the {'/'.join(encodings)} encoding, which the broker cannot scan")
    return _Decoder(47 if encodings[0] != "deflate" else 15)


class _Decoder:
    """zlib's decompressor, remembering the window bits it was made with (a gzip body may hold several members)."""

    def __init__(self, wbits: int) -> None:
        self.wbits = wbits
        self.inner = zlib.decompressobj(wbits)

    def decompress(self, data: bytes) -> bytes:
        return self.inner.decompress(data)

    def flush(self) -> bytes:
        return self.inner.flush()

    @property
    def eof(self) -> bool:
        return self.inner.eof

    @property
    def unused_data(self) -> bytes:
        return self.inner.unused_data


def _keep_alive(head: Head) -> bool:
    tokens = {t.strip().lower() for v in head.values("connection") for t in v.split(",")}
    if head.first[2] == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _keep_alive_headers(head: Head) -> bool:
    return not any("close" in v.lower() for v in head.values("connection"))


def _authority_host(authority: str, port: int) -> str:
    host, _, given = authority.strip().lower().rpartition(":") if authority.count(":") == 1 else (
        authority.strip().lower(), "", "")
    if given and given != str(port):
        return ""
    return host.rstrip(".")


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
