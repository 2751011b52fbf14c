"""The host-side egress proxy against real local servers: a TCP echo server (CONNECT) and an HTTP server."""

from __future__ import annotations

import asyncio
import gc
import http.server
import json
import os
import socket
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.net import proxy as netproxy
from agentbox.net.proxy import Policy, check_pattern
from tests.helpers import wait_for

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)


class EchoServer:
    """A TCP echo server on 127.0.0.1 in its own loop thread; counts connections open at once."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                self.active -= 1
                writer.close()

        async def open_server() -> None:
            self.server = await asyncio.start_server(echo, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        def run() -> None:
            self.loop.run_until_complete(open_server())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait()

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.path} host={self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.stop()


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def to_loopback(host: str, port: int) -> list[str]:
    """The resolver hook: every *.test name is 127.0.0.1, anything else does not exist."""
    if host.endswith(".test"):
        return ["127.0.0.1"]
    raise socket.gaierror(socket.EAI_NONAME, "no such name")


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "net.log"


def policy(*allow: str, lan: bool = True, **kw: object) -> Policy:
    return Policy(allow=allow, allow_lan=lan, allow_loopback=lan, resolver=to_loopback, **kw)  # type: ignore[arg-type]


def read_head(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), rest


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def connect(proxy_port: int, target: str) -> tuple[socket.socket, int, bytes]:
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    status, rest = read_head(sock)
    return sock, status, rest


def refusal(sock: socket.socket, rest: bytes) -> dict[str, object]:
    body = rest + read_all(sock)
    sock.close()
    return json.loads(body)


def log_entries(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_log(path: Path, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if path.exists() and len(entries := log_entries(path)) >= count:
            return entries
        time.sleep(0.02)
    raise AssertionError(f"fewer than {count} log lines in {path}")


def test_allowed_connect_tunnels_both_ways_and_is_logged(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"echo.test:{echo.port}"), log_path) as proxy:
        sock, status, _ = connect(proxy.port, f"echo.test:{echo.port}")
        assert status == 200
        sock.sendall(b"ping" * 1000)
        got = b""
        while len(got) < 4000:
            got += sock.recv(65536)
        assert got == b"ping" * 1000
        sock.close()
        (entry,) = wait_for_log(log_path, 1)
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    assert entry["decision"] == "allow" and entry["method"] == "CONNECT"
    assert entry["host"] == "echo.test" and entry["port"] == echo.port
    assert entry["bytes_up"] == 4000 and entry["bytes_down"] == 4000
    assert set(entry) == {"time", "client", "method", "host", "port", "decision", "reason", "bytes_up", "bytes_down"}
    assert str(entry["client"]).startswith("127.0.0.1:")


def test_unlisted_host_gets_403_with_json_body(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"echo.test:{echo.port}"), log_path) as proxy:
        sock, status, rest = connect(proxy.port, f"other.test:{echo.port}")
        assert status == 403
        body = refusal(sock, rest)
        # Listed host, unlisted port: also refused, and the advice names the port.
        sock, status, rest = connect(proxy.port, "echo.test:443")
        assert status == 403
        port_body = refusal(sock, rest)
        entries = wait_for_log(log_path, 2)
    assert body == {"blocked": "other.test", "port": echo.port, "reason": "host not in the allow list",
                    "allow": f"agentbox net allow other.test:{echo.port}"}
    assert port_body["reason"] == "port 443 not allowed for this host"
    assert port_body["allow"] == "agentbox net allow echo.test"
    assert [(e["host"], e["decision"]) for e in entries] == [("other.test", "deny"), ("echo.test", "deny")]
    assert echo.peak == 0


def test_suffix_pattern_matches_subdomains_only(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"*.example.test:{echo.port}"), log_path) as proxy:
        statuses = {}
        for name in ("a.example.test", "deep.b.Example.test", "example.test", "badexample.test"):
            sock, statuses[name], _ = connect(proxy.port, f"{name}:{echo.port}")
            sock.close()
    assert statuses == {"a.example.test": 200, "deep.b.Example.test": 200, "example.test": 403,
                        "badexample.test": 403}


def test_default_ports_443_for_connect_and_80_for_plain_http(log_path: Path) -> None:
    p = policy("api.test")
    assert p.permits("api.test", 443, netproxy.CONNECT_PORT) is None
    assert p.permits("api.test", 80, netproxy.HTTP_PORT) is None
    assert p.permits("api.test", 80, netproxy.CONNECT_PORT) == "port 80 not allowed for this host"
    assert p.permits("api.test", 8443, netproxy.CONNECT_PORT) == "port 8443 not allowed for this host"


def test_ip_literal_connect_refused_unless_listed(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"echo.test:{echo.port}"), log_path) as proxy:
        sock, status, rest = connect(proxy.port, f"127.0.0.1:{echo.port}")
        assert status == 403
        assert refusal(sock, rest)["reason"] == "IP address not in the allow list"
    with netproxy.start(policy(f"127.0.0.1:{echo.port}"), log_path) as proxy:
        sock, status, _ = connect(proxy.port, f"127.0.0.1:{echo.port}")
        sock.close()
        assert status == 200


@pytest.mark.parametrize(("target", "address"), [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"),
                                                 ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"), ("[::1]", "::1")])
@pytest.mark.parametrize("mode", ["allowlist", "open"])
def test_a_listed_literal_of_the_host_itself_is_refused_at_connect_time(echo: EchoServer, log_path: Path,
                                                                        target: str, address: str, mode: str) -> None:
    """Issue 27: an allow pattern (or the broker's open mode) never reaches the host's own services."""
    listed = Policy(open=True) if mode == "open" else Policy(allow=[f"{target}:{echo.port}"], allow_lan=True)
    with netproxy.start(listed, log_path) as proxy:
        sock, status, rest = connect(proxy.port, f"{target}:{echo.port}")
        assert status == 403
        body = refusal(sock, rest)
        assert body["reason"] in (f"is a loopback address ({address})", f"is the host's own address ({address})")
        assert "network.allowHost" in body["allow"]
    # Control: with loopback allowed (the tests' own servers) the same listed literal connects.
    if target == "127.0.0.1":
        with netproxy.start(Policy(allow=[f"{target}:{echo.port}"], allow_loopback=True), log_path) as proxy:
            sock, status, _ = connect(proxy.port, f"{target}:{echo.port}")
            sock.close()
            assert status == 200


@pytest.mark.parametrize("lan", [False, True])
def test_name_resolving_to_loopback_is_refused_even_with_allow_lan(echo: EchoServer, log_path: Path,
                                                                    lan: bool) -> None:
    with netproxy.start(Policy(allow=[f"echo.test:{echo.port}"], allow_lan=lan, resolver=to_loopback),
                        log_path) as proxy:
        sock, status, rest = connect(proxy.port, f"echo.test:{echo.port}")
        assert status == 403
        body = refusal(sock, rest)
    assert body["reason"] == "resolves to a loopback address (127.0.0.1)"
    assert "network.allowHost" in body["allow"]
    assert echo.peak == 0


def test_name_resolving_to_a_private_address_is_refused_without_allow_lan(log_path: Path) -> None:
    with netproxy.start(Policy(allow=["lan.test:9"], resolver=lambda host, port: ["10.1.2.3"]), log_path) as proxy:
        sock, status, rest = connect(proxy.port, "lan.test:9")
        assert status == 403
        body = refusal(sock, rest)
    assert body["reason"] == "resolves to a private address (10.1.2.3)"
    assert body["allow"] == "network.allowLan: true (in agentbox.yml)"


@pytest.mark.parametrize("address", ["10.1.2.3", "172.16.0.1", "192.168.5.2", "169.254.169.254",
                                     "100.64.0.1", "fe80::1", "fd00::1"])
def test_private_addresses_are_blocked_unless_allow_lan(address: str) -> None:
    assert Policy(allow_lan=False).blocked_address(address)
    assert not Policy(allow_lan=True).blocked_address(address)


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::1", "::ffff:127.0.0.1", "224.0.0.1"])
def test_loopback_and_unspecified_addresses_are_blocked_even_with_allow_lan(address: str) -> None:
    assert Policy(allow_lan=False).blocked_address(address)
    assert Policy(allow_lan=True).blocked_address(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700::6810:84e5", "8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert not Policy(allow_lan=False).blocked_address(address)


def test_connects_to_the_address_it_checked(echo: EchoServer, log_path: Path) -> None:
    """A resolver answering differently on a second lookup cannot rebind: the proxy looks up once."""
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])
    calls = []

    def flipping(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    with netproxy.start(Policy(allow=[f"echo.test:{echo.port}"], allow_lan=True, allow_loopback=True,
                               resolver=flipping), log_path) as proxy:
        sock, status, _ = connect(proxy.port, f"echo.test:{echo.port}")
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        sock.close()
    assert status == 200 and calls == ["echo.test"]


def test_plain_http_forwarded_and_refused(web: int, log_path: Path) -> None:
    with netproxy.start(policy(f"web.test:{web}"), log_path) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(f"GET http://web.test:{web}/a?b=1 HTTP/1.1\r\nHost: web.test:{web}\r\n"
                     "Proxy-Connection: keep-alive\r\n\r\n".encode())
        status, rest = read_head(sock)
        body = rest + read_all(sock)
        sock.close()
        assert status == 200 and body == f"hello /a?b=1 host=web.test:{web}".encode()
        # A Host header naming another site is replaced by the URL's (checked) authority.
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(f"GET http://web.test:{web} HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
        status, rest = read_head(sock)
        body = rest + read_all(sock)
        sock.close()
        assert status == 200 and body == f"hello / host=web.test:{web}".encode()
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        status, rest = read_head(sock)
        assert status == 403 and refusal(sock, rest)["allow"] == "agentbox net allow evil.test"
        entries = wait_for_log(log_path, 3)
    assert [(e["method"], e["host"], e["decision"]) for e in entries] == [
        ("GET", "web.test", "allow"), ("GET", "web.test", "allow"), ("GET", "evil.test", "deny")]
    assert entries[0]["bytes_down"] > 0


def test_head_over_64k_gets_431(log_path: Path) -> None:
    with netproxy.start(policy("api.test"), log_path) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(b"CONNECT api.test:443 HTTP/1.1\r\nX-Big: " + b"a" * (70 * 1024))
        status, _ = read_head(sock)
        read_all(sock)  # and the proxy closes the connection
        sock.close()
        (entry,) = wait_for_log(log_path, 1)
    assert status == 431 and entry["reason"] == "request head over 64 KB"


@pytest.mark.parametrize("request_bytes", [b"CONNECT\r\n\r\n", b"CONNECT api.test HTTP/1.1\r\n\r\n",
                                           b"GET /relative HTTP/1.1\r\n\r\n", b"CONNECT a b c d\r\n\r\n",
                                           b"GET http://x/ HTTP/1.1\r\nno colon\r\n\r\n",
                                           b"CONNECT bad..name:443 HTTP/1.1\r\n\r\n"])
def test_malformed_requests_get_400(request_bytes: bytes, log_path: Path) -> None:
    with netproxy.start(policy("api.test"), log_path) as proxy:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(request_bytes)
        status, _ = read_head(sock)
        sock.close()
        (entry,) = wait_for_log(log_path, 1)
    assert status == 400 and entry["decision"] == "error"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settled(expected: int) -> None:
    """The process is back to at most `expected` open fds within 10 s (the echo server's threads close their
    sockets a moment after the proxy does; on a busy machine that moment grows; an fd another test's thread held
    when `expected` was counted may close meanwhile)."""
    wait_for(open_fds, 10, f"the open fds to come back to {expected} or fewer", until=lambda n: n <= expected)


def test_300_parallel_connections_are_bounded_and_release_every_fd(echo: EchoServer, log_path: Path) -> None:
    before = open_fds()
    proxy = netproxy.start(policy(f"echo.test:{echo.port}", max_connections=20, queue_timeout=0.5), log_path)
    running = open_fds()

    async def one(i: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                return head.split(b" ")[1].decode()
            writer.write(b"%d" % i)
            got = await reader.read(100)
            await asyncio.sleep(0.2)  # hold the slot so that others must wait
            return "ok" if got == b"%d" % i else "wrong"
        finally:
            writer.close()

    async def all_of_them() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(300)))

    # CPython closes a forgotten transport's socket when it is collected, so a missing close() shows
    # as a ResourceWarning rather than as an fd count.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        results = asyncio.run(all_of_them())
        wait_for_log(log_path, 300)
        gc.collect()
        # every connection's sockets are closed while the proxy keeps running (the echo server's own
        # threads close their ends a moment after the proxy: wait for them, a leak stays a failure)
        settled(running)
        proxy.stop()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert set(results) <= {"ok", "503"} and "ok" in results and "503" in results
    assert echo.peak <= 20
    settled(before)
    assert len(log_entries(log_path)) == 300


def test_stop_closes_open_tunnels_and_the_listener(echo: EchoServer, log_path: Path) -> None:
    before = open_fds()
    proxy = netproxy.start(policy(f"echo.test:{echo.port}"), log_path)
    sock, status, _ = connect(proxy.port, f"echo.test:{echo.port}")
    assert status == 200
    proxy.stop()
    assert sock.recv(10) == b""  # the tunnel was closed by the proxy
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    settled(before)


def test_idle_tunnel_is_closed(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"echo.test:{echo.port}", idle_timeout=0.3), log_path) as proxy:
        sock, status, _ = connect(proxy.port, f"echo.test:{echo.port}")
        started = time.monotonic()
        assert status == 200 and sock.recv(10) == b""
        assert time.monotonic() - started < 3
        sock.close()
        (entry,) = wait_for_log(log_path, 1)
    assert entry["reason"] == "idle timeout"


def test_taken_port_picks_another(log_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        with netproxy.start(policy("api.test"), log_path, port=taken) as proxy:
            assert proxy.port not in (0, taken)
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
    finally:
        holder.close()


def test_log_is_appended_not_replaced(echo: EchoServer, log_path: Path) -> None:
    log_path.parent.mkdir()
    log_path.write_text('{"earlier": true}\n')
    log_path.chmod(0o644)
    with netproxy.start(policy(), log_path) as proxy:
        sock, _, _ = connect(proxy.port, "x.test:443")
        sock.close()
        entries = wait_for_log(log_path, 2)
    assert entries[0] == {"earlier": True} and entries[1]["host"] == "x.test"
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600


@pytest.mark.parametrize("pattern", ["example.com", "*.example.com", "api.example.com:8443", "*.co:1",
                                     "203.0.113.7", "203.0.113.7:22", "[2001:db8::1]", "[2001:db8::1]:443",
                                     "EXAMPLE.com", "under_score.example.com"])
def test_valid_patterns(pattern: str) -> None:
    assert check_pattern(pattern) is None
    Policy(allow=[pattern])


@pytest.mark.parametrize(("pattern", "says"), [
    ("*.", "nothing after `*.`"), ("http://x", "is a URL"), ("", "is empty"), (None, "is empty"),
    ("x.com:0", "port `0`"), ("x.com:65536", "port `65536`"), ("x.com:", "port ``"), ("x.com:ab", "port `ab`"),
    ("a b.com", "contains a space"), ("x.com/path", "is a URL"), ("*", "network.mode: open"),
    ("a*.com", "only allowed as a leading"), ("*.*.com", "not a valid wildcard"), ("-x.com", "not a valid host"),
    ("x..com", "not a valid host"), ("2001:db8::1", "in brackets"), ("[nope]:1", "not an IPv6"),
    ("user@x.com", "is a URL"),
])
def test_invalid_patterns(pattern: str, says: str) -> None:
    problem = check_pattern(pattern)
    assert problem is not None and says in problem
    with pytest.raises(ValueError, match=r"network\.allow"):
        Policy(allow=[pattern])


def test_beyond_the_queue_gets_503_at_once(echo: EchoServer, log_path: Path) -> None:
    with netproxy.start(policy(f"echo.test:{echo.port}", max_connections=2, queue_timeout=30), log_path) as proxy:
        held = [connect(proxy.port, f"echo.test:{echo.port}")[0] for _ in range(2)]
        waiting = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(2)]
        for sock in waiting:  # a connection takes its place in the queue once its head is read
            sock.sendall(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        time.sleep(0.2)  # both are queued for a slot now
        started = time.monotonic()
        sock, status, rest = connect(proxy.port, f"echo.test:{echo.port}")
        assert status == 503 and time.monotonic() - started < 5
        assert refusal(sock, rest)["reason"] == "too many connections"
        held[0].close()  # a slot frees: a queued connection is served
        assert read_head(waiting[0])[0] == 200
        for s in held[1:] + waiting:
            s.close()
