"""The double's running guest (tests/fake_limactl/machine.py): what one `limactl shell` leaves running
outlives it, every shell of a running instance sees the same processes, /tmp and /run, and all of it
ends when the instance stops, is stopped forcibly, deleted or restarted, as in a VM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import fake_limactl, test_fake_limactl
from tests.helpers import needs
from tests.test_fake_limactl import Lima

lima = test_fake_limactl.lima        # the fixtures of the double's own tests
running = test_fake_limactl.running

pytestmark = pytest.mark.xdist_group("fake_limactl_machine")


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    needs("bwrap")


def sh(lima: Lima, script: str, **kwargs: object) -> subprocess.CompletedProcess:
    return lima.ok("shell", "vm", "--", "bash", "-c", script, **kwargs)


def guest_pids(lima: Lima, pattern: str) -> list[str]:
    out = lima.run("shell", "vm", "--", "pgrep", "-f", pattern).stdout
    return out.split()


def host_alive(marker: str) -> bool:
    """Whether a host process whose command line is marker is alive (not a zombie)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if cmdline == marker.encode() and "\nState:\tZ" not in status:
            return True
    return False


def test_a_detached_process_outlives_its_shell_and_every_shell_sees_it(running: Lima) -> None:
    sh(running, "nohup sleep 1001 >/dev/null 2>&1 & echo started")
    pids = guest_pids(running, "sleep 1001")
    assert len(pids) == 1, pids
    # Another shell can signal it: one pid namespace for the whole guest.
    sh(running, f"kill {pids[0]}")
    for _ in range(100):
        if not guest_pids(running, "sleep 1001"):
            break
        time.sleep(0.05)
    assert guest_pids(running, "sleep 1001") == []


def test_setsid_and_tmp_and_run_are_shared(running: Lima) -> None:
    sh(running, "setsid sleep 1002 </dev/null >/dev/null 2>&1 & echo hi > /tmp/note; "
                "sudo sh -c 'echo root > /run/mark'")
    assert sh(running, "cat /tmp/note /run/mark").stdout == "hi\nroot\n"
    assert len(guest_pids(running, "sleep 1002")) == 1
    # The guest's pid 1 is the sandbox's, not the host's init.
    assert sh(running, "cat /proc/1/comm").stdout.strip() != "systemd"


def test_a_tmux_server_survives_its_shell(running: Lima) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed on this machine")
    sh(running, "tmux new-session -d -s work 'sleep 1003'")
    assert sh(running, "tmux list-sessions -F '#{session_name}'").stdout == "work\n"
    assert len(guest_pids(running, "^sleep 1003")) == 1


@pytest.mark.parametrize("how, seconds", [(("stop", "vm"), 1041), (("stop", "--force", "vm"), 1042),
                                          (("delete", "--force", "vm"), 1043), (("restart", "vm"), 1044)])
def test_guest_processes_end_with_the_instance(running: Lima, how: tuple[str, ...], seconds: int) -> None:
    marker = f"sleep {seconds}"
    sh(running, f"nohup {marker} >/dev/null 2>&1 &")
    assert host_alive(marker)
    running.ok("--tty=false", *how)
    assert not host_alive(marker), how
    if how[0] == "restart":  # the new boot has a fresh guest that works
        assert guest_pids(running, marker) == []
        assert sh(running, "echo ok").stdout == "ok\n"


def _stop_by(lima: Lima, how: str) -> None:
    if how == "lima home removed":  # the guest's machine ends on its own
        shutil.rmtree(lima.lima_home / "vm", ignore_errors=True)
    else:
        lima.ok("--tty=false", *how.split(), "vm")


@pytest.mark.parametrize("how, seconds", [("stop", 1051), ("stop --force", 1052),
                                          ("lima home removed", 1053)])
