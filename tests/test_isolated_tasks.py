"""Isolated background tasks (`agentbox run --on local`) through the CLI against the limactl double: the agent
works on a copy of the workspace made in the VM from git bundles of agentbox's store, and what it changed comes
back as a proposal (`tasks`, `review`, `apply`), the workspace untouched meanwhile."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.tasks import records
from tests.helpers import (
    COPY_AGENT,
    NAME,
    FakeLima,
    git,
    make_repository,
    run_agentbox,
    run_cli,
    snapshot_tree,
    wait_for,
    write,
)

pytestmark = pytest.mark.xdist_group("tasks")

AGENT = COPY_AGENT  # the stand-in agent, in the guest as claude

EDITS = "do:write:modified.txt:by the agent;rm:deleted.txt;write:new/added.txt:new file;summary:what I did"


@pytest.fixture
def tasks_vm(project: Path, vm: FakeLima) -> FakeLima:
    """The project as a git repository with uncommitted, untracked and ignored files, its VM running (live), the
    stand-in agent."""
    make_repository(project, config="tasks:\n  maxConcurrent: 2\nnotify: false\n")
    write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / "claude", AGENT, mode=0o755)
    vm.clear()
    return vm


def run_task(project: Path, *args: str) -> int:
    result = run_cli("run", *args, cwd=project)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout.strip())


def record(project: Path, task_id: int) -> dict:
    result = run_cli("tasks", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    return next(t for t in json.loads(result.stdout) if t["id"] == task_id)


def stop_keeper(task_id: int) -> None:
    """Kill the task's keeper, as a restart of this machine would: nothing collects the task until a command looks."""
    wanted = [b"-m", b"agentbox.tasks.keeper", str(task_id).encode()]
    state = f"AGENTBOX_STATE_DIR={paths.state_dir()}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[1:4] == wanted and state in environ:
            os.kill(int(pid), signal.SIGKILL)
            return
    task = records.get(task_id)  # the record as it is: no command runs, none collects the task
    if task is not None and task.active and not task.harvested:
        return  # its keeper is gone already, and nothing collected the task
    raise AssertionError(f"no keeper runs for task {task_id}, which is "
                         f"{(task.state, task.reason, task.harvested) if task else 'not recorded'}")


def wait(project: Path, task_id: int):  # type: ignore[no-untyped-def]
    return run_agentbox("wait", str(task_id), cwd=project, timeout=90)


def seen_by_agent(project: Path, task_id: int) -> dict:
    return json.loads(run_agentbox("logs", str(task_id), cwd=project).stdout.splitlines()[0])


def bundles() -> list[Path]:
    return sorted((paths.staging_dir(NAME) / "bundles").glob("*.bundle"), key=lambda p: p.stat().st_mtime_ns)


def test_the_agent_edits_a_copy_and_its_changes_come_back_as_a_proposal(project: Path, tasks_vm: FakeLima) -> None:
    before = snapshot_tree(project)
    task_id = run_task(project, "--on", "local", EDITS)
    done = wait(project, task_id)
    assert done.returncode == 0, done.stderr + run_agentbox("logs", str(task_id), cwd=project).stderr
    assert "proposal 1: 3 files changed" in done.stderr
    # The live workspace was never touched: every file, its content and mode as before.
    assert snapshot_tree(project) == before
    seen = seen_by_agent(project, task_id)
    assert seen["cwd"] != str(project) and seen["cwd"].endswith(f"/.agentbox/tasks/{task_id}/{project.name}")
    # The copy holds the checkpoint: uncommitted and untracked files, not the ignored ones.
    assert {"modified.txt", "untracked.txt", "tracked.txt", "deleted.txt", ".gitignore"} <= set(seen["files"])
    assert "build/out.o" not in seen["files"]
    task = record(project, task_id)
    assert (task["host"], task["isolated"], task["proposal"], task["state"]) == ("local", True, 1, "Completed")
    listing = run_cli("tasks", cwd=project)
    assert "Completed, proposal 1" in listing.stdout
    review = run_cli("review", "1", cwd=project)
    assert review.exit_code == 0, review.stderr
    for line in (f"task {task_id}, collected", "-uncommitted", "+by the agent", "+new file", "deleted file mode",
                 "what I did"):
        assert line in review.stdout, review.stdout
    applied = run_cli("apply", "1", cwd=project)
    assert applied.exit_code == 0, applied.stderr
    assert (project / "modified.txt").read_text() == "by the agent\n"
    assert (project / "new" / "added.txt").read_text() == "new file\n"
    assert not (project / "deleted.txt").exists()
    assert not (project / ".agentbox-summary.md").exists()  # the summary went beside the patch, not into it
    assert (project / "build" / "out.o").read_text() == "ignored\n"
    # The copy is gone from the VM once the patch was written.
    homes = list((tasks_vm.home / NAME).rglob(f".agentbox/tasks/{task_id}"))
    assert homes == []


def test_a_second_task_sends_only_what_changed(project: Path, tasks_vm: FakeLima) -> None:
    write(project / "big.bin", os.urandom(300_000).hex())
    first = run_task(project, "--on", "local", "do:sleep:0")
    assert wait(project, first).returncode == 0
    [whole] = bundles()
    write(project / "small.txt", "a small change\n")
    second = run_task(project, "--isolated", "do:sleep:0")
    done = wait(project, second)
    assert done.returncode == 0, done.stderr
    assert "no changes" in done.stderr
    assert "small.txt" in seen_by_agent(project, second)["files"]
    assert "big.bin" in seen_by_agent(project, second)["files"]
    [same, delta] = bundles()
    assert same == whole
    assert delta.stat().st_size < whole.stat().st_size // 10
    header = delta.read_bytes().split(b"PACK", 1)[0]
    assert b"\n-" + whole.name.removesuffix(".bundle").encode() in header  # needs the first one's commit
    # Nothing changed since: the next task sends nothing new.
    third = run_task(project, "--on", "local", "do:sleep:0")
    assert wait(project, third).returncode == 0
    assert len(bundles()) == 2


