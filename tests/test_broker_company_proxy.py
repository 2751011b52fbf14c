"""Behind a company proxy (issue 27): agentbox's own proxy (the broker's, in open mode too) goes on through the
proxy the config's env names, with its credentials, trusting the config's caCert; NO_PROXY hosts and a config
without a proxy go directly; the proxy's password is in no process's argv and no world-readable file."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import guard as netguard
from agentbox.net import proxy as netproxy
from agentbox.net import upstream as companyproxy
from tests.company_proxy import CompanyProxy
from tests.fake_upstream import FakeUpstream
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, write

pytestmark = pytest.mark.timeout(180)

PASSWORD = "pa55-Corp-Secret-77"
CLAUDE = "api.anthropic.com"
LOGIN_HOST = "platform.claude.com"
TUNNEL = "tunnel.example"
DIRECT = "direct.example"
NEW_ACCESS = "sk-ant-oat01-LOGGED-IN-" + "q" * 30

# In the guest: a login's code exchange (answered on the host, which asks the real endpoint), an API call with
# the access token it got (brokered), and a plain tunnel to argv[1]:argv[2]; each through $HTTPS_PROXY.
GUEST = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, urllib.parse
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
unchecked = ssl._create_unverified_context()  # the tunnel's TLS is end to end: the VM's own business
def call(host, method, path, body=None, headers={}, port=443, context=context):
    connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
    connection.set_tunnel(host, port, headers=proxy_auth)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())
if sys.argv[1] == "login":
    status, tokens = call("platform.claude.com", "POST", "/v1/oauth/token", json.dumps(
        {"grant_type": "authorization_code", "code": "c", "code_verifier": "v", "client_id": "c",
         "redirect_uri": "http://localhost:1/callback"}), {"Content-Type": "application/json"})
    print(json.dumps([status, call("api.anthropic.com", "GET", "/api/oauth/profile", None,
                                   {"Authorization": "Bearer " + tokens["access_token"]})]))
print(json.dumps(call(sys.argv[2], "GET", "/hello", port=int(sys.argv[3]), context=unchecked)))
"""


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", [CLAUDE, LOGIN_HOST, TUNNEL, DIRECT]) as fake:
        fake.route("POST", "/v1/oauth/token", {"access_token": NEW_ACCESS, "refresh_token": "sk-ant-ort01-R" + "r" * 30,
                                               "expires_in": 28800, "token_type": "Bearer"}, host=LOGIN_HOST)
        fake.route("GET", "/api/oauth/profile", {"account": "the host's"}, host=CLAUDE,
                   authorization=f"Bearer {NEW_ACCESS}")
        fake.route("GET", "/hello", {"hello": "tunnel"})
        # No broker upstream hook: the real hosts are reached as configured (the company proxy, or directly:
        # `direct.example` resolves to the fake upstream on this host, every other name does not resolve here).
        monkeypatch.delenv("AGENTBOX_TEST_BROKER_UPSTREAM", raising=False)
        monkeypatch.setenv(netproxy.TEST_RESOLVE, f"{DIRECT}=127.0.0.1")
        yield fake


@pytest.fixture
def company(upstream: FakeUpstream) -> Iterator[CompanyProxy]:
    with CompanyProxy(user="corp", password=PASSWORD, default=upstream.address) as proxy:
        yield proxy


def _config(project: Path, upstream: FakeUpstream, env: dict[str, str]) -> None:
    """The company's settings in the user's global config (where they need no trust), the project's empty."""
    lines = "".join(f"  {name}: {json.dumps(value)}\n" for name, value in env.items())
    write(project / "agentbox.yml", "")
    write(Path(os.environ["HOME"]) / ".config" / "agentbox" / "config.yml",
          f"caCert: {upstream.ca_file}\n" + (f"env:\n{lines}" if lines else ""))


def _last_json(stdout: str, count: int = 1) -> list[object]:
    return [json.loads(line) for line in stdout.strip().splitlines()[-count:]]


