"""Only this VM reaches its proxy (issue 36): every CONNECT and every plain-HTTP request must carry the VM's proxy
credentials (`agentbox:SECRET`, the password of the VM's proxy URL), checked first; without them, or with another
VM's, a 407 and nothing reaches an upstream, nothing is looked up. Real clients (curl, git) get through with the
credentials in the URL, also when they first try without (libcurl's anyauth). tests/fake_upstream.py stands for the
real hosts; tests/test_proxy_auth_cli.py drives the same through the CLI and the limactl double."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.credentials.broker import ghcli
from agentbox.net import certauthority
from agentbox.net import guard as netguard
from agentbox.net import proxy as netproxy
from agentbox.net import upstream as companyproxy
from agentbox.net.broker import Brokering, Secret
from tests.company_proxy import CompanyProxy
from tests.fake_upstream import FakeUpstream
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(60)

SECRET = "0123456789abcdef0123456789abcdef"
OTHER_VM_SECRET = "fedcba9876543210fedcba9876543210"
CLAUDE = "api.anthropic.com"
GITHUB = "github.com"
CLAUDE_PH = "sk-ant-oat01-agentbox-ph-" + "a1" * 12
CLAUDE_REAL = "sk-ant-oat01-REAL-host-token"
GH_PH = "gho_agentbox-ph-" + "b2" * 12
GH_REAL = "gho_REALhostGitHubToken"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


RIGHT = basic("agentbox", SECRET)
# What a client without this VM's secret may send: nothing, a guess, another VM's secret, the right secret with
# another user, the secret itself as a bearer token, the right header twice.
WRONG = {
    "none": [],
    "a guess": [basic("agentbox", "0" * 32)],
    "another VM's secret": [basic("agentbox", OTHER_VM_SECRET)],
    "another user": [basic("root", SECRET)],
    "not Basic": [f"Bearer {SECRET}"],
    "an empty password": [basic("agentbox", "")],
    "twice": [RIGHT, RIGHT],
}
REASONS = {
    "none": "no proxy credentials (Proxy-Authorization)",
    "not Basic": "proxy credentials that are not Basic",
    "twice": "more than one Proxy-Authorization header",
}


class Harness:
    def __init__(self, upstream: FakeUpstream, proxy: netproxy.RunningProxy, authority: certauthority.BrokerCA, log: Path,
                 lookups: list[str], web: RecordingServer) -> None:
        self.upstream = upstream
        self.proxy = proxy
        self.ca = authority
        self.log = log
        self.lookups = lookups
        self.web = web

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def bundle(self) -> Path:
        """What the guest trusts: the broker's CA and the upstream's test CA (standing for the public roots)."""
        path = self.log.parent / "guest-bundle.pem"
        path.write_text(self.ca.cert_pem() + self.upstream.ca_file.read_text())
        return path

    def url(self, password: str = SECRET) -> str:
        return f"http://agentbox:{password}@127.0.0.1:{self.proxy.port}"


class RecordingServer:
    """A plain-HTTP server on 127.0.0.1 that records every byte each connection sent and answers one request."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(2)
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            try:  # and whatever else reaches it before the proxy closes
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
        except OSError:
            pass
        finally:
            self.received.append(data)
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(tmp_path / "state"))
    authority = certauthority.ensure("agentbox-auth-test", [CLAUDE, GITHUB])
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    web = RecordingServer()
    with FakeUpstream(tmp_path / "upstream", [CLAUDE, GITHUB]) as upstream:
        brokering = Brokering(
            leaves={host: certauthority.server_context(authority.leaf(host)) for host in (CLAUDE, GITHUB)},
            secrets=(Secret("claude", CLAUDE_PH, frozenset({CLAUDE}), lambda: CLAUDE_REAL),
                     Secret("gh", GH_PH, frozenset({GITHUB}), lambda: GH_REAL, ghcli.PLACES)),
            upstream_context=upstream.client_context(),
            upstream_address=lambda host, port: upstream.address,
        )
        policy = netproxy.Policy(allow=[CLAUDE, GITHUB, f"127.0.0.1:{upstream.port}", f"web.test:{web.port}"],
                                 allow_loopback=True, resolver=resolve)
        log = tmp_path / "log.jsonl"
        with netproxy.start(policy, log, broker=brokering, secret=SECRET) as proxy:
            yield Harness(upstream, proxy, authority, log, lookups, web)
    web.close()


