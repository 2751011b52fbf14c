"""Host git through agentbox.hostgit: snapshots of the working tree that leave the user's git state
alone and never run what the repository's config names."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentbox import hostgit
from tests.gitrepo import HOSTILE_NAMES, commit_all, fired, git, hostile, init, user_state
from tests.helpers import write

pytestmark = pytest.mark.needs("git")
MB = 1 << 20


def files_of(repo: hostgit.Repo, tree: str) -> dict[str, bytes]:
    """path -> content of every file in tree."""
    listing = git(repo.work_tree, "ls-tree", "-r", "-z", tree).stdout.split(b"\0")
    entries = [entry.split(b"\t", 1) for entry in listing if entry]
    oids = {os.fsdecode(name): meta.split()[2].decode() for meta, name in entries if meta.split()[1] == b"blob"}
    blobs = hostgit.read_blobs(repo, list(oids.values()))
    return {name: blobs[oid] for name, oid in oids.items()}


@pytest.fixture
def work(project: Path) -> Path:
    init(project)
    write(project / "tracked.txt", "one\n")
    write(project / "gone.txt", "bye\n")
    write(project / ".gitignore", "*.log\nbuild/\n")
    commit_all(project)
    return project


def test_a_snapshot_holds_tracked_changes_and_untracked_files_but_not_ignored_ones(work: Path) -> None:
    write(work / "tracked.txt", "two\n")
    (work / "gone.txt").unlink()
    names = ["with space.txt", "new\nline.txt", "ünïcödé.txt", "tab\tname", "d/e/deep.txt", "st*r?.txt"]
    for name in names:
        write(work / name, f"content of {name}\n")
    write(work / "debug.log", "ignored\n")
    write(work / "build" / "out.o", "ignored\n")
    os.symlink("tracked.txt", work / "link")
    os.mkfifo(work / "fifo")

    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, 5 * MB)

    files = files_of(repo, snap.tree)
    assert sorted(files) == sorted([".gitignore", "tracked.txt", "link", *names])
    assert files["tracked.txt"] == b"two\n"
    assert files["new\nline.txt"] == b"content of new\nline.txt\n"
    assert files["link"] == b"tracked.txt"  # the link itself, not what it points to
    assert snap.head == git(work, "rev-parse", "HEAD").stdout.decode().strip()
    assert snap.skipped == [] and snap.notes == []


def test_a_snapshot_leaves_the_users_index_head_refs_stash_and_files_untouched(work: Path) -> None:
    write(work / "tracked.txt", "stashed\n")
    git(work, "stash", "-q")
    write(work / "staged.txt", "staged\n")
    git(work, "add", "staged.txt")
    write(work / "tracked.txt", "unstaged\n")
    write(work / "untracked.txt", "untracked\n")
    before = user_state(work)
    status_before = git(work, "status", "--porcelain").stdout

    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, 5 * MB)
    commit = hostgit.commit(repo, snap.tree, snap.head, "agentbox checkpoint")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    hostgit.snapshot(repo, 5 * MB)

    assert user_state(work) == before
    assert git(work, "status", "--porcelain").stdout == status_before
    assert files_of(repo, snap.tree)["staged.txt"] == b"staged\n"
    assert git(work, "rev-parse", "refs/agentbox/checkpoints/1").stdout.decode().strip() == commit
    assert git(work, "rev-parse", f"{commit}^").stdout.decode().strip() == snap.head


def test_large_files_are_skipped_and_named_special_files_and_nested_repositories_noted(work: Path) -> None:
    write(work / "big.bin", "x" * (MB + 1))
    write(work / "small.bin", "x" * MB)
    init(work / "nested")
    write(work / "nested" / "inside.txt", "in\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    assert snap.skipped == [("big.bin", MB + 1)]
    assert "small.bin" in files_of(repo, snap.tree)
    assert "nested/inside.txt" not in files_of(repo, snap.tree)
    assert snap.notes == ["nested/ is a nested git repository; its files are not captured"]


def test_a_repository_without_commits(project: Path) -> None:
    init(project)
    write(project / "first.txt", "1\n")
    repo = hostgit.find(project)
    assert repo is not None and hostgit.head(repo) is None
    snap = hostgit.snapshot(repo, MB)
    assert snap.head is None
    commit = hostgit.commit(repo, snap.tree, None, "first")
    assert git(project, "rev-list", "--parents", "-n1", commit).stdout.decode().split() == [commit]
    assert files_of(repo, snap.tree) == {"first.txt": b"1\n"}
    assert not (project / ".git" / "index").exists()


def test_a_detached_head_is_the_parent(work: Path) -> None:
    first = git(work, "rev-parse", "HEAD").stdout.decode().strip()
    write(work / "second.txt", "2\n")
    commit_all(work)
    git(work, "checkout", "-q", "--detach", first)
    repo = hostgit.find(work)
    assert repo is not None
    assert hostgit.snapshot(repo, MB).head == first
    assert "second.txt" not in files_of(repo, hostgit.snapshot(repo, MB).tree)


def test_a_linked_worktree_uses_its_own_index_and_the_common_objects_and_refs(work: Path) -> None:
    linked = work.parent / "linked"
    git(work, "worktree", "add", "-q", "-b", "side", str(linked))
    write(linked / "only-here.txt", "linked\n")
    write(work / "only-main.txt", "main\n")
    repo = hostgit.find(linked)
    assert repo is not None
    assert repo.common_dir == work / ".git" and repo.git_dir == work / ".git" / "worktrees" / "linked"
    before = user_state(work)
    snap = hostgit.snapshot(repo, MB)
    files = files_of(repo, snap.tree)
    assert "only-here.txt" in files and "only-main.txt" not in files
    commit = hostgit.commit(repo, snap.tree, snap.head, "linked")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    assert git(work, "cat-file", "-t", commit).stdout == b"commit\n"
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/1") == commit
    assert user_state(work) == before


def test_sha256_repositories(project: Path) -> None:
    init(project, "--object-format=sha256")
    write(project / "a.txt", "a\n")
    commit_all(project)
    write(project / "b.txt", "b\n")
    repo = hostgit.find(project)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    assert len(snap.tree) == 64 and hostgit.object_format(repo) == "sha256"
    assert files_of(repo, snap.tree) == {"a.txt": b"a\n", "b.txt": b"b\n"}
    commit = hostgit.commit(repo, snap.tree, snap.head, "m")
    assert hostgit.tree_of(repo, commit) == snap.tree


def test_submodules_are_their_recorded_commit(work: Path, tmp_path: Path) -> None:
    other = init(tmp_path / "other")
    write(other / "o.txt", "o\n")
    recorded = commit_all(other)
    git(work, "submodule", "add", "-q", str(other), "sub")
    commit_all(work)
    write(work / "sub" / "o.txt", "changed inside the submodule\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    entry = git(work, "ls-tree", snap.tree, "sub").stdout.decode().split()
    assert entry[:3] == ["160000", "commit", recorded]
    assert snap.notes == ["submodules are captured as the commit the index records for them, not their own changes"]


def test_file_and_folder_swaps(work: Path) -> None:
    (work / "tracked.txt").unlink()
    write(work / "tracked.txt" / "now-a-folder.txt", "f\n")
    (work / "gone.txt").unlink()
    os.symlink("/etc", work / "gone.txt")
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    assert files_of(repo, snap.tree) == {".gitignore": b"*.log\nbuild/\n",
                                         "tracked.txt/now-a-folder.txt": b"f\n", "gone.txt": b"/etc"}
    base = hostgit.tree_of(repo, snap.head or "")
    assert base is not None
    kinds = {change.path: change.status for change in hostgit.changes(repo, base, snap.tree)}
    assert kinds == {"tracked.txt": "D", "tracked.txt/now-a-folder.txt": "A", "gone.txt": "T"}


def test_the_kept_index_follows_later_changes(work: Path) -> None:
    """The second snapshot reuses agentbox's index: deletions, new files and newly ignored files still show."""
    write(work / "new.txt", "new\n")
    write(work / "later-ignored.txt", "x\n")
    repo = hostgit.find(work)
    assert repo is not None
    first = hostgit.snapshot(repo, MB)
    assert {"new.txt", "later-ignored.txt"} <= set(files_of(repo, first.tree))
    (work / "new.txt").unlink()
    write(work / ".gitignore", "*.log\nbuild/\nlater-ignored.txt\n")
    write(work / "tracked.txt", "edited\n")
    second = hostgit.snapshot(repo, MB)
    files = files_of(repo, second.tree)
    assert "new.txt" not in files and "later-ignored.txt" not in files
    assert files["tracked.txt"] == b"edited\n"
    assert hostgit.snapshot(repo, MB).tree == second.tree


