"""Host ports: which VM holds a port Lima could not forward (status, ports, launch warnings), and
`agentbox port` forwarding one on demand through the double's ssh."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import NAME, FakeLima, echo_server, run_cli, wait_for

OTHER = "agentbox-other"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def other(project: Path, vm: FakeLima) -> Path:
    """A second project whose VM runs beside the project's."""
    folder = project.parent / "other"
    folder.mkdir()
    result = run_cli("start", cwd=folder)
    assert result.exit_code == 0, result.stderr
    vm.clear()
    return folder


def status(project: Path) -> str:
    result = run_cli("status", cwd=project)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def status_ports(project: Path) -> list[dict[str, Any]]:
    result = run_cli("status", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    ports: list[dict[str, Any]] = json.loads(result.stdout)["ports"]
    return ports


def shell(project: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", *command], cwd=project,
                          capture_output=True, text=True, timeout=120)


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("agentbox: warning: ")]


def test_status_ports_and_a_launch_name_the_vm_that_holds_a_host_port(project: Path, vm: FakeLima,
                                                                    other: Path) -> None:
    port = free_port()
    vm.set_guest_listeners(OTHER, f"127.0.0.1:{port}")  # first: the other VM gets the host port
    vm.set_guest_listeners(NAME, f"0.0.0.0:{port}")
    text = status(project)
    clash = re.search(rf"^ports:     port {port} in {NAME} is not reachable at 127\.0\.0\.1:{port}: the VM {OTHER} "
                      rf"\(workspace {re.escape(str(other))}\) forwards that host port; fix: `agentbox port {port} "
                      rf"(\d+)` forwards it to 127\.0\.0\.1:(\d+)$", text, re.M)
    assert clash is not None, text
    assert clash[1] == clash[2] and int(clash[1]) > port
    assert status_ports(project) == [{
        "vm": NAME, "workspace": str(project), "guestAddr": f"0.0.0.0:{port}", "hostAddr": f"127.0.0.1:{port}",
        "via": "lima", "forwarded": False, "url": None,
        "heldBy": {"kind": "vm", "vm": OTHER, "workspace": str(other)},
        "error": f"listen tcp 127.0.0.1:{port}: bind: address already in use",
    }]
    assert f"ports:     http://127.0.0.1:{port}/ -> 127.0.0.1:{port} in the VM (Lima)\n" in status(other)

    listing = run_cli("ports", cwd=project)
    assert listing.exit_code == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["HOST", "VM", "GUEST", "BY", "STATE"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [f"127.0.0.1:{port}", NAME, f"0.0.0.0:{port}", "lima", "NOT"],
        [f"127.0.0.1:{port}", OTHER, f"127.0.0.1:{port}", "lima", "forwarded"],
    ]

    checks = json.loads(run_cli("doctor", "--json", cwd=project).stdout)
    assert [(c["status"], c["message"]) for c in checks if c["check"] == "vm.ports"] == [
        ("WARN", f"port {port} in {NAME} is not reachable at 127.0.0.1:{port}: the VM {OTHER} (workspace {other}) "
                 "forwards that host port")]

    vm.clear()
    launched = shell(project, "true")
    assert launched.returncode == 0, launched.stderr
    assert warnings(launched.stderr) == [
        f"agentbox: warning: port {port} in {NAME} is not reachable at 127.0.0.1:{port}: the VM {OTHER} "
        f"(workspace {other}) forwards that host port; `agentbox port {port} {clash[1]}` forwards it to "
        f"127.0.0.1:{clash[1]}"]
    assert vm.subcommands() == ["list", "shell"]  # the warm launch reads Lima's logs, no extra call


def test_a_host_program_on_the_port_and_a_port_freed_since(project: Path, vm: FakeLima) -> None:
    with socket.socket() as program:
        program.bind(("127.0.0.1", 0))
        program.listen(1)
        port = program.getsockname()[1]
        vm.set_guest_listeners(NAME, f"127.0.0.1:{port}")
        assert (f"port {port} in {NAME} is not reachable at 127.0.0.1:{port}: another program on this host listens "
                f"there (`lsof -nP -iTCP:{port} -sTCP:LISTEN` shows which)") in status(project)
        assert status_ports(project)[0]["heldBy"] == {"kind": "host", "vm": None, "workspace": None}
    # Lima does not try again once the port is free: the guest's port stays unreachable.
    assert (f"port {port} in {NAME} is not reachable at 127.0.0.1:{port}: that host port was taken when the "
            "program in the VM started listening and is free now (Lima does not try again: restart that program)"
            ) in status(project)
    vm.set_guest_listeners(NAME)
    vm.set_guest_listeners(NAME, f"127.0.0.1:{port}")  # the program restarted
    assert f"ports:     http://127.0.0.1:{port}/ -> 127.0.0.1:{port} in the VM (Lima)\n" in status(project)


