"""A fake upstream for the credential broker's tests: one local HTTPS server standing for several hosts.

It listens on 127.0.0.1 (a random port), presents per host (by the SNI name the client sends) a leaf its own
test CA signed, records every request (host, method, path, headers, body) and answers from routes set by the
test: canned JSON, JSON only for the right Authorization header, and GitHub's git smart-HTTP ref
advertisements. A client reaches it as `host` by connecting to `upstream.address` with server_hostname=host
and trusting `upstream.ca_file` (the broker's tests give the broker that address and CA as its upstream).

    with FakeUpstream(tmp_path, ["api.anthropic.com", "github.com"]) as upstream:
        upstream.route("POST", "/v1/oauth/token", json_body={"access_token": "real"})
        upstream.route("GET", "/v1/models", json_body={"data": []}, authorization="Bearer real-token")
        upstream.git_refs("github.com", "/owner/repo.git", {"refs/heads/main": "ab" * 20})
        ...
        assert upstream.requests[0].headers["authorization"] == "Bearer real-token"

`impostor={"api.github.com": "evil.example.com"}` makes a host present another host's certificate (what a
broker must refuse when it checks the upstream's certificate). The test CA is made with openssl once per
folder and is unconstrained: it stands for the public roots, not for agentbox's CA.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 10 * 1024 * 1024


@dataclass(frozen=True)
class Request:
    host: str | None  # the SNI name the client asked for
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lower-cased; a repeated header's values joined with ", "
    raw_headers: list[tuple[str, str]]  # as sent, in order (to see a second Authorization header)
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    # Writes what follows the head itself (a chunked or encoded body, WebSocket frames) from (rfile, wfile); the
    # head then has only `headers` (no Content-Type or Content-Length of its own) and the connection ends after.
    stream: Callable[[Any, Any], None] | None = None


Handler = Callable[[Request], Response]


@dataclass
class _Route:
    host: str | None
    method: str
    path: str  # without the query string
    query: str | None  # when set, the query string must be exactly this
    answer: Handler


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(body).encode(), "application/json", dict(headers or {}))


def pkt_line(text: bytes) -> bytes:
    return b"%04x" % (len(text) + 4) + text


def info_refs(service: str, refs: dict[str, str]) -> bytes:
    """The body of GET <repo>/info/refs?service=<service> in git's smart-HTTP protocol (v0)."""
    body = pkt_line(f"# service={service}\n".encode()) + b"0000"
    capabilities = b"report-status delete-refs side-band-64k ofs-delta" if service == "git-receive-pack" \
        else b"multi_ack thin-pack side-band side-band-64k ofs-delta shallow no-progress include-tag"
    items = list(refs.items()) or [("capabilities^{}", "0" * 40)]
    for number, (name, sha) in enumerate(items):
        line = f"{sha} {name}".encode()
        body += pkt_line(line + (b"\0" + capabilities if number == 0 else b"") + b"\n")
    return body + b"0000"


