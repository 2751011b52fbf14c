"""An explicit HTTP proxy as a company runs one, for tests: CONNECT tunnels and absolute-form plain-HTTP requests,
each only with the right Basic Proxy-Authorization (else 407), every request recorded.

A CONNECT's host is reached at `routes[host]` (or `default`) when given, else as written; a plain-HTTP request
is answered by the proxy itself (200, a JSON body naming what it got), as a cache would.

    with CompanyProxy(user="corp", password="s3cret", default=upstream.address) as company:
        company.url  # http://corp:s3cret@127.0.0.1:PORT
        company.seen  # [Seen(method, target, authorization), ...]
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Seen:
    method: str
    target: str
    authorization: str | None  # the Proxy-Authorization header as sent
    authorized: bool


class CompanyProxy:
    def __init__(self, user: str | None = "corp", password: str = "s3cret",
                 default: tuple[str, int] | None = None, routes: dict[str, tuple[str, int]] | None = None) -> None:
        self.user, self.password = user, password
        self.default = default
        self.routes = dict(routes or {})
        self.seen: list[Seen] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        who = f"{self.user}:{self.password}@" if self.user else ""
        return f"http://{who}127.0.0.1:{self.port}"

    def expected(self) -> str | None:
        if not self.user:
            return None
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    def __enter__(self) -> CompanyProxy:
        self._thread.start()

        async def open_server() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(open_server(), self._loop).result()
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {name.strip().lower(): value.strip()
                       for name, _, value in (line.partition(":") for line in lines[1:] if line)}
            authorization = headers.get("proxy-authorization")
            authorized = self.expected() is None or authorization == self.expected()
            self.seen.append(Seen(method, target, authorization, authorized))
            if not authorized:
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic realm=\"corp\"\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            if method != "CONNECT":
                body = json.dumps({"via": "company proxy", "target": target}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
                return
            host, _, port = target.rpartition(":")
            where = self.routes.get(host) or self.default or (host, int(port))
            up_reader, up_writer = await asyncio.open_connection(*where)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()

    def targets(self, method: str = "CONNECT") -> list[str]:
        return [seen.target for seen in self.seen if seen.method == method]
