"""Which folder is the workspace (and so which VM): git work trees, agentbox.yml, the home folder; and what
agentbox says and offers when the VM of that name belongs to another workspace. Through the real CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from agentbox.net import policy as netpolicy
from agentbox.net import pushes
from tests.helpers import FakeLima, run_cli, write

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
GIT_RULE = "the git work tree containing the current folder"
CWD_RULE = "the current folder: no agentbox.yml, not inside a git work tree"

pytestmark = pytest.mark.usefixtures("limactl")  # status asks Lima


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run([*GIT, "init", "-q", str(path)], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    return path


def status_json(cwd: Path) -> dict:
    result = run_cli("status", "--json", cwd=cwd)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# -- the workspace rule ---------------------------------------------------------------------------


def test_a_subfolder_of_a_git_repo_uses_the_repos_vm(home: Path, limactl: FakeLima) -> None:
    repo = git_repo(home.parent / "work" / "repo")
    deep = repo / "src" / "pkg"
    deep.mkdir(parents=True)
    assert run_cli("start", cwd=repo).exit_code == 0
    limactl.clear()
    result = run_cli("start", cwd=deep)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "agentbox-repo is already running\n"
    assert limactl.subcommands() == ["list"]  # no second VM
    shown = status_json(deep)
    assert (shown["name"], shown["workspace"], shown["workspaceRule"]) == ("agentbox-repo", str(repo), GIT_RULE)
    text = run_cli("status", cwd=deep).stdout
    assert f"workspace: {repo} ({GIT_RULE})\n" in text


def test_a_linked_worktree_is_its_own_workspace(home: Path, limactl: FakeLima) -> None:
    repo = git_repo(home.parent / "work" / "repo")
    tree = home.parent / "work" / "feature"
    subprocess.run([*GIT, "-C", str(repo), "worktree", "add", "-q", str(tree)], check=True)
    (tree / "docs").mkdir()
    assert (tree / ".git").is_file()
    shown = status_json(tree / "docs")
    assert (shown["name"], shown["workspace"], shown["workspaceRule"]) == ("agentbox-feature", str(tree), GIT_RULE)
    result = run_cli("start", cwd=tree / "docs")
    assert result.exit_code == 0, result.stderr
    assert f"agentboxWorkspace: {tree}\n" in limactl.lima_yaml("agentbox-feature")


def test_a_dotfiles_repo_in_home_does_not_make_home_the_workspace(home: Path) -> None:
    git_repo(home)
    notes = home / "notes" / "2024"
    notes.mkdir(parents=True)
    shown = status_json(notes)
    assert (shown["name"], shown["workspace"], shown["workspaceRule"]) == ("agentbox-2024", str(notes), CWD_RULE)
    # A repository below home still counts, dotfiles repo or not.
    project = git_repo(home / "code" / "app")
    (project / "lib").mkdir()
    assert status_json(project / "lib")["workspace"] == str(project)


def test_the_home_folder_itself_is_refused_without_suggesting_init_there(home: Path) -> None:
    git_repo(home)
    result = run_cli("status", cwd=home)
    assert result.exit_code == 2
    assert "contains your home folder" in result.stderr
    hint = result.stderr.split("hint: ", 1)[1]
    assert hint == ("Run agentbox in a project folder, or pass -C DIR. Settings for every project go in the "
                    "global config: `agentbox init --global`.\n")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "empty folder", "plain file", "huge gitdir file"])
def test_things_named_dot_git_that_are_not_a_repository_do_not_count(home: Path, kind: str) -> None:
    outer = git_repo(home.parent / "work" / "outer")
    inner = outer / "inner"
    inner.mkdir()
    dot_git = inner / ".git"
    if kind == "fifo":
        os.mkfifo(dot_git)  # must never be opened for reading (it would hang)
    elif kind == "symlink":
        dot_git.symlink_to(outer / ".git")
    elif kind == "empty folder":
        dot_git.mkdir()
    elif kind == "plain file":
        dot_git.write_text("not a pointer\n")
    else:
        dot_git.write_text("gitdir: " + "x" * 10_000)
    assert status_json(inner)["workspace"] == str(outer)


def test_agentbox_yml_below_the_git_top_decides_and_says_so(home: Path) -> None:
    repo = git_repo(home.parent / "work" / "repo")
    service = repo / "services" / "api"
    local = write(service / "agentbox.yml", "")
    (service / "src").mkdir()
    shown = status_json(service / "src")
    assert (shown["name"], shown["workspace"]) == ("agentbox-api", str(service))
    assert shown["workspaceRule"] == (f"the folder of {local}, inside the git work tree {repo} "
                                      "(the VM does not see the rest of it, nor its .git)")
    # Above it, the repository is the workspace again.
    assert status_json(repo / "services")["workspace"] == str(repo)


def test_outside_git_the_current_folder_is_the_workspace(project: Path) -> None:
    (project / "sub").mkdir()
    shown = status_json(project / "sub")
    assert (shown["workspace"], shown["workspaceRule"]) == (str(project / "sub"), CWD_RULE)


# -- a VM name that belongs to another workspace ----------------------------------------------------


def two_apps(home: Path, limactl: FakeLima) -> tuple[Path, Path]:
    """Two folders named app; the first one's VM agentbox-app exists."""
    first, second = home.parent / "a" / "app", home.parent / "b c" / "app"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    assert run_cli("start", cwd=first).exit_code == 0
    limactl.clear()
    return first, second