def test_a_clash_that_starts_during_the_session_is_reported_after_it(project: Path, vm: FakeLima,
                                                                     other: Path) -> None:
    port, before = free_port(), free_port()
    vm.set_guest_listeners(OTHER, f"127.0.0.1:{port}", f"127.0.0.1:{before}")
    vm.set_guest_listeners(NAME, f"127.0.0.1:{before}")
    started, go = project / ".session-started", project / ".session-go"
    # The session's program says it runs, then waits (60 s at most) until the test has changed the listeners.
    program = f"touch {started}; i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    session = subprocess.Popen([sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", program], cwd=project,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started.exists() or session.poll() is not None, 60, "the session's program to start")
        assert session.poll() is None, session.communicate()
        vm.set_guest_listeners(NAME, f"127.0.0.1:{before}", f"127.0.0.1:{port}")  # a dev server starts meanwhile
        go.touch()
        _, stderr = session.communicate(timeout=120)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 0, stderr
    found = warnings(stderr)
    assert len(found) == 2, stderr
    assert found[0].startswith(f"agentbox: warning: port {before} in {NAME} is not reachable")
    assert found[1].startswith(f"agentbox: warning: during the session, port {port} in {NAME} is not reachable at "
                               f"127.0.0.1:{port}: the VM {OTHER}")


def ask(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"hi")
        return conn.recv(100)


def test_agentbox_port_forwards_on_demand_until_stopped(project: Path, vm: FakeLima, isolated_env) -> None:
    server, guest = echo_server(b"from the VM:")
    host = free_port()
    try:
        result = run_cli("port", str(guest), str(host), cwd=project)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"http://127.0.0.1:{host}/\n"
        assert result.stderr == (
            f"agentbox: Lima has not seen a program listen on port {guest} in {NAME} yet; the URL works once one does\n"
            f"forwarding 127.0.0.1:{host} to port {guest} of {NAME} until it stops "
            f"(`agentbox port --stop {host}` ends it sooner)\n")
        assert ask(host) == b"from the VM:hi"
        assert vm.subcommands() == ["list"]
        assert vm.ssh_calls() == [[
            "-F", str(vm.home / NAME / "ssh.config"), "-N", "-o", "ExitOnForwardFailure=yes", "-o", "ControlMaster=no",
            "-o", "ControlPath=none", "-o", "LogLevel=ERROR", "-L", f"127.0.0.1:{host}:127.0.0.1:{guest}",
            f"lima-{NAME}"]]

        assert f"ports:     http://127.0.0.1:{host}/ -> 127.0.0.1:{guest} in the VM (agentbox port)\n" in status(project)
        listed = json.loads(run_cli("ports", "--json", cwd=project).stdout)
        assert [(row["via"], row["url"]) for row in listed] == [("agentbox port", f"http://127.0.0.1:{host}/")]

        again = run_cli("port", str(guest), str(host), cwd=project)
        assert (again.exit_code, again.stdout) == (0, f"http://127.0.0.1:{host}/\n")
        assert "agentbox port already forwards" in again.stderr and len(vm.ssh_calls()) == 1

        stopped = run_cli("port", "--stop", str(host), cwd=project)
        assert stopped.exit_code == 0, stopped.stderr
        assert stopped.stderr == f"stopped forwarding 127.0.0.1:{host} to port {guest} of {NAME}\n"
        deadline = time.monotonic() + 10
        while True:
            try:
                ask(host)
            except OSError:
                break
            assert time.monotonic() < deadline, "the forward still answers"
            time.sleep(0.1)
        assert json.loads((isolated_env["state"] / "vms" / NAME / "ports.json").read_text()) == []
        twice = run_cli("port", "--stop", str(host), cwd=project)
        assert twice.exit_code == 1
        assert twice.stderr == (f"agentbox: error: agentbox port has no forward of {NAME} on host port {host}\n"
                                f"hint: Its forwards of {NAME} are on host ports: none (`agentbox ports` lists all).\n")
    finally:
        server.close()


