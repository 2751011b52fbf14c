"""The VM's network held on the host (agentbox.net.hold): what agentbox hands Lima for a held start, what QEMU then
runs with, how a guest connection reaches the proxy, and what `net status` says. The real thing (a root agent's
escapes from a held QEMU guest) is tried on the real-Lima tier (tests/test_real_lima.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import hold as nethold
from agentbox.net import proxy as netproxy
from agentbox.net import qemuhold
from agentbox.staginglayout import CONTEXT_FILE, NETWORK_RULES
from tests import helpers
from tests.helpers import NAME, FakeLima, needs_bwrap, run_agentbox, run_cli, write_trusted

CONNECTOR = Path(nethold.__file__).with_name("holdconnector.py")
SECRET = "ab" * 16


def _qemu_cmdline(limactl: FakeLima) -> list[str]:
    pid = int((limactl.home / NAME / "qemu.pid").read_text())
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _enforcement(project: Path) -> dict:
    return json.loads(run_agentbox("net", "status", "--json", cwd=project).stdout)


def test_an_allowlist_vm_starts_held_and_a_start_outside_agentbox_is_reported_unheld(
        project: Path, limactl: FakeLima, home: Path) -> None:
    needs_bwrap()
    write_trusted(project, "network:\n  mode: allowlist\n  allowHost: [5432]\n")
    started = run_agentbox("start", cwd=project, timeout=120)
    assert started.returncode == 0, started.stderr
    # Made from scratch (no base here): its first boot installs from the internet, so it is not held yet.
    assert not (limactl.home / NAME / "qemu.pid").exists()
    first = _enforcement(project)
    assert first["enforcement"] == "advisory" and "agentbox restart" in first["enforcementWhy"], first
    unheld = run_agentbox("shell", "--", "true", cwd=project, timeout=120)
    assert "kept by the VM's own firewall only" in unheld.stderr, unheld.stderr
    again = run_agentbox("shell", "--", "true", cwd=project, timeout=120)
    assert "firewall only" not in again.stderr, again.stderr  # once: a launch that says nothing can use its plan
    restarted = run_agentbox("restart", cwd=project, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    netdev = next(arg for arg in _qemu_cmdline(limactl) if arg.startswith("user,id=net0,"))
    options = netdev.split(",")
    assert "restrict=on" in options and "ipv6=off" in options, netdev
    forwards = [option for option in options if option.startswith("guestfwd=")]
    assert len(forwards) == 2, forwards
    assert forwards[0].startswith("guestfwd=tcp:192.168.5.4:3128-cmd:") and "proxy:" in forwards[0]
    assert str(CONNECTOR) in forwards[0] and forwards[1].endswith("port:5432"), forwards
    status = _enforcement(project)
    assert status["enforcement"] == "host", status

    launched = run_agentbox("shell", "--", "true", cwd=project, timeout=120)
    assert launched.returncode == 0, launched.stderr
    staged = (paths.staging_dir(NAME) / NETWORK_RULES).read_text()
    context = json.loads((paths.staging_dir(NAME) / CONTEXT_FILE).read_text())
    assert context["network"]["enforcement"] == "host", context["network"]
    assert "dnat ip to 192.168.5.4:3128" in staged and "dnat ip to 192.168.5.4:5432" in staged, staged

    # Lima started again by hand, without agentbox: QEMU runs unheld, and agentbox says so.
    for verb in ("stop", "start"):
        subprocess.run(["limactl", "--tty=false", verb, NAME], check=True, capture_output=True, timeout=120)
    assert not any("restrict=on" in arg for arg in _qemu_cmdline_or_none(limactl))
    status = _enforcement(project)
    assert status["enforcement"] == "advisory" and "agentbox restart" in status["enforcementWhy"], status

    restarted = run_agentbox("restart", cwd=project, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    assert _enforcement(project)["enforcement"] == "host"
    quiet = run_agentbox("shell", "--", "true", cwd=project, timeout=120)
    assert "held" not in quiet.stderr and "firewall" not in quiet.stderr, quiet.stderr

    # Back to open mode: the running VM still reaches nothing but the proxy, and the launch says so.
    write_trusted(project, "network:\n  mode: open\n")
    opened = run_agentbox("shell", "--", "true", cwd=project, timeout=120)
    assert "still runs with its network held" in opened.stderr, opened.stderr


def _qemu_cmdline_or_none(limactl: FakeLima) -> list[str]:
    try:
        return _qemu_cmdline(limactl)
    except (OSError, ValueError):
        return []


def test_an_open_vm_is_not_held(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    started = run_agentbox("start", cwd=project, timeout=120)
    assert started.returncode == 0, started.stderr
    assert not (limactl.home / NAME / "qemu.pid").exists()
    status = _enforcement(project)
    assert status["enforcement"] == "advisory"


def test_a_vz_vm_is_advisory_and_says_why(project: Path, limactl: FakeLima) -> None:
    write_trusted(project, "vm:\n  vmType: vz\nnetwork:\n  mode: offline\n")
    status = json.loads(run_cli("net", "status", "--json", cwd=project).stdout)
    assert status["enforcement"] == "advisory"
    assert "vz driver gives no host-side hold" in status["enforcementWhy"], status


@pytest.mark.parametrize(("argv", "problem"), [
    (["-netdev", "user,id=net0,net=192.168.5.0/24,restrict=off"], "already sets restrict=off"),
    (["-m", "1"], "found 0"),
    (["-netdev", "user,id=net0,a", "-netdev", "user,id=net1,b"], "second user-mode network"),
])
def test_qemu_is_never_started_unheld_when_its_network_cannot_be_held(tmp_path: Path, argv: list[str],
                                                                       problem: str) -> None:
    fake = helpers.write(tmp_path / "qemu", "#!/bin/sh\necho ran >> \"$0.ran\"\n", mode=0o755)
    spec = helpers.write(tmp_path / "spec.json", json.dumps({"qemu": [str(fake)], "append": "restrict=on",
                                                             "record": str(tmp_path / "hold.json"), "digest": "x"}))
    if "-netdev" not in argv:
        argv = [*argv, "-netdev", "socket,id=x"]
    result = subprocess.run([sys.executable, "-I", qemuhold.__file__, str(spec), *argv], capture_output=True,
                            text=True)
    assert result.returncode == 1 and problem in result.stderr, result.stderr
    assert not (tmp_path / "qemu.ran").exists() and not (tmp_path / "hold.json").exists()


def _connector(target: str) -> tuple[socket.socket, subprocess.Popen]:
    """What QEMU's `guestfwd ... cmd:` does for one guest connection: the connector started on one end of a socket
    pair (its standard input and output); the guest's end returned with it."""
    guest, qemu_side = socket.socketpair()
    connector = subprocess.Popen([sys.executable, "-I", "-S", str(CONNECTOR), target], stdin=qemu_side,
                                 stdout=qemu_side)
    qemu_side.close()
    guest.settimeout(10)
    return guest, connector


