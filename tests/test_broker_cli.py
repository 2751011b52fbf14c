"""credentials.broker through the real CLI and the limactl double: the VM gets placeholder logins, its requests
to a credential host reach the (fake) real host with the host's token, nothing real is anywhere the VM reads,
and the VM's proxy lives while the VM runs (until `agentbox stop` here; tests/test_broker_lifetime.py: whatever
stops it), in open mode too."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import guard as netguard
from tests.fake_upstream import FakeUpstream
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, staged_logins, write

pytestmark = pytest.mark.timeout(180)

REAL_ACCESS = "sk-ant-oat01-REAL-ACCESS-" + "x" * 40
REAL_REFRESH = "sk-ant-ort01-REAL-REFRESH-" + "y" * 40
REAL_GH = "gho_REALGITHUBTOKEN" + "z" * 20
CLAUDE = "api.anthropic.com"

# In the guest: a request through $HTTPS_PROXY to api.anthropic.com, trusting only the guest's system bundle,
# with the login the VM's file holds.
REQUEST = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, urllib.parse
login = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))["claudeAiOauth"]["accessToken"]
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
connection.set_tunnel(sys.argv[1], 443, headers=proxy_auth)
connection.request("GET", "/api/oauth/profile", headers={"Authorization": sys.argv[2].replace("LOGIN", login)})
response = connection.getresponse()
print(json.dumps({"status": response.status, "body": json.loads(response.read())}))
"""


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", [CLAUDE, "api.github.com"]) as fake:
        fake.route("GET", "/api/oauth/profile", {"account": "the host's"}, host=CLAUDE,
                   authorization=f"Bearer {REAL_ACCESS}")
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(fake.address), "caFile": str(fake.ca_file)}))
        yield fake


@pytest.fixture
def host_logins(home: Path) -> None:
    expires = int((time.time() + 3600) * 1000)
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": REAL_ACCESS, "refreshToken": REAL_REFRESH, "expiresAt": expires,
        "scopes": ["user:inference"], "subscriptionType": "max"}}))
    write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True,
                                             "oauthAccount": {"emailAddress": "me@example.com"}}))
    write(home / ".config" / "gh" / "hosts.yml",
          f"github.com:\n    user: me\n    oauth_token: {REAL_GH}\n    git_protocol: https\n")


def _everything_under(folder: Path) -> bytes:
    found = b""
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found += path.read_bytes()
    return found


def test_the_vm_holds_placeholders_and_its_requests_reach_the_host_with_the_real_token(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_logins: None) -> None:
    write(project / "agentbox.yml", "")  # the broker is on by default
    result = agentbox(project, "shell", "--", "python3", "-c", REQUEST, CLAUDE, "Bearer LOGIN")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer == {"status": 200, "body": {"account": "the host's"}}
    assert [r.headers["authorization"] for r in upstream.requests_to(CLAUDE)] == [f"Bearer {REAL_ACCESS}"]

    # Nothing real in what the VM can read: its home, the staging folder it mounts, its env.
    readable = _everything_under(vm.guest_home(NAME)) + _everything_under(paths.staging_dir(NAME))
    for real in (REAL_ACCESS, REAL_REFRESH, REAL_GH):
        assert real.encode() not in readable
    guest_login = json.loads((vm.guest_home(NAME) / ".claude" / ".credentials.json").read_text())
    assert "agentbox-ph-" in guest_login["claudeAiOauth"]["accessToken"]
    assert "agentbox-ph-" in (vm.guest_home(NAME) / ".config" / "gh" / "hosts.yml").read_text()

    # The proxy serves in open mode and stays after the session, while the VM runs: `agentbox stop` ends it.
    running = netguard.running(NAME)
    assert running is not None and running.brokers
    assert agentbox(project, "stop").returncode == 0
    assert netguard.running(NAME) is None


def test_a_foreign_key_from_the_vm_is_refused_and_the_login_is_not_written_back(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_logins: None, home: Path) -> None:
    write(project / "agentbox.yml", "")  # the broker is on by default
    before = (home / ".claude" / ".credentials.json").read_bytes()
    refused = agentbox(project, "shell", "--", "python3", "-c", REQUEST, CLAUDE, "Bearer sk-ant-oat01-ATTACKER")
    answer = json.loads(refused.stdout.strip().splitlines()[-1])
    assert answer["status"] == 403 and "not this VM's" in answer["body"]["reason"]
    assert upstream.requests_to(CLAUDE) == []
    # The agent rewrites the VM's login; a brokered login never comes back to the host.
    login = vm.guest_home(NAME) / ".claude" / ".credentials.json"
    login.write_text(json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-ATTACKER", "refreshToken": "x",
                                                   "expiresAt": int((time.time() + 7200) * 1000)}}))
    assert agentbox(project, "shell", "--", "true").returncode == 0
    assert (home / ".claude" / ".credentials.json").read_bytes() == before


def test_without_the_broker_the_logins_are_staged_as_before(project: Path, vm: FakeLima, host_logins: None,
                                                            home: Path) -> None:
    staged_logins(home)
    assert agentbox(project, "shell", "--", "true").returncode == 0
    guest_login = json.loads((vm.guest_home(NAME) / ".claude" / ".credentials.json").read_text())
    assert guest_login["claudeAiOauth"]["accessToken"] == REAL_ACCESS
    assert netguard.running(NAME) is None  # open mode without the broker: no proxy
    assert os.environ.get("AGENTBOX_TEST_BROKER_UPSTREAM") is None


