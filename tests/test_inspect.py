"""network.inspect: all through the real CLI on the double: the broker terminates TLS for an allowed host that is no
credential host (with the VM's own CA, the one the guest trusts), so what a request sends there is counted and
checked; `credentials` (the default) leaves it a tunnel; a config that cannot have the CA stops before anything
starts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import certauthority
from agentbox.net import guard as netguard
from tests.fake_upstream import FakeUpstream
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, write

pytestmark = pytest.mark.timeout(180)

FILES = "files.example.com"  # allowed, no credential host
REAL_ACCESS = "sk-ant-oat01-REAL-ACCESS-" + "x" * 40

# In the guest: an HTTPS request through $HTTPS_PROXY to argv[1], trusting only the guest's system bundle:
# POST argv[2] (a path) with argv[3] KiB of body and, with argv[4], the VM's Claude login as a bearer token.
REQUEST = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
connection.set_tunnel(sys.argv[1], 443, headers=proxy_auth)
headers = {}
if len(sys.argv) > 4:
    login = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))["claudeAiOauth"]["accessToken"]
    headers["Authorization"] = "Bearer " + login
try:
    connection.request("POST", sys.argv[2], body=b"x" * (1024 * int(sys.argv[3])), headers=headers)
    response = connection.getresponse()
    print(json.dumps({"status": response.status, "body": json.loads(response.read() or b"{}")}))
except (OSError, http.client.HTTPException) as error:
    print(json.dumps({"error": type(error).__name__}))
"""


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", [FILES, "api.anthropic.com"]) as fake:
        fake.route("POST", "/upload", {"stored": True}, host=FILES)
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(fake.address), "caFile": str(fake.ca_file)}))
        yield fake


@pytest.fixture
def host_login(home: Path) -> None:
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": REAL_ACCESS, "refreshToken": "sk-ant-ort01-R" + "y" * 40,
        "expiresAt": int((time.time() + 3600) * 1000), "scopes": ["user:inference"]}}))
    write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True}))


def send(project: Path, *args: str) -> dict:
    result = agentbox(project, "shell", "--", "python3", "-c", REQUEST, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def log_entries() -> list[dict]:
    return [json.loads(line) for line in netguard.log_path(NAME).read_text().splitlines()]


def test_inspect_all_terminates_tls_for_an_allowed_host_and_counts_and_checks_what_it_sends(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_login: None) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: [{FILES}]\n  inspect: all\n"
                                    "  uploadLimit: 64KiB\n")
    assert send(project, FILES, "/upload", "8") == {"status": 200, "body": {"stored": True}}
    (request,) = upstream.requests_to(FILES)  # the broker's own connection, for the host's name
    assert request.body == b"x" * 8192
    # the VM's CA vouches for the allowed host: its leaf is the one the guest trusted
    assert FILES in certauthority.load(NAME).hosts

    entries = [entry for entry in log_entries() if entry["host"] == FILES]
    assert [entry["reason"] for entry in entries if "path" not in entry] == ["inspected (network.inspect: all)"]
    seen = [entry for entry in entries if entry.get("path") == "/upload"]
    assert seen[0]["decision"] == "pass" and 8192 < seen[0]["bytes_up"] < 8192 + 1024

    # a placeholder sent to it is an attempted leak, refused at the door
    leak = send(project, FILES, "/upload", "1", "with-login")
    assert leak["status"] == 403 and "attempted leak" in leak["body"]["reason"]
    # a body past the cap is refused with 413 and never reaches the host
    capped = send(project, FILES, "/upload", "100")
    assert capped["status"] == 413 and capped["body"]["cap"] == 64 * 1024
    assert len(upstream.requests_to(FILES)) == 1

    # each of these sessions began a window of its own: the last one's holds the refusal
    hosts = json.loads(run_cli("net", "log", "--hosts", "--json", cwd=project).stdout)["hosts"]
    assert [(row["host"], row["requests"], row["capped"]) for row in hosts if row["host"] == FILES] == [
        (FILES, 2, 1)]  # the CONNECT and the refused request


def test_inspect_credentials_leaves_an_allowed_host_a_tunnel(project: Path, vm: FakeLima, upstream: FakeUpstream,
                                                              host_login: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # control for the test above: by default only the credential hosts are terminated
    monkeypatch.setenv("AGENTBOX_TEST_PROXY_RESOLVE", f"{FILES}=127.0.0.1")
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: [{FILES}]\n")
    answer = send(project, FILES, "/upload", "8")
    assert "status" not in answer or answer["status"] != 200  # a tunnel to 127.0.0.1:443: nothing there
    assert upstream.requests_to(FILES) == []
    authority = certauthority.load(NAME)
    assert authority is not None and FILES not in authority.hosts
    assert all(entry.get("path") is None and entry["reason"] != "inspected (network.inspect: all)"
               for entry in log_entries() if entry["host"] == FILES)


@pytest.mark.parametrize("credentials, setting", [
    ("credentials:\n  broker: false\n", "credentials.broker: false"),
    ("credentials: false\n", "credentials: false"),
])
def test_inspect_all_without_the_vms_ca_stops_before_anything_starts(project: Path, limactl: FakeLima,
                                                                     credentials: str, setting: str) -> None:
    write(paths.global_config_file(), credentials)  # turning the broker off is the global config's to say
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n  inspect: all\n")
    result = agentbox(project, "claude")
    assert result.returncode == 2
    assert (f"agentbox.yml:3:12: network.inspect: all needs the VM's own certificate authority, which the credential "
            f"broker makes and installs in the VM, and the config says {setting}") in result.stderr
    assert "hint: Nothing was created or started. Turn the broker on" in result.stderr
    assert limactl.subcommands() == []


def test_inspect_all_in_open_mode_is_a_note(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  inspect: all\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "network.inspect: all has no effect in network.mode open" in result.stderr
    write(project / "agentbox.yml", "network:\n  inspect: everything\n")
    bad = run_cli("config", cwd=project)
    assert bad.exit_code == 2 and "network.inspect: expected credentials or all, found 'everything'" in bad.stderr
