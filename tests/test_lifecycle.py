"""VM lifecycle through the real CLI against the limactl double: start, stop, rm, status, ls, recovery."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentbox.net import policy as netpolicy
from tests.helpers import FakeLima, as_root, on_terminal, process_report, run_agentbox, run_cli, write

NAME = "agentbox-myproject"


def agentbox_process(cwd: Path, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentbox", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_cold_start_creates_and_starts_one_vm(project: Path, limactl: FakeLima, isolated_env) -> None:
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert limactl.status(NAME) == "Running"
    assert limactl.subcommands() == ["list", "create", "start", "list"]
    create = limactl.calls()[1]
    assert create[:4] == ["--tty=false", "create", "--name", NAME]
    template = Path(create[4])
    assert template.parent.stat().st_mode & 0o777 == 0o700
    assert template.stat().st_mode & 0o777 == 0o600
    assert str(template).startswith(str(isolated_env["state"]))
    assert f"agentboxWorkspace: {project}" in limactl.lima_yaml(NAME)
    assert "Creating VM agentbox-myproject: done" in result.stderr
    assert "Starting VM agentbox-myproject: done" in result.stderr


def test_warm_start_is_one_list_call(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0
    assert "already running" in result.stderr
    assert limactl.subcommands() == ["list"]


def test_stop_start_rm_are_idempotent_for_scripts(project: Path, limactl: FakeLima) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0  # nothing to stop yet
    assert "does not exist; nothing to stop" in run_cli("stop", cwd=project).stderr
    assert run_cli("start", cwd=project).exit_code == 0
    stop = run_cli("stop", cwd=project)
    assert stop.exit_code == 0 and limactl.status(NAME) == "Stopped"
    again = run_cli("stop", cwd=project)
    assert again.exit_code == 0 and "already stopped" in again.stderr
    limactl.clear()
    assert run_cli("start", cwd=project).exit_code == 0
    assert limactl.status(NAME) == "Running"
    assert limactl.subcommands() == ["list", "start", "list"]
    rm = run_cli("rm", "--yes", cwd=project)
    assert rm.exit_code == 0
    assert not (limactl.home / NAME).exists()
    rm_again = run_cli("rm", "--yes", cwd=project)
    assert rm_again.exit_code == 0 and "nothing to remove" in rm_again.stderr


def test_rm_without_terminal_or_yes_refuses(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    result = run_cli("rm", cwd=project)
    assert result.exit_code == 1
    assert "without confirmation" in result.stderr and "Run `agentbox rm --yes`" in result.stderr
    assert limactl.status(NAME) == "Running"
    assert run_cli("rm", "--yes", cwd=project).exit_code == 0  # the control
    assert limactl.status(NAME) is None


def test_rm_force_is_the_old_name_of_yes(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    result = run_cli("rm", "--force", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert limactl.status(NAME) is None
    assert "--force" not in run_cli("rm", "--help").stdout.split("Options:")[1]  # hidden, said in the text


def test_restart(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.clear()
    assert run_cli("restart", cwd=project).exit_code == 0
    assert limactl.subcommands() == ["list", "stop", "list", "start", "list"]
    assert limactl.status(NAME) == "Running"


def test_restart_of_a_stopped_vm_starts_it(project: Path, limactl: FakeLima) -> None:
    """Issue 37, item 14: nothing to stop is not news in a restart; the VM is started as it is."""
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    limactl.clear()
    restarted = run_cli("restart", cwd=project)
    assert restarted.exit_code == 0, restarted.stderr
    assert restarted.stderr.splitlines()[-1] == f"{NAME} is running"
    assert "already stopped" not in restarted.stderr and f"Starting VM {NAME}" in restarted.stderr
    assert limactl.subcommands() == ["list", "start", "list"]
    assert limactl.status(NAME) == "Running"


def test_status_json_exact_shape(project: Path, limactl: FakeLima) -> None:
    before = json.loads(run_cli("status", "--json", cwd=project).stdout)
    assert before == {
        "name": NAME, "status": "NotCreated", "workspace": str(project), "cpus": None, "memory": None,
        "disk": None, "vmType": None, "arch": None, "dir": None,
        "workspaceRule": "the current folder: no agentbox.yml, not inside a git work tree", "conflict": None,
        "sessionMode": "live", "ports": [],
        "network": {"mode": "open", "enforcement": "advisory", "enforcementWhy": netpolicy.enforcement(netpolicy.NetworkSettings())[1],
                    "allowHost": False, "allowLan": False,
                    "proxy": {"running": False, "port": None, "pid": None, "url": None}},
        "broker": {"enabled": True, "brokered": ["codex", "claude", "gemini", "gh"],
                   "staged": ["kiro", "opencode", "copilot"],
                   "caFingerprint": None, "notes": [], "notesChecked": False,
                   "vmHolds": "no secret of codex, claude, gemini, gh: their login files and API keys in the VM hold "
                              "placeholders; the real tokens stay on the host and agentbox's proxy puts them only "
                              "where their own services take them; copies of the real logins of kiro, opencode, "
                              "copilot (staged: the broker does not support them)"},
        "pushes": {"mode": "none", "setting": "sync.remoteWrite: false, git.allowPush: false", "branches": None,
                   "checkedOnHost": False, "pushed": 0, "refused": 0, "recent": []},
    }
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n  memory: 4GiB\n  disk: 30GiB\n")
    assert run_cli("start", cwd=project).exit_code == 0
    after = json.loads(run_cli("status", "--json", cwd=project).stdout)
    assert list(after) == ["name", "status", "workspace", "cpus", "memory", "disk", "vmType", "arch", "dir",
                           "workspaceRule", "conflict", "sessionMode", "ports", "network", "broker", "pushes"]
    assert after["workspaceRule"] == f"the folder of {project / 'agentbox.yml'}"
    assert after["conflict"] is None
    assert after["status"] == "Running"
    assert (after["cpus"], after["memory"], after["disk"]) == (2, 4 << 30, 30 << 30)
    assert after["workspace"] == str(project)
    assert after["dir"] == str(limactl.home / NAME)
    assert after["vmType"] == "qemu"


def test_ls_lists_agentbox_vms_by_marker(project: Path, limactl: FakeLima, home: Path) -> None:
    other = home.parent / "work" / "other"
    other.mkdir()
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("start", cwd=other).exit_code == 0
    foreign = home.parent / "foreign.yaml"
    foreign.write_text("images:\n- location: https://example.invalid/x.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", "agentbox-lookalike", str(foreign)],
                   check=True, capture_output=True)
    rows = json.loads(run_cli("ls", "--json", cwd=project).stdout)
    assert [r["name"] for r in rows] == ["agentbox-myproject", "agentbox-other"]
    assert rows[1]["workspace"] == str(other)
    everything = json.loads(run_cli("ls", "--json", "--all", cwd=project).stdout)
    assert [r["name"] for r in everything] == ["agentbox-lookalike", "agentbox-myproject", "agentbox-other"]
    assert everything[0]["workspace"] is None


def test_stop_all_stops_only_running_agentbox_vms(project: Path, limactl: FakeLima, home: Path) -> None:
    other = home.parent / "work" / "other"
    other.mkdir()
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("start", cwd=other).exit_code == 0
    foreign = home.parent / "foreign.yaml"
    foreign.write_text("images:\n- location: https://example.invalid/x.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", "mine", str(foreign)], check=True, capture_output=True)
    subprocess.run(["limactl", "--tty=false", "start", "mine"], check=True, capture_output=True)
    result = run_cli("stop", "--all", cwd=home)  # works anywhere, even without a project
    assert result.exit_code == 0
    assert limactl.status("agentbox-myproject") == "Stopped"
    assert limactl.status("agentbox-other") == "Stopped"
    assert limactl.status("mine") == "Running"
    assert run_cli("stop", "--all", cwd=home).exit_code == 0


def test_broken_vm_is_recovered_with_lima_own_recovery(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.set_status(NAME, "Broken")
    limactl.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert limactl.status(NAME) == "Running"
    assert ["--tty=false", "stop", "--force", NAME] in limactl.calls()
    assert "delete" not in limactl.subcommands()


def test_broken_vm_that_stays_broken_is_explained_not_deleted(project: Path, limactl: FakeLima, monkeypatch) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.set_status(NAME, "Broken")
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_START", "host agent process has exited: exit status 1")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "still Broken" in result.stderr
    assert str(limactl.home / NAME) in result.stderr
    assert "ha.stderr.log" in result.stderr
    assert "agentbox start --recreate" in result.stderr and "agentbox rm --yes" in result.stderr
    assert (limactl.home / NAME / "lima.yaml").exists()
    assert "delete" not in limactl.subcommands()


def test_failing_start_is_reported_and_nothing_deleted(project: Path, limactl: FakeLima, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_START", "did not receive an event with the `running` status")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "did not receive an event with the `running` status" in result.stderr
    assert "level=fatal" not in result.stderr.split("Last lines")[0]
    assert "ha.stderr.log" in result.stderr
    assert "was not deleted" in result.stderr
    assert (limactl.home / NAME / "lima.yaml").exists()
    assert "delete" not in limactl.subcommands()


def test_failing_create_rolls_back_the_half_made_vm(project: Path, limactl: FakeLima, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_CREATE", "failed to download the image")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "failed to download the image" in result.stderr
    assert not (limactl.home / NAME).exists()


def test_limactl_missing(project: Path, tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no limactl, real or double
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "limactl was not found on PATH" in result.stderr
    assert "brew install lima" in result.stderr


def test_limactl_refusing_root_is_explained(project: Path, limactl: FakeLima, tmp_path: Path, monkeypatch) -> None:
    # The double refuses like real limactl when its euid is 0: as root, or mapped to root in a user namespace.
    real = tmp_path / "bin" / "limactl"
    as_root_bin = write(tmp_path / "root-bin" / "limactl",
                        "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in as_root([str(real)])) + ' "$@"\n', mode=0o755)
    monkeypatch.setenv("PATH", f"{as_root_bin.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LIMACTL_REFUSE_ROOT", "1")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [
        "agentbox: error: limactl refuses to run as root, so agentbox cannot manage VMs from this account.",
        "hint: Run agentbox as your normal user (not with sudo or as root).",
    ]


def test_malformed_list_is_an_error_not_a_new_vm(project: Path, limactl: FakeLima, monkeypatch) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    limactl.clear()
    monkeypatch.setenv("FAKE_LIMACTL_LIST_MALFORMED", "1")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "not JSON" in result.stderr
    assert limactl.subcommands() == ["list"]


def test_failing_list_is_an_error_not_a_new_vm(project: Path, limactl: FakeLima, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_LIST_FAIL", "open /x/.lima: permission denied")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "permission denied" in result.stderr
    assert "create" not in limactl.subcommands()


def test_same_folder_name_in_two_places_is_refused(limactl: FakeLima, home: Path) -> None:
    first = home.parent / "a" / "app"
    second = home.parent / "b" / "app"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    assert run_cli("start", cwd=first).exit_code == 0
    result = run_cli("start", cwd=second)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0] == (f"agentbox: error: the VM agentbox-app belongs to {first}, not to this workspace {second} "
                        "(two projects with the same folder name?)")
    assert lines[1].startswith("hint: ")  # how to give this project a VM of its own
    write(second / "agentbox.yml", "vm:\n  name: agentbox-app-b\n")
    assert run_cli("trust", cwd=second).exit_code == 0  # vm.name in a project file needs trust
    assert run_cli("start", cwd=second).exit_code == 0


def test_two_concurrent_first_runs_create_one_vm(project: Path, limactl: FakeLima, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_LATENCY", "create=1,start=1")
    procs = [agentbox_process(project, "start") for _ in range(2)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert limactl.subcommands().count("create") == 1
    assert limactl.status(NAME) == "Running"


def test_interrupt_during_start_exits_130_and_leaves_no_limactl_child(project: Path, limactl: FakeLima,
                                                                       monkeypatch) -> None:
    # SIGINT reaches agentbox only (as from `kill -INT`, or a terminal whose foreground group the
    # child is not in): the double sleeps on, so only agentbox's own handling can end it.
    monkeypatch.setenv("FAKE_LIMACTL_LATENCY", "start=120")
    proc = agentbox_process(project, "start", start_new_session=True)
    try:
        child = _wait_for(lambda: _running_limactl("start"), proc)
        os.kill(proc.pid, signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agentbox did not end on SIGINT:\n{process_report(proc.pid)}") from None
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr
        assert stderr.splitlines()[-2:] == [
            "agentbox: error: interrupted while starting agentbox-myproject; Lima may keep booting it in the background",
            "hint: Run the same command again: agentbox waits for the VM to finish starting.",
        ]
        # agentbox waited for its child before exiting: nothing is left to reap or linger.
        assert _running_limactl() == []
        assert not os.path.exists(f"/proc/{child[0]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid, _ in _running_limactl():
            os.kill(pid, signal.SIGKILL)


def _wait_for(found: Callable[[], list], proc: subprocess.Popen, timeout: float = 60) -> Any:
    """Poll until found() returns something; fail if proc exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result[0]
        if proc.poll() is not None:
            pytest.fail(f"agentbox exited ({proc.returncode}) first: {proc.communicate()[1]}")
        time.sleep(0.02)
    pytest.fail("timed out waiting")


