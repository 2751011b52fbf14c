"""Checkpoints through the CLI: taken at every launch (no extra limactl call), listed, compared with
`agentbox diff`, verified against what the agent can do to refs, pruned, and never running what the
repository's config names."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.git import store as hostgit
from agentbox.review import checkpoints
from tests.gitrepo import commit_all, fired, git, git_folder_state, hostile, init, user_state
from tests.helpers import FakeLima, run_agentbox, run_cli, write, write_trusted

pytestmark = pytest.mark.needs("git")


@pytest.fixture
def repo(project: Path) -> Path:
    init(project)
    write(project / "keep.txt", "keep\n")
    write(project / "edit.txt", "before\n")
    write(project / "remove.txt", "remove me\n")
    write(project / ".gitignore", "*.log\n")
    commit_all(project)
    return project


def session(project: Path, script: str, *flags: str) -> subprocess.CompletedProcess:
    """`agentbox shell -- sh -c script` in a child process: the command runs in the double's VM."""
    return run_agentbox(*flags, "shell", "--", "sh", "-c", script, cwd=project, timeout=120)


def store_git(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """git on agentbox's own checkpoint store of project (where checkpoints live, not in its .git)."""
    return subprocess.run(["git", f"--git-dir={hostgit.store_dir(project)}", *args], capture_output=True, check=check)


def records(project: Path) -> list[dict]:
    result = run_cli("checkpoints", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


AGENT_WORK = ("echo after > edit.txt && rm remove.txt && echo new > 'new file.txt' && mkdir -p src "
              "&& echo code > src/made.py && echo noise > debug.log")


def test_a_session_is_framed_by_two_checkpoints_and_diff_shows_exactly_its_changes(repo: Path, vm: FakeLima) -> None:
    result = session(repo, AGENT_WORK)
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]  # the checkpoints added no limactl call
    assert "checkpoint" not in result.stderr  # nothing to say when nothing was skipped

    found = records(repo)
    assert [(r["id"], r["kind"], r["agent"], r["ok"]) for r in found] == [(1, "start", "shell", True),
                                                                          (2, "end", "shell", True)]
    assert found[0]["session"] == found[1]["session"] and found[0]["session"].startswith("s-")
    assert found[0]["head"] == git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    assert set(found[0]) >= {"id", "commit", "tree", "time", "kind", "agent", "session", "message", "skipped", "ok"}
    assert store_git(repo, "rev-parse", "refs/agentbox/checkpoints/2").stdout.decode().strip() == found[1]["commit"]
    assert git(repo, "for-each-ref", "refs/agentbox/").stdout == b""  # nothing in the workspace's .git

    vm.clear()
    for since in ([], ["--since", "last"], ["--since", "session"], ["--since", "1"]):
        names = run_cli("diff", *since, "--name-only", cwd=repo)
        assert names.exit_code == 0, names.stderr
        assert names.stdout.splitlines() == ["edit.txt", "new file.txt", "remove.txt", "src/made.py"], since
    assert run_cli("diff", "--since", "2", "--name-only", cwd=repo).stdout == ""
    patch = run_cli("diff", cwd=repo).stdout
    assert "-before\n+after\n" in patch and "debug.log" not in patch
    assert "4 files changed" in run_cli("diff", "--stat", cwd=repo).stdout
    assert run_cli("diff", "--name-only", "src", cwd=repo).stdout == "src/made.py\n"
    assert run_cli("diff", "--name-only", "made.py", cwd=repo / "src").stdout == "src/made.py\n"
    assert vm.calls() == []  # diff never asks limactl


def test_an_agent_launch_records_the_agent_and_keeps_the_warm_launch_at_two_calls(repo: Path, vm: FakeLima) -> None:
    write_trusted(repo, f"env:\n  AGENTBOX_TEST_OUT: {repo / '.stub-out.json'}\n")
    git(repo, "add", "agentbox.yml")
    vm.clear()
    result = run_agentbox("codex", "exec", "hi", cwd=repo)
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]
    assert [(r["kind"], r["agent"]) for r in records(repo)] == [("start", "codex"), ("end", "codex")]
    assert run_cli("diff", "--name-only", cwd=repo).stdout == ".stub-out.json\n"


