"""A launch with nothing changed runs no setup in the VM (launch.sh --setup-digest, provision/launch/current.sh); each
kind of change makes the next launch run the setup and apply it. Through the CLI and the double's real shell.

Every program the guest user's PATH finds is wrapped (guest /usr/local/bin, first on PATH) by a shim that logs its name
when launch.sh itself starts it, then runs the real one: a launch that logs nothing started no process before the
program.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.gitrepo import git
from tests.helpers import NAME, STUB, FakeLima, needs_bwrap, run_cli, staged_logins, write, write_trusted

LOG = ".agentbox-calls.log"  # in the guest home
STARTED = 'open(os.path.expanduser("~/.agentbox-calls.log"), "a").write("(agent)\\n")'
SHIM = r"""#!/bin/sh
# logs its name when launch.sh started it (its parent's command line), then runs the real program
name=${0##*/}
case "$({ /usr/bin/tr '\0' ' ' < "/proc/$PPID/cmdline"; } 2>/dev/null)" in
  "/bin/bash /"*"/launch.sh "*) printf '%s\n' "$name" >> "$HOME/.agentbox-calls.log" ;;
esac
exec REAL "$@"
"""


@pytest.fixture
def vm(project: Path, limactl: FakeLima, home: Path) -> FakeLima:
    """The project's VM, started, a stand-in codex and claude, and every program on the guest's PATH shimmed."""
    needs_bwrap()
    staged_logins(home)
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n")
    assert run_cli("start", cwd=project).exit_code == 0
    bin_dir = limactl.home / NAME / "guestfs" / "usr-local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in ("codex", "claude"):  # the stub agents say when they start
        write(bin_dir / binary, STUB.replace("import json, os, sys\n", f"import json, os, sys\n{STARTED}\n", 1),
              mode=0o755)
    sudo = bin_dir / "sudo"
    target = os.readlink(sudo)
    sudo.unlink()
    write(sudo, SHIM.replace("REAL", target), mode=0o755)
    write(bin_dir.parent / "lib" / "agentbox-shim", SHIM.replace("REAL", '"/usr/bin/$name"'), mode=0o755)
    for entry in os.scandir("/usr/bin"):
        if not (bin_dir / entry.name).exists() and os.access(entry.path, os.X_OK) and entry.name.isprintable():
            (bin_dir / entry.name).symlink_to("/usr/local/lib/agentbox-shim")  # the guest's path
    limactl.clear()
    return limactl


def launch(project: Path, agent: str = "codex") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", agent, "exec", "hi"], cwd=project,
                          capture_output=True, input=b"", timeout=120)


def calls(vm: FakeLima) -> list[str]:
    """The programs launch.sh started before the agent since the last call (and forget them all)."""
    log = vm.guest_home(NAME) / LOG
    if not log.exists():
        return []
    names = log.read_text().split()
    log.unlink()
    return names[:names.index("(agent)")] if "(agent)" in names else names


def warm(project: Path, vm: FakeLima, agent: str = "codex") -> None:
    """Launch until the setup is recorded; the next launch then runs nothing."""
    assert launch(project, agent).returncode == 0
    calls(vm)


def test_a_launch_with_nothing_changed_starts_no_process_before_the_agent(project: Path, vm: FakeLima) -> None:
    for agent in ("codex", "claude"):
        first = launch(project, agent)
        assert first.returncode == 0, first.stderr
        assert {"flock", "mkdir", "cmp"} <= set(calls(vm))  # the shims see the setup's programs
        (project / ".stub-out.json").unlink()
        second = launch(project, agent)
        assert second.returncode == 0, second.stderr
        assert calls(vm) == [], (first.stderr, second.stderr)
        assert (project / ".stub-out.json").exists()  # the agent ran
    assert (vm.guest_home(NAME) / ".agentbox" / "setup.applied").read_text().count(" ") == 1


@pytest.mark.parametrize("change", ["credential", "synced file", "env", "network mode", "guards off", "bootstrap",
                                    "boot id", "agent removed", "guard removed"])
def test_each_change_makes_the_next_launch_apply_it(project: Path, vm: FakeLima, home: Path, isolated_env,
                                                    change: str) -> None:
    guest = vm.guest_home(NAME)
    write(home / ".codex" / "auth.json", '{"token": "v1"}', mode=0o600)
    write(home / ".codex" / "prompts" / "review.md", "v1\n")
    write(project / "install-codex.sh", "mkdir -p ~/.local/bin && printf '%s\\n' '#!/bin/sh' "
          "'echo \"(agent)\" >> ~/.agentbox-calls.log' 'echo reinstalled > \"$AGENTBOX_TEST_OUT\"' "
          "> ~/.local/bin/codex && chmod +x ~/.local/bin/codex\n")
    config = f"agents:\n  codex:\n    install: sh {project / 'install-codex.sh'}\n" + \
        (project / "agentbox.yml").read_text()
    write_trusted(project, config)
    warm(project, vm)
    warm(project, vm)
    assert launch(project).returncode == 0 and calls(vm) == []  # nothing changed: nothing ran
    record = guest / ".agentbox" / "setup.applied"
    digest, boot = record.read_text().split()

    if change == "credential":
        write(home / ".codex" / "auth.json", '{"token": "v2"}', mode=0o600)
    elif change == "synced file":
        write(home / ".codex" / "prompts" / "review.md", "v2\n")
    elif change == "env":
        write_trusted(project, config + "  GH_TOKEN: t0ken\n")
    elif change == "network mode":
        write_trusted(project, config + "network:\n  mode: offline\n")
    elif change == "guards off":
        write_trusted(project, config + "sync:\n  remoteWrite: true\n")
    elif change == "bootstrap":
        write(project / "setup.sh", "echo ran > bootstrap-ran\n")
        write_trusted(project, config + "bootstrap:\n  onStartScript: setup.sh\n")
    elif change == "boot id":
        write(vm.home / NAME / "boot-id", "0b0b0b0b-0000-4000-8000-000000000001\n")
    elif change == "agent removed":
        (vm.home / NAME / "guestfs" / "usr-local" / "bin" / "codex").unlink()
    elif change == "guard removed":
        (guest / ".config" / "agentbox" / "hooks" / "pre-push").unlink()

    result = launch(project)
    assert result.returncode == 0, result.stderr
    ran = calls(vm)
    assert "flock" in ran, ran  # the setup ran
    if change == "credential":
        assert (guest / ".codex" / "auth.json").read_text() == '{"token": "v2"}'
    elif change == "synced file":
        assert (guest / ".codex" / "prompts" / "review.md").read_text() == "v2\n"
    elif change == "env":
        assert "git" in ran  # configure_git: gh's credential helper, now that GH_TOKEN is set
    elif change == "network mode":
        staged = isolated_env["state"] / "vms" / NAME / "staging" / "network.nft"
        assert "sudo" in ran and "network.mode offline" in staged.read_text()
        assert (vm.home / NAME / "guestfs" / "run" / "agentbox" / "network.nft").read_text() == staged.read_text()
    elif change == "guards off":
        assert not (guest / ".local" / "bin" / "git").exists()
    elif change == "bootstrap":
        assert (project / "bootstrap-ran").read_text() == "ran\n"
    elif change == "agent removed":
        assert (project / ".stub-out.json").read_text() == "reinstalled\n"
    elif change == "guard removed":
        assert (guest / ".config" / "agentbox" / "hooks" / "pre-push").exists()
    # what the record says: the host's digest changed, or the VM's boot, or (a change in the VM) neither
    new_digest, new_boot = record.read_text().split()
    assert (new_digest != digest) == (change not in ("boot id", "agent removed", "guard removed"))
    assert (new_boot != boot) == (change == "boot id")
    # and then it is recorded: the launch after runs nothing again
    assert launch(project).returncode == 0
    assert calls(vm) == []


def test_a_tool_installed_in_the_vm_updates_the_description_alone(project: Path, vm: FakeLima) -> None:
    """The sandbox's description changes between launches (a tool installed, a new start checkpoint) while the rest
    of the setup stays: only its step runs, under the lock, not the whole setup."""
    warm(project, vm)
    assert launch(project).returncode == 0 and calls(vm) == []
    record = (vm.guest_home(NAME) / ".agentbox" / "setup.applied").read_text()
    write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / "gemini", "#!/bin/sh\n", mode=0o755)  # absent before

    assert launch(project).returncode == 0
    ran = calls(vm)
    assert {"flock", "jq", "sudo"} <= set(ran), ran
    assert not {"git", "mkdir", "grep"} & set(ran), ran  # the full setup starts with mkdir, sets git, checks guards
    described = json.loads((vm.home / NAME / "guestfs" / "run" / "agentbox" / "context.json").read_text())
    assert {tool["name"]: tool["path"] for tool in described["tools"]["list"]}["gemini"] == "/usr/local/bin/gemini"
    assert (vm.guest_home(NAME) / ".agentbox" / "setup.applied").read_text() == record
    assert launch(project).returncode == 0 and calls(vm) == []


# -- what launch.sh itself does when nothing changed, seen by strace ------------------------------------------------

SETUP_PARTS = {"sync.sh", "bootstrap.sh", "isolated.sh", "notify.sh"}  # launch.sh's parts only its setup runs
CLONE = re.compile(r"^(\d+) +.*\b(?:clone3?|v?fork)\(.*= (\d+)(?: /\* (\d+) in strace's PID NS \*/)?$")
EXECVE = re.compile(r'^(\d+) +execve\("([^"]+)", \[(.*?)\], .* = 0$')
OPENED = re.compile(r'^(\d+) +openat\(AT_FDCWD, "[^"]*/launch/([a-z]+\.sh)", .* = \d+$')


class Traced(NamedTuple):
    parts: set[str]  # the parts launch.sh read
    before_agent: list[str]  # what each process launch.sh started before the agent ran ("(subshell)": no exec)


def whole_calls(trace: str) -> list[str]:
    """strace -f's lines, a call another process interrupted ("<unfinished ...>", "<... NAME resumed>") put together."""
    lines, pending = [], {}
    for line in trace.splitlines():
        pid, _, rest = line.partition(" ")
        rest = rest.lstrip()
        if line.endswith(" <unfinished ...>"):
            pending[pid] = line.removesuffix(" <unfinished ...>")
        elif rest.startswith("<... ") and pid in pending:
            lines.append(pending.pop(pid) + rest.partition(" resumed>")[2])
        else:
            lines.append(line)
    return lines


