"""A linked worktree's VM writes what git needs for this checkout and nothing that configures or points
the user's other checkouts (the common dir's config, hooks, info, modules, the other worktrees' folders).

Every test drives `agentbox shell` against the limactl double, whose guest runs the commands for real
in bubblewrap with the mounts of the rendered lima.yaml, bound in their order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentbox.review import tripwire
from tests.helpers import FakeLima, needs_bwrap, run_cli, write

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
IN_VM_GIT = "git -c user.name=a -c user.email=a@b"


@pytest.fixture
def trees(project: Path, limactl: FakeLima) -> tuple[Path, Path, Path]:
    """(the main repository, the workspace `tree`, the user's other worktree `other`), side by side."""
    needs_bwrap()
    base = project.parent
    repo = base / "repo"
    repo.mkdir()
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "first"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "branch", "packed"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "pack-refs", "--all"], check=True)
    for name in ("tree", "other"):
        subprocess.run([*GIT, "-C", str(repo), "worktree", "add", "-q", str(base / name)], check=True)
    # A submodule's git folder of the main checkout (the layout `git submodule update` leaves).
    write(repo / ".git" / "modules" / "sub" / "config", "[core]\n\tbare = false\n")
    write(repo / ".git" / "info" / "exclude", "# excludes\n")
    return repo, base / "tree", base / "other"


def in_vm(workspace: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", script],
        cwd=workspace, capture_output=True, text=True, timeout=120,
    )


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file (bytes) and link (target) under folder, by relative path."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(folder))] = f"-> {path.readlink()}"
        elif path.is_file():
            found[str(path.relative_to(folder))] = path.read_bytes()
        else:
            found[str(path.relative_to(folder))] = "folder"
    return found


# Each line: a name and a shell command the agent could run to change what another checkout runs.
ATTACKS = {
    "config": "echo '[core]' >> $C/config && echo '  fsmonitor = evil' >> $C/config",
    "config-by-git": f"{IN_VM_GIT} config core.fsmonitor evil",
    "config-by-rename": "cp $C/config $C/config.lock && mv -f $C/config.lock $C/config",
    "config-from-objects": "cp $C/config $C/objects/c && echo evil >> $C/objects/c && mv -f $C/objects/c $C/config",
    "config-worktree": "echo '[core] fsmonitor = evil' > $C/config.worktree",
    "commondir-at-top": "echo worktrees/other > $C/commondir",
    "hook": "printf '#!/bin/sh\\nevil\\n' > $C/hooks/x",
    "hook-by-rename": "mv $C/hooks $C/hooks.old",
    "other-commondir": "echo /tmp/evil > $C/worktrees/other/commondir",
    "other-gitdir": "echo /tmp/evil/.git > $C/worktrees/other/gitdir",
    "other-config-worktree": "echo '[core] fsmonitor = evil' > $C/worktrees/other/config.worktree",
    "other-folder-removed": "rm -rf $C/worktrees/other",
    "other-folder-replaced": "mv $C/worktrees/other $C/worktrees/o2 || mv $C/worktrees $C/w2",
    "info-exclude": "echo evil >> $C/info/exclude",
    "info-attributes": "echo '* filter=evil' > $C/info/attributes",
    "module-config": "echo '[core] fsmonitor = evil' >> $C/modules/sub/config",
    "objects-moved-away": "mv $C/objects $C/objects.old",
    "link-at-top": "ln -s /tmp $C/evil",
}


def test_the_vm_cannot_change_what_configures_or_points_other_checkouts(trees: tuple[Path, Path, Path]) -> None:
    repo, tree, other = trees
    common = repo / ".git"
    before = {path: snapshot(common / path) for path in ("hooks", "info", "modules", "worktrees/other")}
    top = {path.name: path.read_bytes() for path in common.iterdir() if path.is_file()}
    script = f"C={common}\n" + "".join(f"( {command} ) 2>/dev/null; echo {name}=$?\n"
                                       for name, command in ATTACKS.items())
    result = in_vm(tree, script)
    assert result.returncode == 0, result.stderr
    outcome = dict(line.split("=") for line in result.stdout.splitlines())
    assert {name for name, code in outcome.items() if code == "0"} == set(), result.stdout
    assert set(outcome) == set(ATTACKS)
    assert {path.name: path.read_bytes() for path in common.iterdir() if path.is_file()} == top
    assert {path: snapshot(common / path) for path in before} == before
    assert not (common / "objects").is_symlink()
    # Host git in the other checkout runs nothing of the agent's.
    status = subprocess.run(["git", "-C", str(other), "config", "--get", "core.fsmonitor"],
                            capture_output=True, text=True)
    assert status.returncode == 1 and status.stdout == ""