def _running_limactl(subcommand: str | None = None) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the double's processes that belong to this test (by its LIMA_HOME)."""
    marker = f"LIMA_HOME={os.environ['LIMA_HOME']}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and any(w.endswith("limactl.py") for w in words) and (
            subcommand is None or subcommand in words
        ):
                found.append((int(pid), words))
    return found


def test_streamed_limactl_calls_get_no_open_stdin(project: Path, limactl: FakeLima, tmp_path: Path, monkeypatch) -> None:
    """create, start and stop read stdin from /dev/null. Left to itself, sh feeds a callable-output command's
    stdin from a queue that never ends (a limactl reading stdin would hang), and after the command exits its
    writer thread notices only between 0.1 s waits on that queue, which wait() sits through."""
    real = tmp_path / "bin" / "limactl"
    wrapper = write(tmp_path / "stdin-bin" / "limactl",
                    f'#!/bin/sh\ncase " $* " in *" start "*|*" stop "*|*" create "*) cat >/dev/null ;; esac\n'
                    f'exec "{real}" "$@"\n', mode=0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    for command in (["start"], ["stop"]):
        proc = agentbox_process(project, *command)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"`agentbox {command[0]}` hung: limactl's stdin never reached its end")
        assert proc.returncode == 0, stderr
    assert limactl.subcommands() == ["list", "create", "start", "list", "list", "stop"]


