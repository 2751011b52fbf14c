"""A TLS-intercepting HTTP proxy, as a company runs one, for the real-distribution tier.

Every CONNECT is answered 200 and the client's TLS is terminated with a certificate for the host it asked for,
signed by the proxy's own CA (made here, with openssl, in the folder given); the proxy then opens TLS to the real
host, verified against the host's trust store, and relays the decrypted bytes both ways. Nothing else is served.
What it saw is kept: per connection the host, whether the client accepted the proxy's certificate, and the first
request line the client sent inside the tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024


@dataclass
class Tunnel:
    host: str
    port: int
    accepted: bool = False  # the client finished the TLS handshake with the proxy's certificate
    error: str = ""  # why the upstream connection failed
    request: str = ""  # the first request line inside the tunnel


class InterceptingProxy:
    """Use as a context manager: the proxy listens on 127.0.0.1:`port` while inside it; `ca_cert` is the CA
    certificate (PEM) a client must trust."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_cert = folder / "proxy-ca.pem"
        self.ca_key = folder / "proxy-ca.key"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self.ca_key), "-out", str(self.ca_cert), "-days", "30",
                 "-subj", "/O=agentbox tests/CN=agentbox test intercepting proxy CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        self.tunnels: list[Tunnel] = []
        self.port = 0
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self._upstream = ssl.create_default_context()
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(lambda loop, context: None)  # a refused handshake is expected
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._inner: asyncio.Server | None = None  # terminates the tunnels' TLS (asyncio's start_tls hangs there)
        self._pending: dict[int, Tunnel] = {}  # by the local port of the relay's connection to the inner server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> InterceptingProxy:
        self._thread.start()
        inner = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        inner.sni_callback = self._pick_leaf
        self._inner = self._call(asyncio.start_server(self._terminate, "127.0.0.1", 0, ssl=inner))
        self._server = self._call(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            for server in (self._server, self._inner):
                if server is not None:
                    server.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def seen(self) -> list[Tunnel]:
        with self._lock:
            return list(self.tunnels)

    def forget(self) -> None:
        with self._lock:
            self.tunnels.clear()

    # -- serving -------------------------------------------------------------------------------------------------

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        """A server context with a certificate for `host` signed by the CA (made once per host)."""
        with self._lock:
            if host not in self._contexts:
                key, cert, ext = (self.folder / f"{host}.{suffix}" for suffix in ("key", "pem", "ext"))
                ext.write_text(f"subjectAltName=DNS:{host}\nextendedKeyUsage=serverAuth\n"
                               "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                               "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
                _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                         "-keyout", str(key), "-out", str(cert.with_suffix(".csr")), "-subj", f"/CN={host}")
                _openssl("x509", "-req", "-in", str(cert.with_suffix(".csr")), "-CA", str(self.ca_cert),
                         "-CAkey", str(self.ca_key), "-CAcreateserial", "-days", "30", "-extfile", str(ext),
                         "-out", str(cert))
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(str(cert), str(key))
                self._contexts[host] = context
            return self._contexts[host]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        method, _, rest = head.decode("latin-1").partition(" ")
        target = rest.partition(" ")[0]
        if method != "CONNECT" or ":" not in target:
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        host, _, port_text = target.rpartition(":")
        tunnel = Tunnel(host.strip("[]").lower(), int(port_text))
        with self._lock:
            self.tunnels.append(tunnel)
        await asyncio.to_thread(self._leaf_context, tunnel.host)
        assert self._inner is not None
        inner_reader, inner_writer = await asyncio.open_connection(*self._inner.sockets[0].getsockname()[:2])
        self._pending[inner_writer.get_extra_info("sockname")[1]] = tunnel
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(self._relay(reader, inner_writer, None), self._relay(inner_reader, writer, None))

    def _pick_leaf(self, connection: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        with self._lock:
            found = self._contexts.get((name or "").lower())
        if found is not None:
            connection.context = found

    async def _terminate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The inner TLS server: the client accepted the proxy's certificate; on to the real host."""
        tunnel = self._pending.pop(writer.get_extra_info("peername")[1])
        tunnel.accepted = True
        try:
            up_reader, up_writer = await asyncio.open_connection(tunnel.host, tunnel.port, ssl=self._upstream,
                                                                 server_hostname=tunnel.host)
        except (ssl.SSLError, OSError) as exc:
            tunnel.error = f"upstream: {exc}"
            writer.close()
            return
        await asyncio.gather(self._relay(reader, up_writer, tunnel), self._relay(up_reader, writer, None))

    @staticmethod
    async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter, tunnel: Tunnel | None) -> None:
        try:
            while chunk := await source.read(CHUNK):
                if tunnel is not None and not tunnel.request:
                    tunnel.request = chunk.split(b"\r\n", 1)[0].decode("latin-1")
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                sink.close()


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr}")