def test_git_in_the_vm_commits_branches_and_tags_in_this_worktree(trees: tuple[Path, Path, Path]) -> None:
    # The control: what git writes for this checkout (objects, loose refs and their locks, reflogs, its own
    # worktrees/<id>) still works, and the host sees it.
    repo, tree, _ = trees
    common = repo / ".git"
    result = in_vm(tree, f"{IN_VM_GIT} commit -q --allow-empty -m in-vm && {IN_VM_GIT} branch topic"
                         f" && {IN_VM_GIT} tag v1 && {IN_VM_GIT} checkout -q -b feature"
                         f" && echo note > {common}/worktrees/tree/agent-note && git log --format=%s -1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "in-vm\n"
    host = ["git", "-C", str(repo), "log", "--format=%s", "-1"]
    for ref in ("tree", "topic", "v1", "feature"):
        assert subprocess.run([*host, ref], capture_output=True, text=True).stdout == "in-vm\n", ref
    assert (common / "logs" / "refs" / "heads" / "topic").is_file()
    assert (common / "worktrees" / "tree" / "agent-note").read_text() == "note\n"


def test_what_git_writes_at_the_top_of_the_common_dir_fails_in_the_vm(trees: tuple[Path, Path, Path]) -> None:
    # packed-refs lies at the top of the common dir: deleting a ref (git locks packed-refs for it) cannot
    # work in the VM, and says so in git's own words.
    _, tree, _ = trees
    result = in_vm(tree, f"{IN_VM_GIT} branch -D packed")
    assert result.returncode != 0
    assert "packed-refs.lock" in result.stderr


def test_the_lima_yaml_mounts_the_common_dir_read_only_then_the_writable_parts(
        trees: tuple[Path, Path, Path]) -> None:
    repo, tree, _ = trees
    common = repo / ".git"
    (common / "rr-cache").mkdir()
    (common / "lfs").symlink_to(tree)  # planted by a VM of the main checkout: never mounted writable
    result = run_cli("template", cwd=tree)
    assert result.exit_code == 0, result.stderr
    mounts = [(m["location"], m.get("writable", False)) for m in yaml.safe_load(result.stdout)["mounts"]]
    git_mounts = [m for m in mounts if m[0].startswith(str(common))]
    assert git_mounts == [(str(common), False), (str(common / "objects"), True), (str(common / "refs"), True),
                          (str(common / "logs"), True), (str(common / "rr-cache"), True),
                          (str(common / "worktrees" / "tree"), True)]
    assert (f"agentbox: warning: not mounting it writable: {common}/lfs is a symbolic link, not a folder; "
            "git in the VM cannot write there") in result.stderr


def test_the_tripwire_watches_the_common_dir_files_host_git_reads(trees: tuple[Path, Path, Path]) -> None:
    repo, tree, _ = trees
    common = repo / ".git"
    write(common / "hooks" / "post-checkout", "#!/bin/sh\n", mode=0o755)
    assert in_vm(tree, "true").returncode == 0  # a session: the record's reference
    # Changed on the host between sessions (by a VM of another checkout, or anyone).
    changed = {
        common / "config": "[core]\n\tfsmonitor = evil\n",
        common / "hooks" / "post-checkout": "#!/bin/sh\nevil\n",
        common / "info" / "attributes": "* filter=evil\n",
        common / "worktrees" / "other" / "commondir": "/tmp/evil\n",
        common / "worktrees" / "other" / "gitdir": "/tmp/evil/.git\n",
        common / "worktrees" / "other" / "config.worktree": "[core]\n\tfsmonitor = evil\n",
        common / "modules" / "sub" / "config": "[core]\n\tfsmonitor = evil\n",
        common / "modules" / "sub" / "hooks" / "pre-commit": "#!/bin/sh\nevil\n",
    }
    for path, text in changed.items():
        write(path, text)
    audit = run_cli("audit", cwd=tree)
    assert audit.exit_code == 1
    for path in changed:
        assert f"  {path}  (changed after the last session started)" in audit.stderr, path
    assert "+\tfsmonitor = evil" in audit.stderr
    reminder = in_vm(tree, "true").stderr
    assert f"8 watched files that your host runs changed and are not acknowledged: {common}/config" in reminder


def test_the_tripwire_list_stays_a_fixed_list(trees: tuple[Path, Path, Path]) -> None:
    # Objects, refs and logs are never looked at, however many there are.
    _, tree, _ = trees
    labels = tripwire.watched_paths(tree)
    assert not [label for label in labels if "/objects/" in label or "/refs/" in label or "/logs/" in label]


def test_files_a_newer_list_watches_are_taken_as_they_are_from_an_older_record(
        trees: tuple[Path, Path, Path]) -> None:
    # A record written before the list watched worktrees/ and modules/ says nothing about them: the first
    # launch after the update takes them as they are rather than reporting them all as added, and watches
    # them from then on.
    repo, tree, _ = trees
    common = repo / ".git"
    assert in_vm(tree, "true").returncode == 0
    record = tripwire.record_file(tree)
    data = json.loads(record.read_text())
    data["watching"] = 1
    data["reference"] = {label: entry for label, entry in data["reference"].items()
                         if "/worktrees/other" not in label and "/modules/" not in label}
    record.write_text(json.dumps(data))
    assert "not acknowledged" not in in_vm(tree, "true").stderr
    assert json.loads(record.read_text())["watching"] == tripwire.WATCH_LIST
    write(common / "worktrees" / "other" / "commondir", "/tmp/evil\n")
    assert "not acknowledged: " + str(common / "worktrees" / "other" / "commondir") in in_vm(tree, "true").stderr