class FakeUpstream:
    def __init__(self, folder: Path, hosts: Iterable[str], impostor: dict[str, str] | None = None) -> None:
        self.hosts = list(hosts)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_file = folder / "upstream-ca.pem"
        self.requests: list[Request] = []
        self.handshakes: list[str | None] = []  # the SNI name of each TLS handshake, in order
        self._routes: list[_Route] = []
        self._lock = threading.Lock()
        self._contexts = {host: self._leaf_context(host) for host in {*self.hosts, *(impostor or {}).values()}}
        self._impostor = dict(impostor or {})
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- the test's side --------------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "start the FakeUpstream first (use it in a with block)"
        return "127.0.0.1", self._server.server_address[1]

    @property
    def port(self) -> int:
        return self.address[1]

    def route(self, method: str, path: str, json_body: Any = None, status: int = 200, host: str | None = None,
              authorization: str | None = None, handler: Handler | None = None) -> None:
        """Answer `method path` (any query string unless the path has one) on `host` (None: every host).

        json_body: the JSON answer. authorization: answer only a request whose one Authorization header is
        exactly this; any other gets 401 {"error": "unauthorized"}. handler: a function Request -> Response
        instead. A later route for the same request wins."""
        split = urlsplit(path)

        def canned(request: Request) -> Response:
            if authorization is not None:
                sent = [value for name, value in request.raw_headers if name.lower() == "authorization"]
                if sent != [authorization]:
                    return json_response({"error": "unauthorized"}, 401)
            return json_response(json_body, status)

        with self._lock:
            self._routes.insert(0, _Route(host, method.upper(), split.path, split.query or None, handler or canned))

    def git_refs(self, host: str, repo: str, refs: dict[str, str], authorization: str | None = None) -> None:
        """Answer git's ref advertisement for fetch (upload-pack) and push (receive-pack) of `repo` ("/o/r.git")."""
        for service in ("git-upload-pack", "git-receive-pack"):
            def answer(request: Request, service: str = service) -> Response:
                if authorization is not None and request.headers.get("authorization") != authorization:
                    return Response(401, b"Authentication failed\n", "text/plain",
                                    {"WWW-Authenticate": 'Basic realm="GitHub"'})
                return Response(200, info_refs(service, refs), f"application/x-{service}-advertisement",
                                {"Cache-Control": "no-cache"})
            self.route("GET", f"{repo}/info/refs?service={service}", host=host, handler=answer)

    def requests_to(self, host: str) -> list[Request]:
        with self._lock:
            return [request for request in self.requests if request.host == host]

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting only the test CA (what the broker uses to reach this upstream)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    # -- serving ----------------------------------------------------------------------------------------------

    def __enter__(self) -> FakeUpstream:
        upstream = self
        base = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        first = self.hosts[0]
        base.load_cert_chain(*self._leaf_files(self._impostor.get(first, first)))

        def pick(sock: ssl.SSLSocket | ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
            sock.sni_name = name  # type: ignore[union-attr]  # read by the handler: the host the client asked for
            upstream.handshakes.append(name)
            asked = name or first
            if asked in upstream.hosts:  # an unknown name gets the first host's certificate, which it refuses
                sock.context = upstream._contexts[upstream._impostor.get(asked, asked)]

        base.sni_callback = pick

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client refusing the certificate is what some tests want; the test sees the client's side

            def get_request(self) -> tuple[socket.socket, Any]:
                conn, address = self.socket.accept()
                return base.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), address

        self._server = Server(("127.0.0.1", 0), _handler_class(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def _answer(self, request: Request) -> Response:
        with self._lock:
            self.requests.append(request)
            routes = list(self._routes)
        split = urlsplit(request.path)
        for route in routes:
            if (route.method == request.method and route.path == split.path
                    and (route.host is None or route.host == request.host)
                    and (route.query is None or route.query == split.query)):
                return route.answer(request)
        return json_response({"error": "no route", "method": request.method, "path": request.path,
                              "host": request.host}, 404)

    # -- the test CA --------------------------------------------------------------------------------------------

    def _leaf_files(self, host: str) -> tuple[str, str]:
        return str(self.folder / f"upstream-{host}.pem"), str(self.folder / f"upstream-{host}.key")

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        ca_key = self.folder / "upstream-ca.key"
        if not self.ca_file.exists():
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(ca_key))
            _openssl("req", "-new", "-x509", "-key", str(ca_key), "-subj", "/CN=fake upstream test CA", "-days", "2",
                     "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
                     "-out", str(self.ca_file))
        cert, key = self._leaf_files(host)
        if not Path(cert).exists():
            ext = self.folder / f"upstream-{host}.cnf"
            ext.write_text(f"[leaf]\nsubjectAltName = DNS:{host}\nextendedKeyUsage = serverAuth\n")
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
            csr = self.folder / f"upstream-{host}.csr"
            _openssl("req", "-new", "-key", key, "-subj", f"/CN={host}", "-out", str(csr))
            _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_file), "-CAkey", str(ca_key),
                     "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-extensions", "leaf", "-out", cert)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        return context


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _handler_class(upstream: FakeUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # its head and body are two writes: no 40 ms wait for a delayed ACK

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _any(self) -> None:
            connection = self.connection
            host = getattr(connection, "sni_name", None)
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = self._chunked()
            else:
                body = self.rfile.read(min(length, MAX_BODY)) if length else b""
            raw = list(self.headers.items())
            headers: dict[str, str] = {}
            for name, value in raw:
                key = name.lower()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            response = upstream._answer(Request(host, self.command, self.path, headers, raw, body))
            self.send_response(response.status)
            if response.stream is not None:
                for name, value in response.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.flush()
                response.stream(self.rfile, self.wfile)
                self.wfile.flush()
                self.close_connection = True
                return
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def _chunked(self) -> bytes:
            body = b""
            while len(body) <= MAX_BODY:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
            return body

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any

    return Handler