def test_an_on_demand_forward_ends_with_the_vm(project: Path, vm: FakeLima) -> None:
    server, guest = echo_server(b"from the VM:")
    host = free_port()
    try:
        assert run_cli("port", str(guest), str(host), cwd=project).exit_code == 0
        assert ask(host) == b"from the VM:hi"
        assert run_cli("stop", cwd=project).exit_code == 0
        deadline = time.monotonic() + 10
        while json.loads(run_cli("ports", "--json", cwd=project).stdout or "[]"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # The forward's ssh notices the VM gone within moments (as real ssh sees its connection drop).
        while True:
            try:
                ask(host)
            except OSError:
                break
            assert time.monotonic() < deadline, "the forward outlived the VM"
            time.sleep(0.2)
        refused = run_cli("port", str(guest), cwd=project)
        assert refused.exit_code == 1
        assert refused.stderr == (f"agentbox: error: the VM {NAME} is stopped, so its ports cannot be forwarded\n"
                                  "hint: `agentbox start` starts it.\n")
    finally:
        server.close()


def test_agentbox_port_refuses_a_taken_host_port_and_says_who_has_it(project: Path, vm: FakeLima,
                                                                     other: Path) -> None:
    port = free_port()
    vm.set_guest_listeners(OTHER, f"127.0.0.1:{port}")
    result = run_cli("port", str(port), cwd=project)
    assert result.exit_code == 1
    message, hint = result.stderr.splitlines()
    assert message == (f"agentbox: error: 127.0.0.1:{port} is taken: the VM {OTHER} (workspace {other}) forwards "
                       "that host port")
    suggested = re.fullmatch(rf"hint: `agentbox port {port} (\d+)` forwards it to 127\.0\.0\.1:(\d+) instead\.", hint)
    assert suggested is not None and suggested[1] == suggested[2]
    with socket.socket() as program:
        program.bind(("127.0.0.1", 0))
        program.listen(1)
        busy = program.getsockname()[1]
        by_host = run_cli("port", "8080", str(busy), cwd=project)
    assert by_host.exit_code == 1
    assert by_host.stderr.startswith(f"agentbox: error: 127.0.0.1:{busy} is taken: another program on this host "
                                     f"listens there (`lsof -nP -iTCP:{busy} -sTCP:LISTEN` shows which)\n")
    assert vm.ssh_calls() == []  # refused before any ssh ran

    # Control: the same port of this VM Lima already forwards needs nothing.
    mine = free_port()
    vm.set_guest_listeners(NAME, f"127.0.0.1:{mine}")
    already = run_cli("port", str(mine), cwd=project)
    assert (already.exit_code, already.stdout) == (0, f"http://127.0.0.1:{mine}/\n")
    assert already.stderr == f"agentbox: Lima already forwards port {mine} of {NAME} to 127.0.0.1:{mine}\n"
    assert vm.ssh_calls() == []


def test_port_arguments(project: Path, vm: FakeLima) -> None:
    for args in ([], ["--stop", "3000", "4000"], ["3000", "--stop", "3001"], ["0"], ["70000"]):
        result = run_cli("port", *args, cwd=project)
        assert result.exit_code == 2, (args, result.stderr)


def test_lima_logs_are_read_defensively(tmp_path: Path) -> None:
    """Malformed lines and odd addresses are skipped; a FIFO or a symlink is not read (never blocks)."""
    import os

    from agentbox.vm.lima import PortForward, port_forwards

    def event(kind: str, guest: str, host: str) -> str:
        return json.dumps({"time": "t", "status": {"running": True, "portForward": {
            "type": kind, "protocol": "tcp", "guestAddr": guest, "hostAddr": host}}})

    (tmp_path / "ha.stdout.log").write_text("\n".join([
        "not json", '{"portForward": [1]', event("forwarding", "127.0.0.1:3000", "127.0.0.1:3000"),
        event("forwarding", "\x1b[31mevil:1", "127.0.0.1:1"), event("forwarding", "127.0.0.1:4000", "/tmp/sock"),
        event("forwarding", "0.0.0.0:5000", "127.0.0.1:5000"), event("stopping", "0.0.0.0:5000", "127.0.0.1:5000"),
        event("forwarding", "[::1]:6000", "127.0.0.1:6000"),
    ]) + "\n")
    (tmp_path / "ha.stderr.log").write_text("\n".join([
        json.dumps({"level": "info", "msg": "Forwarding TCP from [::1]:6000 to 127.0.0.1:6000"}),
        json.dumps({"error": "listen tcp 127.0.0.1:6000: bind: address already in use", "level": "warning",
                    "msg": "failed to listen tcp: 127.0.0.1:6000"}),
        "{broken",
    ]) + "\n")
    assert port_forwards(str(tmp_path)) == [
        PortForward("127.0.0.1:3000", "127.0.0.1:3000", True),
        PortForward("[::1]:6000", "127.0.0.1:6000", False, "listen tcp 127.0.0.1:6000: bind: address already in use"),
    ]
    (tmp_path / "ha.stderr.log").unlink()
    os.mkfifo(tmp_path / "ha.stderr.log")
    assert len(port_forwards(str(tmp_path))) == 2  # the FIFO is skipped: every attempt counts as listening
    (tmp_path / "ha.stdout.log").rename(tmp_path / "elsewhere.log")
    (tmp_path / "ha.stdout.log").symlink_to(tmp_path / "elsewhere.log")
    assert port_forwards(str(tmp_path)) == []
