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
from agentbox.tasks import state as taskstate
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
        task = records.create("agentbox-x", project, "claude", ["claude", "-p"], str(project),
                              f"task number {index}".encode(), name=None, timeout=None, worktree=None)
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
