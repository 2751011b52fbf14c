"""agentbox/review/restore.py: writes into an agent-writable workspace never leave it, whatever links lie on the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentbox.review import restore
from agentbox.review.restore import Change, Operation
from tests.helpers import tree_listing, unwritable, write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the workspace standing for the user's home: it must never change."""
    path = tmp_path / "home-of-user"
    write(path / "secret.txt", "private\n")
    write(path / "sub" / "file.txt", "mine\n")
    return path


def test_writes_files_modes_and_symlinks_creating_folders(workspace: Path) -> None:
    result = restore.apply(workspace, [
        Operation(restore.FILE, "a b/new\nline.txt", b"text\n"),
        Operation(restore.EXECUTABLE, "bin/run", b"#!/bin/sh\n"),
        Operation(restore.SYMLINK, "link", b"a b/new\nline.txt"),
        Operation(restore.FILE, "caf\u00e9/\u00fcber", b"\x00\xff"),
    ])
    assert result.failures == []
    assert tree_listing(workspace) == {
        "a b": ("dir", 0o755, b""),
        "a b/new\nline.txt": ("file", 0o644, b"text\n"),
        "bin": ("dir", 0o755, b""),
        "bin/run": ("file", 0o755, b"#!/bin/sh\n"),
        "caf\u00e9": ("dir", 0o755, b""),
        "caf\u00e9/\u00fcber": ("file", 0o644, b"\x00\xff"),
        "link": ("link", 0, b"a b/new\nline.txt"),
    }
    assert result.changes == [
        Change("created folder", "a b"), Change("restored", "a b/new\nline.txt"),
        Change("created folder", "bin"), Change("restored", "bin/run"),
        Change("created folder", "caf\u00e9"), Change("restored", "caf\u00e9/\u00fcber"),
        Change("restored", "link"),
    ]


def test_mode_is_set_exactly_whatever_the_umask(workspace: Path) -> None:
    write(workspace / "tool", "old", mode=0o600)
    old = os.umask(0o077)
    try:
        restore.apply(workspace, [Operation(restore.EXECUTABLE, "tool", b"new"), Operation(restore.FILE, "doc", b"d")])
    finally:
        os.umask(old)
    assert tree_listing(workspace) == {"tool": ("file", 0o755, b"new"), "doc": ("file", 0o644, b"d")}


def test_a_folder_replaced_by_a_link_to_outside_is_replaced_not_followed(workspace: Path, outside: Path) -> None:
    before = tree_listing(outside)
    (workspace / "src").symlink_to(outside)
    (workspace / "deep").mkdir()
    (workspace / "deep" / "er").symlink_to(outside / "sub")
    result = restore.apply(workspace, [
        Operation(restore.FILE, "src/secret.txt", b"restored\n"),
        Operation(restore.FILE, "src/sub/file.txt", b"restored too\n"),
        Operation(restore.FILE, "deep/er/file.txt", b"third\n"),
    ])
    assert result.failures == []
    assert tree_listing(outside) == before
    assert (workspace / "src" / "secret.txt").read_bytes() == b"restored\n"
    assert not (workspace / "src").is_symlink()
    assert not (workspace / "deep" / "er").is_symlink()
    assert (workspace / "deep" / "er" / "file.txt").read_bytes() == b"third\n"
    assert Change("replaced link", "src", f"-> {outside}") in result.changes
    assert Change("replaced link", "deep/er", f"-> {outside / 'sub'}") in result.changes


def test_a_file_where_a_folder_belongs_is_replaced(workspace: Path) -> None:
    write(workspace / "pkg", "now a file")
    result = restore.apply(workspace, [Operation(restore.FILE, "pkg/mod.py", b"x = 1\n")])
    assert result.failures == []
    assert result.changes == [Change("replaced file", "pkg", "a regular file"), Change("restored", "pkg/mod.py")]
    assert tree_listing(workspace) == {"pkg": ("dir", 0o755, b""), "pkg/mod.py": ("file", 0o644, b"x = 1\n")}


def test_a_link_at_the_file_itself_is_replaced_not_written_through(workspace: Path, outside: Path) -> None:
    before = tree_listing(outside)
    (workspace / "config").symlink_to(outside / "secret.txt")
    (workspace / "script").symlink_to(outside / "secret.txt")
    result = restore.apply(workspace, [
        Operation(restore.FILE, "config", b"mine\n"),
        Operation(restore.SYMLINK, "script", b"config"),
    ])
    assert result.failures == []
    assert tree_listing(outside) == before
    assert tree_listing(workspace) == {"config": ("file", 0o644, b"mine\n"), "script": ("link", 0, b"config")}


