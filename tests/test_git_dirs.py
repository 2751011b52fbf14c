"""A git folder outside the workspace is mounted only for a real `git worktree add` layout.

The agent can write the workspace's `.git` and everything it points to inside the workspace, so
each test builds a layout (real or forged), renders the VM's lima.yaml through `agentbox template`
and checks which folders the VM would get, and that a refusal says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentbox.review import tripwire
from tests.helpers import FakeLima, needs_bwrap, run_cli, write

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
NOT_MOUNTED = "agentbox: warning: not mounting the git common dir: "


def worktree(base: Path, name: str = "tree") -> tuple[Path, Path]:
    """A repository `repo` and a real worktree of it, side by side under base."""
    repo = base / "repo"
    if not (repo / ".git").exists():
        repo.mkdir(parents=True)
        subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
        subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    tree = base / name
    subprocess.run([*GIT, "-C", str(repo), "worktree", "add", "-q", str(tree)], check=True)
    return repo, tree


def template(workspace: Path) -> tuple[list[str], str]:
    """(mount locations, stderr) of `agentbox template` in workspace."""
    result = run_cli("template", cwd=workspace)
    assert result.exit_code == 0, result.stderr
    return [m["location"] for m in yaml.safe_load(result.stdout)["mounts"]], result.stderr


def outside_mounts(workspace: Path, locations: list[str]) -> list[str]:
    """Mounts other than the workspace itself and agentbox's own folders (staging, outbox)."""
    return [loc for loc in locations if loc != str(workspace) and not loc.endswith(("/staging", "/outbox"))]


def git_mounts(repo: Path, tree: str = "tree") -> list[str]:
    """The mounts of a real worktree's common dir: read-only as a whole, then what git writes for this checkout."""
    common = repo / ".git"
    return [str(common), *(str(common / name) for name in ("objects", "refs", "logs", f"worktrees/{tree}"))]


