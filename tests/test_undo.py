"""`agentbox undo` through the CLI: the workspace comes back exactly, never written outside, undo undoable."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import FakeLima, run_cli, tree_listing, unwritable, write, write_trusted

pytestmark = pytest.mark.needs("git")

IGNORED = {"debug.log", "build", "build/out.bin", "new.log"}
CREATED = {"created.txt", "created dir", "created dir/deep", "created dir/deep/f.txt", "new\nname caf\u00e9.txt"}


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True, text=True).stdout


def files(project: Path) -> dict[str, tuple[str, int, bytes]]:
    """The work tree, .git left out."""
    return {path: entry for path, entry in tree_listing(project).items()
            if path != ".git" and not path.startswith(".git/")}


def checkpoint(project: Path) -> int:
    result = run_cli("checkpoint", cwd=project)
    assert result.exit_code == 0, result.stderr
    found = re.match(r"checkpoint #(\d+) of ", result.stdout)
    assert found, result.stdout
    return int(found.group(1))


def undo(project: Path, *args: str, exit_code: int = 0) -> str:
    result = run_cli("undo", *args, cwd=project)
    assert result.exit_code == exit_code, result.output + result.stderr
    return result.stdout


def pre_undo_id(output: str) -> int:
    found = re.search(r"^Checkpoint #(\d+) holds the workspace as it was before this undo", output, re.M)
    assert found, output
    return int(found.group(1))


@pytest.fixture
def repo(project: Path) -> Path:
    """A repository with tracked, untracked and ignored files, names with spaces, newlines and unicode."""
    git(project, "init", "-q")
    git(project, "config", "user.email", "user@example.com")
    git(project, "config", "user.name", "User")
    write(project / ".gitignore", "*.log\nbuild/\n")
    write(project / "keep.txt", "kept\n")
    write(project / "edit.txt", "original\n")
    write(project / "delete me.txt", "to be deleted\n")
    write(project / "dir" / "nested.txt", "nested\n")
    write(project / "dir" / "sub" / "deeper.txt", "deeper\n")
    write(project / "tool.sh", "#!/bin/sh\necho hi\n")
    write(project / "run.sh", "#!/bin/sh\n", mode=0o755)
    write(project / "caf\u00e9" / "\u00fcber.txt", "unicode\n")
    write(project / "new\nline.txt", "newline in the name\n")
    (project / "link").symlink_to("keep.txt")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "initial")
    write(project / "notes.md", "untracked notes\n")
    write(project / "untracked dir" / "u.txt", "untracked\n")
    write(project / "debug.log", "ignored log\n")
    write(project / "build" / "out.bin", "ignored build output\n")
    return project


def agent_works(project: Path) -> None:
    """What an agent might do after the checkpoint: edit, delete, create; tracked, untracked and ignored."""
    write(project / "edit.txt", "edited by the agent\n")
    (project / "delete me.txt").unlink()
    for path in ("dir/sub/deeper.txt", "dir/nested.txt"):
        (project / path).unlink()
    (project / "dir" / "sub").rmdir()
    (project / "dir").rmdir()
    os.chmod(project / "tool.sh", 0o755)
    os.chmod(project / "run.sh", 0o644)
    (project / "link").unlink()
    (project / "link").symlink_to("edit.txt")
    write(project / "caf\u00e9" / "\u00fcber.txt", "unicode, edited\n")
    (project / "new\nline.txt").unlink()
    write(project / "notes.md", "notes rewritten\n")
    (project / "untracked dir" / "u.txt").unlink()
    (project / "untracked dir").rmdir()
    write(project / "created.txt", "created\n")
    write(project / "created dir" / "deep" / "f.txt", "created deep\n")
    write(project / "new\nname caf\u00e9.txt", "created with an odd name\n")
    write(project / "debug.log", "ignored log, changed\n")
    write(project / "new.log", "ignored, created\n")


def expected_after_undo(before: dict, after: dict, clean: bool) -> dict:
    """The checkpoint's files, ignored files as the agent left them, created files unless --clean."""
    keep = IGNORED | (set() if clean else CREATED)
    result = {path: entry for path, entry in before.items() if path not in IGNORED}
    result.update({path: entry for path, entry in after.items() if path in keep})
    return result