def test_removal_never_goes_through_a_link(workspace: Path, outside: Path) -> None:
    before = tree_listing(outside)
    (workspace / "src").symlink_to(outside)
    result = restore.apply(workspace, [
        Operation(restore.REMOVE, "src/secret.txt"),
        Operation(restore.REMOVE, "src/sub/file.txt"),
    ])
    assert result == restore.Result()
    assert tree_listing(outside) == before
    assert (workspace / "src").is_symlink()


def test_removal_removes_only_the_folders_it_leaves_empty(workspace: Path, outside: Path) -> None:
    write(workspace / "new" / "deeper" / "a.txt", "a")
    write(workspace / "new" / "deeper" / "b.txt", "b")
    write(workspace / "kept" / "c.txt", "c")
    write(workspace / "kept" / "other.txt", "other")
    (workspace / "was-empty").mkdir()
    (workspace / "link").symlink_to(outside / "secret.txt")
    result = restore.apply(workspace, [
        Operation(restore.REMOVE, "new/deeper/a.txt"),
        Operation(restore.REMOVE, "new/deeper/b.txt"),
        Operation(restore.REMOVE, "kept/c.txt"),
        Operation(restore.REMOVE, "link"),
        Operation(restore.REMOVE, "absent.txt"),
    ])
    assert result.failures == []
    assert result.changes == [
        Change("removed", "new/deeper/b.txt"), Change("removed", "new/deeper/a.txt"),
        Change("removed folder", "new/deeper"), Change("removed folder", "new"),
        Change("removed", "link"), Change("removed", "kept/c.txt"),
    ]
    assert tree_listing(workspace) == {
        "kept": ("dir", 0o755, b""), "kept/other.txt": ("file", 0o644, b"other"), "was-empty": ("dir", 0o755, b""),
    }
    assert (outside / "secret.txt").read_text() == "private\n"


def test_a_folder_a_write_needs_is_not_removed_as_empty(workspace: Path) -> None:
    write(workspace / "dir" / "created.txt", "new")
    result = restore.apply(workspace, [
        Operation(restore.REMOVE, "dir/created.txt"),
        Operation(restore.FILE, "dir/restored.txt", b"old"),
    ])
    assert result.changes == [Change("removed", "dir/created.txt"), Change("restored", "dir/restored.txt")]


def test_a_file_becomes_a_folder_again_once_its_files_are_removed(workspace: Path) -> None:
    write(workspace / "name" / "inside.txt", "created since")
    result = restore.apply(workspace, [
        Operation(restore.REMOVE, "name/inside.txt"),
        Operation(restore.FILE, "name", b"was a file", overwrite=False),
    ])
    assert result.failures == []
    assert result.changes == [Change("removed", "name/inside.txt"), Change("removed folder", "name"),
                              Change("restored", "name")]
    assert tree_listing(workspace) == {"name": ("file", 0o644, b"was a file")}


@pytest.mark.parametrize("path, problem", [
    ("/etc/passwd", "the path is absolute"),
    ("../escape", "the path has a `..` component"),
    ("a/../../escape", "the path has a `..` component"),
    (".git/hooks/pre-commit", "the path is inside a `.git` folder"),
    ("sub/.GIT/config", "the path is inside a `.git` folder"),
    (".g\u200cit/config", "the path is inside a `.git` folder"),
    ("a//b", "the path has an empty or `.` component"),
    ("./a", "the path has an empty or `.` component"),
    ("", "the path is empty"),
    ("a\0b", "the path contains a NUL character"),
])
def test_refused_paths_are_never_touched(workspace: Path, path: str, problem: str) -> None:
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "sub" / ".GIT").mkdir(parents=True)
    before = tree_listing(workspace.parent)
    result = restore.apply(workspace, [Operation(restore.FILE, path, b"evil"), Operation(restore.REMOVE, path)])
    assert result.failures == [restore.Failure(path, f"refused: {problem}")] * 2
    assert result.changes == []
    assert tree_listing(workspace.parent) == before


