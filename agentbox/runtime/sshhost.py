"""A host reached over ssh as a runtime (agentbox.runtime.contract): one multiplexed connection
(agentbox.remote.ssh) to agentbox's far end there (agentbox/remote/far.py), which runs that host's limactl and
reads what its VMs wrote, as the local runtime does here."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import socket
import tarfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentbox import paths
from agentbox.remote import registry
from agentbox.remote.farclient import FAR_ROOT, Far
from agentbox.remote.ssh import Transport
from agentbox.runtime.contract import Handed, Job, NeedsTemplate, TaskSeen
from agentbox.vm import golden, render

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.remote.registry import Host

COLLECT_LIMIT = 64 << 20
SESSION_ENDED = 100  # the far end's `attach` after the session ended (far.py's SESSION_ENDED)


def mirror_name(vm_name: str, host: str) -> str:
    """This machine's mirror of a host's VM's shared folders (paths.staging_dir(mirror), paths.vm_outbox(mirror))."""
    return f"{vm_name}.on-{host}"


class SshRuntime:
    takes_logins = False  # a login reaches the VM there only as the broker's placeholder (agentbox.tasks.hostlogins)

    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.name
        self.transport = Transport(host.target())
        self.far = Far(self.transport)

    def vm_for(self, config: Config, vm_name: str) -> str:
        """The project's VM on the host: its name here and the key of the provisioning it is built from (the base
        key, agentbox.vm.golden): a new agentbox or provisioning setting makes a new VM there on first use, never a
        VM provisioned differently from what this machine's VMs get. (The older one stays until deleted there.)"""
        return f"{vm_name}-{golden.key(config)[:8]}"

    def mirror(self, vm_name: str) -> str:
        return mirror_name(vm_name, self.name)

    def key(self, task_id: int) -> str:
        """Its id and this machine's, so two laptops sharing a host never collide."""
        machine = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:24].strip("-") or "laptop"
        digest = hashlib.sha256(str(paths.state_dir()).encode()).hexdigest()[:8]
        return f"t{task_id}-{machine}-{digest}"

    def template(self, config: Config, vm_name: str) -> str | None:
        """agentbox's own template for the VM there (vm.render.render_remote): the config's resources and
        provisioning, no mount of the workspace, nothing of this machine's. Its two shared folders are the far
        end's, mounted at this machine's mirror paths, so every path the launch step names is right there too."""
        mirror = self.mirror(vm_name)
        return render.render_remote(
            config, vm_name,
            render.RenderedMount(f"{FAR_ROOT}/vms/{vm_name}/staging", str(paths.staging_dir(mirror)), False),
            render.RenderedMount(f"{FAR_ROOT}/vms/{vm_name}/outbox", str(paths.vm_outbox(mirror)), True))

    def answered(self, ok: bool) -> None:
        (registry.reached if ok else registry.unreachable)(self.host)

    def describe(self) -> dict[str, Any]:
        return self.far.call("facts")

    def instances(self) -> dict[str, str]:
        return {str(row.get("name")): str(row.get("status")) for row in self.describe().get("vms") or []}

    def stop(self, vm_name: str) -> None:
        self.far.call("stop", vm_name, timeout=600)

    def delete(self, vm_name: str) -> None:
        self.far.call("delete", vm_name, timeout=600)

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

    def task(self, vm_name: str, key: str) -> TaskSeen:
        answer = self.far.call("status", key)
        seen = (answer.get("tasks") or {}).get(key) or {}
        state = seen.get("state")
        return TaskSeen(state.encode() if isinstance(state, str) else None, seen.get("heartbeat"),
                        {name: int(seen[name]) for name in ("stdout", "stderr") if seen.get(name) is not None},
                        seen.get("vmStatus"))

    def read(self, vm_name: str, key: str, name: str, offset: int, limit: int) -> bytes:
        answer = self.far.call("read", key, name, str(offset), str(limit))
        return base64.b64decode(answer.get("data") or "")

    def cancel(self, vm_name: str, key: str) -> None:
        self.far.call("cancel", key)

    def collect(self, vm_name: str, key: str, names: Sequence[str], limit: int) -> dict[str, bytes]:
        raw = self.far.call_bytes("collect", key, timeout=600, limit=COLLECT_LIMIT)
        return _untar(raw, set(names), limit)

    def forget(self, vm_name: str, key: str) -> None:
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