def test_undo_restores_exactly_and_keeps_created_and_ignored_files(repo: Path, limactl: FakeLima) -> None:
    number = checkpoint(repo)
    before = files(repo)
    agent_works(repo)
    after = files(repo)
    output = undo(repo, str(number))
    assert files(repo) == expected_after_undo(before, after, clean=False)
    assert limactl.calls() == []
    lines = output.splitlines()
    assert lines[0] == "Checkpoint #2 holds the workspace as it was before this undo (`agentbox undo 2` returns to it)."
    assert re.fullmatch(r"Undo to #1 \(manual, \d{4}-\d\d-\d\d \d\d:\d\d\):", lines[1])
    assert lines[2:] == [
        "  restored        caf\u00e9/\u00fcber.txt",
        "  restored        delete me.txt",
        "  created folder  dir",
        "  restored        dir/nested.txt",
        "  created folder  dir/sub",
        "  restored        dir/sub/deeper.txt",
        "  restored        edit.txt",
        "  restored        link",
        "  restored        new\\nline.txt",
        "  restored        notes.md",
        "  restored        run.sh",
        "  restored        tool.sh",
        "  created folder  untracked dir",
        "  restored        untracked dir/u.txt",
        "Created since #1 (manual, " + lines[1].split("(manual, ")[1][:-2] + "), left in place (use --clean to remove):",
        "  created dir/deep/f.txt",
        "  created.txt",
        "  new\\nname caf\u00e9.txt",
    ]


def test_clean_removes_created_files_but_never_ignored_ones(repo: Path, limactl: FakeLima) -> None:
    number = checkpoint(repo)
    before = files(repo)
    agent_works(repo)
    after = files(repo)
    output = undo(repo, "--clean", f"#{number}")
    assert files(repo) == expected_after_undo(before, after, clean=True)
    for line in ("  removed         created dir/deep/f.txt", "  removed folder  created dir/deep",
                 "  removed folder  created dir", "  removed         created.txt",
                 "  removed         new\\nname caf\u00e9.txt"):
        assert line in output.splitlines()
    assert "left in place" not in output
    assert limactl.calls() == []


