"""agentbox's own checkpoint store through the CLI: the workspace's git folder stays byte for byte as it was around
every host command, checkpoints of the old kind (in the workspace's repository) move into the store once, and
what the VM can no longer be given is refused with why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentbox.git import store as hostgit
from agentbox.review import checkpoints
from tests.gitrepo import commit_all, git, git_folder_state, init
from tests.helpers import NAME, FakeLima, agentbox, make_repository, run_cli, write
from tests.test_tasks import TASK_AGENT, run_task, wait

pytestmark = pytest.mark.needs("git")


@pytest.fixture
def task_vm(project: Path, vm: FakeLima) -> FakeLima:
    """The project as a committed git repository, its VM running, test_tasks' stand-in agent."""
    make_repository(project, config="tasks:\n  maxConcurrent: 2\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work in progress")
    write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / "claude", TASK_AGENT, mode=0o755)
    vm.clear()
    return vm


def plant_reflog_links(project: Path, outside: Path) -> None:
    """What an attacker leaves for host git to write through: reflogs and fan-out folders that are links."""
    logs = project / ".git" / "logs" / "refs" / "agentbox" / "checkpoints"
    logs.mkdir(parents=True, exist_ok=True)
    for number in range(1, 6):
        os.symlink(outside, logs / str(number))
    os.symlink(outside, project / ".git" / "logs" / "refs" / "heads" / "agentbox")


@pytest.mark.needs("bwrap")
def test_the_git_folder_is_byte_identical_around_every_command_of_an_isolated_session(
        project: Path, isolated_vm: FakeLima, tmp_path: Path) -> None:
    outside = write(tmp_path / "bashrc", "# the user's\n")
    plant_reflog_links(project, outside)
    before = git_folder_state(project)
    for args in (["claude"], ["checkpoints"], ["diff", "--since", "1"], ["proposals"], ["review"],
                 ["apply", "--check"], ["apply"], ["checkpoint", "-m", "after"], ["diff", "--stat"]):
        result = agentbox(project, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert git_folder_state(project) == before, args
    applied = json.loads(agentbox(project, "checkpoints", "--json").stdout)
    target = next(c for c in applied if "apply" in [c["kind"], *(use[0] for use in c.get("uses", []))])["id"]
    undone = agentbox(project, "undo", str(target))
    assert undone.returncode == 0, undone.stderr
    assert git_folder_state(project) == before
    assert outside.read_text() == "# the user's\n"
    # control: the same links are written through by plain git updating a ref with a reflog
    git(project, "-c", "core.logAllRefUpdates=always", "update-ref", "refs/agentbox/checkpoints/1", "HEAD")
    assert outside.read_text() != "# the user's\n"


@pytest.mark.needs("bwrap")
def test_host_commands_about_a_worktree_task_leave_the_git_folder_alone(project: Path, task_vm: FakeLima) -> None:
    number = run_task(project, "--worktree", "--", "do:write:tracked.txt:from the task")
    assert wait(project, number).returncode == 0
    before = git_folder_state(project)
    for args in (["tasks"], ["tasks", "--json", "--all"], ["logs", str(number)], ["diff", "--since", f"task:{number}"],
                 ["checkpoints"]):
        result = run_cli(*args, cwd=project)
        assert result.exit_code == 0, (args, result.stderr)
        assert git_folder_state(project) == before, args
    diff = run_cli("diff", "--since", f"task:{number}", "--name-only", cwd=project)
    assert "tracked.txt" in diff.stdout


def v1_record(project: Path, entries: list[dict]) -> None:
    path = checkpoints.records_file(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "next": len(entries) + 1, "checkpoints": entries}))


def old_checkpoint(project: Path, number: int, message: str) -> dict:
    """A checkpoint as agentbox wrote them before the store: a commit in the workspace's repository."""
    git(project, "add", "-A")
    tree = git(project, "write-tree").stdout.decode().strip()
    head = git(project, "rev-parse", "HEAD").stdout.decode().strip()
    commit = git(project, "commit-tree", "-p", head, "-m", message, tree).stdout.decode().strip()
    git(project, "update-ref", f"refs/agentbox/checkpoints/{number}", commit)
    git(project, "reset", "-q")
    return {"id": number, "commit": commit, "tree": tree, "head": head, "time": "2026-01-01T00:00:00Z",
            "kind": "manual", "agent": None, "session": None, "message": message, "skipped": [],
            "ref": f"refs/agentbox/checkpoints/{number}"}


