"""Real Claude Code in a terminal never stops at a one-time question in the VM (issue 27, item 6).

The real-distribution tier (tests/test_real_distro_broker.py: the cached Debian userspace, the real CLI, the real
broker against the fake upstream) with Claude Code started interactively, as a launch starts it (agentbox's
approvals-off flag and settings), in a tmux pane on the host whose program is the userspace's: the test reads the
screen. The VM's ~/.claude.json is the broker's placeholder companion, then launch.sh's own mark_claude_onboarded
(provision/launch/home.sh, run with the host's bash and jq over the guest's home) marks it.

The control first: without the mark, the same start stops at the folder-trust question (so the screen is read).

Run: python3 -m pytest -n 0 -m realdistro tests/test_real_distro_claude_prompts.py -s   (as root)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agentbox.agents import claude
from agentbox.vm import provisioning
from tests.test_real_distro import Machine
from tests.test_real_distro_broker import (  # noqa: F401 # userspace: the module's fixture, used by name
    CLAUDE_REQUEST,
    CLIS,
    GUEST_BUNDLE,
    GUEST_CA,
    GUEST_HOME,
    UID,
    USER,
    Broker,
    broker,
    claude_host_login,
    claude_routes,
    real,
    userspace,
)

pytestmark = [pytest.mark.realdistro, pytest.mark.xdist_group("realdistro"), pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
WORKSPACE = f"{GUEST_HOME}/work"
# What Claude Code shows when it waits for a person: the folder-trust question, the bypass-permissions
# acceptance, the onboarding's theme choice and login.
QUESTIONS = ("Accessing workspace", "Yes, I trust this folder", "trust the files in this folder", "Yes, I accept", "Bypass Permissions mode",
             "Choose the text style", "Select login method", "Press Enter to continue")
READY = ("? for shortcuts", "bypass permissions on")


def _guest_home(machine: Machine, running: Broker) -> Path:
    shutil.copyfile(running.authority.cert, machine.path(GUEST_CA))
    machine.run(["update-ca-certificates", "--fresh"], timeout=120)
    home = machine.path(GUEST_HOME)
    shutil.rmtree(home)
    home.mkdir(mode=0o700)
    files = {**running.prepared.files}
    settings = claude.RECORD.settings
    assert settings is not None
    files[settings.path] = provisioning.home_files()[settings.path].encode()  # a new VM's settings: approvals off
    for relative, data in files.items():
        target = home / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o600)
    (home / "work").mkdir()
    (home / "work" / "README.md").write_text("a project\n")
    return home


def _mark(home: Path) -> None:
    """launch.sh's mark_claude_onboarded over the guest's home, as the launch runs it (binary claude)."""
    program = (f"set -euo pipefail\nstate={shlex.quote(str(home))}/.agentbox\nmkdir -p \"$state\"\n"
               f"workspace={shlex.quote(WORKSPACE)}\nbinary=claude\nworktree=\n"
               f"source {REPO / 'provision/launch/common.sh'}\nsource {REPO / 'provision/launch/home.sh'}\n"
               "mark_claude_onboarded\n")
    subprocess.run(["bash", "-c", program], check=True, env={"HOME": str(home), "PATH": os.environ["PATH"]})


def _screen(machine: Machine, running: Broker, tmp_path: Path, name: str, seconds: float = 90) -> str:
    """Claude Code started in the workspace in a tmux pane; the screen once it shows a question or its prompt."""
    machine.run(["chown", "-R", f"{USER}:{USER}", GUEST_HOME])
    proxy = f"http://127.0.0.1:{running.proxy.port}"
    variables = {"HOME": GUEST_HOME, "USER": USER, "PATH": f"{CLIS}/bin:/usr/local/bin:/usr/bin:/bin",
                 "TERM": "xterm-256color", "HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy,
                 "http_proxy": proxy, "NO_PROXY": "", "NODE_EXTRA_CA_CERTS": GUEST_BUNDLE,
                 "SSL_CERT_FILE": GUEST_BUNDLE, **running.prepared.env}
    argv = ["env", "-i", *(f"{k}={v}" for k, v in variables.items()), "sh", "-c",
            f'cd {WORKSPACE} && exec "$@"', "sh", "claude", *claude.RECORD.default_args]
    full = machine.command(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups", *argv])
    socket = tmp_path / f"tmux-{name}"
    tmux = ["tmux", "-S", str(socket)]
    environment = {"R": str(machine.root), "PATH": os.environ["PATH"], "TERM": "xterm-256color"}
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-x", "140", "-y", "45", "-s", name,
                    "env", f"R={machine.root}", *full], check=True, env=environment)
    screen = ""
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(1)
            shown = subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True,
                                   env=environment)
            if shown.returncode != 0:
                break  # the program ended
            screen = shown.stdout
            if any(q in screen for q in QUESTIONS) or any(r in screen for r in READY):
                time.sleep(5)  # a question drawn just after the prompt (the auto-mode nudge) would show now
                screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True,
                                        text=True, env=environment).stdout or screen
                break
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, env=environment)
    print(f"===== {name}\n{screen}")
    return screen


def test_claude_code_reaches_its_prompt_with_no_question_in_a_marked_vm(userspace: Machine,  # noqa: F811
                                                                        tmp_path: Path) -> None:
    if shutil.which("tmux") is None or shutil.which("jq") is None:
        pytest.skip("tmux and jq are needed on the host")
    access, refresh = real("sk-ant-oat01-"), real("sk-ant-ort01-")
    claude_host_login(access, refresh, expires_in=3600)
    with broker(tmp_path, CLAUDE_REQUEST, claude_routes(access)) as running:
        _guest_home(userspace, running)
        control = _screen(userspace, running, tmp_path, "unmarked")
        assert any(q in control for q in QUESTIONS), control  # the control: unmarked, it asks

        home = _guest_home(userspace, running)
        _mark(home)
        state = json.loads((home / ".claude.json").read_text())
        assert state["projects"][WORKSPACE]["hasTrustDialogAccepted"] is True
        screen = _screen(userspace, running, tmp_path, "marked")
        assert not [q for q in QUESTIONS if q in screen], screen
        assert any(r in screen for r in READY), screen