@pytest.mark.parametrize("clean", [[], ["--clean"]])
def test_undo_of_the_undo_returns_to_the_later_state(repo: Path, clean: list[str]) -> None:
    number = checkpoint(repo)
    agent_works(repo)
    later = files(repo)
    output = undo(repo, *clean, str(number))
    assert files(repo) != later
    result = run_cli("undo", str(pre_undo_id(output)), cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert files(repo) == later
    assert "#2 was taken before an undo: files created since it are removed, as with --clean." in result.stderr
    assert "  removed         delete me.txt" in result.stdout.splitlines()


def test_a_folder_replaced_by_a_link_to_outside_is_restored_inside(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "users-home"
    write(outside / "nested.txt", "the user's own file\n")
    write(outside / "sub" / "deeper.txt", "also the user's\n")
    outside_before = tree_listing(outside)
    number = checkpoint(repo)
    before = files(repo)
    for path in ("dir/sub/deeper.txt", "dir/nested.txt"):
        (repo / path).unlink()
    (repo / "dir" / "sub").rmdir()
    (repo / "dir").rmdir()
    (repo / "dir").symlink_to(outside)
    output = undo(repo, str(number))
    assert tree_listing(outside) == outside_before
    assert files(repo) == before
    assert f"  replaced link   dir (-> {outside})" in output.splitlines()
    assert "left in place" not in output  # the link was not kept as a file created since


def test_a_deleted_or_rewritten_ref_fails_loudly_and_changes_nothing(repo: Path) -> None:
    from agentbox.git import store as hostgit
    from agentbox.review import checkpoints

    first = checkpoint(repo)
    write(repo / "between.txt", "between\n")
    second = checkpoint(repo)
    agent_works(repo)
    record = checkpoints.records_file(repo).read_bytes()
    store = f"--git-dir={hostgit.store_dir(repo)}"
    git(repo, store, "update-ref", "-d", f"refs/agentbox/checkpoints/{first}")
    other = hostgit.write_object(hostgit.store_dir(repo), b"commit", b"tree " + b"0" * 40 + b"\n\nx\n", "sha1")
    git(repo, store, "update-ref", f"refs/agentbox/checkpoints/{second}", other)
    before = tree_listing(repo)
    result = run_cli("undo", str(first), cwd=repo)
    assert result.exit_code == 1
    assert f"agentbox: error: checkpoint #{first} (manual, " in result.stderr
    assert f"cannot be used: its ref refs/agentbox/checkpoints/{first} was deleted" in result.stderr
    result = run_cli("undo", f"#{second}", cwd=repo)
    assert result.exit_code == 1
    assert f"its ref refs/agentbox/checkpoints/{second} was rewritten" in result.stderr
    assert result.stdout == ""
    assert tree_listing(repo) == before  # no file restored, no pre-undo checkpoint taken
    assert checkpoints.records_file(repo).read_bytes() == record


def test_dry_run_changes_nothing_and_shows_the_same_plan(repo: Path) -> None:
    number = checkpoint(repo)
    agent_works(repo)
    refs = git(repo, "for-each-ref")
    before = {path: entry for path, entry in tree_listing(repo).items() if not path.startswith(".git/objects")}
    planned = undo(repo, "--dry-run", "--clean", str(number)).splitlines()
    after = {path: entry for path, entry in tree_listing(repo).items() if not path.startswith(".git/objects")}
    assert after == before
    assert git(repo, "for-each-ref") == refs
    assert planned[0].startswith(f"Dry run: undo to #{number} (manual, ")
    assert planned[0].endswith(") would make these changes (nothing was changed):")
    done = undo(repo, "--clean", str(number)).splitlines()
    assert planned[1:] == done[2:]


def test_paths_limits_the_undo(repo: Path) -> None:
    number = checkpoint(repo)
    before = files(repo)
    agent_works(repo)
    after = files(repo)
    output = undo(repo, str(number), "--paths", "dir", "edit.txt", "--clean")
    expected = dict(after)
    expected.update({path: before[path] for path in ("dir", "dir/nested.txt", "dir/sub", "dir/sub/deeper.txt",
                                                     "edit.txt")})
    assert files(repo) == expected
    assert output.splitlines()[2:] == [
        "  created folder  dir", "  restored        dir/nested.txt", "  created folder  dir/sub",
        "  restored        dir/sub/deeper.txt", "  restored        edit.txt",
    ]


def test_paths_are_relative_to_the_current_folder_and_stay_inside(repo: Path) -> None:
    number = checkpoint(repo)
    write(repo / "dir" / "nested.txt", "changed\n")
    write(repo / "edit.txt", "changed\n")
    output = undo(repo / "dir", str(number), "--paths", "nested.txt")
    assert (repo / "dir" / "nested.txt").read_text() == "nested\n"
    assert (repo / "edit.txt").read_text() == "changed\n"
    assert "  restored  dir/nested.txt" in output.splitlines()
    for outside, problem in (("../..", "it is outside the workspace"), ("/etc", "it is outside the workspace"),
                             ("../.git/config", "the path is inside a `.git` folder")):
        result = run_cli("undo", str(number), "--paths", outside, cwd=repo / "dir")
        assert result.exit_code == 2
        assert f"--paths {outside}: {problem}" in result.stderr


def test_a_failure_is_reported_the_rest_restored_and_the_way_back_named(repo: Path) -> None:
    number = checkpoint(repo)
    write(repo / "dir" / "nested.txt", "changed\n")
    write(repo / "edit.txt", "changed\n")
    with unwritable(repo / "dir"):
        result = run_cli("undo", str(number), cwd=repo)
    assert result.exit_code == 1
    assert "  dir/nested.txt: " in result.stdout
    assert (repo / "edit.txt").read_text() == "original\n"
    assert (repo / "dir" / "nested.txt").read_text() == "changed\n"
    assert "agentbox: error: undo to #1 could not restore 1 path (listed above); the others were restored" in result.stderr
    assert "hint: Checkpoint #2 holds the workspace as it was before this undo: `agentbox undo 2` returns to it." in result.stderr


def test_files_too_large_to_capture_are_not_compared(repo: Path) -> None:
    write_trusted(repo, "checkpoints:\n  maxFileSize: 100\n")
    write(repo / "big.bin", "x" * 200)
    number = checkpoint(repo)
    write(repo / "big.bin", "small now")  # captured now, never in the checkpoint: not a file "created since"
    write(repo / "huge.bin", "z" * 300)  # created since, too large to capture
    write(repo / "edit.txt", "changed\n")
    output = undo(repo, "--clean", str(number))
    assert (repo / "big.bin").read_text() == "small now"
    assert (repo / "huge.bin").read_text() == "z" * 300
    assert (repo / "edit.txt").read_text() == "original\n"
    assert output.splitlines()[2:] == [
        "  restored  edit.txt",
        "Not compared (larger than checkpoints.maxFileSize in a snapshot, never captured):",
        "  big.bin (200 bytes)",
        "  huge.bin (300 bytes)",
    ]


def test_not_a_git_repository(project: Path) -> None:
    result = run_cli("undo", cwd=project)
    assert result.exit_code == 1
    assert f"agentbox: error: checkpoints are off: {project} is not a git repository" in result.stderr


def test_a_file_the_agent_made_ignored_is_left_in_place(repo: Path) -> None:
    number = checkpoint(repo)
    write(repo / ".gitignore", "*.log\nbuild/\nnotes.md\n")
    write(repo / "notes.md", "the agent's notes, now ignored\n")
    output = undo(repo, "--clean", str(number))
    assert (repo / ".gitignore").read_text() == "*.log\nbuild/\n"
    assert (repo / "notes.md").read_text() == "the agent's notes, now ignored\n"
    assert output.splitlines()[2:] == [
        "  restored  .gitignore",
        "Not restored, left in place (remove it yourself and undo again to restore it):",
        "  notes.md (a regular file is there now that no snapshot captured, an ignored one perhaps)",
    ]


def test_submodules_are_not_restored_nor_entered(repo: Path) -> None:
    sub = repo / "sub"
    sub.mkdir()
    git(sub, "init", "-q")
    write(sub / "lib.txt", "v1\n")
    git(sub, "add", "-A")
    git(sub, "-c", "user.name=U", "-c", "user.email=u@example.com", "commit", "-qm", "v1")
    git(repo, "add", "sub")
    git(repo, "commit", "-qm", "add a nested repository")
    number = checkpoint(repo)
    write(sub / "lib.txt", "v2\n")
    git(sub, "-c", "user.name=U", "-c", "user.email=u@example.com", "commit", "-qam", "v2")
    git(repo, "add", "sub")
    write(repo / "edit.txt", "changed\n")
    inside = tree_listing(sub)
    output = undo(repo, "--clean", str(number))
    assert tree_listing(sub) == inside
    assert (repo / "edit.txt").read_text() == "original\n"
    assert output.splitlines()[2:] == [
        "  restored  edit.txt",
        "Submodules or nested repositories, not restored:",
        "  sub",
    ]


@pytest.mark.needs("bwrap")
def test_undo_last_after_a_session_with_the_vm_stopped(repo: Path, vm: FakeLima) -> None:
    before = files(repo)
    script = ("set -e; echo agent > edit.txt; rm 'delete me.txt'; rm -r dir; chmod +x tool.sh; "
              "echo new > created.txt; echo log > new.log")
    result = run_cli("shell", "--", "sh", "-c", script, cwd=repo)
    assert result.exit_code == 0, result.stderr
    after = files(repo)
    assert after != before
    vm.set_status("agentbox-myproject", "Stopped")
    vm.clear()
    output = undo(repo)  # `last`: the start of the session just ended
    assert vm.calls() == []
    assert re.search(r"^Undo to #\d+ \(start, ", output, re.M)
    expected = before | {path: after[path] for path in ("created.txt", "new.log")}
    assert files(repo) == expected


def test_a_name_that_is_not_utf8_is_restored_and_shown_escaped(repo: Path) -> None:
    name = os.fsdecode(b"latin1-caf\xe9.txt")
    try:
        write(repo / name, "bytes\n")
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    number = checkpoint(repo)
    (repo / name).unlink()
    output = undo(repo, str(number))
    assert (repo / name).read_text() == "bytes\n"
    assert "  restored  latin1-caf\\xe9.txt" in output.splitlines()


def test_undo_to_the_oldest_kept_checkpoint_does_not_prune_it(repo: Path, limactl: FakeLima) -> None:
    """At the checkpoints.keep limit, the checkpoint taken before an undo prunes the oldest one but never the
    one the undo goes back to."""
    write_trusted(repo, "checkpoints:\n  keep: 2\n")
    first = checkpoint(repo)
    write(repo / "edit.txt", "second\n")
    checkpoint(repo)
    write(repo / "edit.txt", "third\n")

    before = pre_undo_id(undo(repo, str(first)))
    assert (repo / "edit.txt").read_text() == "original\n"
    listed = json.loads(run_cli("checkpoints", "--json", cwd=repo).stdout)
    assert [(c["id"], c["ok"]) for c in listed] == [(first, True), (before, True)]
    undo(repo, str(first))  # still there to go back to