def test_a_shell_whose_vm_stops_under_it_exits_255_as_ssh_does(running: Lima, how: str, seconds: int) -> None:
    """ssh loses its connection: limactl's ssh, a ControlMaster client at LogLevel=ERROR, exits 255 and says
    nothing; limactl passes it on (not the 137 of the command the guest's end killed)."""
    marker = f"sleep {seconds}"
    proc = subprocess.Popen(["limactl", "shell", "vm", "--", "bash", "-c", f"echo started; exec {marker}"],
                            env=running.env, cwd=running.root, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not host_alive(marker):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    _stop_by(running, how)
    stdout, stderr = proc.communicate(timeout=30)
    assert (proc.returncode, stdout, stderr) == (255, "started\n", "")


@pytest.mark.parametrize("sig", ["KILL", "TERM", "SEGV"])
def test_a_command_a_signal_ends_exits_255_while_its_vm_runs(running: Lima, sig: str) -> None:
    """Measured with Lima 2.2.0 and a Debian guest: `limactl shell VM sh -c 'kill -9 $$'` exits 255 and says
    nothing (sshd's `exit-signal` gives ssh no status); the guest goes on. A shell's 128+N is a status, kept."""
    result = running.run("shell", "vm", "--", "bash", "-c", f"ulimit -c 0; kill -{sig} $$")
    assert (result.returncode, result.stdout, result.stderr) == (255, "", "")
    assert sh(running, "echo on").stdout == "on\n"
    own = running.run("shell", "vm", "--", "bash", "-c", "bash -c 'kill -KILL $$'; exit $?")
    assert own.returncode == 137, own.stderr


def test_the_command_still_gets_stdio_and_exit_code(running: Lima) -> None:
    result = running.run("shell", "vm", "--", "bash", "-c", "cat; echo err >&2; exit 7", input="in\n")
    assert (result.returncode, result.stdout, result.stderr) == (7, "in\n", "err\n")


def test_killing_the_shell_kills_its_command_but_not_what_it_detached(running: Lima) -> None:
    proc = subprocess.Popen(["limactl", "shell", "vm", "--", "bash", "-c",
                             "nohup sleep 1011 >/dev/null 2>&1 & exec sleep 1012"],
                            env=running.env, cwd=running.root, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if host_alive("sleep 1012") and host_alive("sleep 1011"):
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    for _ in range(100):
        if not host_alive("sleep 1012"):
            break
        time.sleep(0.05)
    assert not host_alive("sleep 1012")
    assert host_alive("sleep 1011")


def test_an_instance_marked_running_by_hand_gets_a_guest_at_its_first_shell(lima: Lima) -> None:
    lima.create()
    state_file = lima.inst_dir() / "fake-state.json"
    state = json.loads(state_file.read_text())
    state.update(status="Running", iid="iid-by-hand")
    state_file.write_text(json.dumps(state))
    sh(lima, "nohup sleep 1021 >/dev/null 2>&1 &")
    assert len(guest_pids(lima, "sleep 1021")) == 1
    lima.ok("--tty=false", "stop", "--force", "vm")
    assert not host_alive("sleep 1021")


def test_the_guest_ends_when_lima_home_is_removed(running: Lima) -> None:
    sh(running, "nohup sleep 1031 >/dev/null 2>&1 &")
    shutil.rmtree(running.lima_home, ignore_errors=True)
    for _ in range(100):
        if not host_alive("sleep 1031"):
            break
        time.sleep(0.05)
    assert not host_alive("sleep 1031")


def test_sudo_works_from_a_process_that_outlived_its_shell(running: Lima) -> None:
    sh(running, "nohup bash -c 'sleep 0.5; sudo id -u > /tmp/later 2>&1' >/dev/null 2>&1 &")
    for _ in range(100):
        out = sh(running, "cat /tmp/later 2>/dev/null || true").stdout
        if out:
            break
        time.sleep(0.05)
    assert out == "0\n"


def test_calls_log_only_limactl_commands(running: Lima) -> None:
    sh(running, "true")
    calls = [json.loads(line)["argv"] for line in
             (running.lima_home / "_fake" / "calls.jsonl").read_text().splitlines()]
    assert not any("__machine" in argv for argv in calls)


def test_a_crashed_guest_is_stopped_and_start_boots_it_afresh(running: Lima) -> None:
    """kill -9 of QEMU: Lima's host agent exits with its driver and `list` says Stopped; `shell` is refused as for
    any stopped instance, and `start` is a new boot (a new boot id, nothing of the old guest left running)."""
    sh(running, "nohup sleep 1061 >/dev/null 2>&1 &")
    boot_id = sh(running, "cat /proc/sys/kernel/random/boot_id").stdout
    fake_limactl.crash(running.lima_home, "vm")
    assert not host_alive("sleep 1061")
    listed = json.loads(running.ok("list", "--json", "vm").stdout)
    assert listed["status"] == "Stopped"
    refused = running.run("shell", "vm", "--", "true")
    assert refused.returncode == 1
    assert "instance `vm` is stopped, run `limactl start vm` to start the instance" in refused.stderr
    running.ok("--tty=false", "start", "vm")
    assert json.loads(running.ok("list", "--json", "vm").stdout)["status"] == "Running"
    assert sh(running, "cat /proc/sys/kernel/random/boot_id").stdout != boot_id
    assert guest_pids(running, "sleep 1061") == []
