"""Isolated mode through the CLI and the limactl double: the VM sees the workspace read-only elsewhere, the
agent works on a guest-local copy at the workspace's own path, and its changes come back only as a proposal."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from agentbox import paths, staginglayout
from agentbox.review import isolation
from tests.helpers import (
    NAME,
    READ_ONLY_CACHE,
    FakeLima,
    agentbox,
    copy_in_guest,
    git,
    install_agent,
    launch_workdir,
    make_repository,
    needs_bwrap,
    run_cli,
    snapshot_tree,
    write,
    write_trusted,
)


def test_the_vm_sees_the_workspace_read_only_elsewhere_and_gets_an_outbox(project: Path, isolated_vm: FakeLima) -> None:
    import yaml

    mounts = yaml.safe_load(isolated_vm.lima_yaml(NAME))["mounts"]
    outbox = str(isolation.outbox(NAME))
    assert {"location": str(project), "mountPoint": "/mnt/agentbox/workspace", "writable": False,
            **READ_ONLY_CACHE} in mounts
    assert {"location": outbox, "mountPoint": outbox, "writable": True} in mounts
    assert not [m for m in mounts if m["mountPoint"] == str(project)]
    assert stat.S_IMODE(os.stat(outbox).st_mode) == 0o700


def test_an_isolated_session_works_on_a_copy_and_the_host_is_untouched(project: Path, isolated_vm: FakeLima) -> None:
    before = snapshot_tree(project, skip=())
    result = agentbox(project, "claude", "do", "it")
    assert result.returncode == 0, result.stderr
    report = dict(line.split("=", 1) for line in (isolated_vm.home / NAME / "guestfs" / "tmp" / "agent-report")
                  .read_text().splitlines())
    # The agent ran in the copy at the workspace's own path, which starts as HEAD plus the uncommitted work.
    assert report["cwd"] == str(project)
    assert report["status"] == " M modified.txt;?? untracked.txt;"
    assert report["args"] == "--dangerously-skip-permissions do it"
    # During the session the host's files stayed as they were, and the VM could not write them.
    assert report["host-write"] == "no"
    assert report["host-tracked"] == "one;"
    assert snapshot_tree(project, skip=(".git",)) == {k: v for k, v in before.items()
                                                       if k != ".git" and not k.startswith(".git/")}
    copy = snapshot_tree(copy_in_guest(isolated_vm, project))
    assert copy["tracked.txt"] == ("file", b"one\nchanged\n")
    assert "build/out.o" not in copy  # ignored files are not in the copy
    assert "isolated mode: copying the workspace into the VM" in result.stderr


def test_a_warm_isolated_launch_makes_two_limactl_calls(project: Path, isolated_vm: FakeLima) -> None:
    # An isolated session lists its VM first (agentbox.session.launch._warm): its copy is prepared before the shell.
    assert agentbox(project, "shell", "--", "true").returncode == 0
    isolated_vm.clear()
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    assert isolated_vm.subcommands() == ["list", "shell"]
    shell = isolated_vm.calls()[-1]
    assert launch_workdir(shell) == str(paths.staging_dir(NAME))
    start = shell.index("--isolated-from")
    sent = shell[start:shell.index("--", start)]
    assert sent[:2] == ["--isolated-from", "/mnt/agentbox/workspace"]
    isolated_options = [arg for arg in sent if arg in ("--isolated-from", "--base", "--outbox", "--chdir")]
    assert isolated_options == ["--isolated-from", "--base", "--outbox", "--chdir"]
    assert sent[sent.index("--chdir") + 1] == str(project)
    assert Path(sent[sent.index("--outbox") + 1]).parent == isolation.outbox(NAME)
    assert "agentbox: the session changed nothing in the workspace copy: no proposal" in result.stderr


def test_the_copy_carries_over_while_the_workspace_is_unchanged(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo kept > scratch.txt").returncode == 0
    again = agentbox(project, "shell", "--", "cat", "scratch.txt")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "kept\n"
    assert "copying the workspace" not in again.stderr
    # A change on the host makes a new base: the copy is made anew from the workspace as it is now.
    write(project / "tracked.txt", "host edit\n")
    fresh = agentbox(project, "shell", "--", "bash", "-c", "cat tracked.txt; ls scratch.txt 2>&1 || true")
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("host edit\n")
    assert "No such file" in fresh.stdout
    assert "copying the workspace" in fresh.stderr


def test_isolated_on_a_live_vm_runs_on_a_copy_aside_and_session_mode_is_refused(
        project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    make_repository(project, config="")
    assert run_cli("start", cwd=project).exit_code == 0
    install_agent(limactl)
    before = snapshot_tree(project)
    # The session's own --isolated (issue 37): on a copy aside in the live VM, its changes a proposal.
    result = agentbox(project, "claude", "--isolated", "x")
    assert result.returncode == 0, result.stderr
    assert ("agentbox: agentbox-myproject was created live: this session works on a copy of the workspace in the VM, "
            "and its changes come back as a proposal; the VM still mounts your workspace writable") in result.stderr
    assert "created isolated" not in result.stderr and "changed since" not in result.stderr
    report = dict(line.split("=", 1) for line in (limactl.home / NAME / "guestfs" / "tmp" / "agent-report")
                  .read_text().splitlines())
    assert report["cwd"] != str(project) and report["cwd"].endswith("/.agentbox/copies/myproject")
    assert report["status"] == " M modified.txt;?? untracked.txt;"
    assert snapshot_tree(project) == before
    assert "agentbox: proposal 1: 9 files changed;" in result.stderr
    limactl.clear()
    write(project / "agentbox.yml", "session:\n  mode: isolated\n")  # session.mode asks for an isolated VM
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 1
    assert f"(session.mode: isolated in local ({project / 'agentbox.yml'}))" in result.stderr
    assert "shell" not in limactl.subcommands()
    refused = agentbox(project, "start", "--isolated")
    assert refused.returncode == 1 and "was created live" in refused.stderr
    # Recreated isolated, the same launch runs, on a copy.
    recreated = agentbox(project, "start", "--recreate", "--yes", timeout=300)
    assert recreated.returncode == 0, recreated.stderr
    assert "/mnt/agentbox/workspace" in limactl.lima_yaml(NAME)
    ran = agentbox(project, "shell", "--", "pwd")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"{project}\n"


def test_a_live_launch_on_an_isolated_vm_runs_isolated_and_says_so(project: Path, isolated_vm: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    git(project, "add", "agentbox.yml")
    result = agentbox(project, "shell", "--", "bash", "-c", "touch /mnt/agentbox/workspace/x || echo read-only")
    assert result.returncode == 0, result.stderr
    assert "read-only" in result.stdout
    assert ("agentbox: agentbox-myproject was created isolated, so its sessions work on a copy of the workspace "
            "too; `agentbox start --recreate` with session.mode: live makes it live (`agentbox status` shows the "
            "mode)\n") in result.stderr
    assert "mode changed since" not in result.stderr
    assert not (project / "x").exists()


def test_a_workspace_that_is_not_a_git_work_tree_cannot_be_isolated(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "session:\n  mode: isolated\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert (f"agentbox: error: session.mode: isolated needs the workspace {project} to be a git work tree (agentbox "
            "makes the agent's copy from a git checkpoint of it and applies its proposals with git), and it is not "
            "one\nhint: Make it a git repository (`git init`; one without commits works), or use `session.mode: "
            "live`.\n") == result.stderr
    assert limactl.subcommands() == ["list"]


def test_a_mount_over_the_workspace_path_is_refused_in_isolated_mode(project: Path, limactl: FakeLima) -> None:
    make_repository(project, config="")
    (project.parent / "data").mkdir()
    write_trusted(project, "session:\n  mode: isolated\nmounts:\n  - location: ../data\n"
                           f"    mountPoint: {project}/data\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert (f"agentbox: error: mounts: {project.parent / 'data'}: its mount point {project}/data is at, inside or "
            f"above {project} (the workspace path, where the agent's copy lives); isolated mode cannot have it\n"
            ) in result.stderr


def test_launch_sh_never_puts_the_copy_on_a_mount(project: Path, limactl: FakeLima) -> None:
    """A staged launch.sh asked for a copy where the VM mounts the host workspace (a live VM) refuses, and the
    host files stay: "replace the old copy" must never reach the user's files."""
    needs_bwrap()
    make_repository(project, config="")
    assert run_cli("start", cwd=project).exit_code == 0
    assert agentbox(project, "shell", "--", "true").returncode == 0
    before = snapshot_tree(project, skip=())
    outbox = isolation.outbox(NAME)
    outbox.mkdir(parents=True, exist_ok=True)
    script = paths.staging_dir(NAME) / staginglayout.LAUNCH_SCRIPT
    result = subprocess.run(
        ["limactl", "shell", "--workdir", str(paths.staging_dir(NAME)), NAME, "--", "/bin/bash", str(script),
         "--workspace", str(project), "--isolated-from", str(project), "--base", git(project, "rev-parse", "HEAD")
         .strip(), "--outbox", str(outbox), "--chdir", str(project), "--", "true"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert (f"agentbox: isolated mode: not making the workspace copy: {project} is a mount in this VM (was the VM "
            "created live? agentbox start --recreate makes it isolated).\n") in result.stderr
    assert snapshot_tree(project, skip=()) == before


def test_session_mode_needs_trust_only_to_loosen_what_the_global_config_asks(project: Path, home: Path,
                                                                             limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "session:\n  mode: isolated\n")
    assert run_cli("config", "--json", cwd=project).exit_code == 0
    assert json.loads(run_cli("config", "--json", cwd=project).stdout)["session"] == {"mode": "isolated", "keepAlive": False}
    write(home / ".config" / "agentbox" / "config.yml", "session:\n  mode: isolated\n")
    write(project / "agentbox.yml", "session:\n  mode: live\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert ("  - session.mode: live (the global config says isolated; live gives the agent the workspace, "
            "writable)\n") in result.stderr
    write(home / ".config" / "agentbox" / "config.yml", "session:\n  mode: live\n")
    assert "session.mode" not in run_cli("trust", "--show", cwd=project).stdout


def test_an_unknown_session_mode_is_a_config_error(project: Path) -> None:
    write(project / "agentbox.yml", "session:\n  mode: sandboxed\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert "session.mode: expected live or isolated, found 'sandboxed'" in result.stderr


def test_a_worktree_checkout_can_be_isolated(project: Path, limactl: FakeLima) -> None:
    """A `git worktree add` checkout: its git folder lives in the main repository, mounted read-only."""
    import yaml

    needs_bwrap()
    main = project.parent / "main"
    main.mkdir()
    write(main / "tracked.txt", "one\n")
    git(main, "init", "-q")
    git(main, "add", "-A")
    git(main, "commit", "-qm", "init")
    project.rmdir()
    git(main, "worktree", "add", "-q", "-b", "feature", str(project))
    write(project / "agentbox.yml", "session:\n  mode: isolated\n")
    assert run_cli("start", cwd=project).exit_code == 0
    mounts = yaml.safe_load(limactl.lima_yaml(NAME))["mounts"]
    common = str(main / ".git")
    assert {"location": common, "mountPoint": common, "writable": False, **READ_ONLY_CACHE} in mounts
    result = agentbox(project, "shell", "--", "bash", "-c", "git status --short --branch | head -1; "
                      "echo agent >> tracked.txt")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## feature")  # the copy is on the checkout's branch
    assert agentbox(project, "apply").returncode == 0
    assert (project / "tracked.txt").read_text() == "one\nagent\n"
    assert (main / "tracked.txt").read_text() == "one\n"


def test_with_checkpoints_off_the_base_is_still_the_workspace_as_it_is(project: Path, isolated_vm: FakeLima) -> None:
    write_trusted(project, "session:\n  mode: isolated\ncheckpoints:\n  enabled: false\n")
    result = agentbox(project, "shell", "--", "bash", "-c", "cat modified.txt untracked.txt; echo x > new.txt")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "uncommitted\nuntracked\n"
    assert agentbox(project, "apply").returncode == 0
    assert (project / "new.txt").read_text() == "x\n"


def test_a_second_session_joins_the_copy_in_use(project: Path, isolated_vm: FakeLima) -> None:
    """While a session runs, another in the same VM works on the same copy: it is not remade under the first,
    even when the workspace changed meanwhile."""
    gate = isolated_vm.home / NAME / "guestfs" / "tmp" / "gate"
    first = subprocess.Popen(
        [sys.executable, "-m", "agentbox", "shell", "--", "bash", "-c",
         "echo first > first.txt; until [ -e /tmp/gate ]; do sleep 0.2; done"],
        cwd=project, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        copy = copy_in_guest(isolated_vm, project)
        for _ in range(600):
            if (copy / "first.txt").exists():
                break
            time.sleep(0.1)
        write(project / "tracked.txt", "changed on the host\n")
        second = agentbox(project, "shell", "--", "cat", "first.txt", "tracked.txt")
        assert second.returncode == 0, second.stderr
        assert second.stdout == "first\none\n"
        assert ("isolated mode: another session in this VM works on the copy, so this one joins it as it is (its "
                "base is older than your workspace now)") in second.stderr
    finally:
        gate.touch()
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    # The second session to end proposed the copy's state; the first, ending on the same changes, filed nothing new.
    listed = json.loads(agentbox(project, "proposals", "--json").stdout)
    assert [(p["status"], [f["path"] for f in p["files"]]) for p in listed] == [("pending", ["first.txt"])]
    assert "the session changed nothing in the workspace copy since proposal 1: no new proposal" in stderr
    # With no session left on it, the next one gets a copy of the workspace as it is now.
    third = agentbox(project, "shell", "--", "cat", "tracked.txt")
    assert third.stdout == "changed on the host\n"



def test_isolated_right_after_the_agent_is_agentboxs_and_a_later_one_the_agents(
        project: Path, isolated_vm: FakeLima) -> None:
    result = agentbox(project, "claude", "--isolated", "--isolated", "x")
    assert result.returncode == 0, result.stderr
    report = (isolated_vm.home / NAME / "guestfs" / "tmp" / "agent-report").read_text()
    assert "args=--dangerously-skip-permissions --isolated x\n" in report
    shell = agentbox(project, "claude", "--isolated", "shell", "--", "pwd")
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout == f"{project}\n"


# -- issue 27: the mode is said by status, once by a launch; a detached isolated session never starts ----------


def test_status_shows_the_session_mode(project: Path, isolated_vm: FakeLima) -> None:
    shown = run_cli("status", cwd=project)
    assert shown.exit_code == 0, shown.stderr
    assert "mode:      isolated (the agent works on a copy in the VM; `agentbox proposals` lists what it proposes)\n" \
        in shown.stdout
    assert json.loads(run_cli("status", "--json", cwd=project).stdout)["sessionMode"] == "isolated"
    write(project / "agentbox.yml", "session:\n  mode: live\n")
    git(project, "add", "agentbox.yml")
    assert run_cli("trust", cwd=project).exit_code == 0
    live_config = run_cli("status", cwd=project).stdout
    assert "mode:      isolated (the agent works on a copy" in live_config
    assert "session.mode says live, which `agentbox start --recreate` applies" in live_config


def test_status_of_a_live_project_says_live(project: Path, limactl: FakeLima) -> None:
    shown = run_cli("status", cwd=project)
    assert "mode:      live (the agent edits the workspace)\n" in shown.stdout


def test_the_created_isolated_note_is_said_once_per_vm(project: Path, isolated_vm: FakeLima) -> None:
    write(project / "agentbox.yml", "session:\n  mode: live\n")
    git(project, "add", "agentbox.yml")
    assert run_cli("trust", cwd=project).exit_code == 0
    first = agentbox(project, "shell", "--", "true")
    assert first.returncode == 0, first.stderr
    assert f"{NAME} was created isolated, so its sessions work on a copy of the workspace too" in first.stderr
    isolated_vm.clear()
    second = agentbox(project, "shell", "--", "true")
    assert second.returncode == 0, second.stderr
    assert "was created isolated" not in second.stderr
    assert isolated_vm.subcommands() == ["list", "shell"]  # the warm launch stays two calls


def test_detach_of_an_isolated_vm_is_refused_before_anything_starts(project: Path, isolated_vm: FakeLima) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0
    isolated_vm.clear()
    refused = agentbox(project, "claude", "-d", "fix it")
    assert refused.returncode == 2, refused.stderr
    assert f"an isolated session cannot be detached ({NAME} is isolated)" in refused.stderr
    assert "nothing was started" in refused.stderr and "without --detach" in refused.stderr
    assert isolated_vm.subcommands() == []
    assert isolated_vm.status(NAME) == "Stopped"


# -- issue 37: the first shell after a start enters the copy without an error ------------------------------------


def test_the_first_shell_after_a_start_prints_the_project_path_and_no_error(
        project: Path, isolated_vm: FakeLima) -> None:
    # Lima enters the host's folder before the command runs; the copy there is made by the launch step, later.
    first = agentbox(project, "shell", "--", "pwd")
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"{project}\n"
    assert "isolated mode: copying the workspace into the VM" in first.stderr  # the copy was made by this launch
    assert "No such file" not in first.stderr and "cd:" not in first.stderr, first.stderr
