"""network.*: the modes through the real CLI against the limactl double (issue 17).

The double's guest shares the host's network namespace and resolves host.lima.internal to 127.0.0.1, as
Lima's user network maps it to the host's loopback; so a program in the guest reaches agentbox's proxy the
way it would in a VM. The guest's firewall is real nftables only in tests/test_netfirewall.py (a namespace of
its own); here the double's `nft` records the ruleset the VM would enforce.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import netguard
from tests.helpers import NAME, FakeLima, agentbox, run_cli, write

# A program in the guest: CONNECT through $HTTPS_PROXY to argv[1] (host:port), print the status line, and
# for a 200 send "ping" and print what came back; for a refusal, print the JSON body.
CONNECT = r"""
import json, os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
data = b""
while b"\r\n\r\n" not in data:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, _, rest = data.partition(b"\r\n\r\n")
status = head.split(b"\r\n")[0].decode()
if " 200 " in status + " ":
    s.sendall(b"ping")
    print(json.dumps({"status": 200, "echo": s.recv(100).decode()}))
else:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    print(json.dumps({"status": int(status.split()[1]), "body": json.loads(rest or b"{}")}))
"""


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 answering "echo:" + what it got."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture(autouse=True)
def _hosts_tmp(request: pytest.FixtureRequest) -> None:
    if "vm" in request.fixturenames:
        vm = request.getfixturevalue("vm")
        hosts = vm.home / NAME / "guestfs" / "etc" / "hosts"
        if "host.lima.internal" not in hosts.read_text():
            with open(hosts, "a") as f:
                f.write("127.0.0.1 host.lima.internal\n")


def connect_from_guest(project: Path, target: str) -> dict:
    result = agentbox(project, "shell", "--", "python3", "-c", CONNECT, target)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def log_entries() -> list[dict]:
    path = netguard.log_path(NAME)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_allowlist_lets_a_listed_host_through_and_refuses_others_with_403_json(project: Path, vm: FakeLima,
                                                                               echo_server: int) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['127.0.0.1:{echo_server}']\n")
    allowed = connect_from_guest(project, f"127.0.0.1:{echo_server}")
    assert allowed == {"status": 200, "echo": "echo:ping"}

    other = connect_from_guest(project, "example.org:443")
    assert other["status"] == 403
    assert other["body"]["blocked"] == "example.org"
    assert other["body"]["allow"] == "agentbox net allow example.org"

    literal = connect_from_guest(project, f"127.0.0.2:{echo_server}")
    assert literal["status"] == 403 and literal["body"]["reason"] == "IP address not in the allow list"

    rebound = connect_from_guest(project, "localhost:443")  # a listed name would be refused the same way
    assert rebound["status"] == 403

    decisions = [(entry["host"], entry["decision"]) for entry in log_entries()]
    assert decisions == [("127.0.0.1", "allow"), ("example.org", "deny"), ("127.0.0.2", "deny"),
                         ("localhost", "deny")]
    assert os.stat(netguard.log_path(NAME)).st_mode & 0o077 == 0


def test_a_listed_name_that_resolves_to_loopback_is_refused(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n  allow: ['localhost:443']\n")
    refused = connect_from_guest(project, "localhost:443")
    assert refused["status"] == 403
    assert refused["body"]["reason"].startswith("resolves to a loopback address")


def test_the_proxy_is_gone_when_the_session_ends(project: Path, vm: FakeLima, echo_server: int) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['127.0.0.1:{echo_server}']\n")
    result = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("http://host.lima.internal:")
    port = int(result.stdout.rsplit(":", 1)[1])
    assert netguard.running(NAME) is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_offline_keeps_only_the_agents_api(project: Path, vm: FakeLima, tmp_path: Path) -> None:
    from agentbox import paths

    write(paths.global_config_file(), f"env:\n  AGENTBOX_TEST_OUT: {project / '.agent.json'}\n")
    write(project / "agentbox.yml", "network:\n  mode: offline\n  presets: [npm]\n")
    result = agentbox(project, "claude")
    assert result.returncode == 0, result.stderr
    policy = netguard.policy(NAME)
    assert policy is not None and policy["mode"] == "offline"
    hosts = [host for host, _ in policy["allow"]]
    assert "api.anthropic.com" in hosts and "registry.npmjs.org" not in hosts


def test_open_mode_starts_no_proxy_and_a_warm_launch_stays_at_two_calls(project: Path, vm: FakeLima) -> None:
    result = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "${HTTPS_PROXY:-none}"')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "none"
    assert vm.subcommands() == ["list", "shell"]
    assert not netguard.folder(NAME).joinpath("proxy.json").exists()


def test_allowlist_warm_launch_stays_at_two_calls(project: Path, vm: FakeLima, echo_server: int) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]


@pytest.mark.parametrize("text, key", [
    ("network:\n  allow: ['*.']\n", "network.allow.[0]"),
    ("network:\n  allow: ['http://x']\n", "network.allow.[0]"),
    ("network:\n  allow: ['example.com:70000']\n", "network.allow.[0]"),
    ("network:\n  allowHost: [0]\n", "network.allowHost.[0]"),
    ("network:\n  mode: closed\n", "network.mode"),
    ("network:\n  presets: [npmjs]\n", "network.presets.[0]"),
    ("agents:\n  claude:\n    endpoints: ['api.*.com']\n", "agents.claude.endpoints.[0]"),
])
def test_malformed_network_settings_are_config_errors_before_anything_starts(project: Path, limactl: FakeLima,
                                                                             text: str, key: str) -> None:
    write(project / "agentbox.yml", text)
    result = agentbox(project, "claude")
    assert result.returncode == 2
    assert "agentbox.yml:" in result.stderr and f"{key}:" in result.stderr
    assert limactl.subcommands() == []


def test_the_docker_era_network_keys_still_load(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  policy: deny\n  allowHosts: [example.com]\n")
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "network.policy is ignored" in result.stderr and "network.mode" in result.stderr


@pytest.mark.parametrize("global_text, local_text, needs_trust", [
    ("", "network:\n  mode: allowlist\n  allow: [example.com]\n", False),  # stricter than open
    ("network:\n  mode: allowlist\n", "network:\n  mode: offline\n", False),
    ("network:\n  mode: allowlist\n", "network:\n  mode: open\n", True),
    ("network:\n  mode: allowlist\n", "network:\n  allow: [example.com]\n", True),
    ("network:\n  mode: allowlist\n  allow: [example.com]\n", "network:\n  allow: [example.com]\n", False),
    ("", "network:\n  allowHost: [5432]\n", True),
    ("network:\n  allowHost: true\n", "network:\n  allowHost: [5432]\n", False),
    ("network:\n  mode: offline\n", "network:\n  allowLan: true\n", True),
    ("network:\n  mode: offline\n  agentApi: false\n", "network:\n  agentApi: true\n", True),
])
def test_a_project_file_may_tighten_the_network_but_loosening_needs_trust(
        project: Path, home: Path, limactl: FakeLima, global_text: str, local_text: str, needs_trust: bool) -> None:
    from agentbox import paths

    write(paths.global_config_file(), global_text)
    write(project / "agentbox.yml", local_text)
    result = run_cli("config", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert ("UNTRUSTED" in result.stderr) is needs_trust