def test_verbose_streams_limactl_output_and_debug_prints_calls(project: Path, limactl: FakeLima) -> None:
    result = run_cli("-v", "--debug", "start", cwd=project)
    assert result.exit_code == 0
    assert "READY" in result.stderr
    assert "[debug]" in result.stderr and "create --name agentbox-myproject" in result.stderr


def test_every_limactl_call_is_logged(project: Path, limactl: FakeLima, isolated_env) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    lines = (isolated_env["state"] / "limactl.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["argv"][1] if e["argv"][1] != "--tty=false" else e["argv"][2] for e in entries] == [
        "list", "create", "start", "list"
    ]
    assert all(e["exit"] == 0 and e["duration"] >= 0 for e in entries)


def test_host_wide_lima_default_that_widens_the_vm_is_refused(project: Path, limactl: FakeLima, home: Path) -> None:
    config_dir = limactl.home / "_config"
    config_dir.mkdir()
    (config_dir / "default.yaml").write_text(f"mounts:\n- location: {home}\n  writable: true\n")
    # agentbox's own forwardAgent: false beats default.yaml; override.yaml beats everything.
    (config_dir / "override.yaml").write_text("ssh:\n  forwardAgent: true\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "settings agentbox did not give it" in result.stderr
    assert f"an extra writable mount of {home}" in result.stderr
    assert "ssh.forwardAgent is true" in result.stderr
    assert "_config/default.yaml" in result.stderr


def test_vm_deleted_between_list_and_shell_is_a_clear_error(project: Path, limactl: FakeLima, tmp_path: Path, monkeypatch) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    real = tmp_path / "bin" / "limactl"
    racing = tmp_path / "racing-bin"
    racing.mkdir()
    (racing / "limactl").write_text(
        f'#!/bin/sh\nif [ "$1" = shell ]; then "{real}" delete --force {NAME} >/dev/null 2>&1; fi\nexec "{real}" "$@"\n'
    )
    (racing / "limactl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{racing}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "disappeared" in result.stderr
    assert result.stderr.count("agentbox: error") == 1


def _installing(project: Path, limactl: FakeLima, wait: int) -> None:
    """A VM whose status is one agentbox does not act on (the WSL2 driver's `Installing`)."""
    from tests import fake_limactl

    assert run_cli("start", cwd=project).exit_code == 0
    state = fake_limactl.read_state(limactl.home, NAME)
    state["status"] = "Installing"
    fake_limactl.write_state(limactl.home, NAME, state)
    write(project / "agentbox.yml", f"startupWaitSec: {wait}\n")
    assert json.loads(run_cli("status", "--json", cwd=project).stdout)["status"] == "Installing"
    limactl.clear()


def test_unknown_status_is_waited_for(project: Path, limactl: FakeLima) -> None:
    _installing(project, limactl, wait=120)
    proc = agentbox_process(project, "start")
    try:
        # Once agentbox has looked again (a second `list`), the VM settles.
        _wait_for(lambda: limactl.subcommands()[1:2], proc)
        limactl.set_status(NAME, "Running")
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert f"agentbox: {NAME} is Installing; waiting up to 120s" in stderr.splitlines()
    assert set(limactl.subcommands()) == {"list"}


def test_unknown_status_that_stays_is_explained_after_the_startup_wait(project: Path, limactl: FakeLima) -> None:
    _installing(project, limactl, wait=1)
    result = run_agentbox("start", cwd=project)  # a wait that ignored startupWaitSec would end at the timeout
    assert result.returncode == 1
    assert f"agentbox: error: {NAME} did not become usable (status 'Installing') within 1s" in result.stderr.splitlines()
    assert set(limactl.subcommands()) == {"list"}  # nothing deleted, stopped or started


@pytest.mark.parametrize("explicit_name", [False, True])
def test_recreate_refuses_a_vm_of_another_workspace(limactl: FakeLima, home: Path, explicit_name: bool) -> None:
    first = home.parent / "a" / "app"
    second = home.parent / "b" / "app"
    for folder in (first, second):
        folder.mkdir(parents=True)
        if explicit_name:
            write(folder / "agentbox.yml", "vm:\n  name: agentbox-shared\n")
            assert run_cli("trust", cwd=folder).exit_code == 0
    name = "agentbox-shared" if explicit_name else "agentbox-app"
    assert run_cli("start", cwd=first).exit_code == 0
    limactl.clear()
    result = run_cli("start", "--recreate", "--yes", cwd=second)
    assert result.exit_code == 1
    assert f"belongs to {first}" in result.stderr
    assert "delete" not in limactl.subcommands()
    assert limactl.status(name) == "Running"
    assert f"agentboxWorkspace: {first}" in limactl.lima_yaml(name)


def test_recreate_without_terminal_or_yes_refuses(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.clear()
    result = run_cli("start", "--recreate", cwd=project)
    assert result.exit_code == 1
    assert "without confirmation" in result.stderr and "agentbox start --recreate --yes" in result.stderr
    assert limactl.subcommands() == ["list"]
    assert limactl.status(NAME) == "Running"


def test_recreate_with_yes_deletes_and_creates_anew(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    marker = limactl.home / NAME / "from-the-old-vm"
    marker.write_text("")
    limactl.clear()
    result = run_cli("start", "--recreate", "--yes", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert limactl.subcommands() == ["list", "delete", "create", "start", "list"]
    assert limactl.status(NAME) == "Running" and not marker.exists()


def test_recreate_asks_on_a_terminal(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.clear()
    code, output = on_terminal(project, ["start", "--recreate"], answer=b"n\n")
    assert code == 1
    assert "Delete VM agentbox-myproject and its disk, then create it anew?" in output
    assert "delete" not in limactl.subcommands() and limactl.status(NAME) == "Running"
    code, output = on_terminal(project, ["start", "--recreate"], answer=b"y\n")
    assert code == 0, output
    assert "delete" in limactl.subcommands() and limactl.status(NAME) == "Running"


def test_recreate_replaces_a_same_named_vm_agentbox_did_not_create(project: Path, limactl: FakeLima, home: Path) -> None:
    foreign = home.parent / "foreign.yaml"
    foreign.write_text("images:\n- location: https://example.invalid/x.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", NAME, str(foreign)], check=True, capture_output=True)
    refused = run_cli("start", cwd=project)
    assert refused.exit_code == 1 and "was not created by this agentbox" in refused.stderr
    result = run_cli("start", "--recreate", "--yes", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert f"agentboxWorkspace: {project}" in limactl.lima_yaml(NAME)
