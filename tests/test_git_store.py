"""agentbox's checkpoint store (agentbox.git.store, agentbox.git.snapshot): snapshots of the working tree read
by agentbox itself, objects and refs in agentbox's own repository, the workspace's git folder left byte
for byte as it was, and nothing the repository's config names ever run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentbox.git import snapshot
from agentbox.git import store as hostgit
from agentbox.review import migrate as checkpointmove
from tests.gitrepo import HOSTILE_NAMES, commit_all, fired, git, git_folder_state, hostile, init, user_state
from tests.helpers import write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = [pytest.mark.needs("git"), pytest.mark.timeout(60)]
MB = 1 << 20


def files_of(repo: hostgit.Repo, tree: str) -> dict[str, bytes]:
    """path -> content of every file and link in tree (a tree of the store)."""
    oids = {os.fsdecode(name): oid for mode, oid, name in hostgit.tree_entries(repo, tree) if mode != "160000"}
    blobs = hostgit.read_blobs(repo, list(oids.values()))
    return {name: blobs[oid] for name, oid in oids.items()}


def head_tree(repo: hostgit.Repo) -> str:
    """HEAD's tree, brought into the store (read by agentbox from the workspace's objects)."""
    head = hostgit.head(repo)
    assert head is not None
    tree = checkpointmove.import_commit(repo, head)
    checkpointmove.import_blobs(repo, [oid for mode, oid, _ in hostgit.tree_entries(repo, tree) if mode != "160000"])
    return tree


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
    snap = snapshot.take(repo, 5 * MB)

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
    snap = snapshot.take(repo, 5 * MB)
    commit = hostgit.commit(repo, snap.tree, snap.head, "agentbox checkpoint")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    snapshot.take(repo, 5 * MB)

    assert user_state(work) == before
    assert git(work, "status", "--porcelain").stdout == status_before
    assert files_of(repo, snap.tree)["staged.txt"] == b"staged\n"
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/1") == commit
    assert git(work, "rev-parse", "-q", "--verify", "refs/agentbox/checkpoints/1", check=False).stdout == b""


def test_large_files_are_skipped_and_named_special_files_and_nested_repositories_noted(work: Path) -> None:
    write(work / "big.bin", "x" * (MB + 1))
    write(work / "small.bin", "x" * MB)
    init(work / "nested")
    write(work / "nested" / "inside.txt", "in\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = snapshot.take(repo, MB)
    assert snap.skipped == [("big.bin", MB + 1)]
    assert "small.bin" in files_of(repo, snap.tree)
    assert "nested/inside.txt" not in files_of(repo, snap.tree)
    assert snap.notes == ["nested/ is a nested git repository; its files are not captured"]


def test_a_repository_without_commits(project: Path) -> None:
    init(project)
    write(project / "first.txt", "1\n")
    repo = hostgit.find(project)
    assert repo is not None and hostgit.head(repo) is None
    snap = snapshot.take(repo, MB)
    assert snap.head is None
    commit = hostgit.commit(repo, snap.tree, None, "first")
    assert hostgit.tree_of(repo, commit) == snap.tree
    assert files_of(repo, snap.tree) == {"first.txt": b"1\n"}
    assert not (project / ".git" / "index").exists()


def test_a_detached_head_is_the_parent(work: Path) -> None:
    first = git(work, "rev-parse", "HEAD").stdout.decode().strip()
    write(work / "second.txt", "2\n")
    commit_all(work)
    git(work, "checkout", "-q", "--detach", first)
    repo = hostgit.find(work)
    assert repo is not None
    assert snapshot.take(repo, MB).head == first
    assert "second.txt" not in files_of(repo, snapshot.take(repo, MB).tree)


def test_a_linked_worktree_uses_its_own_index_and_the_common_objects_and_refs(work: Path) -> None:
    linked = work.parent / "linked"
    git(work, "worktree", "add", "-q", "-b", "side", str(linked))
    write(linked / "only-here.txt", "linked\n")
    write(work / "only-main.txt", "main\n")
    repo = hostgit.find(linked)
    assert repo is not None
    assert repo.common_dir == work / ".git" and repo.git_dir == work / ".git" / "worktrees" / "linked"
    before = user_state(work)
    snap = snapshot.take(repo, MB)
    files = files_of(repo, snap.tree)
    assert "only-here.txt" in files and "only-main.txt" not in files
    folder_before = git_folder_state(work)
    commit = hostgit.commit(repo, snap.tree, None, "linked")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    assert git(work, "cat-file", "-t", commit, check=False).returncode != 0  # in agentbox's store only
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/1") == commit
    assert user_state(work) == before
    assert git_folder_state(work) == folder_before


def test_sha256_repositories(project: Path) -> None:
    init(project, "--object-format=sha256")
    write(project / "a.txt", "a\n")
    commit_all(project)
    write(project / "b.txt", "b\n")
    repo = hostgit.find(project)
    assert repo is not None
    snap = snapshot.take(repo, MB)
    assert len(snap.tree) == 64 and hostgit.object_format(repo) == "sha256"
    assert files_of(repo, snap.tree) == {"a.txt": b"a\n", "b.txt": b"b\n"}
    commit = hostgit.commit(repo, snap.tree, None, "m")
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
    snap = snapshot.take(repo, MB)
    assert ("160000", recorded, b"sub") in hostgit.tree_entries(repo, snap.tree)
    assert snap.notes == ["submodules are captured as the commit the index records for them, not their own changes"]


def test_file_and_folder_swaps(work: Path) -> None:
    (work / "tracked.txt").unlink()
    write(work / "tracked.txt" / "now-a-folder.txt", "f\n")
    (work / "gone.txt").unlink()
    os.symlink("/etc", work / "gone.txt")
    repo = hostgit.find(work)
    assert repo is not None
    snap = snapshot.take(repo, MB)
    assert files_of(repo, snap.tree) == {".gitignore": b"*.log\nbuild/\n",
                                         "tracked.txt/now-a-folder.txt": b"f\n", "gone.txt": b"/etc"}
    base = head_tree(repo)
    kinds = {change.path: change.status for change in hostgit.changes(repo, base, snap.tree)}
    assert kinds == {"tracked.txt": "D", "tracked.txt/now-a-folder.txt": "A", "gone.txt": "T"}


def test_the_kept_index_follows_later_changes(work: Path) -> None:
    """The second snapshot reuses agentbox's index: deletions, new files and newly ignored files still show."""
    write(work / "new.txt", "new\n")
    write(work / "later-ignored.txt", "x\n")
    repo = hostgit.find(work)
    assert repo is not None
    first = snapshot.take(repo, MB)
    assert {"new.txt", "later-ignored.txt"} <= set(files_of(repo, first.tree))
    (work / "new.txt").unlink()
    write(work / ".gitignore", "*.log\nbuild/\nlater-ignored.txt\n")
    write(work / "tracked.txt", "edited\n")
    second = snapshot.take(repo, MB)
    files = files_of(repo, second.tree)
    assert "new.txt" not in files and "later-ignored.txt" not in files
    assert files["tracked.txt"] == b"edited\n"
    assert snapshot.take(repo, MB).tree == second.tree


