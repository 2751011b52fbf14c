"""agentbox at scale (issue 28, item 6): what made a first sync of a skills folder and a listing of a thousand
tasks slow stays gone, and the speed-ups keep the rules (the cap, no link followed, the same listing).
The figures themselves are benchmarks/scale.py's, not tests'."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from agentbox import fsutil, paths
from agentbox.tasks import records
from agentbox.tasks import transitions as taskstate
from tests.helpers import FakeLima, run_cli, write

pytestmark = pytest.mark.timeout(120)

SKILLS = 200


def skills(home: Path, count: int = SKILLS) -> list[Path]:
    return [write(home / ".claude" / "skills" / f"s{index // 10}" / f"part{index}.md", f"# part {index}\n" * 4)
            for index in range(count)]


def peak_while(call: object) -> tuple[object, int]:
    """What call() returned, and the most memory Python held at once while it ran (bytes)."""
    assert callable(call)
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_first_sync_reads_each_small_file_into_a_buffer_of_its_size(project: Path, vm: FakeLima,
                                                                      home: Path) -> None:
    from tests.test_session_setup import launch_in_process

    files = skills(home)
    code, peak = peak_while(lambda: launch_in_process(project))
    assert code == 0
    copies = vm.guest_home("agentbox-" + project.name) / ".claude" / "skills"
    assert sorted(p.name for p in copies.rglob("*.md")) == sorted(p.name for p in files)
    # A 64 MiB buffer per file (the cap) would show here as a peak of at least 64 MiB.
    assert peak < 16 * 1024 * 1024, f"peak {peak:,} bytes while staging {SKILLS} small files"


def test_sync_show_reads_small_files_without_a_cap_sized_buffer_and_still_follows_no_outside_link(
        project: Path, home: Path, tmp_path: Path) -> None:
    skills(home, 50)
    outside = write(tmp_path / "elsewhere" / "secret.md", "not for the VM\n")
    (home / ".claude" / "skills" / "s0" / "link.md").symlink_to(outside)
    result, peak = peak_while(lambda: run_cli("sync", "--show", "claude", cwd=project))
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    shown = result.stdout  # type: ignore[attr-defined]
    assert "  copy  ~/.claude/skills/ (50 files, " in shown  # each read and transformed, to say its size
    assert f"~/.claude/skills/s0/link.md: a symlink to {outside}, outside ~/.claude: not followed" in shown
    assert peak < 16 * 1024 * 1024, f"peak {peak:,} bytes while describing 50 small files"


def test_read_capped_sizes_its_buffer_to_the_file_and_keeps_the_cap(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    real_read = os.read

    def counting_read(fd: int, size: int) -> bytes:
        asked.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", counting_read)
    small = write(tmp_path / "small", "x" * 100)
    fd = os.open(small, os.O_RDONLY)
    try:
        assert fsutil.read_capped(fd, 64 * 1024 * 1024) == b"x" * 100
    finally:
        os.close(fd)
    assert asked[0] == 101 and max(asked) <= 64 * 1024  # the file's size + 1, then (at its end) a small read
    large = write(tmp_path / "large", "y" * 5000)
    fd = os.open(large, os.O_RDONLY)
    try:
        assert fsutil.read_capped(fd, 1000) == b"y" * 1001  # one past the cap: the caller refuses it
    finally:
        os.close(fd)


def test_a_workspace_file_over_its_cap_is_still_refused(tmp_path: Path) -> None:
    write(tmp_path / "big", "z" * 2000)
    write(tmp_path / "fits", "z" * 1000)
    with pytest.raises(OSError, match="larger than 1,000 bytes"):
        fsutil.read_workspace_file(tmp_path / "big", limit=1000)
    assert fsutil.read_workspace_file(tmp_path / "fits", limit=1000) == b"z" * 1000  # the control


RECORDED = 150


@pytest.fixture
def many_tasks(project: Path) -> list[records.Task]:
    made = []
    for index in range(RECORDED):
        task = records.create(records.NewTask("agentbox-x", project, "claude", ["claude", "-p"], str(project),
                              f"task number {index}".encode(), name=None, timeout=None, worktree=None))
        records.advance(task, taskstate.QUEUED, at=1_790_000_000.0)
        records.advance(task, taskstate.RUNNING, at=1_790_000_000.0)
        records.advance(task, taskstate.COMPLETED, at=1_790_000_075.0, exit_code=0, harvested=True)
        records.save(task)
        made.append(task)
    return made


def test_tasks_computes_the_state_folder_a_bounded_number_of_times(project: Path, many_tasks: list[records.Task],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    computed = []
    real = paths.state_dir

    def counting() -> Path:
        computed.append(1)
        return real()

    monkeypatch.setattr(paths, "state_dir", counting)
    result = run_cli("tasks", cwd=project, env={"COLUMNS": ""})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "AGENT", "STATE", "EXIT", "STARTED", "TIME", "PROMPT"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == [str(task.id) for task in many_tasks]  # every record, by id
    assert all(row[1:4] == ["claude", "Completed", "0"] and "1m15s" in row for row in rows)
    assert [" ".join(row[-3:]) for row in rows] == [f"task number {index}" for index in range(RECORDED)]
    assert len(computed) <= 10, f"the state folder was computed {len(computed)} times for {RECORDED} records"


# -- diff and undo --dry-run: the lookup beside the snapshot, git diff-files started first ----------------


@pytest.fixture
def checkpointed(project: Path) -> Path:
    from tests.gitrepo import commit_all, init

    init(project)
    for index in range(30):
        write(project / "src" / f"f{index}.txt", f"{index}\n")
    commit_all(project)
    result = run_cli("checkpoint", cwd=project)
    assert result.exit_code == 0, result.stderr
    return project


def store_of(project: Path) -> Path:
    from agentbox.review import checkpoints

    return checkpoints.records_file(project).parent / "store"


@pytest.mark.needs("git")
def test_diff_and_undo_dry_run_name_a_missing_checkpoint_first_and_leave_the_git_folder_alone(
        checkpointed: Path) -> None:
    from tests.gitrepo import git_folder_state

    write(checkpointed / "src" / "f3.txt", "changed\n")
    git_folder = git_folder_state(checkpointed)
    for args in (("diff", "--since", "7"), ("undo", "--dry-run", "7")):
        result = run_cli(*args, cwd=checkpointed)
        assert result.exit_code != 0
        assert f"there is no checkpoint #7 of {checkpointed} (the newest is #1)" in result.stderr, result.stderr
    diff = run_cli("diff", "--since", "1", "--name-only", cwd=checkpointed)  # the control
    assert (diff.exit_code, diff.stdout) == (0, "src/f3.txt\n"), diff.stderr
    undo = run_cli("undo", "--dry-run", "1", cwd=checkpointed)
    assert undo.exit_code == 0 and "src/f3.txt" in undo.stdout, undo.stderr
    assert (checkpointed / "src" / "f3.txt").read_text() == "changed\n"  # a dry run changes nothing
    assert git_folder_state(checkpointed) == git_folder  # agentbox's git runs on its own store only


@pytest.mark.needs("git")
@pytest.mark.parametrize("damage", ["none", "walk cache gone", "stat index gone", "files cache gone",
                                    "files cache damaged"])
def test_diff_sees_a_change_whatever_state_the_stat_index_is_in(checkpointed: Path, damage: str) -> None:
    store = store_of(checkpointed)
    assert (store / "stat.index").exists() and (store / "walk.cache").exists()
    files_caches = list(store.glob("files.*.cache"))  # the folders' recorded files, read only when something changed
    assert len(files_caches) == 1
    write(checkpointed / "src" / "f5.txt", "changed, same size\n"[:3])  # "cha": as long as "5\n" + 1
    os.utime(checkpointed / "src" / "f5.txt", ns=(1_000_000_000, 1_000_000_000))  # an old mtime: only stat tells
    if damage == "walk cache gone":  # the stat index no longer matches what was recorded: its answer is dropped
        (store / "walk.cache").unlink()
    elif damage == "stat index gone":
        (store / "stat.index").unlink()
    elif damage == "files cache gone":  # the walk starts over: every file is read again
        files_caches[0].unlink()
    elif damage == "files cache damaged":
        files_caches[0].write_bytes(b"\0not marshal")
    result = run_cli("diff", "--since", "1", "--name-only", cwd=checkpointed)
    assert (result.exit_code, result.stdout) == (0, "src/f5.txt\n"), result.stderr
    assert len(list(store.glob("files.*.cache"))) == 1  # the new one; none left behind
