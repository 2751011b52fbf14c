"""`agentbox doctor` through the real CLI against the limactl double."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from tests.conftest import FakeLima, needs_bwrap, run_cli, write

NAME = "agentbox-myproject"


def doctor(project: Path, *args: str) -> Result:
    return run_cli("doctor", *args, cwd=project)


def line(result: Result, status: str, fragment: str) -> str:
    """The one output line with this status that contains fragment."""
    found = [text for text in result.stdout.splitlines() if text.startswith(f"  {status:<6}") and fragment in text]
    assert len(found) == 1, f"no single {status} line with {fragment!r} in:\n{result.stdout}"
    return found[0]


def hint_after(result: Result, fragment: str) -> str:
    lines = result.stdout.splitlines()
    index = next(i for i, text in enumerate(lines) if fragment in text)
    assert lines[index + 1].startswith(" " * 8 + "hint: "), result.stdout
    return lines[index + 1]


def launch(project: Path) -> None:
    """One real launch (`agentbox shell -- true`): stages credentials, installs the guards in the VM."""
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_no_limactl_is_a_failure_not_a_crash(project: Path, isolated_env, monkeypatch) -> None:
    write(project / "agentbox.yml", "")
    monkeypatch.setenv("PATH", str(project / "no-such-bin"))
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "limactl was not found on PATH")
    assert "brew install lima" in hint_after(result, "limactl was not found")
    line(result, "OK", "config is valid")
    checks = json.loads(doctor(project, "--json").stdout)
    assert not [c for c in checks if c["check"].startswith("vm")]  # the VM checks are skipped
    assert "internal error" not in result.stderr
    assert not (isolated_env["state"] / "crash.log").exists()


def test_healthy_running_vm_after_a_launch(project: Path, limactl: FakeLima, home: Path, isolated_env) -> None:
    needs_bwrap()
    write(home / ".claude" / ".credentials.json", '{"token": "t"}', mode=0o600)
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    launch(project)
    limactl.clear()

    result = doctor(project)
    assert result.exit_code == 0, result.stdout
    line(result, "OK", "Lima 2.2.0 (limactl at ")
    line(result, "OK", f"config is valid (local {project / 'agentbox.yml'})")
    line(result, "OK", f"VM {NAME} is running")
    line(result, "OK", f"VM {NAME} belongs to this workspace")
    assert line(result, "OK", "claude:").endswith("claude: logged in on the host (1 of 2 files), staged, in the VM")
    line(result, "OK", "guards are installed in the VM")
    line(result, "WARN", "codex: not logged in on the host")
    # --version, list and exactly one `limactl shell` for every in-VM question.
    assert limactl.subcommands() == ["", "list", "shell"]
    assert limactl.calls()[0] == ["--version"]

    # A login made on the host after the launch is neither staged nor in the VM yet.
    write(home / ".codex" / "auth.json", "{}", mode=0o600)
    result = doctor(project)
    assert result.exit_code == 0
    assert line(result, "WARN", "codex:").endswith("codex: logged in on the host, not staged now, not in the VM yet")
    assert "agentbox codex" in hint_after(result, "codex: logged in")


def test_json_lists_every_check(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = doctor(project, "--json")
    assert result.exit_code == 0
    checks = json.loads(result.stdout)
    assert [c["check"] for c in checks[:3]] == ["lima", "config", "workspace"]
    assert all(set(c) == {"check", "status", "message", "hint"} for c in checks)
    assert all(c["status"] in ("OK", "WARN", "FAIL") for c in checks)
    vm = next(c for c in checks if c["check"] == "vm")
    assert vm["status"] == "WARN" and "created on first launch" in vm["message"] and vm["hint"]


def test_not_created_vm_is_a_warning(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", f"VM {NAME} does not exist yet: it is created on first launch")
    line(result, "WARN", "guards (sync.remoteWrite: false) are not installed yet")
    assert limactl.subcommands() == ["", "list"]


def test_running_vm_before_any_launch_has_no_guards_yet(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", "guards (sync.remoteWrite: false) are not installed in the VM yet")
    assert "next launch" in hint_after(result, "are not installed in the VM yet")


def test_foreign_git_in_the_vm_fails_and_unreachable_vm_warns(project: Path, limactl: FakeLima, monkeypatch) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    launch(project)
    write(limactl.guest_home(NAME) / ".local" / "bin" / "git", "#!/bin/sh\nexec /usr/bin/git \"$@\"\n", mode=0o755)
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "~/.local/bin/git in the VM is not agentbox's")
    assert "rm ~/.local/bin/git" in hint_after(result, "is not agentbox's")

    monkeypatch.setenv("FAKE_LIMACTL_SHELL_SSH_FAIL", "1")
    result = doctor(project)
    line(result, "WARN", f"cannot look inside {NAME} (`limactl shell` exit 255)")
    line(result, "OK", "not checked in the VM: `limactl shell` failed")


def test_stopped_vm_is_fine_and_not_looked_into(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", f"VM {NAME} is stopped; it starts on next launch")
    line(result, "OK", "not checked in the VM: the VM is Stopped")
    assert "shell" not in limactl.subcommands()


def test_broken_vm_fails(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.set_status(NAME, "Broken")
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"VM {NAME} is Broken")
    hint = hint_after(result, "is Broken")
    assert "agentbox start" in hint and "agentbox start --recreate" in hint
    assert "shell" not in limactl.subcommands()


def test_invalid_config_is_reported_not_exit_2(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "vm: [\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "OK", "Lima 2.2.0")
    failure = line(result, "FAIL", "the config is not valid")
    assert str(project / "agentbox.yml") in failure
    assert result.stderr == ""


def test_unusable_config_file_is_a_failure(project: Path, limactl: FakeLima) -> None:
    path = write(project / "agentbox.yml", "", mode=0o666)
    result = doctor(project)
    assert result.exit_code == 1  # launches refuse such a file, so doctor fails it
    line(result, "FAIL", f"{path} is not used: it is writable by group and others, so launches refuse to run")
    assert hint_after(result, "is not used") == " " * 8 + f"hint: Fix it with `chmod g-w,o-w {path}`."


def test_home_as_workspace_fails(home: Path, limactl: FakeLima) -> None:
    result = doctor(home)
    assert result.exit_code == 1
    line(result, "FAIL", "contains your home folder")


def test_vm_of_another_workspace_fails_naming_both(project: Path, home: Path, limactl: FakeLima) -> None:
    other = home.parent / "work" / "other"
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    lima_yaml = limactl.home / NAME / "lima.yaml"  # as if the other project had created it
    lima_yaml.write_text(lima_yaml.read_text().replace(f"agentboxWorkspace: {project}", f"agentboxWorkspace: {other}"))
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 1
    failure = line(result, "FAIL", f"VM {NAME} belongs to {other}, not to this workspace {project}")
    assert failure
    hint = hint_after(result, "belongs to")
    assert re.fullmatch(
        " {8}hint: Give this workspace its own VM: set `name: agentbox-myproject-[0-9a-f]{8}` under `vm:` in "
        + re.escape(f"{project / 'agentbox.yml'}, then run `agentbox -C {project} trust`."), hint), hint
    assert "shell" not in limactl.subcommands()  # never look into another project's VM


def test_instance_not_created_by_agentbox_fails(project: Path, limactl: FakeLima, tmp_path: Path) -> None:
    template = write(tmp_path / "plain.yaml", "images:\n- location: /nonexistent.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", NAME, str(template)], check=True, capture_output=True)
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"the Lima instance {NAME} was not created by agentbox")


def test_remote_write_and_credentials_off(project: Path, limactl: FakeLima, home: Path) -> None:
    write(home / ".claude" / ".credentials.json", "{}", mode=0o600)
    write(home / ".config" / "agentbox" / "config.yml", "sync:\n  remoteWrite: true\ncredentials: false\n")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", "guards are off by config (sync.remoteWrite: true): agents in the VM can push")
    line(result, "OK", "credentials are off in config")
    assert "claude:" not in result.stdout


def test_agent_with_credentials_off_and_custom_agent(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "agents:\n  codex:\n    credentials: false\n  aider:\n    binary: aider\n"
          "    credentials: [~/.aider/token]\n")
    result = doctor(project)
    line(result, "OK", "codex: no login to bring into the VM (credentials are off for it in config)")
    line(result, "WARN", "aider: not logged in on the host")


def test_untrusted_local_config_fails_until_trusted(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"{project / 'agentbox.yml'} is not trusted, so launches refuse it: it sets sync.remoteWrite")
    assert "agentbox trust --show" in hint_after(result, "is not trusted")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", f"{project / 'agentbox.yml'} is trusted as it is")


def test_missing_ca_cert_fails(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "caCert: certs/corp.pem\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"caCert: {project / 'certs' / 'corp.pem'} does not exist")


def test_old_lima_fails(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "oldbin"
    write(bin_dir / "limactl", '#!/bin/sh\n[ "$1" = --version ] && echo "limactl version 1.2.1"\nexit 0\n', mode=0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "Lima 1.2.1")
    assert "older than 2.0.0" in result.stdout


def test_version_tuple() -> None:
    from agentbox.doctor import version_tuple

    assert version_tuple("2.0.0") == (2, 0, 0)
    assert version_tuple("v2.1") == (2, 1, 0)
    assert version_tuple("2.1.0-beta.1") == (2, 1, 0)
    assert version_tuple("HEAD-abc") is None
