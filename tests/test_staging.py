"""The staging contract: the host's option table and launch.sh's parser agree, launch.sh refuses an option it
does not know, and the staging folder holds what agentbox/session/staging.py says, with the modes it says."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox import paths, staginglayout
from agentbox.net import guard as netguard
from agentbox.net import policy as netpolicy
from agentbox.session import staging
from tests.helpers import NAME, FakeLima, run_agentbox, write, write_trusted

REPO = Path(__file__).resolve().parent.parent
LAUNCH_SH = REPO / "provision" / "launch.sh"
LAUNCH_PARTS = REPO / "provision" / staginglayout.LAUNCH_PARTS  # launch.sh's sourced parts (tests/test_launch_parts.py)
ISOLATED_OPTIONS = ("--isolated-from", "--base", "--outbox", "--chdir", "--copy-aside")
# A background task's launch only, and `agentbox AGENT --worktree NAME`'s (tests/test_tasks.py sends them).
TASK_OPTIONS = ("--task", "--isolated-task", "--worktree", "--worktree-branch", "--worktree-base")
SESSION_OPTIONS = ("--session", "--session-attach", "--session-reply", "--session-events", "--session-live")
PUSH_OPTIONS = ("--push-namespace",)  # git.allowPush: session's only (tests/test_scoped_push.py sends it)
START_OPTIONS = ("--setup-only",)  # agentbox start's only (tests/test_setup_digest.py)
PROBE_SH = REPO / "provision" / "doctor-probe.sh"


def launch_sh_options() -> dict[str, bool]:
    """The options launch.sh's parser knows: {name: whether it takes a value}, read from its case labels."""
    text = LAUNCH_SH.read_text()
    loop = re.search(r'^while \[ \$# -gt 0 \]; do\n  case "\$1" in\n(.*?)^  esac\ndone\n', text, re.S | re.M)
    assert loop, "launch.sh's option loop was not found"
    labels = re.findall(r"^    (--[a-z-]+)\) (.*)$", loop.group(1), re.M)
    return {label: '"$2"' in body for label, body in labels}


def test_launch_sh_knows_exactly_the_host_options() -> None:
    table = {option.name: option.value is not None for option in staginglayout.LAUNCH_OPTIONS}
    assert launch_sh_options() == table


def test_launch_options_follow_the_table_and_refuse_an_option_launch_sh_lacks() -> None:
    argv = staginglayout.launch_options({
        "--on-start": ["s"], "--install": "", "--binary": "claude", "--timing": True, "--guards": "on",
        "--workspace": "/w", "--wait": "30", "--on-create": ["a", "b"],
    })
    assert argv == ["--wait", "30", "--workspace", "/w", "--guards", "on", "--timing", "--binary", "claude",
                    "--install", "", "--on-create", "a", "--on-create", "b", "--on-start", "s"]
    assert staginglayout.launch_options({"--timing": False, "--on-create": []}) == []
    with pytest.raises(ValueError, match="--from-a-newer-host"):
        staginglayout.launch_options({"--from-a-newer-host": "x"})
    with pytest.raises(ValueError, match="--wait"):
        staginglayout.launch_options({"--wait": ["1", "2"]})


def run_launch_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    home = tmp_path / "guest-home"
    home.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(LAUNCH_SH), *args], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(home)}, timeout=30)


