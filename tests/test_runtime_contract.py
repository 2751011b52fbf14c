"""The runtime contract (agentbox.runtime.contract): one test, run against this machine (LocalRuntime: the limactl
double here) and a host over a real sshd (SshRuntime: the far end there, the double on the remote user's PATH).
What agentbox asks of a place must mean the same on both: create on first use, one call on a warm VM, files in,
the program's effects, the task's files out (never through a link the VM planted), cancel, forget, state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.remote import registry
from agentbox.runtime.contract import Job, NeedsTemplate, Runtime
from agentbox.runtime.local import LocalRuntime
from agentbox.runtime.sshhost import SshRuntime
from tests.helpers import FakeLima
from tests.remotehost import RemoteHost

pytestmark = pytest.mark.timeout(180)
VM = "agentbox-contract"
KEY = "t1-contract"


class Place:
    def __init__(self, runtime: Runtime, staging: str, outbox: str, calls: Callable[[], list[list[str]]],
                 read_back: Callable[[str], bytes]) -> None:
        self.runtime, self.staging, self.outbox, self.calls, self.read_back = runtime, staging, outbox, calls, \
            read_back


@pytest.fixture(params=["local", "ssh"])
def place(request: pytest.FixtureRequest, limactl: FakeLima, home: Path) -> Place:
    if request.param == "local":
        return Place(LocalRuntime(), str(paths.staging_dir(VM)), str(paths.vm_outbox(VM)), limactl.calls,
                     lambda path: Path(path).read_bytes())
    host: RemoteHost = request.getfixturevalue("remote_hosts")(1)[0]
    added = registry.add("big", host.url)
    root = f"{host.home}/.agentbox-remote/vms/{VM}"
    return Place(SshRuntime(added), f"{root}/staging", f"{root}/outbox", FakeLima(host.lima_home).calls,
                 lambda path: host.run(["cat", path]).stdout)


def lima_yaml(place: Place) -> str:
    return ("images:\n- location: https://example.invalid/ubuntu.img\nmounts:\n"
            f"- location: {place.staging}\n  writable: false\n- location: {place.outbox}\n  writable: true\n")


def job(place: Place, script: str, *, with_yaml: bool = True, **extra: object) -> Job:
    box = f"{place.outbox}/tasks/{KEY}"
    return Job(VM, KEY, lima_yaml(place) if with_yaml else None,
               {"staging/run.sh": script.encode(), "task/prompt": b"the prompt\n"},
               ["/bin/bash", f"{place.staging}/run.sh", box], 300, executables=frozenset({"staging/run.sh"}),
               **extra)  # type: ignore[arg-type]


def test_a_place_creates_on_first_use_runs_and_hands_the_task_s_files_back(place: Place) -> None:
    runtime = place.runtime
    with pytest.raises(NeedsTemplate):
        runtime.submit(job(place, "exit 0", with_yaml=False))
    script = ('box="$1"; cat "$box/prompt" > "$box/stdout"; printf "state=completed\\nexit=0\\n" > "$box/state"\n'
              'touch "$box/heartbeat"; ln -s /etc/passwd "$box/stderr"; test -x "$(dirname "$0")/run.sh"\n')
    handed = runtime.submit(job(place, script))
    assert (handed.code, handed.created, handed.started) == (0, True, True)
    assert runtime.instances()[VM] == "Running"
    seen = runtime.task(VM, KEY)
    assert seen.vm_status == "Running" and seen.state == b"state=completed\nexit=0\n"
    assert seen.heartbeat is not None and seen.sizes == {"stdout": len(b"the prompt\n")}
    assert runtime.read(VM, KEY, "stdout", 4, 100) == b"prompt\n"
    collected = runtime.collect(VM, KEY, ["state", "stdout", "stderr", "changes.patch"], 1 << 20)
    assert collected == {"state": b"state=completed\nexit=0\n", "stdout": b"the prompt\n"}  # no link followed
    runtime.cancel(VM, KEY)
    assert place.read_back(f"{place.outbox}/tasks/{KEY}/cancel") == b""
    runtime.forget(VM, KEY)
    assert runtime.collect(VM, KEY, ["stdout"], 100) == {}

    # Warm: one limactl call (the shell), and the staging folder keeps only what the job names.
    before = len(place.calls())
    again = runtime.submit(job(place, "exit 3", staging=["run.sh"]))
    assert (again.code, again.created, again.started) == (3, False, False)
    assert [call[0] for call in place.calls()[before:]] == ["shell"]


def test_a_place_starts_a_stopped_vm_and_deletes_one(place: Place) -> None:
    runtime = place.runtime
    assert runtime.submit(job(place, "exit 0")).created
    runtime.stop(VM)
    assert runtime.instances()[VM] == "Stopped"
    handed = runtime.submit(job(place, "exit 0", with_yaml=False))
    assert (handed.created, handed.started) == (False, True)
    runtime.delete(VM)
    assert VM not in runtime.instances()