def test_diff_works_with_the_vm_stopped_or_never_created(repo: Path, limactl: FakeLima) -> None:
    taken = run_cli("checkpoint", "-m", "by hand", cwd=repo)
    assert taken.exit_code == 0, taken.stderr
    assert taken.stdout.startswith("checkpoint #1 of ")
    write(repo / "edit.txt", "changed on the host\n")
    result = run_cli("diff", "--since", "1", cwd=repo)
    assert result.exit_code == 0, result.stderr
    assert "+changed on the host" in result.stdout
    listing = run_cli("checkpoints", cwd=repo)
    assert "#1" in listing.stdout and "manual" in listing.stdout and "by hand" in listing.stdout
    assert limactl.calls() == []


def test_a_piped_diff_applies_back_with_git_apply(repo: Path, limactl: FakeLima, tmp_path: Path) -> None:
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    write(repo / "edit.txt", "edited\n")
    (repo / "remove.txt").unlink()
    (repo / "bytes.bin").write_bytes(bytes(range(256)) * 8)
    write(repo / "name with spaces and ünïcode.txt", "hello\n")
    os.symlink("keep.txt", repo / "a-link")
    expected = user_state(repo)
    result = run_agentbox("diff", "--since", "1", cwd=repo)
    assert result.returncode == 0, result.stderr
    patch = tmp_path / "x.patch"
    patch.write_text(result.stdout)

    git(repo, "stash", "-q", "-u")
    assert not (repo / "bytes.bin").exists()
    git(repo, "apply", str(patch))
    after = user_state(repo)
    assert {name: value.split()[:2] for name, value in after.items() if not name.startswith(".git/")} == {
        name: value.split()[:2] for name, value in expected.items() if not name.startswith(".git/")}


def test_on_a_terminal_the_diff_is_escaped_and_coloured(repo: Path, limactl: FakeLima) -> None:
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    write(repo / "edit.txt", "plain\x1b[2J\x1b]0;owned\x07 text\r\n")
    output = _on_a_terminal([sys.executable, "-m", "agentbox", "diff", "--since", "1"], repo)
    assert b"\x1b[2J" not in output and b"\x1b]0;" not in output and b"\x07" not in output
    assert b"plain\\x1b[2J\\x1b]0;owned\\x07 text\\r" in output
    assert b"\x1b[32m+plain" in output and b"\x1b[31m-before" in output


def _on_a_terminal(argv: list[str], cwd: Path) -> bytes:
    leader, follower = pty.openpty()
    child = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
                             env={**os.environ, "TERM": "xterm", "NO_COLOR": ""})
    os.close(follower)
    output = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    return output


def test_the_agent_cannot_reach_the_store_and_a_changed_store_fails_loudly(repo: Path, vm: FakeLima) -> None:
    for number in range(3):
        write(repo / "edit.txt", f"round {number}\n")
        assert run_cli("checkpoint", cwd=repo).exit_code == 0
    result = session(repo, "git update-ref refs/agentbox/checkpoints/1 HEAD && "
                           "git update-ref refs/agentbox/checkpoints/2 HEAD && rm -rf .git/objects/pack")
    assert result.returncode == 0, result.stderr
    assert all(r["ok"] for r in records(repo))  # what the agent did to its .git does not touch checkpoints
    assert run_cli("diff", "--since", "1", "--name-only", cwd=repo).stdout == "edit.txt\n"

    store_git(repo, "update-ref", "-d", "refs/agentbox/checkpoints/1")
    store_git(repo, "update-ref", "refs/agentbox/checkpoints/2", records(repo)[2]["commit"])
    deleted = run_cli("diff", "--since", "1", cwd=repo)
    assert deleted.exit_code == 1
    assert "checkpoint #1 (manual," in deleted.stderr
    assert "its ref refs/agentbox/checkpoints/1 was deleted" in deleted.stderr
    rewritten = run_cli("diff", "--since", "#2", cwd=repo)
    assert rewritten.exit_code == 1
    assert "its ref refs/agentbox/checkpoints/2 was rewritten" in rewritten.stderr
    assert deleted.stdout == rewritten.stdout == ""
    found = {r["id"]: r for r in records(repo)}
    assert (found[1]["ok"], found[2]["ok"], found[3]["ok"]) == (False, False, True)
    listing = run_cli("checkpoints", cwd=repo)
    assert listing.stdout.count("BROKEN") == 2
    assert run_cli("diff", "--since", "3", cwd=repo).exit_code == 0


