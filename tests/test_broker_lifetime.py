"""The broker ends with its VM (issue 36): a brokered VM's proxy process stays between sessions while its VM runs,
and ends, whatever stopped the VM, once no session holds it: `limactl stop` or `limactl delete` run outside
agentbox (against the double directly), its state folder removed, a reboot (the process killed: the next launch
starts another). It asks Lima only while no session holds it, and seldom."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import guard as netguard
from tests.fake_limactl import read_calls
from tests.helpers import NAME, FakeLima, agentbox, wait_for, write

pytestmark = pytest.mark.timeout(180)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def brokered_proxy(project: Path) -> netguard.Running:
    write(project / "agentbox.yml", "")  # the broker is on by default: its proxy serves in open mode too
    assert agentbox(project, "shell", "--", "true").returncode == 0
    running = netguard.running(NAME)
    assert running is not None and running.brokers
    return running


def limactl(*args: str) -> None:
    """The double, run directly (outside agentbox), as a user would run Lima."""
    result = subprocess.run([shutil.which("limactl") or "limactl", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def proxy_calls(vm: FakeLima) -> list[list[str]]:
    return [call["argv"] for call in read_calls(vm.home, proxy=True) if call.get("proxy")]


@pytest.mark.parametrize("how", [["stop", NAME], ["delete", "--force", NAME]])
def test_a_vm_stopped_or_deleted_outside_agentbox_takes_its_broker_with_it(project: Path, vm: FakeLima,
                                                                              how: list[str]) -> None:
    running = brokered_proxy(project)
    vm.clear()
    limactl(*how)
    wait_for(lambda: alive(running.pid), netguard.VM_CHECK_SEC + 15, "the broker's process to end",
             until=lambda is_alive: not is_alive)
    assert netguard.running(NAME) is None
    calls = proxy_calls(vm)
    assert calls and all(argv == ["list", "--json"] for argv in calls)  # it asked Lima, through agentbox.vm.lima
    assert len(calls) <= 2  # seldom
    assert vm.subcommands() == [how[0]]  # what the test ran; the proxy's own calls are told apart


def test_while_a_session_holds_it_the_broker_stays_and_asks_nothing(project: Path, vm: FakeLima) -> None:
    from agentbox.session import brokersetup

    running = brokered_proxy(project)
    from agentbox.config import load

    lease = brokersetup.begin_proxy(load.load(project), NAME, {})  # what a session holds while it runs
    assert lease is not None
    try:
        vm.clear()
        limactl("stop", NAME)
        # Nothing to wait for but time: the proxy would ask Lima VM_CHECK_SEC after it was last held.
        time.sleep(netguard.IDLE_GRACE_SEC + netguard.VM_CHECK_SEC + 2)
        assert netguard.running(NAME) == running and alive(running.pid)
        assert proxy_calls(vm) == []  # a held proxy never asks
    finally:
        lease.release()
    # The control: the session's end lets it see the stopped VM.
    wait_for(lambda: alive(running.pid), netguard.VM_CHECK_SEC + 15, "the broker's process to end",
             until=lambda is_alive: not is_alive)


def test_a_running_vm_keeps_its_broker_between_sessions(project: Path, vm: FakeLima) -> None:
    running = brokered_proxy(project)
    wait_for(lambda: proxy_calls(vm), netguard.VM_CHECK_SEC + 15, "the broker to ask whether its VM runs")
    assert netguard.running(NAME) == running and alive(running.pid)  # it runs: the broker stays
    second = agentbox(project, "shell", "--", "true")
    assert second.returncode == 0 and netguard.running(NAME) == running


def test_the_broker_ends_at_once_when_the_vms_state_folder_is_gone(project: Path, vm: FakeLima) -> None:
    running = brokered_proxy(project)
    shutil.rmtree(paths.vm_state_dir(NAME))
    wait_for(lambda: alive(running.pid), 5, "the broker's process to end", until=lambda is_alive: not is_alive)
    assert not paths.vm_state_dir(NAME).exists()  # and it made nothing again on its way out


def test_after_a_reboot_the_next_launch_starts_a_new_broker(project: Path, vm: FakeLima) -> None:
    running = brokered_proxy(project)
    os.kill(running.pid, signal.SIGKILL)  # what a reboot does to it: proxy.json stays, its lock goes
    # Its lock goes a moment after the process (the kernel closes a dead process's files asynchronously).
    wait_for(lambda: netguard.running(NAME), 10, "its lock to be free", until=lambda found: found is None)
    assert (netguard.folder(NAME) / "proxy.json").exists()  # stale, and not taken for a running proxy
    assert agentbox(project, "shell", "--", "true").returncode == 0
    again = netguard.running(NAME)
    assert again is not None and again.pid != running.pid and alive(again.pid)


def test_a_throwaway_projects_broker_ends_with_stop_all(project: Path, vm: FakeLima, tmp_path: Path) -> None:
    """The project's folder was deleted (a throwaway project); its VM still runs, and `stop --all` run anywhere
    stops it: the broker goes with it before the command returns."""
    running = brokered_proxy(project)
    shutil.rmtree(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stopped = agentbox(elsewhere, "stop", "--all", "--yes")
    assert stopped.returncode == 0, stopped.stderr
    # `stop` waits STOP_TIMEOUT_SEC for the proxy's end; a loaded machine may take a moment longer
    wait_for(lambda: alive(running.pid), 5, "the broker's process to end", until=lambda is_alive: not is_alive)
    assert netguard.running(NAME) is None


def test_a_throwaway_projects_broker_ends_when_its_vm_is_deleted_outside_agentbox(project: Path,
                                                                                  vm: FakeLima) -> None:
    running = brokered_proxy(project)
    shutil.rmtree(project)
    limactl("delete", "--force", NAME)
    wait_for(lambda: alive(running.pid), netguard.VM_CHECK_SEC + 15, "the broker's process to end",
             until=lambda is_alive: not is_alive)


def test_a_broker_whose_lima_home_is_gone_ends(project: Path, vm: FakeLima) -> None:
    """A throwaway Lima home (LIMA_HOME in a temporary folder) removed with its VMs: Lima lists none there."""
    running = brokered_proxy(project)
    limactl("stop", NAME)
    shutil.rmtree(vm.home)
    wait_for(lambda: alive(running.pid), netguard.VM_CHECK_SEC + 15, "the broker's process to end",
             until=lambda is_alive: not is_alive)
