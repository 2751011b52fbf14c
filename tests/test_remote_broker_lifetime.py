"""A remote task's broker (this machine's proxy for its mirror of the remote VM, `VM.on-HOST`) ends with what it
serves (issue 37): the host's last task, the host itself (`hosts rm`), the remote VM stopped or deleted there
outside agentbox. tests/leftovers.py fails the run on any that stays."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agentbox.net import guard as netguard
from agentbox.runtime.sshhost import mirror_name
from tests import test_remote_tasks
from tests.helpers import run_agentbox, wait_for
from tests.remotehost import RemoteHost
from tests.test_broker_lifetime import alive
from tests.test_remote_tasks import record, submit

remote_project = test_remote_tasks.remote_project  # the fixture: a project with a remote host `big`

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("tasks")]


def running_broker(project: Path) -> tuple[int, str, netguard.Running]:
    task_id = submit(project, "--on", "big", "do:sleep:120")
    wait_for(lambda: record(project, task_id)["state"], 120, "the task running", until=lambda state: state == "Running")
    mirror = mirror_name(record(project, task_id)["vm"], "big")
    found = wait_for(lambda: netguard.running(mirror), 30, "the task's broker")
    assert found.brokers
    return task_id, mirror, found


def ended_by_the_command(mirror: str, broker: netguard.Running) -> None:
    """The command stopped the broker (it waits STOP_TIMEOUT_SEC for its end; a loaded machine may take a moment
    more): well before the broker could have seen for itself that nothing holds it (its keeper's next look, then
    IDLE_GRACE_SEC and VM_CHECK_SEC)."""
    wait_for(lambda: alive(broker.pid), 2, "the broker's process to end", until=lambda is_alive: not is_alive)
    assert netguard.running(mirror) is None


def test_hosts_rm_force_ends_the_broker_of_its_tasks_at_once(remote_project: tuple[Path, RemoteHost]) -> None:
    project, _ = remote_project
    _, mirror, broker = running_broker(project)
    forced = run_agentbox("hosts", "rm", "big", "--force", cwd=project)
    assert forced.returncode == 0, forced.stderr
    ended_by_the_command(mirror, broker)


def test_hosts_rm_ends_a_broker_whose_keeper_is_gone(remote_project: tuple[Path, RemoteHost]) -> None:
    """This machine lost the task's keeper (killed here, as a restart would), the broker still serves: removing the
    host ends it, and no keeper brings it back."""
    import os
    import signal

    from agentbox.tasks import keeper

    project, _ = remote_project
    task_id, mirror, broker = running_broker(project)
    for pid in subprocess.run(["pgrep", "-f", f"agentbox.tasks.keeper {task_id}$"], capture_output=True,
                              text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    wait_for(lambda: keeper.running(task_id), 30, "the keeper to be gone", until=lambda runs: not runs)
    forced = run_agentbox("hosts", "rm", "big", "--force", cwd=project)
    assert forced.returncode == 0, forced.stderr
    ended_by_the_command(mirror, broker)


def test_the_hosts_last_task_ending_ends_its_broker(remote_project: tuple[Path, RemoteHost]) -> None:
    project, _ = remote_project
    task_id, mirror, broker = running_broker(project)
    assert run_agentbox("cancel", str(task_id), cwd=project).returncode == 0
    wait_for(lambda: alive(broker.pid), 30, "the broker to end with the host's last task",
             until=lambda is_alive: not is_alive)
    assert netguard.running(mirror) is None


@pytest.mark.parametrize("how", [["stop"], ["delete", "--force"]])
def test_a_remote_vm_stopped_or_deleted_there_takes_the_broker_with_it(remote_project: tuple[Path, RemoteHost],
                                                                       how: list[str]) -> None:
    project, host = remote_project
    task_id, mirror, broker = running_broker(project)
    done = host.run(["limactl", *how, record(project, task_id)["vm"]])
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    wait_for(lambda: alive(broker.pid), 60, "the broker to end with the remote VM",
             until=lambda is_alive: not is_alive)
    assert time.monotonic() - started < 30
    assert netguard.running(mirror) is None
    assert record(project, task_id)["state"] == "Failed"