def test_a_commit_object_altered_in_the_store_is_caught(repo: Path, limactl: FakeLima) -> None:
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    commit = records(repo)[0]["commit"]
    store = hostgit.store_dir(repo)
    loose = store / "objects" / commit[:2] / commit[2:]
    other = hostgit.write_object(store, b"commit", b"tree " + b"0" * 40 + b"\n\nforged\n", "sha1")
    loose.chmod(0o644)
    loose.write_bytes((store / "objects" / other[:2] / other[2:]).read_bytes())
    result = run_cli("diff", "--since", "1", cwd=repo)
    assert result.exit_code == 1
    assert f"its commit {commit} is missing or was altered" in result.stderr


def test_only_the_last_keep_checkpoints_are_kept(repo: Path, limactl: FakeLima) -> None:
    write_trusted(repo, "checkpoints:\n  keep: 3\n")
    for number in range(5):
        write(repo / "edit.txt", f"round {number}\n")
        assert run_cli("checkpoint", cwd=repo).exit_code == 0
    assert run_cli("checkpoint", cwd=repo).exit_code == 0  # nothing changed: no new entry, nothing pruned
    assert [r["id"] for r in records(repo)] == [3, 4, 5]
    refs = store_git(repo, "for-each-ref", "--format=%(refname)", "refs/agentbox/checkpoints/").stdout.decode().split()
    assert refs == ["refs/agentbox/checkpoints/3", "refs/agentbox/checkpoints/4", "refs/agentbox/checkpoints/5"]
    pruned = run_cli("diff", "--since", "1", cwd=repo)
    assert pruned.exit_code == 1 and "checkpoint #1 was pruned" in pruned.stderr
    missing = run_cli("diff", "--since", "9", cwd=repo)
    assert missing.exit_code == 1 and "there is no checkpoint #9" in missing.stderr and "newest is #5" in missing.stderr


@pytest.mark.parametrize(("written", "listed"), [
    ("checkpoints: {keep: 1}\n", "checkpoints.keep: 1 (fewer than the default 50: older checkpoints are pruned"),
    ("checkpoints:\n  enabled: false\n", "checkpoints.enabled: false (no checkpoints: nothing to review or undo)"),
    ("checkpoints:\n  maxFileSize: 10\n", "checkpoints.maxFileSize: 10 (less than the default 5MiB"),
])
def test_an_agent_that_weakens_checkpoints_stops_the_next_launch_until_trusted(
        repo: Path, vm: FakeLima, written: str, listed: str) -> None:
    assert session(repo, "echo one > edit.txt").returncode == 0
    kept = records(repo)
    assert len(kept) == 2
    wrote = session(repo, f"printf '{written}' > agentbox.yml")
    assert wrote.returncode == 0, wrote.stderr
    kept = records(repo)
    refused = session(repo, "echo after > edit.txt")
    assert refused.returncode == 2, refused.stderr
    assert "agentbox.yml widens what the VM gets from your host or runs in it, and it is not trusted" in refused.stderr
    assert f"  - {listed}" in refused.stderr and " trust`" in refused.stderr
    assert (repo / "edit.txt").read_text() == "one\n"  # the session never ran
    assert records(repo) == kept  # nothing pruned, nothing skipped
    assert checkpoints.records_file(repo).exists()
    assert run_cli("trust", cwd=repo).exit_code == 0  # the user read it and agrees
    assert session(repo, "true").returncode == 0