def _world_readable_holding(folder: Path, text: str) -> list[Path]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o044:
            try:
                if text.encode() in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def _argv_holding(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in argv:
                found.append(argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_broker_and_a_tunnel_go_through_the_company_proxy_with_its_credentials(
        project: Path, vm: FakeLima, upstream: FakeUpstream, company: CompanyProxy, home: Path) -> None:
    write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True}))
    _config(project, upstream, {"HTTPS_PROXY": company.url})
    # The login's code exchange is accepted only while `agentbox claude login` runs: the guest's claude does it.
    guest_bin = vm.home / NAME / "guestfs" / "usr-local" / "bin"
    write(guest_bin / "company-proxy-guest.py", GUEST)
    write(guest_bin / "claude", f"#!/bin/sh\nexec python3 /usr/local/bin/company-proxy-guest.py login {TUNNEL} 443\n",
          mode=0o755)
    result = agentbox(project, "claude", "login")
    assert result.returncode == 0, result.stderr
    login, tunnel = _last_json(result.stdout, 2)
    assert login == [200, [200, {"account": "the host's"}]]
    assert tunnel == [200, {"hello": "tunnel"}]
    # The code exchange (the broker's own request on the host), the brokered call and the tunnel: each a CONNECT
    # to the company proxy, with its credentials.
    assert company.targets() == [f"{LOGIN_HOST}:443", f"{CLAUDE}:443", f"{TUNNEL}:443"]
    assert all(seen.authorized and seen.authorization == company.expected() for seen in company.seen)
    assert [r.headers["authorization"] for r in upstream.requests_to(CLAUDE)] == [f"Bearer {NEW_ACCESS}"]
    saved = json.loads((home / ".claude" / ".credentials.json").read_text())["claudeAiOauth"]
    assert saved["accessToken"] == NEW_ACCESS

    # The password: in the proxy's 0600 state file only; in no process's argv, no world-readable file, no log line.
    running = netguard.running(NAME)
    assert running is not None and running.brokers
    assert PASSWORD.encode() not in Path(f"/proc/{running.pid}/cmdline").read_bytes()
    assert _argv_holding(PASSWORD) == []
    state = netguard.folder(NAME) / companyproxy.FILE
    assert PASSWORD in state.read_text() and state.stat().st_mode & 0o077 == 0
    assert _world_readable_holding(paths.vm_state_dir(NAME), PASSWORD) == []
    assert _world_readable_holding(vm.home, PASSWORD) == []
    log = netguard.log_path(NAME).read_text()
    assert PASSWORD not in log and f"127.0.0.1:{company.port}" in log  # the log names the proxy as host:port


def test_no_proxy_hosts_go_directly_and_the_hosts_own_proxy_variables_stand_in_for_the_configs(
        project: Path, vm: FakeLima, upstream: FakeUpstream, company: CompanyProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the config's env names no proxy: the host's environment's (agentbox's own) is used, its NO_PROXY too
    _config(project, upstream, {})
    monkeypatch.setenv("https_proxy", company.url)
    monkeypatch.setenv("NO_PROXY", f"localhost,.{DIRECT}")
    direct = agentbox(project, "shell", "--", "python3", "-c", GUEST, "tunnel", DIRECT, str(upstream.port))
    assert direct.returncode == 0, direct.stderr + netguard.log_path(NAME).read_text()
    assert _last_json(direct.stdout) == [[200, {"hello": "tunnel"}]]
    assert company.seen == []  # NO_PROXY: directly
    via = agentbox(project, "shell", "--", "python3", "-c", GUEST, "tunnel", TUNNEL, "443")
    assert via.returncode == 0, via.stderr
    assert _last_json(via.stdout) == [[200, {"hello": "tunnel"}]]
    assert company.targets() == [f"{TUNNEL}:443"] and company.seen[0].authorization == company.expected()