def test_left_in_place_when_not_to_overwrite(workspace: Path) -> None:
    write(workspace / "ignored.log", "the user's")
    (workspace / "folder").mkdir()
    result = restore.apply(workspace, [
        Operation(restore.FILE, "ignored.log", b"old", overwrite=False),
        Operation(restore.FILE, "folder", b"old", overwrite=False),
    ])
    assert result.changes == [Change("left in place", "folder", "a folder"),
                              Change("left in place", "ignored.log", "a regular file")]
    assert (workspace / "ignored.log").read_text() == "the user's"


def test_a_failure_is_reported_and_the_rest_goes_on(workspace: Path) -> None:
    write(workspace / "locked" / "f.txt", "now")
    write(workspace / "full" / "x", "a file in a folder where the checkpoint had a file")
    with unwritable(workspace / "locked"):
        result = restore.apply(workspace, [
            Operation(restore.FILE, "locked/f.txt", b"before"),
            Operation(restore.FILE, "full", b"was a file"),
            Operation(restore.FILE, "ok.txt", b"fine"),
        ])
    assert [failure.path for failure in result.failures] == ["full", "locked/f.txt"]
    assert result.failures[0].reason == "a folder with files in it is there now"
    assert result.changes == [Change("restored", "ok.txt")]
    assert (workspace / "locked" / "f.txt").read_text() == "now"
    assert sorted(os.listdir(workspace / "locked")) == ["f.txt"]  # no temp file left behind


def test_an_empty_folder_at_the_file_is_replaced(workspace: Path) -> None:
    (workspace / "f").mkdir()
    result = restore.apply(workspace, [Operation(restore.FILE, "f", b"x")])
    assert result.changes == [Change("replaced folder", "f"), Change("restored", "f")]
    assert tree_listing(workspace) == {"f": ("file", 0o644, b"x")}


def _scenario(workspace: Path, outside: Path) -> list[Operation]:
    (workspace / "src").symlink_to(outside)
    write(workspace / "pkg", "file where a folder was")
    write(workspace / "gone" / "deep" / "created.txt", "new")
    write(workspace / "changed.txt", "new content")
    (workspace / "emptied").mkdir()
    write(workspace / "was-file" / "created.txt", "new")  # --clean: removed, then the file comes back
    write(workspace / "was-folder", "created since")  # --clean: removed, then a folder comes back
    return [
        Operation(restore.REMOVE, "was-file/created.txt"),
        Operation(restore.FILE, "was-file", b"5", overwrite=False),
        Operation(restore.REMOVE, "was-folder"),
        Operation(restore.FILE, "was-folder/inside", b"6"),
        Operation(restore.FILE, "src/a/b.txt", b"1"),
        Operation(restore.FILE, "src/a/c.txt", b"2"),
        Operation(restore.FILE, "pkg/x.py", b"3"),
        Operation(restore.REMOVE, "gone/deep/created.txt"),
        Operation(restore.FILE, "changed.txt", b"old content"),
        Operation(restore.FILE, "emptied", b"was a file"),
        Operation(restore.FILE, "new/dir/file", b"4"),
    ]


def test_dry_run_changes_nothing_and_reports_what_a_real_run_does(tmp_path: Path, outside: Path) -> None:
    dry_ws, real_ws = tmp_path / "dry", tmp_path / "real"
    dry_ws.mkdir()
    real_ws.mkdir()
    dry_ops = _scenario(dry_ws, outside)
    before = tree_listing(tmp_path)
    planned = restore.apply(dry_ws, dry_ops, dry_run=True)
    assert tree_listing(tmp_path) == before
    done = restore.apply(real_ws, _scenario(real_ws, outside))
    assert planned.failures == done.failures == []
    assert [(c.action, c.path) for c in planned.changes] == [(c.action, c.path) for c in done.changes]
    assert {(c.action, c.path) for c in done.changes} >= {
        ("replaced link", "src"), ("created folder", "src/a"), ("replaced file", "pkg"),
        ("removed", "gone/deep/created.txt"), ("removed folder", "gone/deep"), ("removed folder", "gone"),
        ("replaced folder", "emptied"), ("created folder", "new"), ("created folder", "new/dir"),
        ("removed folder", "was-file"), ("restored", "was-file"), ("removed", "was-folder"),
        ("created folder", "was-folder"), ("restored", "was-folder/inside"),
    }