def test_status_reports_a_name_clash(home: Path, limactl: FakeLima) -> None:
    first, second = two_apps(home, limactl)
    pushes.Ledger("agentbox-app").record([("refs/heads/agentbox/agentbox-app/x", "0" * 40, "1" * 40)], "ok")
    shown = status_json(second)
    suggested = shown["conflict"]["suggestedName"]
    assert re.fullmatch(r"agentbox-app-[0-9a-f]{8}", suggested)
    assert shown.pop("broker")["enabled"] is True  # on by default; tests/test_broker_report.py checks the rest
    # the other workspace's VM's pushes are not this one's (tests/test_scoped_push.py checks the rest)
    assert shown.pop("pushes")["recent"] == []
    assert shown == {
        "name": "agentbox-app", "status": "NotCreated", "workspace": str(second), "cpus": None, "memory": None,
        "disk": None, "vmType": None, "arch": None, "dir": None, "workspaceRule": CWD_RULE, "sessionMode": "live",
        "conflict": {"vm": "agentbox-app", "workspace": str(first), "suggestedName": suggested},
        "ports": [],
        "network": {"mode": "open", "enforcement": "advisory", "enforcementWhy": netpolicy.enforcement(netpolicy.NetworkSettings())[1],
                    "allowHost": False, "allowLan": False,
                    "proxy": {"running": False, "port": None, "pid": None, "url": None}},
    }
    result = run_cli("status", cwd=second)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:5] == [
        "name:      agentbox-app",
        "status:    NotCreated",
        f"workspace: {second} ({CWD_RULE})",
        f"conflict:  the VM agentbox-app belongs to another workspace, {first}",
        f"fix:       Give this workspace its own VM: `agentbox -C '{second}' init --vm-name {suggested}` "
        f"(it writes {second / 'agentbox.yml'} with that name and trusts it).",
    ]
    assert status_json(first)["conflict"] is None
    assert limactl.subcommands() == ["list"] * 3  # status only looks


def test_status_reports_a_lima_instance_agentbox_did_not_create(project: Path, limactl: FakeLima) -> None:
    foreign = write(project.parent / "foreign.yaml", "images:\n- location: /nonexistent.img\n")
    subprocess.run(["limactl", "create", "--name", "agentbox-myproject", str(foreign)], check=True,
                   capture_output=True)
    shown = status_json(project)
    assert shown["status"] == "NotCreated"
    assert shown["conflict"]["vm"] == "agentbox-myproject" and shown["conflict"]["workspace"] is None
    text = run_cli("status", cwd=project).stdout
    assert "conflict:  the Lima instance agentbox-myproject exists but was not created by agentbox\n" in text
    assert "fix:       Recreate it with `agentbox start --recreate` (this deletes agentbox-myproject), or give" in text


def test_the_clash_hint_is_one_command_that_fixes_it(home: Path, limactl: FakeLima, monkeypatch) -> None:
    first, second = two_apps(home, limactl)
    git_repo(second)
    (second / "src").mkdir()
    result = run_cli("claude", cwd=second / "src")
    assert result.exit_code == 1
    assert f"the VM agentbox-app belongs to {first}, not to this workspace {second}" in result.stderr
    command = re.search(r"hint: Give this workspace its own VM: `([^`]+)`", result.stderr).group(1)
    argv = shlex.split(command)
    assert argv[0] == "agentbox"
    elsewhere = home.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    fixed = run_cli(*argv[1:])  # run exactly what the hint says, from another folder
    assert not (elsewhere / "agentbox.yml").exists()
    assert fixed.exit_code == 0, fixed.stderr
    name = argv[-1]
    assert yaml.safe_load((second / "agentbox.yml").read_text()) == {"vm": {"name": name}}
    started = run_cli("start", cwd=second / "src")
    assert started.exit_code == 0, started.stderr  # trusted already: vm.name needs trust
    assert limactl.status(name) == "Running" and limactl.status("agentbox-app") == "Running"
    assert f"agentboxWorkspace: {second}\n" in limactl.lima_yaml(name)