@pytest.mark.parametrize("written", ["checkpoints: {keep: 60, maxFileSize: 10MiB, enabled: true}\n",
                                     "checkpoints: {keep: 50}\n"])
def test_keeping_more_needs_no_trust(repo: Path, vm: FakeLima, written: str) -> None:
    assert session(repo, f"printf '{written}' > agentbox.yml").returncode == 0
    again = session(repo, "echo after > edit.txt")
    assert again.returncode == 0, again.stderr
    assert len(records(repo)) == 3  # the second session's start is the first one's end (nothing changed between)


def test_large_files_are_left_out_and_named_escaped(repo: Path, vm: FakeLima) -> None:
    write_trusted(repo, "checkpoints:\n  maxFileSize: 1KiB\n")
    git(repo, "add", "agentbox.yml")
    result = session(repo, "head -c 4096 /dev/zero > \"$(printf 'big\\033[31m.bin')\" && echo small > small.txt")
    assert result.returncode == 0, result.stderr
    assert "left out" not in result.stderr  # the end checkpoint is taken after the launch returned...
    listed = run_cli("checkpoints", "--json", cwd=repo)  # ...and the next command that reads checkpoints says it
    assert "warning: checkpoint #2 (end) left out 1 file larger than 1 KiB (checkpoints.maxFileSize): " \
           "big\\x1b[31m.bin (4 KiB)" in listed.stderr
    assert "\x1b[31m" not in listed.stderr
    assert [r["skipped"] for r in json.loads(listed.stdout)] == [[], [["big\x1b[31m.bin", 4096]]]
    diff = run_cli("diff", "--name-only", cwd=repo)
    assert diff.stdout == "small.txt\n"
    assert "checkpoint #2 (end) left out" not in diff.stderr  # said once
    assert "not compared, larger than checkpoints.maxFileSize: big\\x1b[31m.bin (4 KiB)" in diff.stderr

    again = session(repo, "true")  # still there: named by the start checkpoint, not again at the end
    assert again.stderr.count("left out") == 1 and "checkpoint #3 (start)" in again.stderr


def test_verbose_shows_the_checkpoint_ids(repo: Path, vm: FakeLima) -> None:
    result = session(repo, "echo x > edit.txt", "-v")
    assert result.returncode == 0, result.stderr
    assert "checkpoint #1 (start) of " in result.stderr
    unchanged = session(repo, "true", "-v")  # the end checkpoint, taken after the launch, is said by the next command
    assert "checkpoint #2 (end) of " in unchanged.stderr
    assert "checkpoint #2 (start, the workspace as in #2) of " in unchanged.stderr
    assert "checkpoint #2 (end, the workspace as in #2) of " in run_cli("checkpoints", cwd=repo).stderr


def test_not_a_git_repository_is_said_once(project: Path, vm: FakeLima) -> None:
    first = session(project, "echo hi > f.txt")
    assert first.returncode == 0, first.stderr
    assert "checkpoints are off: " in first.stderr and "is not a git repository" in first.stderr
    second = session(project, "true")
    assert second.returncode == 0 and "checkpoints" not in second.stderr
    assert vm.subcommands() == ["list", "shell", "shell"]  # the second launch is warm: one call
    diff = run_cli("diff", cwd=project)
    assert diff.exit_code == 1 and "is not a git repository" in diff.stderr