def traced_launch(project: Path, tmp_path: Path, *args: str) -> Traced:
    """`agentbox codex ARGS exec hi` under strace -f: the processes launch.sh started, in order, and the parts it read.
    A child's pid is the one strace names it by (--decode-pids=pidns: the guest's pid namespace is the double's)."""
    trace = tmp_path / "strace.out"
    result = subprocess.run(["strace", "-f", "-qq", "-s", "4096", "--decode-pids=pidns", "-e", "signal=none",
                             "-e", "trace=execve,clone,clone3,fork,vfork,openat", "-o", str(trace),
                             sys.executable, "-m", "agentbox", "codex", *args, "exec", "hi"],
                            cwd=project, capture_output=True, input=b"", timeout=120)
    assert result.returncode == 0, result.stderr
    lines = whole_calls(trace.read_text())
    start = next(index for index, line in enumerate(lines)
                 if (match := EXECVE.match(line)) and re.match(r'"[^"]*bash", "[^"]*/launch\.sh"', match[3]))
    launch = int(lines[start].split()[0])
    lines = lines[start:]  # the same process ran the login shell before it was launch.sh
    children: list[int] = []
    parts: set[str] = set()
    for line in lines:
        if (clone := CLONE.match(line)) and int(clone[1]) == launch:
            children.append(int(clone[3] or clone[2]))
        elif (opened := OPENED.match(line)) and int(opened[1]) == launch:
            parts.add(opened[2])
    ran = {}
    for line in lines:
        if (execve := EXECVE.match(line)) and int(execve[1]) in children:
            ran.setdefault(int(execve[1]), execve[2])
    started = [ran.get(child, "(subshell)") for child in children]
    agent = next((index for index, program in enumerate(started) if program.endswith("/codex")), len(started))
    return Traced(parts, started[:agent])