def test_an_agent_that_changes_nothing_makes_no_proposal_and_says_so(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "--on", "local", "do:sleep:0")
    done = wait(project, task_id)
    assert done.returncode == 0
    assert f"task {task_id}: no changes: no proposal" in done.stderr
    assert record(project, task_id)["proposal"] is None
    assert "Completed, no changes" in run_cli("tasks", cwd=project).stdout
    assert "no proposals" in run_cli("proposals", cwd=project).stderr


def test_cancel_stops_an_isolated_task_and_makes_no_proposal(project: Path, tasks_vm: FakeLima) -> None:
    before = snapshot_tree(project)
    task_id = run_task(project, "--on", "local", "do:write:modified.txt:half;sleep:60")
    wait_for(lambda: record(project, task_id)["state"], 60, "the task to run", until=lambda s: s == "Running")
    result = run_cli("cancel", str(task_id), cwd=project)
    assert result.exit_code == 0, result.stderr
    task = record(project, task_id)
    assert task["state"] == "Cancelled" and task["proposal"] is None
    assert snapshot_tree(project) == before
    assert list((tasks_vm.home / NAME).rglob(f".agentbox/tasks/{task_id}")) == []


def test_on_refuses_worktree_and_an_unknown_host(project: Path, tasks_vm: FakeLima) -> None:
    result = run_cli("run", "--on", "local", "--worktree", "x", "do:sleep:0", cwd=project)
    assert result.exit_code == 2 and "do not go together" in result.stderr
    result = run_cli("run", "--on", "elsewhere", "do:sleep:0", cwd=project)
    assert result.exit_code != 0 and "no host named 'elsewhere'" in result.stderr


@pytest.mark.parametrize("kind", ["control", "symlink"])
def test_a_changes_patch_the_vm_turned_into_a_link_is_not_read(project: Path, tasks_vm: FakeLima, tmp_path: Path,
                                                              kind: str) -> None:
    secret = write(tmp_path / "secret", "diff --git a/x b/x\nSECRET-BYTES-7f3a\n")
    release = project / ".git" / "agentbox-test-release"  # seen in the VM, in no patch
    task_id = run_task(project, "--on", "local", f"do:await:{release};write:modified.txt:by the agent")
    box = paths.vm_outbox(NAME) / "tasks" / str(task_id)
    stop_keeper(task_id)  # nothing collects the task until an agentbox command looks at it
    release.write_text("")  # only now may the task end: its keeper cannot have collected it
    deadline = time.monotonic() + 60
    while b"state=completed" not in ((box / "state").read_bytes() if (box / "state").exists() else b""):
        assert time.monotonic() < deadline, "the runner never ended"
        time.sleep(0.1)
    assert (box / "changes.patch").is_file()
    if kind == "symlink":  # what a root agent in the VM could do
        (box / "changes.patch").unlink()
        (box / "changes.patch").symlink_to(secret)
    listing = run_cli("tasks", cwd=project)
    assert listing.exit_code == 0, listing.stderr
    task = record(project, task_id)
    proposals = paths.workspace_state_dir(project) / "proposals"
    if kind == "control":
        assert task["proposal"] == 1 and "proposal 1" in listing.stdout
        return
    assert task["proposal"] is None and "no proposal" in listing.stdout
    said = run_agentbox("wait", str(task_id), cwd=project)
    assert "not taken" in said.stderr and "symbolic link" in said.stderr
    for path in proposals.rglob("*") if proposals.exists() else []:
        assert not path.is_file() or b"SECRET-BYTES" not in path.read_bytes()
    assert b"SECRET-BYTES" not in (paths.tasks_dir() / str(task_id) / "task.json").read_bytes()
    assert secret.read_text().endswith("SECRET-BYTES-7f3a\n")


def test_an_isolated_task_runs_on_an_isolated_vm(project: Path, isolated_vm: FakeLima) -> None:
    write(isolated_vm.home / NAME / "guestfs" / "usr-local" / "bin" / "claude", AGENT, mode=0o755)
    before = snapshot_tree(project)
    task_id = run_task(project, "--on", "local", "do:write:tracked.txt:changed")
    done = wait(project, task_id)
    assert done.returncode == 0, done.stderr
    assert record(project, task_id)["proposal"] is not None
    assert snapshot_tree(project) == before
    assert git(project, "status", "--porcelain")  # the user's uncommitted work is still there


def test_its_keeper_brings_a_local_task_home_without_a_command(project: Path, tasks_vm: FakeLima) -> None:
    """`--on local` is a runtime Job like `--on HOST`: its keeper follows it through this machine's runtime, so the
    proposal is made though no agentbox command looks at the task."""
    task_id = run_task(project, "--on", "local", EDITS)
    record_file = paths.tasks_dir() / str(task_id) / "task.json"

    def record_now() -> dict:
        return json.loads(record_file.read_text())

    done = wait_for(record_now, 60, "the keeper bringing the task home", until=lambda task: task["harvested"])
    assert done["state"] == "Completed" and done["proposal"] == 1
    assert done["remote_key"] == str(task_id)  # a Job's key here is its id
    assert (paths.tasks_dir() / str(task_id) / "stdout").read_bytes()  # the output, moved into the record
