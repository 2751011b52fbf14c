"""The keeper of a task on a remote host: a detached process on this machine, one per task, while it is active.

It hands the task over when its host answers (a host that was unreachable at submit), then asks the host for the
runner's state every POLL_SEC over the host's multiplexed ssh connection, and writes it into the record, so that
`agentbox tasks` shows the last known state without contacting any host. While the host does not answer, the
record says since when (the runner there goes on by itself). When the task ended, it brings home the outputs and
the changes (a proposal, agentbox.tasks.records.take_changes), removes the task's folder there and ends.

`step` is also what `tasks --refresh`, `wait` and `logs -f` call: one look at the host, under the records' lock.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from agentbox.tasks import records as tasks
from agentbox.tasks.state import FAILED

POLL_SEC = 2.0
UNREACHABLE_POLL_SEC = 10.0
SILENT_RUNNER_SEC = 60.0  # a Running task whose runner's heartbeat did not move for this long has lost its runner
OUTPUTS_LIMIT = 16 << 20
COLLECTED = ("state", "stdout", "stderr", "changes.patch", "summary.md")
LOCK = "keeper.lock"


def start(task_id: int) -> None:
    """Start the task's keeper, detached (it ends by itself with the task)."""
    import subprocess

    from agentbox import hosttools

    env = hosttools.environ()
    subprocess.Popen([sys.executable, "-m", "agentbox.session.remotekeeper", str(task_id)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True, env=env, cwd="/")


def step(task_id: int) -> tasks.Task | None:
    """One look at the host for an active task (or one whose results are not home yet); the record, updated."""
    from agentbox.remote import hosts
    from agentbox.remote.farclient import FarError
    from agentbox.remote.ssh import Unreachable
    from agentbox.runtime.remote import SshRuntime
    from agentbox.session import remote

    task = tasks.get(task_id)
    if task is None or task.host == tasks.LOCAL or (not task.active and task.harvested):
        return task
    host = hosts.get(task.host)
    if host is None:
        with tasks.locked():
            fresh = tasks.get(task_id) or task
            if fresh.active:
                tasks.end(fresh, FAILED, f"its host {task.host} is no longer known (`agentbox hosts rm`)")
            fresh.harvested = True
            tasks.save(fresh)
        return tasks.get(task_id)
    if task.active and not task.handed:
        try:
            if not remote.hand_over(task, host):
                return _unreachable(task_id)
        except Exception as exc:  # refused by the host: the task cannot run
            with tasks.locked():
                fresh = tasks.get(task_id) or task
                if fresh.active:
                    tasks.end(fresh, FAILED, getattr(exc, "message", None) or str(exc))
            return tasks.get(task_id)
        task = tasks.get(task_id) or task
    runtime = SshRuntime(host)
    key = task.remote_key or ""
    try:
        if task.active:
            seen = runtime.task(task.vm, key)
            _apply(task_id, seen, host.name)
            task = tasks.get(task_id) or task
        if not task.active and not task.harvested:
            _bring_home(task_id, runtime)
    except Unreachable:
        return _unreachable(task_id)
    except FarError as exc:
        _note(task_id, reason=f"{host.name} answered with an error: {exc.message}")
    hosts.reached(host)
    return tasks.get(task_id)


def _unreachable(task_id: int) -> tasks.Task | None:
    from agentbox.remote import hosts

    with tasks.locked():
        task = tasks.get(task_id)
        if task is None:
            return None
        if task.unreachable_since is None:
            task.unreachable_since = time.time()
            tasks.save(task)
    host = hosts.get(task.host)
    if host is not None:
        hosts.unreachable(host)
    return task


def _note(task_id: int, **fields: Any) -> None:
    with tasks.locked():
        task = tasks.get(task_id)
        if task is not None:
            for name, value in fields.items():
                setattr(task, name, value)
            tasks.save(task)


def _apply(task_id: int, seen: Any, host_name: str) -> None:
    """The runner's state (and the VM's) into the record."""
    now = time.time()
    with tasks.locked():
        task = tasks.get(task_id)
        if task is None or not task.active:
            return
        task.seen = now
        task.unreachable_since = None
        runner = tasks.parse_runner_state(seen.state) if seen.state is not None else None
        if runner is not None:
            tasks.apply_seen(task, runner)
        if task.active:
            if seen.vm_status is None:
                tasks.end(task, FAILED, f"its VM {task.vm} on {host_name} was deleted while the task was "
                                        f"{task.state.lower()}")
                return
            if seen.vm_status != "Running":
                tasks.end(task, FAILED, f"its VM {task.vm} on {host_name} stopped ({seen.vm_status}) while the "
                                        f"task was {task.state.lower()}")
                return
            if seen.heartbeat is not None and seen.heartbeat != task.heartbeat_seen:
                task.heartbeat_seen, task.heartbeat_moved = seen.heartbeat, now
            elif task.state == "Running" and task.heartbeat_moved and now - task.heartbeat_moved > SILENT_RUNNER_SEC:
                tasks.end(task, FAILED, f"its runner on {host_name} stopped answering "
                                        f"{int(now - task.heartbeat_moved)} s ago (the VM restarted?)")
                return
        tasks.save(task)


def _bring_home(task_id: int, runtime: Any) -> None:
    """The ended task's outputs and changes, from the host into the record; then its folder there goes."""
    from agentbox.fsutil import atomic_write

    key = (tasks.get(task_id) or None)
    if key is None:
        return
    found = runtime.collect(key.vm, key.remote_key or "", COLLECTED, OUTPUTS_LIMIT)
    with tasks.locked():
        task = tasks.get(task_id)
        if task is None or task.harvested:
            return
        for name in tasks.OUTPUTS:
            atomic_write(tasks.folder(task.id) / name, found.get(name, b""), mode=0o600)
        if task.isolated:
            tasks.take_changes(task, found.get("changes.patch"), found.get("summary.md"))
        task.harvested = True
        tasks.save(task)
    runtime.forget(key.vm, key.remote_key or "")


def main(argv: list[str]) -> int:
    import fcntl

    task_id = int(argv[0])
    try:
        fd = os.open(tasks.folder(task_id) / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another keeper follows it
    while True:
        try:
            task = step(task_id)
        except Exception:  # a bad moment (the record being written): look again
            task = tasks.get(task_id)
        if task is None or (not task.active and task.harvested):
            return 0
        time.sleep(UNREACHABLE_POLL_SEC if task.unreachable_since is not None else POLL_SEC)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
