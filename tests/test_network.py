"""network.*: the modes through the real CLI against the limactl double (issue 17).

The double's guest shares the host's network namespace and resolves host.lima.internal to 127.0.0.1, as
Lima's user network maps it to the host's loopback; so a program in the guest reaches agentbox's proxy the
way it would in a VM. The guest's firewall is real nftables only in tests/test_netfirewall.py (a namespace of
its own); here the double's `nft` records the ruleset the VM would enforce.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.net import guard as netguard
from agentbox.net import proxy as netproxy
from tests import helpers
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, staged_logins, write

# A program in the guest: CONNECT through $HTTPS_PROXY to argv[1] (host:port), print the status line, and
# for a 200 send "ping" and print what came back; for a refusal, print the JSON body.
CONNECT = GUEST_PROXY + r"""
import json, os, socket, sys, urllib.parse
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n"
           % (sys.argv[1], sys.argv[1], proxy_auth["Proxy-Authorization"])).encode())
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


@pytest.fixture(autouse=True)
def _staged_logins(home: Path) -> None:
    """The proxy's own lifecycle, per network mode: without the credential broker, which keeps it for the VM's
    life in every mode (tests/test_broker_cli.py, tests/test_broker_lifetime.py)."""
    staged_logins(home)


@pytest.fixture
def echo_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 answering "echo:" + what it got, which the proxy process knows as
    echo.test (a loopback address is the host's own: the proxy reaches it only by this tests-only hook)."""
    monkeypatch.setenv(netproxy.TEST_RESOLVE, "echo.test=127.0.0.1,rebind.test=0.0.0.0")
    server, port = helpers.echo_server()
    yield port
    server.close()


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
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['echo.test:{echo_server}']\n")
    allowed = connect_from_guest(project, f"echo.test:{echo_server}")
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
    assert decisions == [("echo.test", "allow"), ("example.org", "deny"), ("127.0.0.2", "deny"),
                         ("localhost", "deny")]
    assert os.stat(netguard.log_path(NAME)).st_mode & 0o077 == 0


def test_a_listed_name_that_resolves_to_the_host_is_refused(project: Path, vm: FakeLima, echo_server: int) -> None:
    # The check is on the address connected to: a listed name rebinding to 0.0.0.0 (the host's localhost) is refused.
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['rebind.test:{echo_server}', "
                                    f"'echo.test:{echo_server}']\n")
    refused = connect_from_guest(project, f"rebind.test:{echo_server}")
    assert refused["status"] == 403
    assert refused["body"]["reason"] == "resolves to a loopback address (0.0.0.0)"
    assert "network.allowHost" in refused["body"]["allow"]
    assert connect_from_guest(project, f"echo.test:{echo_server}")["status"] == 200  # control: the hook's server


@pytest.mark.parametrize("pattern", ["127.0.0.1:8080", "localhost", "localhost.", "[::1]", "127.1", "0.0.0.0",
                                     "[::ffff:127.0.0.1]:8080", "2130706433", "0x7f000001", "0177.0.0.1",
                                     "*.localhost", "LOCALHOST:3000", "[::]:80", "0"])
def test_net_allow_refuses_the_hosts_own_loopback_and_names_allow_host(project: Path, limactl: FakeLima,
                                                                       pattern: str) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    result = run_cli("net", "allow", pattern, cwd=project)
    assert result.exit_code == 2, result.stderr
    assert "the proxy never connects to the host itself" in result.stderr
    port = pattern.rsplit(":", 1)[1] if pattern.rsplit("]", 1)[-1].count(":") == 1 else None
    assert f"`network.allowHost: [{port or 'PORT'}]` in agentbox.yml" in result.stderr
    assert (project / "agentbox.yml").read_text() == "network:\n  mode: allowlist\n"
    # The same pattern written into agentbox.yml is a config error naming the key, before anything starts.
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['{pattern}']\n")
    launched = run_cli("shell", "--", "true", cwd=project)
    assert launched.exit_code == 2 and "network.allow" in launched.stderr and "allowHost" in launched.stderr
    assert limactl.subcommands() == []


def test_net_allow_refuses_an_address_of_this_host(project: Path, limactl: FakeLima) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet: only picks the interface a route would use
        own = probe.getsockname()[0]
    except OSError:
        pytest.skip("this machine has no IPv4 route out, so no non-loopback address to test with")
    finally:
        probe.close()
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    result = run_cli("net", "allow", f"{own}:8080", cwd=project)
    assert result.exit_code == 2, result.stderr
    assert f"is an address of this host ({own})" in result.stderr and "network.allowHost: [8080]" in result.stderr
    control = run_cli("net", "allow", "203.0.113.7:8080", cwd=project)  # TEST-NET-3: no host's
    assert control.exit_code == 0, control.stderr
    assert "203.0.113.7:8080" in (project / "agentbox.yml").read_text()


def test_offline_net_allow_and_net_test_say_what_offline_lets_through(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: offline\n")
    refused = run_cli("net", "allow", "example.org", cwd=project)
    assert refused.exit_code == 1, refused.stderr
    assert "network.mode is offline" in refused.stderr and "network.allow has no effect" in refused.stderr
    assert "the launched agent's API hosts" in refused.stderr
    assert "set `network.mode: allowlist` in agentbox.yml" in refused.stderr
    assert (project / "agentbox.yml").read_text() == "network:\n  mode: offline\n"
    tested = agentbox(project, "net", "test", "https://example.org")
    assert tested.returncode == 1, tested.stderr
    assert "network.mode is offline, which lets through only the agents' API hosts" in tested.stdout
    assert "`agentbox net allow` has no effect there" in tested.stdout
    assert "to allow it: agentbox net allow" not in tested.stdout
    # Control: in allowlist mode the same commands suggest and make the allow.
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    assert "to allow it: agentbox net allow example.org" in agentbox(project, "net", "test", "https://example.org").stdout
    assert run_cli("net", "allow", "example.org", cwd=project).exit_code == 0


def test_the_proxy_is_gone_when_the_session_ends(project: Path, vm: FakeLima, echo_server: int) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['echo.test:{echo_server}']\n")
    result = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    assert result.returncode == 0, result.stderr
    secret = netguard.secret(NAME)  # the VM's proxy credentials are in its proxy URL
    assert result.stdout.startswith(f"http://agentbox:{secret}@host.lima.internal:")
    port = int(result.stdout.rsplit(":", 1)[1])
    rules = vm.nft_ruleset(NAME)  # the VM's firewall: the proxy's port the only way to the host
    assert f"ip daddr 192.168.5.2 tcp dport {port} accept" in rules
    assert "ip daddr 192.168.5.2 reject" in rules and "meta l4proto tcp reject with tcp reset" in rules
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
    registry = connect_from_guest(project, "registry.npmjs.org:443")  # the preset does not count offline
    assert registry["status"] == 403 and registry["body"]["blocked"] == "registry.npmjs.org"


def test_open_mode_starts_no_proxy_and_a_warm_launch_stays_at_two_calls(project: Path, vm: FakeLima) -> None:
    result = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "${HTTPS_PROXY:-none}"')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "none"
    assert "firewall" not in result.stderr  # it was set: no warning
    rules = vm.nft_ruleset(NAME)
    assert "ip daddr 192.168.5.2 reject" in rules and "tcp reset" not in rules  # open: only the host closed
    assert vm.subcommands() == ["list", "shell"]
    assert not netguard.folder(NAME).joinpath("proxy.json").exists()


def test_allow_host_opens_only_its_ports_in_the_vms_firewall(project: Path, vm: FakeLima) -> None:
    write(paths_global(), "network:\n  allowHost: [5432, 8080]\ncredentials:\n  broker: false\n")
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "ip daddr 192.168.5.2 tcp dport { 5432, 8080 } accept" in vm.nft_ruleset(NAME)
    write(paths_global(), "network:\n  allowHost: true\ncredentials:\n  broker: false\n")
    assert agentbox(project, "shell", "--", "true").returncode == 0
    rules = vm.nft_ruleset(NAME)
    assert "ip daddr 192.168.5.2 accept" in rules and "192.168.5.2 reject" not in rules
    # With the credential broker the VM's proxy port is open too, and only it besides the listed ports.
    write(paths_global(), "network:\n  allowHost: [5432]\n")
    assert agentbox(project, "shell", "--", "true").returncode == 0
    port = netguard.running(NAME).port  # type: ignore[union-attr]
    assert f"ip daddr 192.168.5.2 tcp dport {{ 5432, {port} }} accept" in vm.nft_ruleset(NAME)


def paths_global() -> Path:
    from agentbox import paths

    return paths.global_config_file()


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
    ("network:\n  mode: allowlist\n", "network:\n  uploadLimit: 10MiB\n", False),  # below the default 50MiB
    ("network:\n  mode: allowlist\n", "network:\n  uploadLimit: 100MiB\n", True),
    ("network:\n  mode: allowlist\n", "network:\n  uploadLimit: false\n", True),
    ("network:\n  mode: allowlist\n  uploadLimit: 1GiB\n", "network:\n  uploadLimit: 100MiB\n", False),
    ("network:\n  mode: allowlist\n  uploadLimit: false\n", "network:\n  uploadLimit: 2GiB\n", False),
    ("network:\n  mode: allowlist\n", "network:\n  inspect: all\n", False),  # stricter
    ("network:\n  mode: allowlist\n  inspect: all\n", "network:\n  inspect: credentials\n", True),
    ("network:\n  mode: allowlist\n  inspect: all\n", "network:\n  inspect: all\n", False),
    ("", "network:\n  private: []\n", True),  # the agent could otherwise let every private file out
    ("", "network:\n  private: ['.env*', '*.pem', '*.key', 'id_*', 'secrets/**', 'deploy/*']\n", False),
    ("network:\n  private: ['*.key']\n", "network:\n  private: ['*.key', '.env*']\n", False),
])
def test_a_project_file_may_tighten_the_network_but_loosening_needs_trust(
        project: Path, home: Path, limactl: FakeLima, global_text: str, local_text: str, needs_trust: bool) -> None:
    from agentbox import paths

    write(paths.global_config_file(), global_text)
    write(project / "agentbox.yml", local_text)
    result = run_cli("config", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert ("UNTRUSTED" in result.stderr) is needs_trust


PROXY_AGENT = """#!/bin/bash
# A stand-in agent: tells where its proxy is, then waits as long as its last argument says (seconds).
printf '%s\\n' "${HTTPS_PROXY:-none}" > "$PWD/.agent-proxy"
sleep "${@: -1}"
"""


def install_agent(vm: FakeLima, script: str = PROXY_AGENT) -> None:
    write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / "claude", script, mode=0o755)