def test_a_changed_proxy_setting_reaches_the_running_proxy_and_without_one_it_goes_directly(
        project: Path, vm: FakeLima, upstream: FakeUpstream, company: CompanyProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The proxy reads its settings files every 30 s here, not every 0.25 s: the launch that changed them must not
    # rely on that poll (under load, a session's first connection used to beat it and went by the old route).
    monkeypatch.setenv(netguard.TEST_POLL, "30")
    _config(project, upstream, {"HTTPS_PROXY": company.url})
    try:
        first = agentbox(project, "shell", "--", "python3", "-c", GUEST, "tunnel", TUNNEL, "443")
        assert first.returncode == 0, first.stderr
        assert company.targets() == [f"{TUNNEL}:443"]
        pid = netguard.running(NAME)
        # Control: no proxy configured any more: the same (still running) proxy goes directly, as before.
        _config(project, upstream, {})
        time.sleep(0.05)  # a new mtime for the state file
        direct = agentbox(project, "shell", "--", "python3", "-c", GUEST, "tunnel", DIRECT, str(upstream.port))
        assert direct.returncode == 0, direct.stderr
        assert _last_json(direct.stdout) == [[200, {"hello": "tunnel"}]]
        assert company.targets() == [f"{TUNNEL}:443"]
        assert netguard.running(NAME) == pid
        assert not (netguard.folder(NAME) / companyproxy.FILE).read_text().count("HTTPS_PROXY")
    finally:
        netguard.stop(NAME)  # its slow loop would notice its folder gone only after the run


# -- the proxy itself -------------------------------------------------------------------------------------------

def _ask(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def _route(company: CompanyProxy, password: str = PASSWORD) -> companyproxy.Route:
    proxy = companyproxy.parse_url(f"http://corp:{password}@127.0.0.1:{company.port}")
    return companyproxy.Route(https=proxy, http=proxy)


def test_the_host_itself_is_still_refused_and_plain_http_goes_in_absolute_form(
        tmp_path: Path, company: CompanyProxy) -> None:
    names = {"rebinds.example": ["127.0.0.1"], "plain.example": []}
    policy = netproxy.Policy(open=True, resolver=lambda host, port: names.get(host, []), upstream=_route(company))
    with netproxy.start(policy, tmp_path / "log.jsonl") as running:
        for target in ("rebinds.example:443", "127.0.0.1:443", "localhost:443"):
            answer = _ask(running.port, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403"), (target, answer)
        assert company.seen == []  # refused before anything was sent
        plain = _ask(running.port, b"GET http://plain.example/a?b HTTP/1.1\r\nHost: plain.example\r\n\r\n")
        assert plain.startswith(b"HTTP/1.1 200") and b'"via": "company proxy"' in plain
    assert [(s.method, s.target, s.authorized) for s in company.seen] == [("GET", "http://plain.example/a?b", True)]


def test_a_refusing_company_proxy_is_a_502_naming_it_without_its_password(
        tmp_path: Path, company: CompanyProxy) -> None:
    policy = netproxy.Policy(open=True, resolver=lambda host, port: [],
                             upstream=_route(company, password="wrong-" + PASSWORD))
    with netproxy.start(policy, tmp_path / "log.jsonl") as running:
        answer = _ask(running.port, b"CONNECT somewhere.example:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502") and b"407" in answer and f":{company.port}".encode() in answer
    assert PASSWORD.encode() not in answer and PASSWORD not in (tmp_path / "log.jsonl").read_text()
    assert company.seen[0].target == "somewhere.example:443" and not company.seen[0].authorized


def test_without_a_company_proxy_a_name_that_does_not_resolve_is_a_502(tmp_path: Path) -> None:
    policy = netproxy.Policy(open=True, resolver=lambda host, port: [])
    with netproxy.start(policy, tmp_path / "log.jsonl") as running:
        answer = _ask(running.port, b"CONNECT somewhere.example:443 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 502") and b"does not resolve" in answer
    assert os.environ.get("HTTPS_PROXY") is None