@pytest.mark.parametrize("args", [
    ["--from-a-newer-host", "value", "--", "touch", "ran"],
    ["--wait", "5", "-x", "--", "touch", "ran"],
    ["--from-a-newer-host", "touch", "ran"],
])
def test_launch_sh_refuses_an_unknown_option(tmp_path: Path, args: list[str]) -> None:
    result = run_launch_sh(tmp_path, *args)
    unknown = next(arg for arg in args if arg.startswith("-") and arg not in ("--wait", "--"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"agentbox: launch.sh: unknown option {unknown} (agentbox and its staged launch.sh "
                             "disagree; run the command again)\n")
    assert not (tmp_path / "ran").exists()


@pytest.mark.skipif(os.path.exists("/run/lima-boot-done"), reason="in a Lima VM launch.sh would go on and set it up")
def test_launch_sh_accepts_every_option_the_host_sends(tmp_path: Path) -> None:
    values: dict[str, staginglayout.OptionValue] = {
        option.name: True if option.value is None else [str(tmp_path / "x.sh")] if option.repeated else "1"
        for option in staginglayout.LAUNCH_OPTIONS
    }
    values["--wait"] = "0"  # this host is no VM that finished booting: launch.sh gives up on it at once
    result = run_launch_sh(tmp_path, *staginglayout.launch_options(values), "--", "touch", "ran")
    assert result.returncode == 125, result.stderr  # past the options, at its first step
    assert "has not finished provisioning after 0s" in result.stderr


def test_unknown_option_is_refused_in_the_vm(project: Path, vm: FakeLima) -> None:
    """Through the double's real shell: a staged launch.sh older than the host stops instead of running `--foo`."""
    launched = subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project,
                              capture_output=True, timeout=120)
    assert launched.returncode == 0, launched.stderr
    script = paths.staging_dir(NAME) / staginglayout.LAUNCH_SCRIPT
    marker = project / "ran"
    result = subprocess.run(["limactl", "shell", NAME, "--", "/bin/bash", str(script), "--from-a-newer-host",
                             "--", "touch", str(marker)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "agentbox: launch.sh: unknown option --from-a-newer-host" in result.stderr
    assert not marker.exists()


def test_a_launch_sends_every_option_and_launch_sh_takes_them(project: Path, vm: FakeLima, home: Path) -> None:
    """An agent with an install command, both bootstrap kinds, its own setup to sync and --timings: every option
    of the table reaches launch.sh, which runs the session; the staging folder holds the documented files with
    the documented modes."""
    write(home / ".codex" / "auth.json", '{"OPENAI_API_KEY": "sk-proj-the-host-key-1234"}', mode=0o644)
    write(home / ".codex" / "AGENTS.md", "Be brief.\n")
    write(home / ".gitconfig", "[user]\n\tname = Someone\n")
    write(project / "create.sh", "echo created >> boot.log\n")
    write(project / "start.sh", "echo started >> boot.log\n")
    install = "mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho tool-ran\\n' > ~/.local/bin/mytool && chmod +x ~/.local/bin/mytool"
    write_trusted(project, "env:\n  MY_VAR: hi\nbootstrap:\n  onCreateScript: create.sh\n  onStartScript: start.sh\n"
                           f"agents:\n  codex:\n    binary: mytool\n    install: {install!r}\n")
    result = subprocess.run([sys.executable, "-m", "agentbox", "--timings", "codex"], cwd=project,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "tool-ran\n"
    assert (project / "boot.log").read_text() == "created\nstarted\n"
    assert (vm.guest_home(NAME) / ".codex" / "AGENTS.md").read_text().startswith("Be brief.\n<!-- BEGIN AGENTBOX")
    assert "setup step (launch.sh)" in result.stderr
    shell = next(argv for argv in vm.calls() if "shell" in argv)
    sent = {arg for arg in shell if arg.startswith("--")}
    # Isolated mode's options go with an isolated launch only (tests/test_isolated.py sends them), a kept
    # session's with a kept launch (tests/test_sessions.py), a task's with a task (tests/test_tasks.py), scoped
    # pushes' with git.allowPush: session (tests/test_scoped_push.py), the setup alone with agentbox start.
    others = {*ISOLATED_OPTIONS, *SESSION_OPTIONS, *TASK_OPTIONS, *PUSH_OPTIONS, *START_OPTIONS}
    assert {option.name for option in staginglayout.LAUNCH_OPTIONS} - others <= sent
    assert not sent & others

    folder = paths.staging_dir(NAME)
    found = {path.relative_to(folder).as_posix(): stat.S_IMODE(path.lstat().st_mode) for path in folder.rglob("*")}
    executable = {staginglayout.LAUNCH_SCRIPT, staginglayout.OPEN_URL, staginglayout.MEMORY_SCRIPT, staginglayout.TASK_RUNNER,
                  staginglayout.SESSION_SCRIPT, staginglayout.ATTENTION_SCRIPT,
                  *(f"{staginglayout.GUARDS}/{name}" for name in staginglayout.GUARD_FILES)}
    memory = "sync/memory-files/home/.codex/AGENTS.md"  # every agent's memory file travels apart
    synced = {"sync/codex/manifest", "sync/codex/stamps.json", "sync/memory-files/manifest",
              "sync/memory-files/stamps.json", memory}
    named = {staginglayout.ENV_FILE, staginglayout.CREDS_MANIFEST, staginglayout.CREDS_STAMPS, staginglayout.GIT_IDENTITY,
             staginglayout.GIT_IDENTITY_STAMP, f"{staginglayout.CREDS_HOME}/.codex/auth.json", "sync/defaults", *synced,
             staginglayout.CONTEXT_FILE, staginglayout.MEMORY_BLOCK, staginglayout.CONTEXT_TOOLS, staginglayout.CONTEXT_DIGESTS,
             staginglayout.TMUX_CONF, staginglayout.CLAUDE_HOOKS, staginglayout.NETWORK_RULES, staginglayout.BROKER_CA,
             staginglayout.BROKER_CA_DIGEST, *executable}
    folders = {staginglayout.GUARDS, staginglayout.BOOTSTRAP, staginglayout.CREDS, staginglayout.CREDS_HOME, f"{staginglayout.CREDS_HOME}/.codex",
               "sync", "sync/codex", "sync/memory-files", "sync/memory-files/home", "sync/memory-files/home/.codex",
               staginglayout.CONTEXT, staginglayout.BROKER, staginglayout.GO_MARKERS, staginglayout.CANARIES}
    copies = {name for name in found if name.startswith(f"{staginglayout.BOOTSTRAP}/")}
    parts = {f"{staginglayout.LAUNCH_PARTS}/{part.name}" for part in LAUNCH_PARTS.glob("*.sh")}
    assert len(parts) > 5
    folders.add(staginglayout.LAUNCH_PARTS)
    assert set(found) == named | folders | copies | parts
    assert all((folder / part).read_bytes() == (REPO / "provision" / part).read_bytes() for part in parts)
    assert [re.fullmatch(r"bootstrap/[0-9a-f]{16}-(create|start)\.sh", name) is not None for name in copies] == [True] * 2
    assert {name: mode for name, mode in found.items() if mode != 0o600} == {
        **dict.fromkeys(executable, 0o700), **dict.fromkeys(folders, 0o700)}
    # the config's env, then the proxy's variables (the credential broker serves the VM in every mode)
    port = netguard.running(NAME).port  # type: ignore[union-attr]
    proxy = "".join(f"{key}={value}\0" for key, value in netpolicy.proxy_env(port, netguard.secret(NAME)).items())
    assert (folder / staginglayout.ENV_FILE).read_bytes() == f"MY_VAR=hi\0{proxy}".encode()
    documented = staging.__doc__ or ""
    assert "    launch/PART.sh " in documented
    for name in named - {f"{staginglayout.CREDS_HOME}/.codex/auth.json", memory}:
        name = name.replace("sync/codex/", "sync/AGENT/").replace("sync/memory-files/", "sync/AGENT/")
        assert re.search(rf"^    {re.escape(name)}\b|, {re.escape(name)}\b|^      {re.escape(name)}\b", documented, re.M), name
    assert "    creds/home/PATH " in documented and "    bootstrap/SHA-NAME " in documented
    assert "    sync/AGENT/home/PATH " in documented


def test_doctor_probe_and_launch_sh_agree_on_the_guards() -> None:
    """doctor-probe.sh recognises what launch.sh installs: the wrappers' marker, the hooks folder."""
    launch, probe = (LAUNCH_PARTS / "guards.sh").read_text(), PROBE_SH.read_text()
    marker = re.search(r'^readonly_marker="([^"]+)"$', launch, re.M)
    hooks = re.search(r'^hooks_dir="([^"]+)"$', launch, re.M)
    assert marker and hooks
    assert re.search(rf'^marker="{re.escape(marker.group(1))}"', probe, re.M)
    assert re.search(rf'^hooks_dir="{re.escape(hooks.group(1))}"', probe, re.M)
    for wrapper in ("git", "gh"):
        assert f"# {marker.group(1)}\n" in (REPO / "wrappers" / wrapper).read_text()


def test_timings_are_a_table_names_in_one_column_numbers_right_aligned_in_another(vm: FakeLima,
                                                                                     project: Path) -> None:
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n")
    result = run_agentbox("--timings", "claude", "-p", "hi", cwd=project, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    block = lines[lines.index("agentbox timings:") + 1:]
    block = block[: next((i for i, line in enumerate(block) if not line.startswith("  ")), len(block))]
    assert len(block) >= 5 and block[-1].startswith("  total (since agentbox was loaded) "), block
    assert max(len(line.split("  ")[1]) for line in block) > 34  # a name longer than the column once was
    for line in block:
        assert re.fullmatch(r"  \S.*?\s+\d+\.\d ms", line), line
    assert len({len(line) for line in block}) == 1, "\n".join(block)  # the numbers end in one column
