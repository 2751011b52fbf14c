"""The far end (agentbox/remote/far.py) and its client, through a transport that runs the command locally (`sh -c`)
with a home of its own standing for the remote host's and the limactl double first on PATH."""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agentbox.remote import far as far_module
from agentbox.remote.farclient import Far, FarError, script_name
from tests.helpers import FakeLima, needs_bwrap

pytestmark = pytest.mark.timeout(60)

VM = "agentbox-proj-0123abcd"
SECRET = b"the laptop's secret 7f3a9c"


class Completed(NamedTuple):
    code: int
    stdout: bytes
    stderr: bytes


class LocalTransport:
    """Runs the far end's command here, as ssh would run it there: one string for `sh -c`, HOME the remote's."""

    name = "box2"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.runs: list[list[str]] = []

    def run(self, argv: list[str], stdin: bytes | None = None, timeout: float = 60) -> Completed:
        self.runs.append(list(argv))
        with subprocess.Popen(["sh", "-c", shlex.join(argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=dict(os.environ, HOME=str(self.home)),
                              start_new_session=True) as process:
            try:
                stdout, stderr = process.communicate(stdin or b"", timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the far end too, not only its shell
                raise
        return Completed(process.returncode, stdout, stderr)


@pytest.fixture
def remote(tmp_path: Path, limactl: FakeLima) -> Path:
    home = tmp_path / "remote-home"
    home.mkdir()
    return home


@pytest.fixture
def far(remote: Path) -> Far:
    return Far(LocalTransport(remote))


def outbox(remote: Path, vm: str = VM) -> Path:
    return remote / ".agentbox-remote" / "vms" / vm / "outbox"


def plant_task(remote: Path, key: str, files: dict[str, bytes] | None = None, vm: str = VM) -> Path:
    """A task as a submit leaves it (the index entry, its outbox folder), with files the VM wrote."""
    index = remote / ".agentbox-remote" / "tasks"
    index.mkdir(parents=True, exist_ok=True)
    (index / key).write_text(vm + "\n")
    box = outbox(remote, vm) / "tasks" / key
    box.mkdir(parents=True)
    for name, data in (files or {}).items():
        (box / name).write_bytes(data)
    return box


def tar_of(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """An uncompressed tar: (name, bytes) files, (name, None, target) symlinks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                archive.addfile(info)
            else:
                assert data is not None
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def job(key: str, launch: list[str], lima_yaml: str | None = None) -> bytes:
    return json.dumps({"vm": VM, "task": key, "limaYaml": lima_yaml, "startTimeout": 300, "launch": launch}).encode()


def members_of(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        return {info.name: archive.extractfile(info).read() for info in archive.getmembers()}  # type: ignore[union-attr]


# -- the script itself ---------------------------------------------------------------------------------------


def test_far_is_standalone_python_38() -> None:
    source = Path(far_module.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name.startswith("agentbox")]


# -- the client ----------------------------------------------------------------------------------------------


def test_the_client_installs_the_far_end_once_then_each_call_is_one_run(remote: Path, far: Far) -> None:
    transport = far.transport
    assert isinstance(transport, LocalTransport)
    script = Path(far_module.__file__).read_bytes()
    installed = remote / ".agentbox-remote" / "bin" / f"far-{hashlib.sha256(script).hexdigest()[:12]}.py"
    assert script_name() == installed.name

    first = far.call("facts")
    assert [run[:2] for run in transport.runs] == [["sh", "-c"]] * 3
    assert transport.runs[0][3:] == ["far", "facts"] and "exit 127" in transport.runs[0][2]  # not there: 127
    assert "cat >" in transport.runs[1][2]  # the install
    assert transport.runs[2] == transport.runs[0]  # then the call again
    assert installed.read_bytes() == script
    for folder in (remote / ".agentbox-remote", installed.parent):
        assert folder.stat().st_mode & 0o777 == 0o700
    assert first["far"] == installed.name[4:16]

    far.call("facts")
    far.call("status", "nothing")
    assert len(transport.runs) == 5
    assert Far(transport).call("facts")["far"] == first["far"]  # a new client finds it installed
    assert len(transport.runs) == 6


def test_a_far_end_error_names_the_host_and_the_command(far: Far) -> None:
    with pytest.raises(FarError) as raised:
        far.call("cancel", "t9")
    assert raised.value.message == ("box2: the far end's `cancel` failed: task t9 is not known on this host (never "
                                    "submitted here, or forgotten)")
    # Collecting a task the host does not know (forgotten after an earlier collect) is empty, not an error: the
    # runtime contract's `collect` answers the same on every place.
    with tarfile.open(fileobj=io.BytesIO(far.call_bytes("collect", "t9"))) as archive:
        assert [(m.name, json.loads(archive.extractfile(m).read())) for m in archive] == [  # type: ignore[union-attr]
            ("collect.json", {"files": {}, "unknown": True})]


def test_facts(far: Far, limactl: FakeLima) -> None:
    facts = far.call("facts")
    assert facts["limaVersion"] == "2.2.0"
    assert facts["limactl"].endswith("/bin/limactl")
    assert facts["vms"] == [] and facts["running"] == 0
    assert facts["cpus"] == os.cpu_count() and facts["memory"] > 0 and facts["diskFree"] > 0
    assert facts["virt"] in ("kvm", "none") and facts["os"] == "linux"
    assert set(facts) == {"far", "os", "arch", "limactl", "limaVersion", "virt", "cpus", "memory", "diskFree",
                          "vms", "running", "root"}
    assert limactl.calls() == [["--version"], ["list", "--json"]]


# -- submit --------------------------------------------------------------------------------------------------


def test_submit_creates_and_starts_the_vm_then_a_warm_submit_is_one_limactl_call(
        remote: Path, far: Far, limactl: FakeLima) -> None:
    needs_bwrap()
    box = outbox(remote)
    staging = remote / ".agentbox-remote" / "vms" / VM / "staging"
    lima_yaml = ("images:\n- location: https://example.invalid/ubuntu.img\nmounts:\n"
                 f"- location: {staging}\n- location: {box}\n  writable: true\n")
    launch = ["sh", "-c", f'cat {staging}/hello "$1/prompt" > "$1/stdout"; echo state=running > "$1/state"', "x"]

    answer = far.call("submit", stdin=tar_of([
        ("job.json", job("t1", [*launch, f"{box}/tasks/t1"], lima_yaml), None),
        ("staging/hello", b"from staging\n", None), ("task/prompt", b"the prompt\n", None)]))
    assert answer == {"code": 0, "created": True, "started": True, "stderr": ""}
    assert (box / "tasks" / "t1" / "stdout").read_bytes() == b"from staging\nthe prompt\n"
    assert limactl.subcommands() == ["shell", "list", "create", "start", "shell"]
    assert [f"--name={VM}", "--tty=false"] == limactl.calls()[2][1:3]
    assert limactl.lima_yaml(VM) == lima_yaml

    limactl.clear()
    answer = far.call("submit", stdin=tar_of([("job.json", job("t2", [*launch, f"{box}/tasks/t2"]), None),
                                              ("staging/hello", b"again\n", None),
                                              ("task/prompt", b"second\n", None)]))
    assert answer == {"code": 0, "created": False, "started": False, "stderr": ""}
    assert limactl.calls() == [["shell", "--tty=false", VM, "--", *launch, f"{box}/tasks/t2"]]
    assert (box / "tasks" / "t2" / "stdout").read_bytes() == b"again\nsecond\n"

    status = far.call("status", "t1", "t2")["tasks"]
    assert status["t2"]["state"] == "state=running\n" and status["t2"]["stdout"] == 13
    assert status["t1"]["vm"] == VM and status["t1"]["vmStatus"] == "Running"
    assert far.call("facts")["running"] == 2

    limactl.set_status(VM, "Stopped")
    limactl.clear()
    answer = far.call("submit", stdin=tar_of([("job.json", job("t3", ["true"]), None)]))
    assert answer == {"code": 0, "created": False, "started": True, "stderr": ""}
    assert limactl.subcommands() == ["shell", "list", "start", "shell"]

    assert far.call("stop", VM) == {"vm": VM, "status": "Stopped"}
    assert far.call("vm-status", VM) == {"vm": VM, "status": "Stopped"}
    assert far.call("delete", VM) == {"vm": VM, "deleted": True}
    assert limactl.status(VM) is None and not staging.exists()
    assert (box / "tasks" / "t1" / "stdout").exists()  # results not collected yet stay


def test_two_submits_to_a_cold_vm_at_once_create_it_once(remote: Path, far: Far, limactl: FakeLima) -> None:
    needs_bwrap()
    far.install()
    box = outbox(remote)
    lima_yaml = f"images:\n- location: https://example.invalid/ubuntu.img\nmounts:\n- location: {box}\n  writable: true\n"
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda key: far.call("submit", stdin=tar_of([
            ("job.json", job(key, ["sh", "-c", f"echo {key} > {box}/tasks/{key}/stdout"], lima_yaml), None)])),
            ["t1", "t2"]))
    assert sorted(answer["created"] for answer in answers) == [False, True]
    assert [answer["code"] for answer in answers] == [0, 0]
    assert limactl.subcommands().count("create") == 1
    assert (box / "tasks" / "t2" / "stdout").read_text() == "t2\n"


def test_a_missing_vm_without_a_template_asks_for_one(remote: Path, far: Far, limactl: FakeLima) -> None:
    answer = far.call("submit", stdin=tar_of([("job.json", job("t1", ["true"]), None),
                                              ("staging/a/b", b"b\n", None), ("task/spec", b"id=1\0", None)]))
    assert answer == {"need": "limaYaml"}
    assert (outbox(remote).parent / "staging" / "a" / "b").read_bytes() == b"b\n"
    assert (outbox(remote) / "tasks" / "t1" / "spec").read_bytes() == b"id=1\0"
    assert limactl.subcommands() == ["shell", "list"]


@pytest.mark.parametrize(("bad", "said"), [
    (("task/../x", b"x", None), "a member going up with `..`: 'task/../x'"),
    (("../x", b"x", None), "a member going up with `..`: '../x'"),
    (("/tmp/x", b"x", None), "a member with an absolute or odd name: '/tmp/x'"),
    (("elsewhere/x", b"x", None), "a member outside job.json, staging/ and task/: 'elsewhere/x'"),
    (("task/link", None, "/etc/passwd"), "member 'task/link' is a link or a device"),
])
def test_submit_refuses_a_tar_with_a_member_outside_its_folders_or_a_link(
        remote: Path, far: Far, limactl: FakeLima, bad: tuple[str, bytes | None, str | None], said: str) -> None:
    good = [("job.json", job("t1", ["true"]), None), ("task/spec", b"id=1\0", None)]
    with pytest.raises(FarError) as raised:
        far.call("submit", stdin=tar_of([*good, bad]))
    assert said in raised.value.message
    assert not (remote / ".agentbox-remote" / "vms").exists()  # nothing unpacked
    assert not list(remote.parent.glob("x")) and limactl.calls() == []
    # the control: the same tar without that member is taken
    assert far.call("submit", stdin=tar_of(good)) == {"need": "limaYaml"}
    assert (outbox(remote) / "tasks" / "t1" / "spec").exists()


def test_submit_replaces_a_link_the_vm_planted_in_the_task_folder_instead_of_writing_through_it(
        remote: Path, far: Far, tmp_path: Path) -> None:
    target = tmp_path / "laptop-file"
    target.write_bytes(SECRET)
    box = plant_task(remote, "t1")
    (box / "spec").symlink_to(target)
    assert far.call("submit", stdin=tar_of([("job.json", job("t1", ["true"]), None),
                                            ("task/spec", b"id=1\0", None)])) == {"need": "limaYaml"}
    assert target.read_bytes() == SECRET
    assert not (box / "spec").is_symlink() and (box / "spec").read_bytes() == b"id=1\0"


# -- status, read, cancel, collect, forget ----------------------------------------------------------------


def test_status_reads_the_runners_files(remote: Path, far: Far, limactl: FakeLima) -> None:
    box = plant_task(remote, "t1", {"state": b"state=running\nqueued_at=1.5\n", "stdout": b"12345",
                                    "heartbeat": b"99\n"})
    os.utime(box / "heartbeat", (1000, 1000))
    answer = far.call("status", "t1", "t2")
    assert answer == {"tasks": {
        "t1": {"vm": VM, "state": "state=running\nqueued_at=1.5\n", "heartbeat": 1000.0, "stdout": 5, "stderr": None,
               "vmStatus": None},
        "t2": {"vm": None, "state": None, "heartbeat": None, "stdout": None, "stderr": None, "vmStatus": None}}}
    assert limactl.calls() == [["list", "--json"]]
    (box / "state").write_bytes(b"x" * 5000)  # more than 4 KiB: not a state
    assert far.call("status", "t1")["tasks"]["t1"]["state"] is None


def test_read_takes_bytes_from_an_offset_and_never_follows_a_link(remote: Path, far: Far, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    box = plant_task(remote, "t1", {"stdout": b"0123456789"})
    (box / "stderr").symlink_to(secret)
    answer = far.call("read", "t1", "stdout", "3", "4")
    assert answer == {"name": "stdout", "offset": 3, "data": base64.b64encode(b"3456").decode(), "size": 10}
    assert far.call("read", "t1", "stderr", "0", "100") == {
        "name": "stderr", "offset": 0, "data": None, "size": None,
        "refused": "is a symbolic link, which is never followed"}
    assert far.call("read", "t1", "summary.md", "0", "100")["missing"] is True
    with pytest.raises(FarError, match="is not a file name"):
        far.call("read", "t1", "../secret", "0", "100")


def test_cancel_creates_the_cancel_file(remote: Path, far: Far, tmp_path: Path) -> None:
    box = plant_task(remote, "t1")
    assert far.call("cancel", "t1") == {"cancelled": "t1"}
    assert (box / "cancel").is_file()
    target = tmp_path / "laptop-file"
    target.write_bytes(SECRET)
    (box / "cancel").unlink()
    (box / "cancel").symlink_to(target)  # the VM's trap: replaced, not written through
    assert far.call("cancel", "t1") == {"cancelled": "t1"}
    assert target.read_bytes() == SECRET and not (box / "cancel").is_symlink()


def test_collect_takes_the_results_as_a_tar(remote: Path, far: Far) -> None:
    plant_task(remote, "t1", {"state": b"state=completed\nexit=0\n", "stdout": b"out", "stderr": b"",
                              "changes.patch": b"diff --git a/x b/x\n", "summary.md": b"# done\n", "other": b"no"})
    members = members_of(far.call_bytes("collect", "t1"))
    assert members.pop("collect.json") == json.dumps({"files": {
        "changes.patch": {"kept": 19, "size": 19}, "state": {"kept": 23, "size": 23}, "stderr": {"kept": 0, "size": 0},
        "stdout": {"kept": 3, "size": 3}, "summary.md": {"kept": 7, "size": 7}}}, sort_keys=True).encode()
    assert members == {"state": b"state=completed\nexit=0\n", "stdout": b"out", "stderr": b"",
                       "changes.patch": b"diff --git a/x b/x\n", "summary.md": b"# done\n"}


def test_collect_never_follows_a_link_and_a_fifo_does_not_block(remote: Path, far: Far, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    box = plant_task(remote, "t1", {"state": b"state=completed\n"})
    (box / "stdout").symlink_to(secret)
    os.mkfifo(box / "stderr")
    (box / "changes.patch").symlink_to(secret)
    data = far.call_bytes("collect", "t1", timeout=20)
    assert SECRET not in data
    members = members_of(data)
    assert sorted(members) == ["collect.json", "state"]
    report = json.loads(members["collect.json"])["files"]
    assert report["stdout"] == {"refused": "is a symbolic link, which is never followed"}
    assert report["stderr"] == {"refused": "is not a regular file"}
    assert report["summary.md"] == {"missing": True}
    # the control: the same bytes as a regular file are taken
    (box / "stdout").unlink()
    (box / "stdout").write_bytes(SECRET)
    assert members_of(far.call_bytes("collect", "t1", timeout=20))["stdout"] == SECRET


def test_collect_refuses_a_task_folder_that_is_a_link(remote: Path, far: Far, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout").write_bytes(SECRET)
    box = plant_task(remote, "t1")
    box.rmdir()
    box.symlink_to(elsewhere)
    with pytest.raises(FarError, match="task t1's folder in the outbox of agentbox-proj-0123abcd cannot be opened"):
        far.call_bytes("collect", "t1")


def test_collect_caps_an_oversized_output(remote: Path, far: Far) -> None:
    cap = {name: limit for name, limit, _ in far_module.COLLECTED}["stdout"]
    box = plant_task(remote, "t1", {"summary.md": b"s"})
    with open(box / "stdout", "wb") as handle:
        handle.truncate(cap + 4096)  # sparse: costs no disk
    with open(box / "summary.md", "wb") as handle:
        handle.truncate(cap)  # a summary this big is refused whole
    members = members_of(far.call_bytes("collect", "t1", timeout=60))
    assert len(members["stdout"]) == cap
    report: dict[str, Any] = json.loads(members["collect.json"])["files"]
    assert report["stdout"] == {"kept": cap, "size": cap + 4096}
    assert "summary.md" not in members and report["summary.md"]["refused"].startswith("is larger than")


def test_forget_removes_the_task(remote: Path, far: Far) -> None:
    box = plant_task(remote, "t1", {"stdout": b"x"})
    (box / "sub").mkdir()
    (box / "sub" / "f").write_bytes(b"y")
    assert far.call("forget", "t1") == {"forgotten": True}
    assert not box.exists() and not (remote / ".agentbox-remote" / "tasks" / "t1").exists()
    assert far.call("forget", "t1") == {"forgotten": False}
    assert far.call("status", "t1")["tasks"]["t1"]["vm"] is None


def test_vm_status_stop_and_delete(remote: Path, far: Far, limactl: FakeLima) -> None:
    assert far.call("vm-status", VM) == {"vm": VM, "status": None}
    assert far.call("stop", VM) == {"vm": VM, "status": None}
    assert far.call("delete", VM) == {"vm": VM, "deleted": True}
    with pytest.raises(FarError, match="is not an agentbox VM name"):
        far.call("vm-status", "other")