def _guest_program(vm: FakeLima, name: str, text: str) -> None:
    path = vm.home / NAME / "guestfs" / "usr-local" / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def test_a_missing_host_login_says_how_to_log_in_and_stages_nothing(project: Path, vm: FakeLima,
                                                                      upstream: FakeUpstream, home: Path) -> None:
    write(project / "agentbox.yml", "")  # the broker is on by default
    _guest_program(vm, "claude", "#!/bin/sh\necho 2.1.0\n")
    result = agentbox(project, "claude", "--version")
    assert result.returncode == 0, result.stderr
    # Both ways to log in, agentbox's own first (it needs no agent on the host).
    assert "Claude Code: no login on the host" in result.stderr
    assert ("; log in with `agentbox claude login` (in the VM; the login is kept on this machine), or, if you also "
            "run claude outside agentbox, on the host with `claude auth login` (said once)") in result.stderr
    assert "Codex" not in result.stderr  # only the launched agent's
    assert not (vm.guest_home(NAME) / ".claude" / ".credentials.json").exists()
    again = agentbox(project, "claude", "--version")
    assert again.returncode == 0 and "no login on the host" not in again.stderr  # said once; doctor keeps it
    # doctor keeps it for Claude Code, launched before; not for the agents never used here
    warnings = [line for line in run_cli("doctor", cwd=project).stdout.splitlines() if line.startswith("  WARN")]
    assert [line for line in warnings if "no login on the host" in line] == [
        line for line in warnings if line.startswith("  WARN  Claude Code: no login on the host")]
    assert len(warnings) >= 1


def test_a_malformed_host_login_stops_the_launch_before_the_vm_starts(project: Path, vm: FakeLima,
                                                                        upstream: FakeUpstream, home: Path) -> None:
    write(project / "agentbox.yml", "")  # the broker is on by default
    write(home / ".claude" / ".credentials.json", "{not json")
    assert agentbox(project, "stop").returncode == 0
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode != 0
    assert str(home / ".claude" / ".credentials.json") in result.stderr
    assert vm.subcommands()[-1] == "stop"  # nothing was started after the stop


# In the guest: what a login inside the VM does at its end (the OAuth code exchange), then an API call with
# the access token it got back.
LOGIN = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, urllib.parse
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
def call(host, method, path, body=None, headers={}):
    connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
    connection.set_tunnel(host, 443, headers=proxy_auth)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())
status, tokens = call("platform.claude.com", "POST", "/v1/oauth/token", json.dumps(
    {"grant_type": "authorization_code", "code": "the-code", "code_verifier": "v", "client_id": "c",
     "redirect_uri": "http://localhost:1/callback"}), {"Content-Type": "application/json"})
print(json.dumps({"status": status, "tokens": tokens}))
print(json.dumps(dict(zip(("status", "body"), call("api.anthropic.com", "GET", "/api/oauth/profile", None,
                                                   {"Authorization": "Bearer " + tokens["access_token"]})))))
"""


def test_a_login_inside_the_vm_saves_the_real_tokens_on_the_host_and_the_vm_gets_placeholders(
        project: Path, vm: FakeLima, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """`agentbox claude login` (the same exchange from a plain session is refused: tests/test_broker_login.py)."""
    new_access, new_refresh = "sk-ant-oat01-LOGGED-IN-" + "q" * 30, "sk-ant-ort01-LOGGED-IN-" + "r" * 30
    with FakeUpstream(tmp_path / "up", [CLAUDE, "platform.claude.com"]) as fake:
        fake.route("POST", "/v1/oauth/token", {"access_token": new_access, "refresh_token": new_refresh,
                                               "expires_in": 28800, "token_type": "Bearer"},
                   host="platform.claude.com")
        fake.route("GET", "/api/oauth/profile", {"account": "new"}, host=CLAUDE, authorization=f"Bearer {new_access}")
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(fake.address), "caFile": str(fake.ca_file)}))
        write(project / "agentbox.yml", "")  # the broker is on by default
        _guest_program(vm, "claude", "#!/usr/bin/python3" + LOGIN)  # what `claude auth login` does at its end
        result = agentbox(project, "claude", "login")
        assert result.returncode == 0, result.stderr
        exchange, profile = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
        assert exchange["status"] == 200 and "agentbox-ph-" in exchange["tokens"]["access_token"]
        assert "agentbox-ph-" in exchange["tokens"]["refresh_token"]
        assert profile == {"status": 200, "body": {"account": "new"}}
    saved = home / ".claude" / ".credentials.json"
    oauth = json.loads(saved.read_text())["claudeAiOauth"]
    assert (oauth["accessToken"], oauth["refreshToken"]) == (new_access, new_refresh)
    assert saved.stat().st_mode & 0o077 == 0
    assert new_access not in result.stdout and new_refresh not in result.stdout


def test_a_warm_brokered_launch_stays_at_one_limactl_call_and_starts_nothing(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_logins: None) -> None:
    write(project / "agentbox.yml", "")
    assert agentbox(project, "shell", "--", "true").returncode == 0
    first = netguard.running(NAME)
    assert first is not None
    vm.clear()
    assert agentbox(project, "shell", "--", "true").returncode == 0
    assert vm.subcommands() == ["shell"]
    assert netguard.running(NAME) == first  # the same proxy process: nothing was started
