"""A host reached over ssh as a runtime (agentbox.runtime.contract): one multiplexed connection
(agentbox.remote.ssh) to agentbox's far end there (agentbox/remote/far.py), which runs that host's limactl and
reads what its VMs wrote, as the local runtime does here."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentbox.runtime.contract import Handed, Job, NeedsTemplate, TaskSeen

if TYPE_CHECKING:
    from agentbox.remote.registry import Host

COLLECT_LIMIT = 64 << 20
SESSION_ENDED = 100  # the far end's `attach` after the session ended (far.py's SESSION_ENDED)


class SshRuntime:
    def __init__(self, host: Host) -> None:
        from agentbox.remote.farclient import Far
        from agentbox.remote.ssh import Transport

        self.host = host
        self.name = host.name
        self.transport = Transport(host.target())
        self.far = Far(self.transport)

    def describe(self) -> dict[str, Any]:
        return self.far.call("facts")

    def instances(self) -> dict[str, str]:
        return {str(row.get("name")): str(row.get("status")) for row in self.describe().get("vms") or []}

    def stop(self, vm: str) -> None:
        self.far.call("stop", vm, timeout=600)

    def delete(self, vm: str) -> None:
        self.far.call("delete", vm, timeout=600)

    def submit(self, job: Job) -> Handed:
        described = {"vm": job.vm, "task": job.task, "limaYaml": job.lima_yaml, "startTimeout": job.start_timeout,
                     "launch": list(job.argv)}
        if job.staging is not None:
            described["staging"] = list(job.staging)
        payload = _tar({"job.json": json.dumps(described).encode(), **dict(job.files)}, job.executables)
        answer = self.far.call("submit", stdin=payload, timeout=job.start_timeout + 900)
        if answer.get("need") == "limaYaml":
            raise NeedsTemplate(job.vm)
        return Handed(int(answer.get("code", 1)), str(answer.get("stderr") or ""), bool(answer.get("created")),
                      bool(answer.get("started")))

    def task(self, vm: str, key: str) -> TaskSeen:
        answer = self.far.call("status", key)
        seen = (answer.get("tasks") or {}).get(key) or {}
        state = seen.get("state")
        return TaskSeen(state.encode() if isinstance(state, str) else None, seen.get("heartbeat"),
                        {name: int(seen[name]) for name in ("stdout", "stderr") if seen.get(name) is not None},
                        seen.get("vmStatus"))

    def read(self, vm: str, key: str, name: str, offset: int, limit: int) -> bytes:
        answer = self.far.call("read", key, name, str(offset), str(limit))
        return base64.b64decode(answer.get("data") or "")

    def cancel(self, vm: str, key: str) -> None:
        self.far.call("cancel", key)

    def collect(self, vm: str, key: str, names: Sequence[str], limit: int) -> dict[str, bytes]:
        raw = self.far.call_bytes("collect", key, timeout=600, limit=COLLECT_LIMIT)
        return _untar(raw, set(names), limit)

    def forget(self, vm: str, key: str) -> None:
        self.far.call("forget", key)

    def attach(self, key: str) -> int:
        """Join task KEY's session (a session task's tmux there) on this terminal; the far end's exit status:
        0 detached, SESSION_ENDED the session is gone, else tmux's or limactl's failure. The far end is
        installed already: the caller asked its status first."""
        return self.transport.attached(self.far.argv("attach", key), tty=True)


def _tar(files: dict[str, bytes], executables: frozenset[str] = frozenset()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o700 if name in executables else 0o600
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _untar(raw: bytes, names: set[str], limit: int) -> dict[str, bytes]:
    """The wanted regular files of a tar the far end made from what the VM wrote; anything else is dropped."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
            for member in archive:
                if member.name not in names or not member.isreg() or member.size > limit:
                    continue
                extracted = archive.extractfile(member)
                if extracted is not None:
                    found[member.name] = extracted.read(limit)
    except tarfile.TarError:
        return found
    return found