def test_the_clash_hint_with_an_existing_agentbox_yml_edits_it_and_trusts(home: Path, limactl: FakeLima) -> None:
    _first, second = two_apps(home, limactl)
    local = write(second / "agentbox.yml", "vm:\n  cpus: 2\n")
    result = run_cli("start", cwd=second)
    assert result.exit_code == 1
    found = re.search(r"set `name: (\S+)` under `vm:` in (.+), then run `([^`]+)`\.", result.stderr)
    assert found and found.group(2) == str(local), result.stderr
    assert shlex.split(found.group(3)) == ["agentbox", "-C", str(second), "trust"]
    write(local, f"vm:\n  cpus: 2\n  name: {found.group(1)}\n")
    assert run_cli(*shlex.split(found.group(3))[1:]).exit_code == 0
    assert run_cli("start", cwd=second).exit_code == 0


# -- init ------------------------------------------------------------------------------------------


def test_init_vm_name_writes_only_the_name_and_trusts_it(project: Path, limactl: FakeLima) -> None:
    result = run_cli("init", "--vm-name", "1e3", cwd=project)  # YAML would read 1e3 as a number unquoted
    assert result.exit_code == 0, result.stderr
    target = project / "agentbox.yml"
    assert result.stdout == f"Wrote {target}\n"
    assert result.stderr == f"Trusted it: the VM of {project} is 1e3.\n"
    assert yaml.safe_load(target.read_text()) == {"vm": {"name": "1e3"}}
    assert "#   cpus: 4" in target.read_text()  # the rest of the example stays, commented out
    assert run_cli("shell", "--", "true", cwd=project).exit_code == 0
    assert limactl.status("1e3") == "Running"


def test_init_vm_name_refuses_an_existing_file_unless_overwrite(project: Path) -> None:
    target = write(project / "agentbox.yml", "vm: {cpus: 2}\n")
    refused = run_cli("init", "--vm-name", "agentbox-mine", cwd=project)
    assert refused.exit_code == 1
    assert f"{target} already exists; nothing was written" in refused.stderr
    assert target.read_text() == "vm: {cpus: 2}\n"
    forced = run_cli("init", "--vm-name", "agentbox-mine", "--overwrite", cwd=project)
    assert forced.exit_code == 0
    assert yaml.safe_load(target.read_text()) == {"vm": {"name": "agentbox-mine"}}
    assert "is trusted as it is" in run_cli("trust", "--show", cwd=project).stdout


@pytest.mark.parametrize(("name", "message"), [
    ("my vm", "--vm-name: 'my vm' is not a valid Lima instance name"),
    ("x.yaml", "--vm-name: 'x.yaml' must not end with .yml or .yaml"),
])
def test_init_vm_name_refuses_a_name_lima_would_refuse(project: Path, name: str, message: str) -> None:
    result = run_cli("init", "--vm-name", name, cwd=project)
    assert result.exit_code == 2
    assert f"agentbox: error: {message}" in result.stderr
    assert not (project / "agentbox.yml").exists()


def test_init_vm_name_refuses_the_name_of_another_workspaces_vm(home: Path, limactl: FakeLima) -> None:
    first, second = two_apps(home, limactl)
    result = run_cli("init", "--vm-name", "agentbox-app", cwd=second)
    assert result.exit_code == 2
    assert f"--vm-name: agentbox-app is already the VM of {first}" in result.stderr
    assert not (second / "agentbox.yml").exists()


@pytest.mark.parametrize("where", ["home", "root"])
@pytest.mark.parametrize("extra", [[], ["--vm-name", "agentbox-x"]])
def test_init_refuses_home_and_root(home: Path, where: str, extra: list[str]) -> None:
    folder = home if where == "home" else Path("/")
    result = run_cli("init", *extra, cwd=folder)
    assert result.exit_code == 2
    shown = "/" if where == "root" else str(home)
    assert result.stderr.startswith(f"agentbox: error: refusing to write agentbox.yml into {shown}: ")
    assert "hint: For settings every project shares, run `agentbox init --global`" in result.stderr
    assert not (folder / "agentbox.yml").exists()


def test_init_in_a_subfolder_of_a_repo_says_the_workspace_changes(home: Path) -> None:
    repo = git_repo(home.parent / "work" / "repo")
    (repo / "sub").mkdir()
    result = run_cli("init", cwd=repo / "sub")
    assert result.exit_code == 0
    assert (f"agentbox: note: the workspace is now {repo / 'sub'}, the folder of this file, not the git work tree "
            f"{repo}") in result.stderr
    assert "note" not in run_cli("init", cwd=repo).stderr
