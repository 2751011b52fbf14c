"""Lima's host-wide files ($LIMA_HOME/_config/default.yaml, override.yaml) cannot widen an agentbox VM.

Every widening is refused at the launch that sees it, the VM is stopped, and the refusal holds until
the file is fixed; mount locations are re-checked before each start. Through the CLI against the double.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FakeLima, needs_bwrap, run_cli, write

NAME = "agentbox-myproject"


def staging(isolated_env) -> Path:
    return isolated_env["state"] / "vms" / NAME / "staging"


# (file, YAML text, words the error must contain). {home} and {staging} are filled in per test.
WIDENINGS = {
    "extra mount": ("default.yaml", "mounts:\n- location: {home}\n  writable: true\n",
                    ["mounts:", "an extra writable mount of {home}"]),
    "writable flipped": ("override.yaml", "mounts:\n- location: {staging}\n  mountPoint: {staging}\n  writable: true\n",
                         ["mounts:", "the mount of {staging} at {staging} is writable"]),
    "forwardAgent": ("override.yaml", "ssh:\n  forwardAgent: true\n", ["ssh.forwardAgent is true"]),
    "forwardX11": ("default.yaml", "ssh:\n  forwardX11: true\n", ["ssh.forwardX11 is true"]),
    "forwardX11Trusted": ("override.yaml", "ssh:\n  forwardX11Trusted: true\n", ["ssh.forwardX11Trusted is true"]),
    "propagateProxyEnv": ("override.yaml", "propagateProxyEnv: true\n", ["propagateProxyEnv is true"]),
    "docker socket": ("default.yaml",
                      "portForwards:\n- guestSocket: /run/docker.sock\n  hostSocket: /var/run/docker.sock\n  reverse: true\n",
                      ["portForwards:", "reverse forward", "/var/run/docker.sock"]),
    "copyToHost": ("override.yaml", "copyToHost:\n- guest: /etc/shadow\n  host: '{{{{.Dir}}}}/copied'\n",
                   ["copyToHost copies /etc/shadow"]),
    "networks": ("default.yaml", "networks:\n- lima: shared\n", ["networks: an extra network (lima: shared)"]),
    "containerd.system": ("override.yaml", "containerd:\n  system: true\n", ["containerd.system is true"]),
}


def shell(project: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", *command], cwd=project,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def host_wide(limactl: FakeLima, file: str, text: str) -> Path:
    path = limactl.home / "_config" / file
    write(path, text)
    return path


@pytest.mark.parametrize("case", list(WIDENINGS))
def test_widening_refuses_stops_the_vm_and_keeps_refusing_until_removed(
    case: str, project: Path, limactl: FakeLima, home: Path, isolated_env
) -> None:
    needs_bwrap()
    file, text, words = WIDENINGS[case]
    values = {"home": home, "staging": staging(isolated_env)}
    assert run_cli("start", cwd=project).exit_code == 0
    path = host_wide(limactl, file, text.format(**values))
    limactl.clear()

    first = shell(project, "true")
    assert first.returncode == 1, first.stderr
    for word in words:
        assert word.format(**values) in first.stderr
    assert f"(set by {path})" in first.stderr
    assert "agentbox stopped it" in first.stderr
    assert limactl.status(NAME) == "Stopped"
    assert "shell" not in limactl.subcommands()

    limactl.clear()
    second = shell(project, "true")
    assert second.returncode == 1
    assert str(path) in second.stderr
    assert "start" not in limactl.subcommands() and "shell" not in limactl.subcommands()
    assert limactl.status(NAME) == "Stopped"

    path.unlink()
    third = shell(project, "sh", "-c", "echo fixed")
    assert third.returncode == 0, third.stderr
    assert third.stdout == "fixed\n"
    assert "refused" not in json.loads((isolated_env["state"] / "vms" / NAME / "state.json").read_text())


def test_widening_added_while_stopped_is_refused_before_start(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    path = host_wide(limactl, "override.yaml", "ssh:\n  forwardAgent: true\n")
    limactl.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "ssh.forwardAgent is true" in result.stderr and str(path) in result.stderr
    assert "agentbox will not start it" in result.stderr
    assert limactl.subcommands() == ["list"]
    assert limactl.status(NAME) == "Stopped"


def test_start_on_a_running_vm_checks_its_config(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    host_wide(limactl, "default.yaml", "networks:\n- lima: shared\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "already running" not in result.stderr
    assert f"  - networks: an extra network (lima: shared) (set by {limactl.home / '_config' / 'default.yaml'})" \
        in result.stderr.splitlines()
    assert limactl.status(NAME) == "Stopped"


def test_a_setting_neither_file_holds_is_named_as_host_wide(project: Path, limactl: FakeLima, home: Path) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    # A widening that reaches the VM some other way (here: written into Lima's own copy of lima.yaml).
    instance_yaml = limactl.home / NAME / "lima.yaml"
    instance_yaml.write_text(instance_yaml.read_text().replace("propagateProxyEnv: false", "propagateProxyEnv: true"))
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert "propagateProxyEnv is true:" in result.stderr
    assert "(set by a host-wide Lima setting)" in result.stderr


def test_scalar_is_blamed_on_override_not_on_default(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    default = host_wide(limactl, "default.yaml", "ssh:\n  forwardAgent: true\n")  # agentbox's false beats it
    assert run_cli("start", cwd=project).exit_code == 0
    override = host_wide(limactl, "override.yaml", "ssh:\n  forwardAgent: true\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    assert f"(set by {override})" in result.stderr and str(default) not in result.stderr


def test_refused_vm_started_outside_agentbox_is_restarted_before_use(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    assert run_cli("start", cwd=project).exit_code == 0
    path = host_wide(limactl, "override.yaml", "ssh:\n  forwardAgent: true\n")
    assert shell(project, "true").returncode == 1
    # The user starts it by hand (it boots with the widening), then cleans override.yaml:
    subprocess.run(["limactl", "--tty=false", "start", NAME], check=True, capture_output=True)
    path.unlink()
    limactl.clear()
    result = shell(project, "sh", "-c", "echo ok")
    assert result.returncode == 0, result.stderr
    assert "restarting it" in result.stderr
    assert limactl.subcommands() == ["list", "stop", "start", "list", "shell"]


def test_vm_of_an_older_agentbox_is_checked_from_its_kept_lima_yaml(project: Path, limactl: FakeLima, isolated_env) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    state_file = isolated_env["state"] / "vms" / NAME / "state.json"
    state = json.loads(state_file.read_text())
    expected = state.pop("expected")
    state_file.write_text(json.dumps(state))
    assert run_cli("start", cwd=project).exit_code == 0
    assert json.loads(state_file.read_text())["expected"] == expected
    state.pop("expected", None)
    state_file.write_text(json.dumps(state))
    host_wide(limactl, "override.yaml", "copyToHost:\n- guest: /etc/hostname\n  host: /tmp/x\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1 and "copyToHost copies /etc/hostname" in result.stderr


def test_mount_location_redirected_by_a_symlink_is_refused_before_start(
    project: Path, limactl: FakeLima, home: Path
) -> None:
    shared = home.parent / "shared"
    (shared / "data").mkdir(parents=True)
    # The global config is always trusted; its mount is fine when the VM is created.
    write(home / ".config" / "agentbox" / "config.yml", f"mounts:\n- location: {shared / 'data'}\n")
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    secrets = home / "secrets"
    (secrets / "data").mkdir(parents=True)
    shared.rename(home.parent / "shared.moved")
    shared.symlink_to(secrets)  # a path component turned into a symlink: Lima would now mount ~/secrets/data
    limactl.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1, result.stderr
    assert f"{shared / 'data'} now resolves to {secrets / 'data'}" in result.stderr
    assert "start" not in limactl.subcommands()
    assert limactl.status(NAME) == "Stopped"
    shared.unlink()
    (home.parent / "shared.moved").rename(shared)
    assert run_cli("start", cwd=project).exit_code == 0


def test_rendered_mount_of_the_home_folder_is_never_started(project: Path, limactl: FakeLima, home: Path) -> None:
    # vm.lima reaches Lima unchecked; the check before start still keeps the home folder out.
    write(home / ".config" / "agentbox" / "config.yml", f"vm:\n  lima:\n    mounts:\n    - location: {home.parent}\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code != 0
    assert str(home.parent) in result.stderr and "home folder" in result.stderr
    assert "start" not in limactl.subcommands()


def test_settings_agentbox_rendered_on_purpose_are_not_refused(project: Path, limactl: FakeLima, home: Path) -> None:
    # Entries in the form Lima fills in differently (templates, relative socket, ports) still match.
    write(home / ".config" / "agentbox" / "config.yml", """\
vm:
  lima:
    portForwards:
    - guestSocket: "{{.Home}}/docker.sock"
      hostSocket: docker.sock
    - guestPort: 8080
      reverse: true
    copyToHost:
    - guest: /etc/hostname
      host: "{{.Dir}}/hostname"
    networks:
    - lima: shared
    containerd:
      user: true
""")
    created = run_cli("start", cwd=project)
    assert created.exit_code == 0, created.stderr
    limactl.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "already running" in result.stderr and limactl.subcommands() == ["list"]
    # One more of the same, from a host-wide file, is an addition all the same.
    host_wide(limactl, "default.yaml", "networks:\n- lima: shared\n")
    assert run_cli("start", cwd=project).exit_code == 1