def test_checkpoints_enabled_false_takes_none(repo: Path, vm: FakeLima) -> None:
    write_trusted(repo, "checkpoints:\n  enabled: false\n")
    result = session(repo, "echo x > y.txt")
    assert result.returncode == 0, result.stderr
    assert records(repo) == []
    assert not checkpoints.records_file(repo).exists()
    assert not (paths.workspace_state_dir(repo) / "git").exists()


def test_a_failed_checkpoint_warns_once_and_the_session_goes_on(repo: Path, vm: FakeLima, tmp_path: Path) -> None:
    store = hostgit.store_dir(repo)
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("in the way\n")  # the store cannot be made
    result = session(repo, "echo ran > ran.txt")
    assert result.returncode == 0
    assert (repo / "ran.txt").read_text() == "ran\n"
    assert result.stderr.count("the start checkpoint was not taken, the session goes on without it: ") == 1
    assert "checkpoint store" in result.stderr and "cannot be set up" in result.stderr
    assert "end checkpoint" not in result.stderr  # no start, no end


def test_a_launch_leaves_the_users_git_state_alone(repo: Path, vm: FakeLima) -> None:
    write(repo / "staged.txt", "staged\n")
    git(repo, "add", "staged.txt")
    write(repo / "edit.txt", "unstaged\n")
    write(repo / "untracked.txt", "u\n")
    before = user_state(repo)
    folder_before = git_folder_state(repo)
    result = session(repo, "true")
    assert result.returncode == 0, result.stderr
    assert user_state(repo) == before
    assert git_folder_state(repo) == folder_before
    found = records(repo)
    assert len(found) == 1 and found[0]["uses"][0][0] == "end"  # an unchanged workspace adds no entry


def test_nothing_the_repository_configures_runs_during_checkpoints_and_diff(repo: Path, vm: FakeLima,
                                                                           tmp_path: Path) -> None:
    """The same hostile repository runs every marker under plain git: see test_git_store's control test."""
    markers = tmp_path / "markers"
    hostile(repo, markers)
    write(repo / "edit.txt", "edited\n")
    result = session(repo, "echo more >> edit.txt")
    assert result.returncode == 0, result.stderr
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    for args in (["diff"], ["diff", "--stat"], ["diff", "--since", "session"], ["checkpoints"]):
        assert run_cli(*args, cwd=repo).exit_code == 0, args
    assert "+more" in run_agentbox("diff", cwd=repo).stdout
    assert fired(markers) == []
    git(repo, "status")  # the control: the user's own git does run it
    assert "fsmonitor" in fired(markers)


def test_a_linked_worktree_keeps_its_own_checkpoint_refs(repo: Path, limactl: FakeLima) -> None:
    linked = repo.parent / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    assert run_cli("checkpoint", cwd=linked).exit_code == 0
    write(linked / "edit.txt", "in the linked worktree\n")
    assert records(repo)[0]["ref"] == records(linked)[0]["ref"] == "refs/agentbox/checkpoints/1"
    assert hostgit.store_dir(repo) != hostgit.store_dir(linked)  # each checkout has its own store
    assert run_cli("diff", "--since", "1", cwd=repo).stdout == ""
    assert run_cli("diff", "--since", "1", "--name-only", cwd=linked).stdout == "edit.txt\n"


def test_a_repository_without_commits(project: Path, limactl: FakeLima) -> None:
    init(project)
    write(project / "first.txt", "1\n")
    assert run_cli("checkpoint", cwd=project).exit_code == 0
    write(project / "second.txt", "2\n")
    result = run_cli("diff", "--since", "1", "--name-only", cwd=project)
    assert result.stdout == "second.txt\n"
    assert records(project)[0]["head"] is None