def test_a_base_commit_that_disappeared_is_not_needed(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    base = hostgit.commit(repo, snap.tree, snap.head, "checkpoint")
    assert (hostgit.shadow_dir(repo) / "HEAD").read_text() != base + "\n"
    write(work / "tracked.txt", "after\n")
    assert (hostgit.shadow_dir(repo) / "HEAD").read_text() != base + "\n"
    hostgit.snapshot(repo, MB)
    assert (hostgit.shadow_dir(repo) / "HEAD").read_text() == base + "\n"  # the status compared with it
    (work / ".git" / "objects" / base[:2] / base[2:]).unlink()  # pruned and collected
    write(work / "tracked.txt", "later\n")
    assert files_of(repo, hostgit.snapshot(repo, MB).tree)["tracked.txt"] == b"later\n"
    assert not (hostgit.shadow_dir(repo) / "base").exists()


def test_a_file_the_user_staged_is_captured_even_when_ignored(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    hostgit.snapshot(repo, MB)
    write(work / "forced.log", "staged on purpose\n")
    git(work, "add", "-f", "forced.log")
    assert files_of(repo, hostgit.snapshot(repo, MB).tree)["forced.log"] == b"staged on purpose\n"


def test_diff_output_applies_back_with_git_apply(work: Path) -> None:
    write(work / "tracked.txt", "changed\n")
    (work / "bin.dat").write_bytes(bytes(range(256)) * 4)
    write(work / "new file.txt", "new\n")
    repo = hostgit.find(work)
    assert repo is not None
    head = hostgit.snapshot(repo, MB).head
    base = hostgit.tree_of(repo, head or "")
    assert base is not None
    after = hostgit.snapshot(repo, MB).tree
    patch = hostgit.diff(repo, base, after, binary=True)
    assert b"GIT binary patch" in patch
    git(work, "stash", "-q", "-u")
    assert not (work / "bin.dat").exists()
    hostgit.apply(repo, patch, check_only=True)
    assert not (work / "bin.dat").exists()
    hostgit.apply(repo, patch, check_only=False)
    assert (work / "bin.dat").read_bytes() == bytes(range(256)) * 4
    assert (work / "tracked.txt").read_text() == "changed\n"
    assert hostgit.snapshot(repo, MB).tree == after
    assert hostgit.diff(repo, base, after, name_only=True) == b"bin.dat\nnew file.txt\ntracked.txt\n"
    assert b"3 files changed" in hostgit.diff(repo, base, after, stat=True)
    assert hostgit.diff(repo, base, after, name_only=True, paths=["tracked.txt"]) == b"tracked.txt\n"


def test_apply_failures_raise_with_gits_message_and_change_nothing(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    patch = b"--- a/tracked.txt\n+++ b/tracked.txt\n@@ -1 +1 @@\n-not what is there\n+x\n"
    with pytest.raises(hostgit.GitError, match=r"git apply failed .*patch does not apply"):
        hostgit.apply(repo, patch, check_only=False)
    assert (work / "tracked.txt").read_text() == "one\n"


def test_read_blobs_refuses_an_object_altered_after_it_was_written(work: Path) -> None:
    write(work / "victim.txt", "original\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    oid = git(work, "rev-parse", f"{snap.tree}:victim.txt").stdout.decode().strip()
    assert hostgit.read_blobs(repo, [oid]) == {oid: b"original\n"}
    loose = work / ".git" / "objects" / oid[:2] / oid[2:]
    forged = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=b"forged!!!\n", cwd=work,
                            capture_output=True, check=True).stdout.decode().strip()
    forged_file = work / ".git" / "objects" / forged[:2] / forged[2:]
    loose.chmod(0o644)
    shutil.copyfile(forged_file, loose)
    with pytest.raises(hostgit.GitError, match="does not hold what its id says"):
        hostgit.read_blobs(repo, [oid])
    with pytest.raises(hostgit.GitError, match="is missing"):
        hostgit.read_blobs(repo, ["0" * 40])


def test_objects_are_not_written_through_a_planted_symlink(work: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(work / "new.txt", "n\n")
    repo = hostgit.find(work)
    assert repo is not None
    oid = git(work, "hash-object", "--stdin", input=b"n\n").stdout.decode().strip()
    shutil.rmtree(work / ".git" / "objects" / oid[:2], ignore_errors=True)
    os.symlink(elsewhere, work / ".git" / "objects" / oid[:2])
    with pytest.raises(hostgit.GitError, match="is a symbolic link; agentbox does not write objects through it"):
        hostgit.snapshot(repo, MB)
    assert list(elsewhere.iterdir()) == []


def test_nothing_the_repository_configures_runs_on_the_host(work: Path, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    hostile(work, markers)
    write(work / "tracked.txt", "edited\n")
    write(work / "fresh.txt", "new\n")
    repo = hostgit.find(work)
    assert repo is not None
    base = hostgit.tree_of(repo, hostgit.head(repo) or "")
    assert base is not None
    snap = hostgit.snapshot(repo, MB)
    commit = hostgit.commit(repo, snap.tree, snap.head, "m")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    patch = hostgit.diff(repo, base, snap.tree, paths=["tracked.txt"])
    hostgit.diff(repo, base, snap.tree, stat=True)
    hostgit.changes(repo, base, snap.tree)
    hostgit.read_blobs(repo, [change.new_oid for change in hostgit.changes(repo, base, snap.tree)])
    hostgit.delete_refs(repo, ["refs/agentbox/checkpoints/1"])
    write(work / "tracked.txt", "one\n")
    hostgit.apply(repo, patch, check_only=False)
    assert (work / "tracked.txt").read_text() == "edited\n"
    assert b"+edited" in patch  # the content itself, not a textconv of it
    assert fired(markers) == []


def test_the_hostile_repository_does_run_things_under_plain_git(work: Path, tmp_path: Path) -> None:
    """The control for the test above: the same repository makes ordinary git run every marker."""
    markers = tmp_path / "markers"
    hostile(work, markers)
    write(work / "tracked.txt", "edited\n")
    git(work, "status")
    git(work, "add", "-A")
    git(work, "diff", "HEAD")
    git(work, "log", "-p", "-1", "--ext-diff", "--textconv", "--", "tracked.txt")
    git(work, "diff", "--cached", "--textconv", "--no-ext-diff")
    git(work, "update-ref", "refs/x", "HEAD")
    _with_a_terminal(work, ["git", "-p", "log", "-1"])
    git(work, "st", check=False)
    git(work, "checkout", "-q", "--", "gone.txt")
    assert fired(markers) == sorted(HOSTILE_NAMES)


def _with_a_terminal(cwd: Path, argv: list[str]) -> None:
    """Run argv with its stdout on a pseudo-terminal (git starts a pager only there)."""
    import pty

    env = {key: value for key, value in os.environ.items() if key not in ("GIT_PAGER", "PAGER")}
    leader, follower = pty.openpty()
    try:
        subprocess.run(argv, cwd=cwd, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env,
                       timeout=30, check=False)
    finally:
        os.close(follower)
        os.close(leader)


def test_the_users_git_environment_does_not_leak_in(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    script = write(tmp_path / "ext", f"#!/bin/sh\ntouch '{markers}/env'\n", mode=0o755)
    other = init(tmp_path / "other")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(script))
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "nowhere"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{script}'")
    write(work / "tracked.txt", "edited\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = hostgit.snapshot(repo, MB)
    base = hostgit.tree_of(repo, snap.head or "")
    assert base is not None
    assert b"+edited" in hostgit.diff(repo, base, snap.tree)
    assert fired(markers) == []
    assert not (tmp_path / "nowhere").exists()


def test_git_missing_on_the_host_is_one_clear_error(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not hostgit.available()
    with pytest.raises(hostgit.GitMissing, match="git is not installed on this computer"):
        hostgit.snapshot(repo, MB)


def test_not_a_work_tree(project: Path) -> None:
    assert hostgit.find(project) is None
    write(project / ".git", "gitdir: /etc\n")
    assert hostgit.find(project) is None


def test_refs_resolve_and_delete(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    head = hostgit.head(repo)
    assert head is not None
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/7", head)
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/7") == head
    hostgit.delete_refs(repo, ["refs/agentbox/checkpoints/7", "refs/agentbox/checkpoints/8"])
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/7") is None
    with pytest.raises(ValueError):
        hostgit.set_ref(repo, "--upload-pack=x", head)


@pytest.mark.parametrize("fifo", [".gitattributes", "sub/.gitignore", ".git/objects/info/alternates"])
def test_a_fifo_where_git_reads_ends_in_a_timeout_that_names_it(work: Path, fifo: str) -> None:
    (work / fifo).parent.mkdir(parents=True, exist_ok=True)
    write(work / "tracked.txt", "changed\n")
    write(work / "sub" / "x.txt", "x\n")
    repo = hostgit.find(work)
    assert repo is not None
    base = hostgit.tree_of(repo, hostgit.head(repo) or "")
    snap = hostgit.snapshot(repo, MB)
    os.mkfifo(work / fifo)
    assert base is not None
    expected = f"did not finish within 2 seconds .* never comes: {work / fifo}"
    with pytest.raises(hostgit.GitTimeout, match=expected), hostgit.time_limit(2):
        hostgit.snapshot(repo, MB)
        hostgit.diff(repo, base, snap.tree)
    with pytest.raises(hostgit.GitError, match="git would wait forever on these FIFOs"):
        hostgit.snapshot(repo, MB)
    (work / fifo).unlink()
    assert hostgit.snapshot(repo, MB).tree == snap.tree