def test_a_damaged_cache_is_rebuilt(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    first = snapshot.take(repo, MB)
    (hostgit.store_dir(repo) / "stat.cache").write_bytes(b"garbage")
    (hostgit.store_dir(repo) / "stat.index").write_bytes(b"DIRC garbage")
    assert snapshot.take(repo, MB).tree == first.tree
    write(work / "tracked.txt", "after the damage\n")
    assert files_of(repo, snapshot.take(repo, MB).tree)["tracked.txt"] == b"after the damage\n"


def test_a_file_the_user_staged_is_captured_even_when_ignored(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    snapshot.take(repo, MB)
    write(work / "forced.log", "staged on purpose\n")
    git(work, "add", "-f", "forced.log")
    assert files_of(repo, snapshot.take(repo, MB).tree)["forced.log"] == b"staged on purpose\n"


def test_diff_output_applies_back_with_git_apply(work: Path) -> None:
    write(work / "tracked.txt", "changed\n")
    (work / "bin.dat").write_bytes(bytes(range(256)) * 4)
    write(work / "new file.txt", "new\n")
    repo = hostgit.find(work)
    assert repo is not None
    base = head_tree(repo)
    after = snapshot.take(repo, MB).tree
    patch = hostgit.diff(repo, base, after, binary=True)
    assert b"GIT binary patch" in patch
    git(work, "stash", "-q", "-u")
    assert not (work / "bin.dat").exists()
    assert hostgit.apply_to_tree(repo, snapshot.take(repo, MB).tree, patch, three_way=False) == after
    assert not (work / "bin.dat").exists()
    assert hostgit.diff(repo, base, after, name_only=True) == b"bin.dat\nnew file.txt\ntracked.txt\n"
    assert b"3 files changed" in hostgit.diff(repo, base, after, stat=True)
    assert hostgit.diff(repo, base, after, name_only=True, paths=["tracked.txt"]) == b"tracked.txt\n"


def test_apply_failures_raise_with_gits_message_and_change_nothing(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    snap = snapshot.take(repo, MB)
    patch = b"--- a/tracked.txt\n+++ b/tracked.txt\n@@ -1 +1 @@\n-not what is there\n+x\n"
    with pytest.raises(hostgit.GitError, match=r"git apply failed .*patch does not apply"):
        hostgit.apply_to_tree(repo, snap.tree, patch, three_way=False)
    good = b"--- a/tracked.txt\n+++ b/tracked.txt\n@@ -1 +1 @@\n-one\n+x\n"
    assert files_of(repo, hostgit.apply_to_tree(repo, snap.tree, good, three_way=False))["tracked.txt"] == b"x\n"
    assert (work / "tracked.txt").read_text() == "one\n"


def test_read_blobs_refuses_an_object_altered_after_it_was_written(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    snapshot.take(repo, MB)
    store = hostgit.store_dir(repo)
    oid = hostgit.write_object(store, b"blob", b"original\n", "sha1")  # a loose object of the store
    assert hostgit.read_blobs(repo, [oid]) == {oid: b"original\n"}
    loose = store / "objects" / oid[:2] / oid[2:]
    forged = hostgit.write_object(store, b"blob", b"forged!!!\n", "sha1")
    forged_file = store / "objects" / forged[:2] / forged[2:]
    loose.chmod(0o644)
    shutil.copyfile(forged_file, loose)
    with pytest.raises(hostgit.GitError, match="does not hold what its id says"):
        hostgit.read_blobs(repo, [oid])
    with pytest.raises(hostgit.GitError, match="is missing"):
        hostgit.read_blobs(repo, ["0" * 40])


def test_nothing_the_repository_configures_runs_on_the_host(work: Path, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    hostile(work, markers)
    write(work / "tracked.txt", "edited\n")
    write(work / "fresh.txt", "new\n")
    repo = hostgit.find(work)
    assert repo is not None
    base = head_tree(repo)
    snap = snapshot.take(repo, MB)
    commit = hostgit.commit(repo, snap.tree, None, "m")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    patch = hostgit.diff(repo, base, snap.tree, paths=["tracked.txt"])
    hostgit.diff(repo, base, snap.tree, stat=True)
    hostgit.changes(repo, base, snap.tree)
    hostgit.read_blobs(repo, [change.new_oid for change in hostgit.changes(repo, base, snap.tree)])
    hostgit.delete_refs(repo, ["refs/agentbox/checkpoints/1"])
    write(work / "tracked.txt", "one\n")
    assert files_of(repo, hostgit.apply_to_tree(repo, base, patch, three_way=True))["tracked.txt"] == b"edited\n"
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
    snap = snapshot.take(repo, MB)
    base = head_tree(repo)
    assert b"+edited" in hostgit.diff(repo, base, snap.tree)
    assert fired(markers) == []
    assert not (tmp_path / "nowhere").exists()


def test_git_missing_on_the_host_is_one_clear_error(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert not hostgit.available()
    with pytest.raises(hostgit.GitMissing, match="git is not installed on this computer"):
        snapshot.take(repo, MB)


def test_not_a_work_tree(project: Path) -> None:
    assert hostgit.find(project) is None
    write(project / ".git", "gitdir: /etc\n")
    assert hostgit.find(project) is None


def test_refs_resolve_and_delete(work: Path) -> None:
    repo = hostgit.find(work)
    assert repo is not None
    head = hostgit.commit(repo, snapshot.take(repo, MB).tree, None, "m")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/7", head)
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/7") == head
    hostgit.delete_refs(repo, ["refs/agentbox/checkpoints/7", "refs/agentbox/checkpoints/8"])
    assert hostgit.resolve(repo, "refs/agentbox/checkpoints/7") is None
    with pytest.raises(ValueError):
        hostgit.set_ref(repo, "--upload-pack=x", head)


@pytest.mark.parametrize("fifo", [".gitattributes", "sub/.gitignore", ".gitignore", ".git/info/exclude", ".git/index",
                                  ".git/HEAD", "sub/fifo.txt"])
def test_a_fifo_anywhere_never_stalls_a_snapshot(work: Path, fifo: str) -> None:
    """agentbox reads everything itself, never blocking: a FIFO is left out (or read as absent) at once."""
    import time

    (work / fifo).parent.mkdir(parents=True, exist_ok=True)
    write(work / "tracked.txt", "changed\n")
    write(work / "sub" / "x.txt", "x\n")
    repo = hostgit.find(work)
    assert repo is not None
    (work / fifo).unlink(missing_ok=True)
    os.mkfifo(work / fifo)
    started = time.monotonic()
    snap = snapshot.take(repo, MB)
    assert time.monotonic() - started < 10
    files = files_of(repo, snap.tree)
    assert files["tracked.txt"] == b"changed\n" and files["sub/x.txt"] == b"x\n"
    assert fifo not in files


def test_the_git_folder_is_byte_identical_after_snapshots_commits_refs_and_diffs(work: Path) -> None:
    """Symlinks planted under .git (reflogs, refs, objects) are never written through: nothing is written there."""
    write(work / "tracked.txt", "edited\n")
    outside = work.parent / "outside.txt"
    write(outside, "keep\n")
    (work / ".git" / "logs" / "refs" / "agentbox" / "checkpoints").mkdir(parents=True, exist_ok=True)
    os.symlink(outside, work / ".git" / "logs" / "refs" / "agentbox" / "checkpoints" / "1")
    os.symlink(outside, work / ".git" / "objects" / "ab")
    repo = hostgit.find(work)
    assert repo is not None
    before = git_folder_state(work)
    snap = snapshot.take(repo, MB)
    commit = hostgit.commit(repo, snap.tree, None, "m")
    hostgit.set_ref(repo, "refs/agentbox/checkpoints/1", commit)
    base = head_tree(repo)
    hostgit.diff(repo, base, snap.tree)
    hostgit.delete_refs(repo, ["refs/agentbox/checkpoints/1"])
    assert git_folder_state(work) == before
    assert outside.read_text() == "keep\n"


def test_a_file_swapped_for_a_symlink_between_listing_and_reading_is_not_followed(
        work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbox.git import snapshot

    secret = write(tmp_path / "id_ed25519", "PRIVATE KEY\n")
    write(work / "swap.txt", "innocent\n")
    repo = hostgit.find(work)
    assert repo is not None
    real_open = os.open

    def swapping_open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if path in (b"swap.txt", "swap.txt") and dir_fd is not None:
            os.unlink(path, dir_fd=dir_fd)
            os.symlink(str(secret), path, dir_fd=dir_fd)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with monkeypatch.context() as patched:
        patched.setattr(snapshot.os, "open", swapping_open)
        snap = snapshot.take(repo, MB)
    contents = files_of(repo, snap.tree).values()
    assert all(b"PRIVATE KEY" not in content for content in contents)
    # control: without the swap, the file's content is captured
    write(work / "swap2.txt", "captured\n")
    assert files_of(repo, snapshot.take(repo, MB).tree)["swap2.txt"] == b"captured\n"


def test_forged_objects_in_the_workspace_cannot_stand_in_for_the_stores(work: Path) -> None:
    """The store's objects are agentbox's own: wiping or forging the workspace's object store changes nothing."""
    write(work / "tracked.txt", "checkpointed\n")
    repo = hostgit.find(work)
    assert repo is not None
    snap = snapshot.take(repo, MB)
    shutil.rmtree(work / ".git" / "objects")
    (work / ".git" / "objects").mkdir()
    assert files_of(repo, snap.tree)["tracked.txt"] == b"checkpointed\n"


def test_replace_refs_are_never_honoured_in_the_store(work: Path) -> None:
    """Defence in depth: even a refs/replace/* in agentbox's own store (nothing of the workspace's reaches it)
    changes no diff, change list or object read; every store git runs with GIT_NO_REPLACE_OBJECTS."""
    repo = hostgit.find(work)
    assert repo is not None
    before = snapshot.take(repo, MB)
    write(work / "tracked.txt", "edited\n")
    after = snapshot.take(repo, MB)
    store = hostgit.store_dir(repo)
    subprocess.run(["git", "--git-dir", str(store), "replace", before.tree, after.tree], check=True,
                   capture_output=True)
    honoured = subprocess.run(["git", "--git-dir", str(store), "diff", "--name-only", before.tree, after.tree],
                              check=True, capture_output=True, text=True)
    assert honoured.stdout == ""  # plain git sees the replacement
    assert [change.path for change in hostgit.changes(repo, before.tree, after.tree)] == ["tracked.txt"]
    assert b"+edited" in hostgit.diff(repo, before.tree, after.tree)
    assert files_of(repo, before.tree)["tracked.txt"] == b"one\n"