def fake_git_folder(folder: Path, worktree_of: Path | None = None, wt_id: str = "x") -> Path:
    """A folder that looks like a repository's .git, optionally with worktrees/<id> pointing back to a workspace."""
    for name in ("objects", "refs", "hooks"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    if worktree_of is not None:
        (folder / "worktrees" / wt_id).mkdir(parents=True)
        (folder / "worktrees" / wt_id / "commondir").write_text("../..\n")
        (folder / "worktrees" / wt_id / "gitdir").write_text(f"{worktree_of / '.git'}\n")
        (folder / "worktrees" / wt_id / "HEAD").write_text("ref: refs/heads/x\n")
    return folder


# -- legitimate layouts ------------------------------------------------------------------------


def test_a_real_worktree_mounts_its_common_dir_without_a_prompt(project: Path) -> None:
    repo, tree = worktree(project.parent)
    locations, err = template(tree)
    assert outside_mounts(tree, locations) == git_mounts(repo)
    assert "not mounting" not in err


def test_a_worktree_with_relative_pointers_is_followed_too(project: Path) -> None:
    # Newer git (worktree.useRelativePaths) writes both pointers relative to where they live.
    repo, tree = worktree(project.parent)
    (tree / ".git").write_text("gitdir: ../repo/.git/worktrees/tree\n")
    (repo / ".git" / "worktrees" / "tree" / "gitdir").write_text("../../../../tree/.git\n")
    locations, err = template(tree)
    assert outside_mounts(tree, locations) == git_mounts(repo)
    assert err == ""


def test_the_resolved_common_dir_is_handed_to_lima(project: Path) -> None:
    repo, tree = worktree(project.parent)
    link = project.parent / "repo-link"
    link.symlink_to(repo)
    (tree / ".git").write_text(f"gitdir: {link}/.git/worktrees/tree\n")
    locations, _ = template(tree)
    assert outside_mounts(tree, locations) == git_mounts(repo)


def test_a_plain_clone_mounts_nothing_else(project: Path) -> None:
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    locations, err = template(project)
    assert outside_mounts(project, locations) == []
    assert err == ""


def test_a_separate_git_dir_inside_the_workspace_needs_no_mount_and_is_watched(project: Path) -> None:
    subprocess.run([*GIT, "init", "-q", "--separate-git-dir", str(project / "gitdata"), str(project)], check=True)
    locations, err = template(project)
    assert outside_mounts(project, locations) == []
    assert err == ""
    labels = tripwire.watched_paths(project)
    assert "gitdata/config" in labels and "gitdata/commondir" in labels


def test_git_works_in_the_vm_in_a_worktree(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    repo, tree = worktree(project.parent)
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c",
         "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m in-vm && git log --format=%s -1"],
        cwd=tree, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "in-vm\n"
    assert subprocess.run(["git", "-C", str(repo), "log", "--format=%s", "-1", "tree"],
                          capture_output=True, text=True).stdout == "in-vm\n"


# -- forged layouts: nothing outside the workspace is mounted, and agentbox says why -------------


def refused(workspace: Path, reason: str) -> None:
    locations, err = template(workspace)
    assert outside_mounts(workspace, locations) == []
    assert NOT_MOUNTED in err
    assert reason in err
    assert "git in the VM will not work in this worktree" in err


def test_gitdir_pointing_at_home(project: Path, home: Path) -> None:
    write(project / ".git", f"gitdir: {home}\n")
    refused(project, f"points to {home}, which is not a `git worktree` folder: {home}/commondir does not exist")


def test_gitdir_pointing_outside_without_commondir(project: Path) -> None:
    elsewhere = fake_git_folder(project.parent / "elsewhere.git")
    write(project / ".git", f"gitdir: {elsewhere}\n")
    refused(project, "is not a `git worktree` folder")


@pytest.mark.parametrize("place", ["home", "home_parent", "state", "lima_home"])
def test_a_complete_layout_in_a_forbidden_place_is_refused(project: Path, isolated_env: dict, place: str) -> None:
    # Everything a real worktree has, but the common dir is (or contains) a folder no VM may write.
    target = {"home": isolated_env["home"], "home_parent": isolated_env["home"].parent,
              "state": isolated_env["state"], "lima_home": isolated_env["lima_home"]}[place]
    fake_git_folder(target, worktree_of=project)
    write(project / ".git", f"gitdir: {target}/worktrees/x\n")
    locations, err = template(project)
    assert outside_mounts(project, locations) == []
    assert NOT_MOUNTED in err
    assert ("is or contains your home folder" if place.startswith("home") else "agentbox's state folder" if "state" in place else "LIMA_HOME") in err


def test_commondir_pointing_at_home_or_root(project: Path, home: Path) -> None:
    gitdir = project / "wt"
    write(gitdir / "gitdir", f"{project / '.git'}\n")
    write(project / ".git", "gitdir: wt\n")
    for target in (str(home), "/"):
        write(gitdir / "commondir", target + "\n")
        refused(project, f"{target} is not a git folder (it has no HEAD file)")


def test_commondir_fifo_does_not_hang(project: Path) -> None:
    gitdir = project / "wt"
    gitdir.mkdir()
    os.mkfifo(gitdir / "commondir")
    write(project / ".git", "gitdir: wt\n")
    result = subprocess.run([sys.executable, "-m", "agentbox", "template"], cwd=project,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f"{gitdir}/commondir is a FIFO (named pipe), not a regular file" in result.stderr


def test_dot_git_fifo_does_not_hang(project: Path) -> None:
    os.mkfifo(project / ".git")
    result = subprocess.run([sys.executable, "-m", "agentbox", "template"], cwd=project,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f"{NOT_MOUNTED}{project}/.git is a FIFO (named pipe), not a regular file" in result.stderr


def test_huge_pointer_files_are_not_read(project: Path) -> None:
    gitdir = project / "wt"
    gitdir.mkdir()
    (gitdir / "commondir").symlink_to("/dev/zero")
    write(project / ".git", "gitdir: wt\n")
    refused(project, f"{gitdir}/commondir is a symbolic link, which agentbox does not follow")
    (gitdir / "commondir").unlink()
    with open(gitdir / "commondir", "wb") as huge:
        huge.truncate(1 << 40)  # a sparse terabyte: reading it whole would never finish
    result = subprocess.run([sys.executable, "-m", "agentbox", "template"], cwd=project,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f"{gitdir}/commondir is larger than 4,096 bytes" in result.stderr
    (gitdir / "commondir").unlink()
    write(project / ".git", "gitdir: " + "a/" * 5000)
    refused(project, f"{project}/.git is larger than 4,096 bytes")


def test_a_common_dir_that_is_not_a_git_folder(project: Path) -> None:
    common = project.parent / "notgit"
    (common / "worktrees" / "x").mkdir(parents=True)
    write(common / "worktrees" / "x" / "commondir", "../..\n")
    write(common / "worktrees" / "x" / "gitdir", f"{project}/.git\n")
    write(project / ".git", f"gitdir: {common}/worktrees/x\n")
    refused(project, f"{common} is not a git folder (it has no HEAD file)")
    write(common / "HEAD", "ref: refs/heads/main\n")
    refused(project, f"{common} is not a git folder (it has no objects folder)")
    (common / "objects").mkdir()
    (common / "refs").symlink_to(Path.home())
    refused(project, f"{common} is not a git folder (its refs is a symbolic link)")


def test_a_gitdir_outside_the_common_dirs_worktrees(project: Path) -> None:
    repo, _ = worktree(project.parent)
    gitdir = project.parent / "loose"
    write(gitdir / "commondir", f"{repo / '.git'}\n")
    write(gitdir / "gitdir", f"{project / '.git'}\n")
    write(project / ".git", f"gitdir: {gitdir}\n")
    refused(project, f"which is not in {repo / '.git'}/worktrees")


def test_another_worktrees_gitdir_is_refused(project: Path) -> None:
    # A real worktree exists, but its back-pointer names that worktree, not this workspace.
    repo, other = worktree(project.parent, "other")
    write(project / ".git", f"gitdir: {repo}/.git/worktrees/other\n")
    refused(project, f"names {other}/.git, not this workspace's {project}/.git")


def test_dot_git_symlink_is_refused(project: Path) -> None:
    repo, _ = worktree(project.parent)
    (project / ".git").symlink_to(repo / ".git")
    refused(project, f"{project}/.git is a symbolic link, which agentbox does not follow")


def test_reasons_are_printed_escaped(project: Path) -> None:
    write(project / ".git", "gitdir: /nowhere/\x1b[2K\u202eevil\n")
    locations, err = template(project)
    assert outside_mounts(project, locations) == []
    assert "\x1b" not in err and "\u202e" not in err
    assert "/nowhere/\\x1b[2K\\u202eevil" in err


# -- the same decision for the tripwire and doctor ---------------------------------------------


def test_tripwire_watches_the_dot_git_file_and_follows_only_validated_pointers(project: Path) -> None:
    repo, tree = worktree(project.parent)
    labels = set(tripwire.watched_paths(tree))
    assert ".git" in labels
    assert f"{repo}/.git/config" in labels and f"{repo}/.git/worktrees/tree/config.worktree" in labels
    assert tripwire.fingerprint(tree)[".git"].text == f"gitdir: {repo}/.git/worktrees/tree\n"

    elsewhere = fake_git_folder(project.parent / "elsewhere")
    write(elsewhere / "config", "[core]\n\tfsmonitor = evil\n")
    write(project / ".git", f"gitdir: {elsewhere}\n")
    labels = set(tripwire.watched_paths(project))
    assert ".git" in labels
    assert not [label for label in labels if label.startswith("/")]
    before = tripwire.fingerprint(project)
    write(project / ".git", f"gitdir: {repo}/.git/worktrees/tree\n")
    assert (".git", "modified") in tripwire.changes(before, tripwire.fingerprint(project))


def test_doctor_says_why_the_common_dir_is_not_mounted(project: Path, limactl: FakeLima) -> None:
    write(project / ".git", "gitdir: /nowhere\n")
    result = run_cli("doctor", "--json", cwd=project)
    checks = [c for c in json.loads(result.stdout) if c["check"] == "git"]
    assert len(checks) == 1 and checks[0]["status"] == "WARN"
    assert "/nowhere, which is not a `git worktree` folder" in checks[0]["message"]

    repo, tree = worktree(project.parent)
    result = run_cli("doctor", "--json", cwd=tree)
    checks = [c for c in json.loads(result.stdout) if c["check"] == "git"]
    assert [c["status"] for c in checks] == ["OK"]
    assert str(repo / ".git") in checks[0]["message"]