def test_a_held_connection_is_handed_to_the_proxy_which_asks_for_the_vms_credentials(tmp_path: Path) -> None:
    folder = tmp_path / ("long-" * 20)  # longer than a socket address takes
    folder.mkdir(mode=0o700)
    log = tmp_path / "log.jsonl"
    with netproxy.start(netproxy.Policy(allow=["example.org"]), log, secret=SECRET,
                        guest_socket=folder / nethold.GUEST_SOCKET):
        guest, handed = _connector(f"proxy:{folder / nethold.GUEST_SOCKET}")
        assert handed.wait(timeout=30) == 0
        guest.sendall(b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
        assert guest.recv(200).startswith(b"HTTP/1.1 407 ")
        guest.close()
        deadline = time.monotonic() + 5
        while not log.exists() or (not log.read_text() and time.monotonic() < deadline):
            time.sleep(0.05)
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["client"] == "guest (held)" and entry["decision"] == "deny", entry


def test_a_held_connection_to_an_allowed_host_port_is_copied_both_ways(tmp_path: Path) -> None:
    server, port = helpers.echo_server()
    try:
        guest, connector = _connector(f"port:{port}")
        guest.sendall(b"ping")
        assert guest.recv(100) == b"echo:ping"
        guest.close()
        assert connector.wait(timeout=10) == 0
    finally:
        server.close()


def test_a_connector_with_nothing_to_reach_resets_the_guests_connection(tmp_path: Path) -> None:
    guest, connector = _connector(f"proxy:{tmp_path / 'none.sock'}")
    assert connector.wait(timeout=30) == 1
    assert guest.recv(10) == b""