def test_diff_refuses_paths_outside_the_workspace_and_unknown_names(repo: Path, limactl: FakeLima) -> None:
    assert run_cli("checkpoint", cwd=repo).exit_code == 0
    outside = run_cli("diff", "--since", "1", "../elsewhere", cwd=repo)
    assert outside.exit_code == 1 and "is outside the workspace" in outside.stderr
    bad = run_cli("diff", "--since", "yesterday", cwd=repo)
    assert bad.exit_code == 1 and "'yesterday' is not a checkpoint" in bad.stderr
    none = run_cli("diff", cwd=repo)
    assert none.exit_code == 1 and "no session has been recorded for this workspace yet" in none.stderr


def test_the_listing_counts_changes_since_the_one_before(repo: Path, limactl: FakeLima) -> None:
    assert run_cli("checkpoint", "-m", "one", cwd=repo).exit_code == 0
    write(repo / "added.txt", "a\n")
    write(repo / "edit.txt", "e\n")
    (repo / "remove.txt").unlink()
    assert run_cli("checkpoint", "-m", "two", cwd=repo).exit_code == 0
    lines = run_cli("checkpoints", cwd=repo).stdout.splitlines()
    assert lines[0].split() == ["ID", "TIME", "KIND", "AGENT", "CHANGES", "MESSAGE"]
    assert lines[1].startswith("#1") and lines[1].endswith("one")
    assert lines[2].startswith("#2") and "+1 ~1 -1" in lines[2] and lines[2].endswith("two")


def test_git_missing_on_the_host(repo: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_cli("checkpoint", cwd=repo)
    assert result.exit_code == 1
    assert "git is not installed on this computer" in result.stderr


def test_a_host_without_git_launches_with_one_note(repo: Path, vm: FakeLima,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    which = shutil.which
    with monkeypatch.context() as patch:
        patch.setattr(shutil, "which", lambda name, *a, **k: None if name == "git" else which(name, *a, **k))
        first = run_cli("shell", "--", "true", cwd=repo)
        assert first.exit_code == 0, first.stderr
        assert "checkpoints are off: git is not installed on this computer (said once)" in first.stderr
        second = run_cli("shell", "--", "true", cwd=repo)
        assert second.exit_code == 0 and "checkpoints" not in second.stderr
    assert vm.subcommands() == ["list", "shell", "shell"]  # the second launch is warm: one call
    assert records(repo) == []


def test_a_fifo_where_git_used_to_read_never_stalls_a_launch(repo: Path, vm: FakeLima) -> None:
    import time

    planted = run_cli("shell", "--", "sh", "-c", "mkdir -p sub && mkfifo sub/.gitignore .gitattributes", cwd=repo)
    assert planted.exit_code == 0, planted.stderr
    assert "checkpoint was not taken" not in planted.stderr
    started = time.monotonic()
    again = run_cli("shell", "--", "sh", "-c", "echo after > edit.txt", cwd=repo)
    assert again.exit_code == 0 and "checkpoint was not taken" not in again.stderr
    assert time.monotonic() - started < 30
    assert run_cli("diff", "--name-only", cwd=repo).stdout == "edit.txt\n"




def test_checkpoints_whose_refs_and_commits_were_packed_in_the_store_still_verify(repo: Path, limactl: FakeLima) -> None:
    # agentbox reads its loose refs and commits itself; once they are packed (a `git gc` of the store) git says.
    for number in range(2):
        write(repo / "edit.txt", f"round {number}\n")
        assert run_cli("checkpoint", cwd=repo).exit_code == 0
    store_git(repo, "pack-refs", "--all")
    store_git(repo, "repack", "-a", "-d", "-q")
    assert not list((hostgit.store_dir(repo) / "refs").rglob("checkpoints/*"))  # no loose ref is left
    assert all(r["ok"] for r in records(repo))
    assert run_cli("diff", "--since", "1", "--name-only", cwd=repo).stdout == "edit.txt\n"
    store_git(repo, "update-ref", "-d", "refs/agentbox/checkpoints/1")
    deleted = run_cli("diff", "--since", "1", cwd=repo)
    assert deleted.exit_code == 1 and "its ref refs/agentbox/checkpoints/1 was deleted" in deleted.stderr