def test_checkpoints_of_the_old_kind_move_into_the_store_once(project: Path) -> None:
    init(project)
    write(project / "a.txt", "one\n")
    commit_all(project)
    write(project / "a.txt", "two\n")
    first = old_checkpoint(project, 1, "first")
    write(project / "a.txt", "three\n")
    write(project / "b.txt", "new\n")
    second = old_checkpoint(project, 2, "second")
    write(project / "gone.txt", "x\n")
    lost = old_checkpoint(project, 3, "lost")
    lost_blob = git(project, "rev-parse", f"{lost['tree']}:gone.txt").stdout.decode().strip()
    (project / ".git" / "objects" / lost_blob[:2] / lost_blob[2:]).unlink()  # as if collected
    v1_record(project, [first, second, lost])
    before = git_folder_state(project)

    listing = run_cli("checkpoints", "--json", cwd=project)
    assert listing.exit_code == 0, listing.stderr
    assert listing.stderr.count("moved 2 checkpoints of ") == 1
    assert "(1 could not be read back and were dropped)" in listing.stderr
    assert "the old refs refs/agentbox/checkpoints/* stay in the repository" in listing.stderr
    found = json.loads(listing.stdout)
    assert [(c["id"], c["ok"], c["tree"]) for c in found] == [(1, True, first["tree"]), (2, True, second["tree"])]
    assert all(c["commit"] not in (first["commit"], second["commit"]) for c in found)  # the store's own commits
    assert git_folder_state(project) == before  # moved by reading, nothing written there

    again = run_cli("checkpoints", cwd=project)
    assert "moved" not in again.stderr
    diff = run_cli("diff", "--since", "1", "--name-only", cwd=project)
    assert diff.exit_code == 0, diff.stderr
    assert diff.stdout == "a.txt\nb.txt\ngone.txt\n"
    assert run_cli("diff", "--since", "2", cwd=project).stdout.count("+x") == 1
    repo = hostgit.find(project)
    assert repo is not None
    store_refs = hostgit.refs(repo, "refs/agentbox/checkpoints")
    assert sorted(store_refs) == ["refs/agentbox/checkpoints/1", "refs/agentbox/checkpoints/2"]


def test_an_altered_old_checkpoint_is_dropped_not_moved(project: Path) -> None:
    init(project)
    write(project / "a.txt", "one\n")
    commit_all(project)
    write(project / "a.txt", "checkpointed\n")
    entry = old_checkpoint(project, 1, "first")
    blob = git(project, "rev-parse", f"{entry['tree']}:a.txt").stdout.decode().strip()
    loose = project / ".git" / "objects" / blob[:2] / blob[2:]
    forged = git(project, "hash-object", "-w", "--stdin", input=b"a backdoor\n").stdout.decode().strip()
    loose.chmod(0o644)
    loose.write_bytes((project / ".git" / "objects" / forged[:2] / forged[2:]).read_bytes())
    v1_record(project, [entry])
    listing = run_cli("checkpoints", "--json", cwd=project)
    assert listing.exit_code == 0, listing.stderr
    assert "moved 0 checkpoints" in listing.stderr and "(1 could not be read back and were dropped)" in listing.stderr
    assert json.loads(listing.stdout) == []


@pytest.mark.needs("bwrap")
def test_worktrees_from_a_linked_worktree_are_refused_with_why(project: Path, task_vm: FakeLima) -> None:
    linked = project.parent / "linked"
    git(project, "worktree", "add", "-q", "-b", "side", str(linked))
    refused = run_cli("run", "--worktree", "--", "do:write:x.txt:x", cwd=linked)
    assert refused.exit_code == 1
    assert f"--worktree cannot be used in {linked}: it is a linked worktree of {project / '.git'}" in refused.stderr
    assert not (project / ".git" / "worktrees" / "task-1").exists()


def test_the_store_is_never_inside_the_workspace_and_holds_no_workspace_object(project: Path) -> None:
    init(project)
    write(project / "a.txt", "one\n")
    commit_all(project)
    taken = run_cli("checkpoint", cwd=project)
    assert taken.exit_code == 0, taken.stderr
    repo = hostgit.find(project)
    assert repo is not None
    store = hostgit.store_dir(repo)
    assert project not in store.parents
    alternates = store / "objects" / "info" / "alternates"
    assert not alternates.exists()
    result = subprocess.run(["git", f"--git-dir={store}", "count-objects", "-v"], capture_output=True, check=True)
    assert b"count: 0" not in result.stdout