def ask(port: int, head: str) -> tuple[bytes, bytes]:
    """Send `head`, read until the proxy closes: (status line and headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return head_bytes, body


def ask_head(port: int, head: str) -> bytes:
    """Send `head` (a CONNECT), read the answer's head: a tunnel stays open."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    return data


def credentials(values: list[str]) -> str:
    return "".join(f"Proxy-Authorization: {value}\r\n" for value in values)


@pytest.mark.parametrize("offered", list(WRONG))
def test_a_connect_without_this_vms_credentials_gets_407_and_nothing_is_looked_up_or_reached(
        harness: Harness, offered: str) -> None:
    for target in (f"{CLAUDE}:443", f"127.0.0.1:{harness.upstream.port}"):  # brokered, then tunnelled
        head, body = ask(harness.proxy.port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                                             f"{credentials(WRONG[offered])}\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 407 Proxy Authentication Required", head
        assert 'Proxy-Authenticate: Basic realm="agentbox"' in lines and "Connection: close" in lines
        refusal = json.loads(body)
        assert refusal["reason"] == REASONS.get(offered, "wrong proxy credentials (not this VM's)")
        assert refusal["by"] == "agentbox proxy"
    assert harness.upstream.requests == [] and harness.lookups == []
    entries = wait_for(harness.entries, 10, "two log lines", until=lambda found: len(found) == 2)
    assert [(e["method"], e["decision"], e["reason"]) for e in entries] == [
        ("CONNECT", "deny", REASONS.get(offered, "wrong proxy credentials (not this VM's)"))] * 2
    assert SECRET not in harness.log.read_text() and OTHER_VM_SECRET not in harness.log.read_text()


def test_with_this_vms_credentials_the_same_connects_go_through(harness: Harness) -> None:
    harness.upstream.route("GET", "/api/oauth/profile", {"account": "the host's"}, host=CLAUDE,
                           authorization=f"Bearer {CLAUDE_REAL}")
    context = ssl.create_default_context(cafile=str(harness.bundle()))
    import http.client

    connection = http.client.HTTPSConnection("127.0.0.1", harness.proxy.port, context=context, timeout=20)
    connection.set_tunnel(CLAUDE, 443, headers={"Proxy-Authorization": RIGHT})
    connection.request("GET", "/api/oauth/profile", headers={"Authorization": f"Bearer {CLAUDE_PH}"})
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())) == (200, {"account": "the host's"})
    connection.close()
    request = harness.upstream.requests_to(CLAUDE)[-1]
    assert "proxy-authorization" not in request.headers  # the VM's credentials stop at the proxy
    head = ask_head(harness.proxy.port, f"CONNECT 127.0.0.1:{harness.upstream.port} HTTP/1.1\r\n"
                                        f"Proxy-Authorization: {RIGHT.replace('Basic', 'basic')}\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head  # the scheme's case does not matter (RFC 9110 11.1)


@pytest.mark.parametrize("offered", ["none", "another VM's secret"])
def test_plain_http_asks_each_request_for_the_credentials_and_never_forwards_them(
        harness: Harness, offered: str) -> None:
    target = f"http://web.test:{harness.web.port}/page"
    head, body = ask(harness.proxy.port, f"GET {target} HTTP/1.1\r\nHost: web.test\r\n"
                                         f"{credentials(WRONG[offered])}\r\n")
    assert head.startswith(b"HTTP/1.1 407") and json.loads(body)["by"] == "agentbox proxy"
    assert harness.web.received == [] and harness.lookups == []
    # With them: forwarded, without them; a second request on the same connection (its head never checked) is
    # never read, let alone forwarded.
    head, body = ask(harness.proxy.port, f"GET {target} HTTP/1.1\r\nHost: web.test\r\n"
                                         f"Proxy-Authorization: {RIGHT}\r\n\r\n"
                                         f"GET {target}?second HTTP/1.1\r\nHost: web.test\r\n"
                                         f"{credentials(WRONG[offered])}\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"hello"
    wait_for(lambda: harness.web.received, 10, "the request at the server")
    (received,) = harness.web.received
    assert received.startswith(b"GET /page HTTP/1.1\r\n") and b"?second" not in received
    assert b"proxy-authorization" not in received.lower() and SECRET.encode() not in received


def test_a_plain_http_body_goes_as_framed_and_nothing_after_it(harness: Harness) -> None:
    target = f"http://web.test:{harness.web.port}/upload"
    chunked = "4\r\nabcd\r\n0\r\n\r\n"
    head, _ = ask(harness.proxy.port, f"POST {target} HTTP/1.1\r\nHost: web.test\r\nProxy-Authorization: {RIGHT}"
                                      f"\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}GET /smuggled HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    head, _ = ask(harness.proxy.port, f"POST {target} HTTP/1.1\r\nHost: web.test\r\nProxy-Authorization: {RIGHT}"
                                      "\r\nContent-Length: 3\r\n\r\nxyzGET /smuggled HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    wait_for(lambda: len(harness.web.received) == 2, 10, "both requests at the server")
    (chunks,) = [got for got in harness.web.received if b"Transfer-Encoding" in got]
    (length,) = [got for got in harness.web.received if b"Content-Length" in got]
    assert chunks.endswith(b"\r\n\r\n" + chunked.encode()) and length.endswith(b"\r\n\r\nxyz"), (chunks, length)
    # Framings a server could read otherwise than the proxy: refused before anything is sent.
    for framing in ("Transfer-Encoding: chunked\r\nContent-Length: 3", "Content-Length: 3\r\nContent-Length: 4",
                    "Transfer-Encoding: gzip, chunked", "Content-Length: +3"):
        head, _ = ask(harness.proxy.port, f"POST {target} HTTP/1.1\r\nHost: web.test\r\n"
                                          f"Proxy-Authorization: {RIGHT}\r\n{framing}\r\n\r\nxyz")
        assert head.startswith(b"HTTP/1.1 400"), (framing, head)
    assert len(harness.web.received) == 2


def test_the_company_proxy_gets_its_own_credentials_never_the_vms(tmp_path: Path) -> None:
    web = RecordingServer()  # where the company proxy's tunnels lead
    with CompanyProxy(user="corp", password="corp-pass", default=("127.0.0.1", web.port)) as company:
        route = companyproxy.Route(https=companyproxy.parse_url(company.url),
                                   http=companyproxy.parse_url(company.url))
        policy = netproxy.Policy(open=True, resolver=lambda host, port: [], upstream=route)
        with netproxy.start(policy, tmp_path / "log.jsonl", secret=SECRET) as running:
            head, body = ask(running.port, "GET http://plain.example/a HTTP/1.1\r\nHost: plain.example\r\n"
                                           f"Proxy-Authorization: {RIGHT}\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b'"via": "company proxy"' in body
            head = ask_head(running.port, f"CONNECT somewhere.example:443 HTTP/1.1\r\n"
                                          f"Proxy-Authorization: {RIGHT}\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            head, _ = ask(running.port, "GET http://plain.example/b HTTP/1.1\r\nHost: plain.example\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 407")
    web.close()
    assert [(seen.method, seen.authorization) for seen in company.seen] == [
        ("GET", company.expected()), ("CONNECT", company.expected())]


def test_curl_and_git_get_through_with_the_credentials_in_the_proxy_url(harness: Harness, tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("git") is None:
        pytest.skip("curl and git are not installed")
    harness.upstream.route("GET", "/api/oauth/profile", {"account": "the host's"}, host=CLAUDE,
                           authorization=f"Bearer {CLAUDE_REAL}")
    bundle = harness.bundle()
    for how in ([], ["--proxy-anyauth"]):  # Basic at once; and first without, then after the 407
        result = subprocess.run(["curl", "-sS", "--max-time", "20", "--proxy", harness.url(), *how, "--cacert",
                                 str(bundle), "-H", f"Authorization: Bearer {CLAUDE_PH}",
                                 f"https://{CLAUDE}/api/oauth/profile"], capture_output=True, text=True, timeout=30)
        assert json.loads(result.stdout or "null") == {"account": "the host's"}, (how, result.stderr)
    refused = subprocess.run(["curl", "-sS", "--max-time", "20", "--proxy", harness.url(OTHER_VM_SECRET), "--cacert",
                              str(bundle), f"https://{CLAUDE}/api/oauth/profile"], capture_output=True, text=True,
                             timeout=30)
    assert refused.returncode != 0 and "407" in refused.stderr  # the control: the secret is what lets it through

    # git's default http.proxyAuthMethod is anyauth: its first CONNECT has no credentials
    basic_login = basic("x-access-token", GH_REAL)
    harness.upstream.git_refs(GITHUB, "/owner/repo.git", {"refs/heads/main": "ab" * 20}, authorization=basic_login)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_TERMINAL_PROMPT": "0"}
    for proxy in (["-c", f"http.proxy={harness.url()}"], []):
        git = subprocess.run(["git", *proxy, "-c", f"http.sslCAInfo={bundle}", "ls-remote",
                              f"https://x-access-token:{GH_PH}@{GITHUB}/owner/repo.git"], capture_output=True,
                             text=True, timeout=30, env={**env, "HTTPS_PROXY": harness.url()} if not proxy else env)
        assert git.stdout == f"{'ab' * 20}\trefs/heads/main\n", git.stderr
    denied = [entry for entry in harness.entries() if entry["decision"] == "deny"]
    assert any(entry["reason"] == "no proxy credentials (Proxy-Authorization)" for entry in denied)  # anyauth's try
    assert SECRET not in harness.log.read_text()
    assert all("proxy-authorization" not in request.headers for request in harness.upstream.requests)


def test_the_secret_is_made_once_0600_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(tmp_path / "state"))
    first = netguard.secret("agentbox-one")
    path = netguard.folder("agentbox-one") / netguard.SECRET_FILE
    assert len(first) == 32 and int(first, 16) >= 0
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert netguard.secret("agentbox-one") == first  # the same for the VM's life
    assert netguard.secret("agentbox-two") != first  # each VM its own
    path.write_text("not a secret\n")
    with pytest.raises(Exception) as refused:
        netguard.secret("agentbox-one")
    assert str(path) in str(refused.value) and "Remove it" in getattr(refused.value, "hint", "")


def test_the_only_proxy_agentbox_starts_is_the_vms_and_it_always_asks_for_the_secret() -> None:
    """agentbox.net.guard.serve (the VM's proxy process, with or without the broker) is the one place that starts a
    proxy, and it passes the VM's secret: no proxy agentbox runs serves a client without it."""
    import ast

    package = Path(netproxy.__file__).resolve().parent.parent
    starts = []
    for path in sorted(set(package.rglob("*.py")) - {Path(netproxy.__file__).resolve()}):
        tree = ast.parse(path.read_text())
        direct = {"RunningProxy", "_Proxy"} | {alias.asname or alias.name for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom) and node.module == "agentbox.net.proxy"
                                                for alias in node.names if alias.name == "start"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr in ("start", "RunningProxy")
                     and isinstance(node.func.value, ast.Name) and node.func.value.id in ("netproxy", "proxy"))
                    or (isinstance(node.func, ast.Name) and node.func.id in direct)):
                secret = next((keyword.value for keyword in node.keywords if keyword.arg == "secret"), None)
                starts.append((path.relative_to(package).as_posix(), ast.unparse(secret) if secret else None))
    assert starts == [("net/guard.py", "secret(vm_name)")]


def test_clients_without_the_credentials_cannot_hold_the_vms_connection_slots(tmp_path: Path) -> None:
    """Another user of the machine opening connections that send nothing (or no credentials) takes none of the
    VM's slots: the VM's own CONNECT is served at once, and a silent connection is dropped after HEAD_TIMEOUT."""
    with socket.create_server(("127.0.0.1", 0)) as target:
        address = f"127.0.0.1:{target.getsockname()[1]}"
        policy = netproxy.Policy(allow=[address], allow_loopback=True, max_connections=2, queue_timeout=1.0)
        with netproxy.start(policy, tmp_path / "log.jsonl", secret=SECRET) as proxy:
            silent = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(4)]
            vm = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            vm.sendall(f"CONNECT {address} HTTP/1.1\r\nHost: {address}\r\nProxy-Authorization: {RIGHT}\r\n\r\n"
                       .encode())
            assert vm.recv(100).startswith(b"HTTP/1.1 200"), "the VM's CONNECT waited for slots others held"
            vm.close()
            for sock in silent:
                sock.settimeout(netproxy.HEAD_TIMEOUT + 5)
                assert sock.recv(100) == b""  # dropped, no answer
                sock.close()