def test_a_task_keeps_the_proxy_until_it_ends(project: Path, vm: FakeLima) -> None:
    from tests.helpers import git, make_repository

    make_repository(project, config="network:\n  mode: allowlist\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work")
    install_agent(vm)
    started = run_cli("run", "--", "3", cwd=project)
    assert started.exit_code == 0, started.stderr
    task_id = started.stdout.strip()
    running = netguard.running(NAME)
    assert running is not None, "the task's marker keeps the proxy after `agentbox run` returned"
    assert wait_until(lambda: (project / ".agent-proxy").exists())
    secret = netguard.secret(NAME)
    assert (project / ".agent-proxy").read_text() == f"http://agentbox:{secret}@host.lima.internal:{running.port}\n"
    done = agentbox(project, "wait", task_id, timeout=60)
    assert done.returncode == 0, done.stderr
    assert wait_until(lambda: netguard.running(NAME) is None, 5), "the proxy stops once the task has ended"


@pytest.mark.needs("tmux")
def test_a_detached_session_keeps_the_proxy_and_its_end_stops_it(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    install_agent(vm)
    result = agentbox(project, "claude", "--detach", "4")
    assert result.returncode == 0, result.stderr
    running = netguard.running(NAME)
    assert running is not None, "the session's marker keeps the proxy after the detached launch returned"
    assert wait_until(lambda: (project / ".agent-proxy").exists())
    secret = netguard.secret(NAME)
    assert (project / ".agent-proxy").read_text() == f"http://agentbox:{secret}@host.lima.internal:{running.port}\n"
    assert wait_until(lambda: netguard.running(NAME) is None, 15), "the proxy stops once the session has ended"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", running.port), timeout=2).close()


def test_a_taken_port_makes_the_proxy_pick_another(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    first = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    assert first.returncode == 0, first.stderr
    old_port = int(first.stdout.rsplit(":", 1)[1])
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", old_port))
    squatter.listen(1)
    try:
        second = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    finally:
        squatter.close()
    assert second.returncode == 0, second.stderr
    new_port = int(second.stdout.rsplit(":", 1)[1])
    assert new_port != old_port
    assert (netguard.folder(NAME) / "port").read_text().strip() == str(new_port)


def test_net_status_json_reports_the_policy_and_the_running_proxy(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n  presets: [pypi]\n  allow: [example.com]\n"
                                    "  allowHost: [5432]\n")
    idle = json.loads(run_cli("net", "status", "--json", cwd=project).stdout)
    assert idle["mode"] == "allowlist" and idle["enforcement"] == "advisory" and idle["allowHost"] == [5432]
    assert idle["proxy"] == {"running": False, "port": None, "pid": None, "url": None}
    sources = {entry["host"]: entry["from"] for entry in idle["allow"]}
    assert sources["pypi.org"] == "preset pypi" and sources["example.com"] == "network.allow"
    assert sources["api.anthropic.com"] == "agent claude"
    lease = netguard.begin(run_config(project).network, NAME, {"codex": ("api.openai.com",)})
    assert lease is not None and lease.port  # the port once the proxy serves
    try:
        busy = json.loads(run_cli("net", "status", "--json", cwd=project).stdout)
        status = json.loads(run_cli("status", "--json", cwd=project).stdout)
    finally:
        lease.release()
    # the URL as the VM has it, its secret masked (it is the VM's own)
    assert busy["proxy"]["running"] and busy["proxy"]["url"] == f"http://agentbox:***@host.lima.internal:{lease.port}"
    assert [entry["from"] for entry in busy["allow"]].count("agent claude") == 0  # only the launched agent's
    assert status["network"]["mode"] == "allowlist" and status["network"]["proxy"]["port"] == lease.port
    assert netguard.running(NAME) is None


def proxy_authorization(vm_name: str = NAME) -> str:
    """The header line that carries the VM's proxy credentials."""
    token = base64.b64encode(f"agentbox:{netguard.secret(vm_name)}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


def run_config(project: Path):
    from agentbox.config import load as config

    return config.load(project)


def proxy_connect(port: int, target: str) -> int:
    """A CONNECT as the VM makes it (with its proxy credentials): the answer's status."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{proxy_authorization()}\r\n".encode())
        return int(sock.recv(100).split(b" ")[1])


def test_net_allow_edits_the_file_and_a_running_proxy_uses_it_at_once(project: Path, vm: FakeLima,
                                                                       echo_server: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(netguard.TEST_POLL, "30")  # "at once": when the command returns, not at the next poll
    original = "# my project\nnetwork:\n  mode: allowlist   # keep it tight\n"
    write(project / "agentbox.yml", original)
    lease = netguard.begin(run_config(project).network, NAME, {})
    assert lease is not None and lease.port
    try:
        assert proxy_connect(lease.port, f"echo.test:{echo_server}") == 403
        result = run_cli("net", "allow", f"echo.test:{echo_server}", cwd=project)
        assert result.exit_code == 0, result.stderr
        assert "lets echo.test" in result.stderr
        assert proxy_connect(lease.port, f"echo.test:{echo_server}") == 200
    finally:
        lease.release()
    text = (project / "agentbox.yml").read_text()
    assert text.startswith(original.rstrip("\n"))  # the user's comments stay
    assert run_config(project).network.allow == (f"echo.test:{echo_server}",)
    again = run_cli("net", "allow", f"echo.test:{echo_server}", cwd=project)
    assert again.exit_code == 0 and "already" in again.stderr
    assert (project / "agentbox.yml").read_text() == text


@pytest.mark.parametrize("confirms", [True, False], ids=["running proxy", "proxy that never confirms"])
def test_a_launch_that_tightens_the_policy_is_refused_from_its_first_connection(
        project: Path, vm: FakeLima, echo_server: int, monkeypatch: pytest.MonkeyPatch, confirms: bool) -> None:
    # Another session holds the proxy (a lease of this process), which reads its settings every 30 s here: the
    # launch that removed echo.test from the allow list must not reach the VM before the proxy knows.
    monkeypatch.setenv(netguard.TEST_POLL, "30")
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['echo.test:{echo_server}']\n")
    lease = netguard.begin(run_config(project).network, NAME, {})
    assert lease is not None and lease.port
    try:
        assert proxy_connect(lease.port, f"echo.test:{echo_server}") == 200
        before = netguard.running(NAME)
        assert before is not None
        if not confirms:  # as a proxy of an agentbox before this one: it never says what it read
            (netguard.folder(NAME) / netguard.LOADED_FILE).write_text('{"pid": 1}\n')
        write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
        result = agentbox(project, "shell", "--", "python3", "-c", CONNECT, f"echo.test:{echo_server}")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1])["status"] == 403
        after = netguard.running(NAME)
        assert after is not None
        if confirms:
            assert after.pid == before.pid, "the running proxy took the change: nothing restarted"
            assert "did not take" not in result.stderr
        else:
            assert after.pid != before.pid
            assert "did not take the changed network settings within 5 s; starting a new one" in result.stderr
    finally:
        lease.release()
        netguard.stop(NAME)


def test_net_allow_that_loosens_the_global_policy_asks_for_trust_again(project: Path, vm: FakeLima) -> None:
    from agentbox import paths

    write(paths.global_config_file(), "network:\n  mode: allowlist\n")
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    result = run_cli("net", "allow", "example.org", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "agentbox trust" in result.stderr
    refused = agentbox(project, "shell", "--", "true")
    assert refused.returncode == 2 and "network.allow" in refused.stderr
    global_result = run_cli("net", "allow", "--global", "example.net", cwd=project)
    assert global_result.exit_code == 0
    assert "example.net" in paths.global_config_file().read_text()


@pytest.mark.parametrize("bad", ["http://example.com", "*.", "example.com:99999", "a b"])
def test_net_allow_refuses_a_malformed_host_and_writes_nothing(project: Path, limactl: FakeLima, bad: str) -> None:
    result = run_cli("net", "allow", bad, cwd=project)
    assert result.exit_code == 2
    assert not (project / "agentbox.yml").exists()


def test_net_log_prints_decisions_with_control_characters_escaped(project: Path, vm: FakeLima) -> None:
    log = netguard.log_path(NAME)
    log.parent.mkdir(parents=True, exist_ok=True)
    entries = [{"time": "2026-11-26T10:00:00Z", "client": "127.0.0.1", "method": "CONNECT", "host": "a.example",
                "port": 443, "decision": "allow", "reason": "", "bytes_up": 1, "bytes_down": 2},
               {"time": "2026-11-26T10:00:01Z", "client": "127.0.0.1", "method": "CONNECT",
                "host": "evil\x1b[2Jhost", "port": 443, "decision": "deny", "reason": "host not in the allow list"}]
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    result = run_cli("net", "log", cwd=project)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "2026-11-26T10:00:00Z  allow  CONNECT a.example:443"
    assert "\x1b" not in result.stdout and "evil\\x1b[2Jhost:443  (host not in the allow list)" in lines[1]
    assert run_cli("net", "log", "-n", "1", cwd=project).stdout.count("\n") == 1


def test_net_test_says_allowed_blocked_or_no_route_from_inside_the_vm(project: Path, vm: FakeLima,
                                                                      echo_server: int) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['echo.test:{echo_server}', "
                                    "'nowhere.invalid']\n")
    allowed = agentbox(project, "net", "test", f"https://echo.test:{echo_server}")
    assert allowed.returncode == 0, allowed.stderr
    assert "allowed through agentbox's proxy (allowlist)" in allowed.stdout
    blocked = agentbox(project, "net", "test", "https://example.org")
    assert blocked.returncode == 1
    assert "blocked by policy (host not in the allow list); to allow it: agentbox net allow example.org" in \
        blocked.stdout
    unresolved = agentbox(project, "net", "test", "https://nowhere.invalid")
    assert unresolved.returncode == 3 and "no route" in unresolved.stdout
    assert netguard.running(NAME) is None


@pytest.mark.parametrize(("mode", "url", "port"), [("allowlist", "http://127.0.0.1:8080", 8080),
                                                  ("allowlist", "http://localhost:3000", 3000),
                                                  ("open", "https://127.0.0.1:9443", 9443)])
def test_net_test_of_a_loopback_address_names_network_allow_host(project: Path, vm: FakeLima, mode: str, url: str,
                                                                 port: int) -> None:
    """`agentbox net allow` refuses a loopback host (the proxy never connects to the host itself), and straight out
    of the VM 127.0.0.1 is the VM itself: the hint names the key that opens this machine's service, with its port."""
    write(project / "agentbox.yml", f"network:\n  mode: {mode}\n")
    tested = agentbox(project, "net", "test", url)
    hint = (f"network.allowHost: [{port}] in agentbox.yml, then host.lima.internal:{port} in the VM (the proxy never "
            "connects to the host itself)\n")
    if mode == "allowlist":  # through the proxy, which refuses it
        assert tested.returncode == 1 and tested.stdout.endswith(f"; to allow it: {hint}"), tested.stdout
    else:
        assert tested.returncode == 3, tested.stderr
        assert tested.stdout == (f"{url}: no route (Connection refused): 127.0.0.1 in the VM is the VM itself; to "
                                 f"reach this machine's service: {hint}")
    assert "agentbox net allow" not in tested.stdout


def test_a_name_the_vm_cannot_resolve_is_said_as_such(project: Path, vm: FakeLima) -> None:
    """A DNS failure in the guest: a name that resolves nowhere, straight out of the VM (open mode); the proxy's own
    name (host.lima.internal) gone from the VM's /etc/hosts. Never `Unknown error -2`."""
    write(project / "agentbox.yml", "")
    direct = agentbox(project, "net", "test", "https://nowhere.invalid")
    assert direct.returncode == 3, direct.stderr
    assert direct.stdout.startswith("https://nowhere.invalid: no route (cannot resolve nowhere.invalid in the VM (")
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    assert agentbox(project, "restart", "--yes").returncode == 0
    hosts = vm.home / NAME / "guestfs" / "etc" / "hosts"
    hosts.write_text("".join(line for line in hosts.read_text().splitlines(keepends=True)
                             if "host.lima.internal" not in line))
    through_proxy = agentbox(project, "net", "test", "https://example.org")
    assert through_proxy.returncode == 3, through_proxy.stderr
    assert through_proxy.stdout.startswith("https://example.org: no route: agentbox's proxy could not be reached "
                                           "(cannot resolve host.lima.internal in the VM ("), through_proxy.stdout
    assert "Unknown error" not in through_proxy.stdout


def test_the_agents_context_file_reports_the_mode_and_its_enforcement(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: offline\n")
    result = run_cli("describe", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    network = json.loads(result.stdout)["network"]
    assert network["mode"] == "offline" and network["enforcement"] == "advisory"
    assert "proxy" in network["internet"] and network["hostLocalhost"].startswith("closed")


def test_doctor_reports_the_network_mode(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    result = run_cli("doctor", cwd=project)
    assert "network.mode allowlist (enforcement: advisory" in result.stdout + result.stderr


def test_a_firewall_that_cannot_be_set_is_said_once_per_boot_and_ruleset(project: Path, vm: FakeLima) -> None:
    stand_in = vm.home / NAME / "guestfs" / "usr-local" / "sbin" / "nft"
    stand_in.unlink()  # the double's nft, replaced by one that fails as an older VM without nftables does
    write(stand_in, "#!/bin/sh\necho 'nft: command not found' >&2\nexit 127\n", mode=0o755)
    first = agentbox(project, "shell", "--", "true")
    assert first.returncode == 0, first.stderr
    assert "the VM's firewall could not be set (nft: command not found)" in first.stderr
    again = agentbox(project, "shell", "--", "true")
    assert again.returncode == 0 and "firewall" not in again.stderr
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    changed = agentbox(project, "shell", "--", "true")
    assert changed.returncode == 0 and "firewall could not be set" in changed.stderr
    assert vm.nft_ruleset(NAME) == ""
