"""The keeper of a Job (an isolated task, agentbox.tasks.jobs): a detached process on this machine, one per task,
while it is active, whatever the place: it talks to the task's runtime (agentbox.runtime.place) only.

It hands the task over when its host answers (a host that was unreachable at submit), then asks the place for the
runner's state every POLL_SEC (a host over its multiplexed ssh connection; this machine's VM by reading its
outbox), and writes it into the record, so that `agentbox tasks` shows the last known state without contacting
any host. While a host does not answer, the record says since when (the runner there goes on by itself). When the
task ended, it brings home the outputs and the changes (a proposal, agentbox.tasks.records.take_changes), removes
the task's folder there and ends.

`step` is also what `tasks --refresh`, `wait` and `logs -f` call: one look at the host, under the records' lock.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentbox import hosttools, paths, runtime, timing
from agentbox.config import load, trust
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, held, private_dir
from agentbox.net import guard
from agentbox.progress import note
from agentbox.remote import registry
from agentbox.remote.farclient import FarError
from agentbox.remote.registry import UnknownHost
from agentbox.remote.ssh import Transport, Unreachable
from agentbox.runtime.contract import Handed, Job, NeedsTemplate, Runtime
from agentbox.runtime.sshhost import SshRuntime, mirror_name
from agentbox.safetext import visible
from agentbox.session import brokersetup
from agentbox.tasks import records
from agentbox.tasks.transitions import CANCELLED, FAILED, RUNNING

POLL_SEC = 2.0
UNREACHABLE_POLL_SEC = 10.0
SILENT_RUNNER_SEC = 60.0  # a Running task whose runner's heartbeat did not move for this long has lost its runner
OUTPUTS_LIMIT = 16 << 20
COLLECTED = ("state", *records.OUTPUTS, records.CHANGES, records.SUMMARY)
LOCK = "keeper.lock"
LOCK_PATIENCE_SEC = 1.0
JOB_FILE = "job.json"  # in the task's record folder until the host took the task (agentbox.tasks.remote)


def end_brokers(host: str) -> list[str]:
    """Stop this machine's proxy (the broker's way back) of every mirror of `host`'s VMs: the host is being
    forgotten (`hosts rm`), so nothing here serves it any more, whatever its keepers still hold. The mirrors
    whose proxy was stopped."""
    suffix = mirror_name("", host)
    try:
        names = sorted(entry.name for entry in os.scandir(paths.state_dir() / "vms")
                       if entry.name.endswith(suffix) and len(entry.name) > len(suffix))
    except OSError:
        return []
    return [name for name in names if guard.stop(name)]


def keep_job(task: records.Task, job: Job) -> None:
    """The job, kept beside the record until the host took it (hand_over reads it, now or later)."""
    data = {"vm": job.vm, "task": job.task, "limaYaml": job.lima_yaml, "argv": list(job.argv),
            "startTimeout": job.start_timeout, "staging": list(job.staging or []),
            "executables": sorted(job.executables),
            "files": {name: base64.b64encode(content).decode("ascii") for name, content in job.files.items()}}
    atomic_write(private_dir(records.folder(task.id)) / JOB_FILE, json.dumps(data), mode=0o600)


def kept_job(task: records.Task) -> Job | None:
    try:
        data = json.loads((records.folder(task.id) / JOB_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return Job(data["vm"], data["task"], data["limaYaml"],
               {name: base64.b64decode(content) for name, content in data["files"].items()}, data["argv"],
               int(data["startTimeout"]), data.get("staging"), frozenset(data.get("executables") or ()))


SENT = "sent.json"  # beside this machine's mirror of a remote VM's staging: what its staging there holds


def _sent_file(task: records.Task) -> Any:
    return paths.vm_state_dir(mirror_name(task.vm, task.host)) / SENT


def _sent(task: records.Task) -> dict[str, str]:
    """{staging file: sha256} of what the host's staging folder of the VM holds, as last sent (empty: unknown)."""
    if task.host == records.LOCAL:
        return {}
    try:
        data = json.loads(_sent_file(task).read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _changed(job: Job, sent: dict[str, str]) -> dict[str, bytes]:
    """The job's files the host does not hold as they are (the task's own files always)."""
    return {name: data for name, data in job.files.items()
            if not name.startswith("staging/") or sent.get(name) != hashlib.sha256(data).hexdigest()}


def _remember_sent(task: records.Task, job: Job, sent: dict[str, str]) -> None:
    now = {name: digest for name, digest in sent.items() if job.staging is None or name[8:] in set(job.staging)}
    now.update({name: hashlib.sha256(data).hexdigest() for name, data in job.files.items()
                if name.startswith("staging/")})
    atomic_write(_sent_file(task), json.dumps(now, sort_keys=True), mode=0o600)


def hand_over(task: records.Task, place: Runtime, proxy_port: int | None) -> bool:
    """Make the task's forward (when it has one: this machine's proxy at `proxy_port`) and submit its kept job;
    True when the place took it (the record is then Queued or Running, as its runner says), False when a host
    did not answer (it stays Pending). StateError when the place refused it."""
    job = kept_job(task)
    if job is None:
        raise StateError(f"{task.label} has no job to hand over (its file {records.folder(task.id) / JOB_FILE} is "
                         "gone)")
    try:
        if task.forward_port is not None and isinstance(place, SshRuntime):
            if proxy_port is None:
                raise StateError(f"{task.label} needs this machine's proxy, and it is not running")
            with timing.phase("the broker's forward (ssh -O forward)"):
                place.transport.forward_remote(proxy_port, task.forward_port)
            _note(task.id, forward_master=place.transport.master_pid(), forward_local=proxy_port)
            task = records.get(task.id) or task
        handed = deliver(task, place, job)
    except Unreachable as exc:
        place.answered(False)
        with records.locked():
            fresh = records.get(task.id) or task
            if fresh.active and fresh.reason is None:
                fresh.reason = f"waiting for {place.name}: {exc.message}"
                records.save(fresh)
        return False
    place.answered(True)
    took(task, job, handed, f"the VM on {place.name}")
    return True


def deliver(task: records.Task, place: Runtime, job: Job) -> Handed:
    """Submit the job: only the staging files the place does not hold as they are, and everything when the VM is
    missing there (its folders are empty)."""
    sent = _sent(task)
    with timing.phase(f"hand-over to {place.name} (submit)"):
        try:
            return place.submit(job._replace(lima_yaml=None, files=_changed(job, sent)))
        except NeedsTemplate:
            if job.lima_yaml is None:
                raise
            note(f"making the project's VM {job.vm} on {place.name} (the first time takes minutes)")
            return place.submit(job)


def took(task: records.Task, job: Job, handed: Handed, where: str) -> None:
    """The place ran the job's launch step: the task is handed over (StateError when the step failed). `where`:
    the VM as the message names it ("the VM", "the VM on big")."""
    if handed.code != 0:
        said = handed.stderr.strip()
        shown = f": {visible(said[-600:])}" if said else ""
        raise StateError(f"{where} did not take {task.label}: the launch step exited {handed.code}{shown}",
                         hint=None if said else "Its messages are above. `agentbox tasks` shows the task as Failed.")
    if job.staging is not None:
        _remember_sent(task, job, _sent(task))
    (records.folder(task.id) / JOB_FILE).unlink(missing_ok=True)
    with records.locked():
        fresh = records.get(task.id) or task
        fresh.reason = None
        fresh.handed = True
        fresh.unreachable_since = None
        fresh.seen = time.time()
        records.save(fresh)


def cancel(task: records.Task) -> None:
    """Cancel a Job: one still waiting for its host is simply Cancelled; else its runner there is asked
    (StateError when the host does not answer: nothing was delivered)."""
    with records.locked():
        fresh = records.get(task.id) or task
        if fresh.active and not fresh.handed:
            records.end(fresh, CANCELLED, f"cancelled before {fresh.host} took it")
            fresh.harvested = True
            records.save(fresh)
            (records.folder(fresh.id) / JOB_FILE).unlink(missing_ok=True)
            return
    try:
        runtime.place(task.host).cancel(task.vm, task.remote_key or "")
    except Unreachable as exc:
        raise StateError(f"{task.label} was not cancelled: {exc.message}",
                         hint=f"It goes on on {task.host}; `agentbox cancel {task.id}` again when the host answers.")\
            from None


def start(task_id: int) -> None:
    """Start the task's keeper, detached (it ends by itself with the task)."""
    env = hosttools.environ()
    subprocess.Popen([sys.executable, "-m", "agentbox.tasks.keeper", str(task_id)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True, env=env, cwd="/")


class Keeping:
    """What only the keeper process holds for its task: a lease on this machine's proxy for the remote VM (the
    broker's way back), and the forward of the host's port to it, made again when the connection was remade."""

    def __init__(self) -> None:
        self.lease: Any = None
        self.problem: str | None = None
        self.closed = False

    def proxy_port(self, task: records.Task) -> int | None:
        if task.forward_port is None:
            return None
        if self.lease is None:
            try:
                self.lease = _proxy_lease(task)
            except Exception as exc:  # the config changed (untrusted now), the proxy could not start: said
                self.problem = getattr(exc, "message", None) or str(exc)
                return None
        return int(self.lease.port) if self.lease is not None else None

    def keep_forward(self, task: records.Task, transport: Any) -> None:
        """The forward, on the current master connection, to the proxy's current port."""
        if task.forward_port is None:
            return
        port = self.proxy_port(task)  # the keeper holds the proxy for the task's life
        if port is None:
            _note(task.id, reason=f"its VM cannot reach this machine's proxy: {self.problem}")
            return
        master = transport.master_pid()
        if master is not None and master == task.forward_master and port == task.forward_local:
            return
        if task.forward_local is not None and task.forward_local != port:
            transport.cancel_forward(task.forward_local, task.forward_port)
        transport.forward_remote(port, task.forward_port)
        _note(task.id, forward_master=transport.master_pid(), forward_local=port)

    def close(self, task: records.Task, transport: Any) -> None:
        """The task ended: its forward and, when no other task of that VM is active, the proxy end."""
        if task.forward_port is None or self.closed:
            return
        if task.forward_local is not None:
            with contextlib.suppress(Exception):
                transport.cancel_forward(task.forward_local, task.forward_port)
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        others = [other for other in records.all_tasks() if other.active and other.id != task.id
                  and other.host == task.host and other.vm == task.vm]
        if not others:
            guard.stop(mirror_name(task.vm, task.host))
        self.closed = True


def _close(task: records.Task, keeping: Keeping) -> None:
    host = registry.get(task.host) if task.forward_port is not None else None
    if host is None:  # no forward, or a forgotten host (`hosts rm`): its forwards went with its connection
        if keeping.lease is not None:
            keeping.lease.release()
        if task.forward_port is not None:
            end_brokers(task.host)  # the proxy goes too
        return
    try:
        keeping.close(task, Transport(host.target()))
    except Exception:  # the host is gone: its forward went with the connection
        if keeping.lease is not None:
            keeping.lease.release()


def running(task_id: int) -> bool:
    """Whether the task's keeper runs (it holds its lock)."""
    return held(records.folder(task_id) / LOCK)


def _proxy_lease(task: records.Task) -> Any:
    """This machine's proxy for the task's remote VM, from the workspace's config as it is now (trusted)."""
    config = load.load(Path(task.workspace))
    trust.require_trust(config)
    agent = config.agent(task.agent)
    return brokersetup.begin_proxy(config, mirror_name(task.vm, task.host), {agent.name: agent.endpoints})


def step(task_id: int, keeping: Keeping | None = None) -> records.Task | None:
    """One look at the place for an active Job (or one whose results are not home yet); the record, updated.
    Only the keeper (with `keeping`) hands a waiting task over and keeps the forward."""
    task = records.get(task_id)
    if task is None or not task.job or task.settled:
        return task
    try:
        place = runtime.place(task.host)
    except UnknownHost:
        with records.locked():
            fresh = records.get(task_id) or task
            if fresh.active:
                records.end(fresh, FAILED, f"its host {task.host} is no longer known (`agentbox hosts rm`)")
            fresh.harvested = True
            records.save(fresh)
        return records.get(task_id)
    if keeping is None and task.active and not running(task_id):
        start(task_id)  # its keeper stopped (this machine restarted): it goes on following the task
    if task.active and not task.handed:
        if keeping is None:
            return task  # its keeper hands it over
        try:
            if not hand_over(task, place, keeping.proxy_port(task)):
                return _unreachable(task_id, place)
        except Exception as exc:  # refused by the place: the task cannot run
            with records.locked():
                fresh = records.get(task_id) or task
                if fresh.active:
                    records.end(fresh, FAILED, getattr(exc, "message", None) or str(exc))
            return records.get(task_id)
        task = records.get(task_id) or task
    key = task.remote_key or ""
    try:
        if task.active and keeping is not None and isinstance(place, SshRuntime):
            keeping.keep_forward(task, place.transport)
        if task.active:
            _apply(task_id, place.task(task.vm, key), place.name)
            task = records.get(task_id) or task
        if not task.active and not task.harvested:
            _bring_home(task_id, place)
        if not task.active and keeping is not None and isinstance(place, SshRuntime):
            keeping.close(task, place.transport)
    except Unreachable:
        return _unreachable(task_id, place)
    except FarError as exc:
        _note(task_id, reason=f"{place.name} answered with an error: {exc.message}")
    place.answered(True)
    return records.get(task_id)


def _unreachable(task_id: int, place: Runtime) -> records.Task | None:
    with records.locked():
        task = records.get(task_id)
        if task is None:
            return None
        if task.unreachable_since is None:
            task.unreachable_since = time.time()
            records.save(task)
    place.answered(False)
    return task


def _note(task_id: int, **fields: Any) -> None:
    with records.locked():
        task = records.get(task_id)
        if task is not None:
            for name, value in fields.items():
                setattr(task, name, value)
            records.save(task)


def _apply(task_id: int, seen: Any, place: str) -> None:
    """The runner's state (and the VM's) into the record."""
    on = "" if place == records.LOCAL else f" on {place}"
    now = time.time()
    with records.locked():
        task = records.get(task_id)
        if task is None or not task.active:
            return
        task.seen = now
        task.unreachable_since = None
        runner = records.parse_runner_state(seen.state) if seen.state is not None else None
        if runner is not None:
            records.apply_seen(task, runner)
        if task.active:
            if seen.vm_status is None:
                records.end(task, FAILED, f"its VM {task.vm}{on} was deleted while the task was "
                                        f"{task.state.lower()}")
                return
            if seen.vm_status != "Running":
                records.end(task, FAILED, f"its VM {task.vm}{on} stopped ({seen.vm_status}) while the "
                                        f"task was {task.state.lower()}")
                return
            if seen.heartbeat is not None and seen.heartbeat != task.heartbeat_seen:
                task.heartbeat_seen, task.heartbeat_moved = seen.heartbeat, now
            elif task.state == RUNNING and task.heartbeat_moved and now - task.heartbeat_moved > SILENT_RUNNER_SEC:
                records.end(task, FAILED, f"its runner{on} stopped answering "
                                        f"{int(now - task.heartbeat_moved)} s ago (the VM restarted?)")
                return
        records.save(task)


def _bring_home(task_id: int, runtime: Runtime) -> None:
    """The ended task's outputs and changes, from the place into the record; then its folder there goes. This
    machine's task folder is its id's (LocalRuntime.key): its outputs are moved whole by a rename, and a file the VM
    made a link is named as not taken (agentbox.tasks.records.harvest)."""
    ended = records.get(task_id)
    if ended is None:
        return
    if ended.host == records.LOCAL:
        with records.locked():
            task = records.get(task_id)
            if task is not None and not task.harvested:
                records.harvest(task)
        return
    found = runtime.collect(ended.vm, ended.remote_key or "", COLLECTED, OUTPUTS_LIMIT)
    with records.locked():
        task = records.get(task_id)
        if task is None or task.harvested:
            return
        for name in records.OUTPUTS:
            atomic_write(records.folder(task.id) / name, found.get(name, b""), mode=0o600)
        if task.isolated:
            records.take_changes(task, found.get(records.CHANGES), found.get(records.SUMMARY))
        task.harvested = True
        records.save(task)
        records.report(task)
    runtime.forget(ended.vm, ended.remote_key or "")


def main(argv: list[str]) -> int:
    task_id = int(argv[0])
    try:
        fd = os.open(records.folder(task_id) / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return 0
    # `running()` probes the lock for an instant (`wait` every quarter second): only a lock still held after a
    # second is another keeper's, and this one leaves the task to it.
    deadline = time.monotonic() + LOCK_PATIENCE_SEC
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() >= deadline:
                return 0  # another keeper follows it
            time.sleep(0.05)
    keeping = Keeping()
    while True:
        try:
            task = step(task_id, keeping)
        except Exception:  # a bad moment (the record being written): look again
            task = records.get(task_id)
        if task is None or task.settled:
            if task is not None:
                _close(task, keeping)
            return 0
        time.sleep(UNREACHABLE_POLL_SEC if task.unreachable_since is not None else POLL_SEC)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
