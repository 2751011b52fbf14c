"""How agentbox reports a session that ended without an exit status, as real Lima gives it: a program a signal
ended in a running VM (exit 255 through `limactl shell`), and a VM that crashed under the session (Lima then
reports it Stopped, and the next launch boots it afresh)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, needs_bwrap, run_agentbox

pytestmark = pytest.mark.timeout(120)


def test_a_program_killed_in_a_running_vm_is_not_called_a_lost_vm(project: Path, vm: FakeLima) -> None:
    needs_bwrap()
    # The launch step that waits for the program (it hands the logins back) is what a signal ends here: an
    # exec'd agent the kernel kills for memory ends the same way, with no status for ssh to give.
    result = run_agentbox("shell", "--", "bash", "-c", 'kill -KILL "$PPID"; sleep 5', cwd=project)
    assert result.returncode == 255, result.stderr
    assert (f"agentbox: {NAME} is still running, but the session ended without an exit status (exit 255): ssh "
            "reports that when the program in the VM was killed by a signal (the kernel's out-of-memory killer, "
            "`kill -9`), ") in result.stderr, result.stderr
    assert "stopped during the session" not in result.stderr
    assert vm.status(NAME) == "Running"


def test_a_vm_that_crashes_during_the_session_is_said_stopped_and_boots_afresh(project: Path, vm: FakeLima) -> None:
    needs_bwrap()
    boot_id = run_agentbox("shell", "--", "cat", "/proc/sys/kernel/random/boot_id", cwd=project).stdout
    marker = vm.guest_home(NAME) / "session-up"
    session = subprocess.Popen([sys.executable, "-m", "agentbox", "shell", "--", "bash", "-c",
                                "touch ~/session-up; exec sleep 1071"], cwd=project, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and session.poll() is None, session.communicate()
        time.sleep(0.05)
    vm.crash(NAME)
    _, stderr = session.communicate(timeout=60)
    assert session.returncode == 255, stderr
    assert (f"agentbox: {NAME} stopped during the session (its status is now Stopped), so ssh lost its connection "
            "(exit 255); the next launch starts it again.") in stderr, stderr
    again = run_agentbox("shell", "--", "cat", "/proc/sys/kernel/random/boot_id", cwd=project)
    assert again.returncode == 0, again.stderr
    assert again.stdout != boot_id  # a new boot, not the crashed one revived
    assert vm.status(NAME) == "Running"
