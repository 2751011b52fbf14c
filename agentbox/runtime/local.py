"""This machine as a runtime (agentbox.runtime.contract): Lima through agentbox.vm.lima, the VM's staging folder
and outbox in agentbox's state folder (paths.staging_dir, paths.vm_outbox), read as the VM wrote them (vmread)."""

from __future__ import annotations

import os
import platform
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentbox import paths, vmread
from agentbox.errors import LimaError
from agentbox.fsutil import atomic_write, private_dir, remove_unlisted
from agentbox.runtime.contract import STAGING, TASK, Handed, Job, NeedsTemplate, TaskSeen
from agentbox.vm.lima import RUNNING, Lima, LimaSaid

if TYPE_CHECKING:
    from agentbox.config.load import Config

MAX_STATE = 4096


class LocalRuntime:
    name = "local"
    takes_logins = True

    def vm_for(self, config: Config, vm_name: str) -> str:
        return vm_name

    def mirror(self, vm_name: str) -> str:
        return vm_name  # the VM mounts these very folders

    def key(self, task_id: int) -> str:
        return str(task_id)  # as a task in the live workspace's (agentbox.tasks.records.outbox_dir)

    def template(self, config: Config, vm_name: str) -> str | None:
        return None  # this machine's project VM is made by agentbox.vm.lifecycle (from the base, recorded)

    def answered(self, ok: bool) -> None:
        pass

    def __init__(self) -> None:
        self.lima = Lima()

    def describe(self) -> dict[str, Any]:
        try:
            version: str | None = self.lima.version()
        except (LimaError, OSError):
            version = None
        try:
            disk = os.statvfs(paths.home())
            free = disk.f_bavail * disk.f_frsize
        except OSError:
            free = None
        running = running_tasks()
        vms = [{"name": n, "status": s} for n, s in self.instances().items()] if version else []
        return {"os": platform.system().lower(), "arch": platform.machine(),
                "limactl": self.lima._resolve() if version else None, "limaVersion": version,
                "virt": local_virtualisation(), "cpus": os.cpu_count(), "memory": _memory(), "diskFree": free,
                "vms": vms, "running": running, "root": str(paths.state_dir())}

    def instances(self) -> dict[str, str]:
        return {name: row.status for name, row in self.lima.instances().items() if name.startswith("agentbox-")}

    def stop(self, vm_name: str) -> None:
        self.lima.stop(vm_name)

    def delete(self, vm_name: str) -> None:
        self.lima.delete(vm_name, force=True)

    def submit(self, job: Job) -> Handed:
        """Files first (the VM mounts their folders), then the shell; only when Lima says the VM is stopped or
        missing: `list`, create from the job's template, start, and the shell again (one call on a warm VM). The
        launch step's messages go to this terminal as it runs, so `stderr` is empty."""
        for name, data in job.files.items():
            _put(job.vm, job.task, name, data, 0o700 if name in job.executables else 0o600)
        if job.staging is not None:
            remove_unlisted(paths.staging_dir(job.vm), set(job.staging))
        code, lima_said = self._shell(job)
        if lima_said is None:
            return Handed(code, "", False, False)
        instance = self.lima.get(job.vm)
        created = started = False
        if instance is None:
            if job.lima_yaml is None:
                raise NeedsTemplate(job.vm)
            template = private_dir(paths.vm_state_dir(job.vm)) / "lima.yaml"
            atomic_write(template, job.lima_yaml, mode=0o600)
            self.lima.create(job.vm, template)
            created = True
        if instance is None or instance.status != RUNNING:
            self.lima.start(job.vm, job.start_timeout)
            started = True
        code, _ = self._shell(job)
        return Handed(code, "", created, started)

    def _shell(self, job: Job) -> tuple[int, LimaSaid | None]:
        """The launch step, its messages on this terminal as it runs (live progress of the VM's setup), and what
        Lima said instead of running it (the VM is stopped or missing)."""
        return self.lima.shell_unlisted(job.vm, list(job.argv), stdin_data=b"")

    def task(self, vm_name: str, key: str) -> TaskSeen:
        status = self.lima.get(vm_name)
        state = beat = None
        sizes: dict[str, int] = {}
        try:
            with vmread.folder(paths.vm_outbox(vm_name), "tasks", key) as box:
                state = vmread.read(box, "state", MAX_STATE)
                for name in ("heartbeat", "stdout", "stderr"):
                    try:
                        st = os.stat(name, dir_fd=box, follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        if name == "heartbeat":
                            beat = st.st_mtime
                        else:
                            sizes[name] = st.st_size
        except OSError:
            pass
        return TaskSeen(state, beat, sizes, status.status if status is not None else None)

    def read(self, vm_name: str, key: str, name: str, offset: int, limit: int) -> bytes:
        try:
            with vmread.folder(paths.vm_outbox(vm_name), "tasks", key) as box:
                fd, _ = vmread.open_regular(box, name)
        except (OSError, vmread.Refused):
            return b""
        try:
            return os.pread(fd, limit, offset)
        finally:
            os.close(fd)

    def cancel(self, vm_name: str, key: str) -> None:
        with vmread.folder(paths.vm_outbox(vm_name), "tasks", key) as box:
            os.close(os.open("cancel", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=box))

    def collect(self, vm_name: str, key: str, names: Sequence[str], limit: int) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        try:
            with vmread.folder(paths.vm_outbox(vm_name), "tasks", key) as box:
                for name in names:
                    try:
                        data = vmread.read(box, name, limit)
                    except vmread.Refused:
                        continue
                    if data is not None:
                        found[name] = data
        except OSError:
            pass
        return found

    def forget(self, vm_name: str, key: str) -> None:
        outbox = paths.vm_outbox(vm_name)
        vmread.remove_folder(outbox, outbox / "tasks" / key)


def running_tasks() -> int:
    """How many tasks a runner in one of this machine's VMs says are running (their state files in the VMs'
    outboxes, read as the VM wrote them), as the far end counts a host's."""
    count = 0
    try:
        vms = [entry.name for entry in os.scandir(paths.state_dir() / "vms") if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    for vm in vms:
        try:
            with vmread.folder(paths.vm_outbox(vm), "tasks") as tasks:
                keys = os.listdir(tasks)
                for key in keys:
                    try:
                        with vmread.folder(paths.vm_outbox(vm), "tasks", key) as box:
                            state = vmread.read(box, "state", MAX_STATE)
                    except (OSError, vmread.Refused):
                        continue
                    if state is not None and "state=running" in state.decode(errors="replace").splitlines():
                        count += 1
        except OSError:
            continue
    return count


def _put(vm_name: str, key: str, name: str, data: bytes, mode: int) -> None:
    """One file into the VM's staging folder or the task's folder in its outbox, folder by folder without following
    a link."""
    area, _, rel = name.partition("/")
    parts = rel.split("/") if area == STAGING else ["tasks", key, rel]
    if area not in (STAGING, TASK) or not rel or any(part in ("", ".", "..") for part in parts) or (
            area == TASK and "/" in rel):
        raise ValueError(f"not a file agentbox puts in a VM's folders: {name!r}")
    root = paths.staging_dir(vm_name) if area == STAGING else paths.vm_outbox(vm_name)
    private_dir(root)
    with vmread.folder(root, *parts[:-1], create=True) as parent:
        temp = f".{parts[-1]}.partial"
        vmread.remove(parent, temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)


def local_virtualisation() -> str:
    """kvm (Linux with a usable /dev/kvm), vz (macOS 13 or later) or none."""
    if platform.system() == "Darwin":
        release = platform.mac_ver()[0]
        return "vz" if release and int(release.split(".")[0]) >= 13 else "none"
    return "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "none"


def _memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return None
