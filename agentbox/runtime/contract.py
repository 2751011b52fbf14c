"""What agentbox asks of a place that runs VMs: find, create, start and stop a VM, run a command in it, copy files
in and out of the folders it shares with the VM, and read the state a task's runner left there.

`agentbox.runtime.local.LocalRuntime` is this machine (agentbox.vm.lima, the only module that runs limactl
here); `agentbox.runtime.sshhost.SshRuntime` is a host reached over one multiplexed ssh connection, where
agentbox's far end (agentbox/remote/far.py) runs limactl. Another engine (a cloud VM API, Kubernetes with Kata
Containers) is one more class with these methods.

Files a VM wrote are the agent's: every implementation reads them without following links, regular files
only, up to a cap, and never blocks on a FIFO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from agentbox.config.load import Config

STAGING = "staging"  # read-only in the VM
TASK = "task"  # the task's folder in the VM's outbox (writable by the VM)


class Job(NamedTuple):
    """One hand-over to a VM: files into its shared folders, then one command (the launch step)."""

    vm: str
    task: str  # the task's key there: its folder `outbox/tasks/KEY`
    lima_yaml: str | None  # what to create the VM from when it does not exist (None: it must exist)
    files: Mapping[str, bytes]  # "staging/REL" (the VM's staging folder) or "task/NAME" (the task's folder) -> content
    argv: Sequence[str]
    start_timeout: int = 600
    staging: Sequence[str] | None = None  # every file the staging folder holds now (None: only add, remove nothing)
    executables: frozenset[str] = frozenset()  # the names of `files` that are programs


class Handed(NamedTuple):
    code: int  # the command's exit code
    stderr: str  # its last words
    created: bool
    started: bool


class TaskSeen(NamedTuple):
    """What a task's runner left in the outbox, as read (raw: the caller parses the state file)."""

    state: bytes | None
    heartbeat: float | None
    sizes: Mapping[str, int]  # stdout/stderr sizes so far
    vm_status: str | None  # the VM's Lima status (None: it does not exist)


class NeedsTemplate(Exception):
    """The VM does not exist there and the job carried nothing to create it from."""


class Runtime(Protocol):
    name: str
    takes_logins: bool  # whether a VM there may be given the host's own login files (else only the broker's)

    def vm_for(self, config: Config, vm_name: str) -> str:
        """The project's VM there, for the VM `vm_name` this machine knows."""

    def mirror(self, vm_name: str) -> str:
        """The name of the folders on this machine (paths.staging_dir, paths.vm_outbox) that stand for the VM's
        shared folders there: the job's files are written there first. The VM itself when they are the same."""

    def key(self, task_id: int) -> str:
        """A task's name there (its folder `outbox/tasks/KEY` in the VM's outbox there)."""

    def template(self, config: Config, vm_name: str) -> str | None:
        """The lima.yaml a job makes the VM from when it is missing there; None: the place makes it otherwise."""

    def answered(self, ok: bool) -> None:
        """Record that the place answered (or did not) just now."""

    def describe(self) -> dict[str, Any]:
        """What the place says of itself: Lima's version, virtualisation, CPUs, memory, free disk, VMs, work."""

    def instances(self) -> dict[str, str]:
        """agentbox's VMs there: name -> Lima status."""

    def stop(self, vm_name: str) -> None: ...

    def delete(self, vm_name: str) -> None: ...

    def submit(self, job: Job) -> Handed:
        """Create the VM when missing (NeedsTemplate without a template), start it when stopped, put the files,
        run the command and return its exit code. On a warm VM this is one round trip."""

    def task(self, vm_name: str, key: str) -> TaskSeen: ...

    def read(self, vm_name: str, key: str, name: str, offset: int, limit: int) -> bytes:
        """Bytes of one of the task's files from offset (stdout, stderr): b"" when there are no more."""

    def cancel(self, vm_name: str, key: str) -> None: ...

    def collect(self, vm_name: str, key: str, names: Sequence[str], limit: int) -> dict[str, bytes]:
        """The task's named files that are regular files (absent ones left out), each capped at limit."""

    def forget(self, vm_name: str, key: str) -> None:
        """Remove the task's folder there (after collect)."""
