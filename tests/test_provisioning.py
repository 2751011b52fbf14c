"""agentbox's provisioning and launch step as they run in the VM: the double runs the real scripts
(as root and as the unprivileged guest user, with stand-ins for apt, curl and the agents' npm
packages, since the guest has no network) and the readiness probe."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fake_limactl
from tests.helpers import FakeLima, needs_bwrap, run_cli, write

# These tests are about the provisioning scripts: the double runs them for real at every boot, never from
# recorded results (tests/fake_limactl/bootcache.py).
pytestmark = pytest.mark.real_boot

NAME = "agentbox-myproject"


def agentbox(project: Path, *args: str, input: bytes = b"", env: dict[str, str] | None = None,
             timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=project, capture_output=True,
                          input=input, timeout=timeout, env={**os.environ, **(env or {})})


def boot_log(limactl: FakeLima) -> str:
    return (fake_limactl.guest_dir(limactl.home, NAME, "var") / "log" / "cloud-init-output.log").read_text()


def boot_id(limactl: FakeLima) -> str:
    return (fake_limactl.instance_dir(limactl.home, NAME) / "boot-id").read_text()


@pytest.fixture
def started(project: Path, limactl: FakeLima) -> FakeLima:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    result = agentbox(project, "start")
    assert result.returncode == 0, result.stderr
    return limactl


def test_provisioning_runs_every_script_and_marks_the_boot(project: Path, started: FakeLima) -> None:
    state = fake_limactl.read_state(started.home, NAME)
    scripts = [(entry["mode"], entry["exit"]) for entry in state["provisionLog"]]
    assert scripts == [("system", 0)] * 4 + [("user", 0)], boot_log(started)
    home = started.guest_home(NAME)
    assert (home / ".agentbox" / "provisioned").read_text() == boot_id(started)
    assert (home / ".npmrc").read_text() == "prefix=/home/lima.guest/.local\n"
    usr_local = fake_limactl.guest_dir(started.home, NAME, "usr-local")
    assert (usr_local / "bin" / "node").is_file() and (usr_local / "include" / "node").is_dir()
    # node's tarball brings README.md, LICENSE and CHANGELOG.md beside bin/: they stay out of /usr/local
    assert sorted(p.name for p in usr_local.iterdir() if p.is_file()) == []


def test_unfinished_provisioning_is_reported_at_every_launch_until_a_restart(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    offline = agentbox(project, "start", env={"FAKE_LIMACTL_GUEST_OFFLINE": "1"})
    assert offline.returncode == 1
    assert b"provisioning did not finish" in offline.stderr and b"`agentbox restart`" in offline.stderr
    assert limactl.status(NAME) == "Running"  # degraded: Lima leaves it running
    assert "Could not resolve host: nodejs.org" in boot_log(limactl)
    for _ in range(2):
        launch = agentbox(project, "shell", "--", "true")
        assert launch.returncode == 0
        assert b"the VM's provisioning did not finish at its last start" in launch.stderr
        assert b"`agentbox restart` runs the provisioning again." in launch.stderr
    assert agentbox(project, "restart").returncode == 0
    healthy = agentbox(project, "shell", "--", "true")
    assert healthy.returncode == 0 and b"provisioning" not in healthy.stderr, healthy.stderr


def test_a_launch_waits_for_a_boot_that_is_still_provisioning(project: Path, started: FakeLima) -> None:
    # A start cut short (Ctrl-C, a timeout) leaves Lima booting the VM in the background.
    limactl = ["limactl", "--tty=false"]
    subprocess.run([*limactl, "stop", NAME], check=True, capture_output=True)
    slow = {**os.environ, "FAKE_LIMACTL_PROVISION_DELAY": "3"}
    cut_short = subprocess.run([*limactl, "start", "--timeout", "1s", NAME], capture_output=True, env=slow)
    assert cut_short.returncode == 1 and started.status(NAME) == "Running"
    launch = agentbox(project, "shell", "--", "true")
    assert launch.returncode == 0, launch.stderr
    assert b"waiting for the VM to finish provisioning" in launch.stderr
    assert b"did not finish" not in launch.stderr  # it finished while the launch waited


def test_a_boot_that_does_not_finish_in_startup_wait_stops_the_launch(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "startupWaitSec: 2\n")
    limactl = ["limactl", "--tty=false"]
    subprocess.run([*limactl, "stop", NAME], check=True, capture_output=True)
    hang = {**os.environ, "FAKE_LIMACTL_PROVISION_HANG": "1"}
    subprocess.run([*limactl, "start", "--timeout", "1s", NAME], capture_output=True, env=hang)
    launch = agentbox(project, "shell", "--", "true")
    assert launch.returncode == 125
    assert b"has not finished provisioning after 2s" in launch.stderr


def test_a_first_boot_waits_for_the_dpkg_lock(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    result = agentbox(project, "start", env={"FAKE_LIMACTL_APT_LOCK_SECONDS": "2,5"})
    assert result.returncode == 0, result.stderr
    log = boot_log(limactl)
    assert "Could not get lock /var/lib/apt/lists/lock" in log  # update retried
    assert "Waiting for cache lock" in log  # install waited
    exits = [entry["exit"] for entry in fake_limactl.read_state(limactl.home, NAME)["provisionLog"]]
    assert exits == [0, 0, 0, 0, 0]


def test_local_bin_is_on_path_once(project: Path, started: FakeLima) -> None:
    home = "/home/lima.guest"
    command = agentbox(project, "shell", "--", "printenv", "PATH")
    assert command.stdout.decode().split(":").count(f"{home}/.local/bin") == 1, command.stdout
    interactive = agentbox(project, "shell", input=b'echo "PATH=$PATH"\n')
    line = next(x for x in interactive.stdout.decode().splitlines() if x.startswith("PATH="))
    assert line[5:].split(":").count(f"{home}/.local/bin") == 1, line


def test_a_command_missing_in_the_vm_reads_like_a_shell(project: Path, started: FakeLima) -> None:
    agentbox(project, "shell", "--", "true")  # the one-time "checkpoints are off: not a git repository" note
    missing = agentbox(project, "shell", "--", "no-such-tool", "x")
    assert (missing.returncode, missing.stderr.decode()) == (127, "no-such-tool: command not found\n")
    no_file = agentbox(project, "shell", "--", "/nowhere/tool")
    assert (no_file.returncode, no_file.stderr.decode()) == (127, "/nowhere/tool: No such file or directory\n")
    directory = agentbox(project, "shell", "--", "/etc")
    assert (directory.returncode, directory.stderr.decode()) == (126, "/etc: Permission denied\n")


def test_an_unreachable_vm_gets_a_hint(project: Path, started: FakeLima) -> None:
    result = agentbox(project, "shell", "--", "true", env={"FAKE_LIMACTL_SHELL_SSH_FAIL": "1"})
    assert result.returncode == 255
    stderr = result.stderr.decode()
    assert "ssh reports that when the program in the VM was killed by a signal" in stderr
    assert "when it could not reach agentbox-myproject or lost its connection" in stderr
    assert "`agentbox restart`" in stderr and f"{started.home}/{NAME}/ha.stderr.log" in stderr


def test_a_vm_stopped_during_the_session_is_said_so(project: Path, started: FakeLima) -> None:
    """limactl shell exits 255 (ssh lost its connection): agentbox says the VM stopped, not that it was unreachable."""
    marker = started.guest_home(NAME) / "session-up"
    session = subprocess.Popen([sys.executable, "-m", "agentbox", "shell", "--", "bash", "-c",
                                "touch ~/session-up; exec sleep 1061"], cwd=project, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and session.poll() is None, session.communicate()
        time.sleep(0.05)
    subprocess.run(["limactl", "--tty=false", "stop", NAME], check=True, capture_output=True, timeout=60)
    _, stderr = session.communicate(timeout=60)
    assert session.returncode == 255
    text = stderr.decode()
    assert (f"agentbox: {NAME} stopped during the session (its status is now Stopped), so ssh lost its connection "
            "(exit 255); the next launch starts it again.") in text, text
    assert "could not reach" not in text


@pytest.mark.parametrize("agent,expected", [
    ("claude", "claude (stand-in) --dangerously-skip-permissions -p hello"),
    ("codex", "codex (stand-in) --dangerously-bypass-approvals-and-sandbox -p hello"),
    ("gemini", "gemini (stand-in) --approval-mode=yolo --no-sandbox -p hello"),
])
def test_agents_install_and_start_with_approvals_off(project: Path, started: FakeLima, agent: str, expected: str) -> None:
    result = agentbox(project, agent, "-p", "hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip() == expected
    assert (started.guest_home(NAME) / ".local" / "bin" / ("claude" if agent == "claude" else agent)).is_file()


def test_gemini_runs_in_a_trusted_folder_with_settings_it_accepts(project: Path, started: FakeLima) -> None:
    gemini = started.guest_home(NAME) / ".gemini"
    assert json.loads((gemini / "settings.json").read_text()) == {"security": {"auth": {"selectedType": "oauth-personal"}}}
    # Written by an older agentbox (and migrated by Gemini CLI): rejected on every run until repaired.
    (gemini / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "oauth-personal"}}, "tools": {"approvalMode": "yolo"},
        "general": {"defaultApprovalMode": "yolo", "vimMode": True}}))
    (gemini / "trustedFolders.json").write_text(json.dumps({"/elsewhere": "DO_NOT_TRUST"}))
    assert agentbox(project, "gemini", "-p", "hi").returncode == 0
    assert json.loads((gemini / "settings.json").read_text()) == {
        "security": {"auth": {"selectedType": "oauth-personal"}}, "general": {"vimMode": True}}
    assert json.loads((gemini / "trustedFolders.json").read_text()) == {
        "/elsewhere": "DO_NOT_TRUST", str(project): "TRUST_FOLDER"}
    before = (gemini / "trustedFolders.json").stat().st_mtime_ns
    assert agentbox(project, "gemini", "-p", "hi").returncode == 0
    assert (gemini / "trustedFolders.json").stat().st_mtime_ns == before  # already trusted: left alone


def test_every_staging_folder_and_file_is_private(project: Path, home: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    login = '{"claudeAiOauth": {"accessToken": "sk-ant-oat01-a", "refreshToken": "sk-ant-ort01-r"}}'
    write(home / ".claude" / ".credentials.json", login, mode=0o644)
    write(home / ".config" / "gh" / "hosts.yml", "github.com:\n    oauth_token: gho_t\n", mode=0o644)
    write(home / "onstart.sh", "true\n")
    write(home / ".config" / "agentbox" / "config.yml", "bootstrap:\n  onStartScript: ~/onstart.sh\nenv:\n  A: b\n")
    write(project / "agentbox.yml", "")
    assert agentbox(project, "claude", "-p", "x").returncode == 0
    staging = Path(os.environ["AGENTBOX_STATE_DIR"]) / "vms" / NAME / "staging"
    seen = {p.relative_to(staging).as_posix() for p in staging.rglob("*")}
    assert {"creds/home/.claude", "creds/home/.config/gh", "guards", "bootstrap", "env", "broker/ca.crt"} <= seen
    for path in [staging, *staging.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, f"{path}: {oct(mode)}"
        else:
            assert mode & 0o077 == 0, f"{path}: {oct(mode)}"


def test_doctor_counts_only_a_real_gemini_login(project: Path, home: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    write(home / ".gemini" / "installation_id", "abc")
    write(home / ".gemini" / "state.json", "{}")

    def checks() -> list[dict[str, str]]:
        return json.loads(run_cli("doctor", "--json", cwd=project).stdout)

    def gemini_check() -> dict[str, str]:
        return next(c for c in checks() if c["check"] == "credentials.gemini")

    # installation_id and state.json are no login: gemini is not one of the agents in use
    agents = next(c for c in checks() if c["check"] == "agents")
    assert agents["message"].startswith("no agent is set in the config or logged in") and "gemini" in agents["message"]
    assert not any(c["check"] == "credentials.gemini" for c in checks())
    write(home / ".gemini" / "oauth_creds.json", "{}")
    assert gemini_check()["message"].startswith("gemini: logged in on the host")