@pytest.mark.needs("strace", "git")
def test_a_launch_with_nothing_changed_forks_nothing_and_reads_only_the_parts_it_runs(
        project: Path, vm: FakeLima, tmp_path: Path) -> None:
    """Not even a subshell or a fork without exec (the shims above see only programs found on PATH): bash's builtins
    alone, from the digest compare to the agent, in a worktree too; and of launch.sh's parts only those it runs."""
    git(project, "init", "-q")
    git(project, "commit", "-q", "--allow-empty", "-m", "start")
    every_part = {path.name for path in (Path(__file__).parent.parent / "provision" / "launch").glob("*.sh")}
    for args in ((), ("--worktree", "w1")):
        setup = traced_launch(project, tmp_path, *args)
        assert setup.parts == every_part  # the control: the setup reads them all, and starts programs
        assert "(subshell)" in setup.before_agent and len(setup.before_agent) > 5, setup.before_agent
        calls(vm)
        unchanged = traced_launch(project, tmp_path, *args)
        assert calls(vm) == []
        assert unchanged.before_agent == [], unchanged.before_agent
        assert unchanged.parts == every_part - SETUP_PARTS


# -- agentbox start does the first launch's setup -------------------------------------------------------------------


def test_start_sets_up_the_first_launch_so_it_runs_no_setup(project: Path, limactl: FakeLima, home: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`agentbox start` runs launch.sh's setup for the default agent (claude here), without running it: the first
    launch after it, a session or a task, finds the setup recorded and skips it, in one limactl call."""
    needs_bwrap()
    monkeypatch.delenv("AGENTBOX_START_SETUP")  # the suite's VMs skip it (tests/conftest.py)
    staged_logins(home)
    write_trusted(project, "agents:\n  claude:\n    binary: /bin/true\n")
    started = run_cli("start", cwd=project)
    assert started.exit_code == 0, started.stderr
    assert re.search(f"^Setting up VM {NAME} for the first launch of claude: done \\(\\d+s\\)$", started.stderr, re.M)
    record = limactl.guest_home(NAME) / ".agentbox" / "setup.applied"
    applied = (record.read_text(), record.stat().st_mtime_ns)
    assert applied[0].count(" ") == 1  # DIGEST BOOT-ID: a setup that finished

    limactl.clear()
    session = subprocess.run([sys.executable, "-m", "agentbox", "claude", "-p", "hi"], cwd=project,
                             capture_output=True, input=b"", timeout=120)
    assert session.returncode == 0, session.stderr
    assert (record.read_text(), record.stat().st_mtime_ns) == applied  # launch.sh rewrites it after a setup
    assert limactl.subcommands() == ["shell"]  # start checked the VM: the first launch is warm
    task = run_cli("run", "--", "hi", cwd=project)
    assert task.exit_code == 0, task.stderr
    assert (record.read_text(), record.stat().st_mtime_ns) == applied

    # the control: another agent's first launch does set up (its binary, its own setup)
    write_trusted(project, "agents:\n  claude:\n    binary: /bin/true\n  kiro:\n    binary: /bin/true\n")
    other = subprocess.run([sys.executable, "-m", "agentbox", "kiro", "hi"], cwd=project, capture_output=True,
                           input=b"", timeout=120)
    assert other.returncode == 0, other.stderr
    assert record.stat().st_mtime_ns != applied[1] and record.read_text() != applied[0]


def test_a_setup_that_fails_at_start_is_a_warning_and_the_first_launch_runs_it(
        project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_bwrap()
    monkeypatch.delenv("AGENTBOX_START_SETUP")
    write(project / "once.sh", "[ -e ran-once ] && exit 0; touch ran-once; exit 3\n")  # fails the first time only
    write_trusted(project, "agents:\n  claude:\n    binary: /bin/true\nbootstrap:\n  onStartScript: once.sh\n")
    started = run_cli("start", cwd=project)
    assert started.exit_code == 0, started.stderr
    assert re.search(f"^Setting up VM {NAME} for the first launch of claude: failed \\(\\d+s\\)\n"
                     r"agentbox: running onStartScript /\S+-once\.sh\n"
                     r"agentbox: onStartScript /\S+-once\.sh failed with exit code 3; the agent was not started\.\n",
                     started.stderr, re.M), started.stderr
    assert (f"agentbox: warning: {NAME} runs, but setting it up for the first launch of claude did not finish "
            "(launch.sh exited 3; its messages are above); that launch tries the setup again\n") in started.stderr
    record = limactl.guest_home(NAME) / ".agentbox" / "setup.applied"
    assert not record.exists() or record.read_text() == ""  # nothing recorded: the first launch sets up
    launched = subprocess.run([sys.executable, "-m", "agentbox", "claude", "-p", "hi"], cwd=project,
                              capture_output=True, input=b"", timeout=120)
    assert launched.returncode == 0, launched.stderr
    assert record.read_text().count(" ") == 1


def test_a_bad_start_setup_switch_is_refused_before_anything_starts(project: Path, limactl: FakeLima,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    write_trusted(project, "")
    monkeypatch.setenv("AGENTBOX_START_SETUP", "no")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert result.stderr == ("agentbox: error: AGENTBOX_START_SETUP: expected on or off, found 'no'\n"
                             "hint: Unset it, or AGENTBOX_START_SETUP=off to start the VM without setting it up.\n")
    assert limactl.calls() == []
