"""A warm launch is one `limactl shell`; the guest proves it is the VM agentbox checked, or agentbox checks it.

Each test launches once (list + shell: the launch checks the VM and the guest keeps the record), then changes
something the way the world does (Lima's own commands, straight on the double; the guest's files), launches
again and reads the call log: what was asked of Lima, how often the agent ran, what the user saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, write, write_trusted

RUNS = ".agent-runs"
# Appends one line per run (the launch's cwd, then its args); `exit N ...` exits N, after writing the project's
# .agent-stderr (when there is one) to stderr.
COUNTING_AGENT = r"""#!/bin/bash
printf '%s %s\n' "$PWD" "$*" >> "$AGENT_RUNS"
[ ! -f "$AGENT_STDERR" ] || cat "$AGENT_STDERR" >&2
code=0
for ((i = 1; i < $#; i++)); do
  next=$((i + 1))
  [ "${!i}" != exit ] || code="${!next}"
done
exit "$code"
"""


@pytest.fixture
def counted(project: Path, vm: FakeLima) -> FakeLima:
    agent = vm.home / NAME / "guestfs" / "usr-local" / "bin" / "codex"
    agent.write_text(COUNTING_AGENT)
    write_trusted(project, f"env:\n  AGENT_RUNS: {project / RUNS}\n  AGENT_STDERR: {project / '.agent-stderr'}\n")
    return vm


def launch(project: Path, *args: str, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", "codex", *args], cwd=cwd or project,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=180)


def runs(project: Path) -> list[str]:
    path = project / RUNS
    return path.read_text().splitlines() if path.exists() else []


def limactl(*args: str) -> None:
    subprocess.run(["limactl", "--tty=false", *args], check=True, capture_output=True, timeout=120)


def first_launch(project: Path, vm: FakeLima) -> None:
    result = launch(project, "exec", "first")
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]  # the first launch checks the VM
    vm.clear()


def test_a_warm_launch_is_one_shell_call(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    (project / "sub").mkdir()
    result = launch(project, "exit", "3", "fix the tests", cwd=project / "sub")
    assert result.returncode == 3, result.stderr
    assert counted.subcommands() == ["shell"]
    shell = counted.calls()[0]
    assert shell[:2] == ["shell", "--tty=false"]  # never Lima's "start it now?" question on a terminal
    assert "--workdir" not in shell  # the stub enters the folder, after its proof
    assert runs(project)[-1] == f"{project / 'sub'} --dangerously-bypass-approvals-and-sandbox exit 3 fix the tests"
    assert len(runs(project)) == 2
    staging = Path(shell[shell.index("agentbox-launch") + 2])
    assert list((staging / "proof").iterdir()) == []  # the launch's nonce is gone with it
    assert not [p for p in (staging.parent / "outbox").iterdir() if p.name.startswith(".started-")]


def test_the_agents_stderr_reaches_the_user_byte_for_byte_on_a_warm_launch(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    # Lines that look like Lima's own, its fatal about this very VM included: the program's, so shown as they are.
    said = (f'time="2026-01-01T00:00:00Z" level=fatal msg="instance `{NAME}` is stopped, run `limactl start {NAME}` '
            'to start the instance"\n')
    (project / ".agent-stderr").write_bytes(said.encode() + b'time="x" level=warning msg="w"\n\x00\xff raw \x1b[31m bytes')
    result = launch(project, "exit", "1")
    assert result.returncode == 1
    # Its exit 1 and Lima's words did not make agentbox start anything (the list after an exit 1 asks whether the VM
    # is still there, as after any session).
    assert counted.subcommands() == ["shell", "list"]
    expected = said.encode() + b'time="x" level=warning msg="w"\n\x00\xff raw \x1b[31m bytes'
    assert expected in result.stderr
    assert len(runs(project)) == 2


def test_a_vm_stopped_outside_agentbox_is_started_once_and_the_agent_runs_once(project: Path,
                                                                              counted: FakeLima) -> None:
    first_launch(project, counted)
    limactl("stop", NAME)
    counted.clear()
    result = launch(project, "exec", "after stop")
    assert result.returncode == 0, result.stderr
    assert counted.subcommands() == ["shell", "list", "start", "list", "shell"]
    assert b"is stopped" not in result.stderr  # Lima's answer was agentbox's to read, not the user's
    assert runs(project)[-1].endswith("exec after stop")
    assert len(runs(project)) == 2
    counted.clear()
    assert launch(project, "exec", "warm again").returncode == 0
    assert counted.subcommands() == ["shell"]


def test_a_stop_by_agentbox_makes_the_next_launch_list_first(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    assert subprocess.run([sys.executable, "-m", "agentbox", "stop"], cwd=project, capture_output=True,
                          timeout=120).returncode == 0
    counted.clear()
    assert launch(project, "exec", "x").returncode == 0
    assert counted.subcommands() == ["list", "start", "list", "shell"]  # no shell that could only fail


def test_a_vm_restarted_outside_agentbox_is_checked_again(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    limactl("stop", NAME)
    limactl("start", NAME)  # a new boot: what it runs with is not what agentbox checked
    counted.clear()
    result = launch(project, "exec", "x")
    assert result.returncode == 0, result.stderr
    assert counted.subcommands() == ["shell", "list", "shell"]
    assert len(runs(project)) == 2


def test_a_vm_deleted_outside_agentbox_is_created_again(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    limactl("delete", "--force", NAME)
    counted.clear()
    result = launch(project, "exec", "x")
    assert result.returncode == 0, result.stderr
    subcommands = counted.subcommands()
    assert subcommands[0] == "list"  # its lima.yaml is gone: agentbox knows without asking the shell
    assert "create" in subcommands and subcommands[-1] == "shell"


def test_an_ssh_failure_is_reported_and_never_taken_for_a_stopped_vm(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    result = launch(project, "exec", "x", env={"FAKE_LIMACTL_SHELL_SSH_FAIL": "1"})
    assert result.returncode == 255
    assert counted.subcommands() == ["shell", "list"]  # the list only asks whether the VM is still there
    # Real Lima gives 255 for a signal death too (tests/fake_limactl/README.md): said as either, never "stopped".
    assert b"is still running, but the session ended without an exit status (exit 255): ssh reports" in result.stderr
    assert b"stopped" not in result.stderr
    assert len(runs(project)) == 1


def test_an_agent_exiting_with_the_proof_code_is_not_run_twice(project: Path, counted: FakeLima) -> None:
    from agentbox.session.warm import PROOF_FAILED

    first_launch(project, counted)
    result = launch(project, "exit", str(PROOF_FAILED))
    assert result.returncode == PROOF_FAILED
    assert counted.subcommands() == ["shell"]
    assert len(runs(project)) == 2


def test_a_guest_record_for_another_workspace_makes_the_launch_check_the_vm(project: Path,
                                                                           counted: FakeLima) -> None:
    first_launch(project, counted)
    record = counted.guest_home(NAME) / ".agentbox" / "verified"
    token, boot, _ = record.read_text().rstrip("\n").split(" ", 2)
    record.write_text(f"{token} {boot} /somewhere/else\n")
    result = launch(project, "exec", "x")
    assert result.returncode == 0, result.stderr
    assert counted.subcommands() == ["shell", "list", "shell"]
    assert record.read_text().endswith(f" {project}\n")  # checked by the host, so recorded again
    assert len(runs(project)) == 2


def test_a_same_named_vm_of_another_workspace_is_refused(project: Path, counted: FakeLima, tmp_path: Path) -> None:
    first_launch(project, counted)
    limactl("delete", "--force", NAME)
    other = tmp_path / "elsewhere" / "myproject"
    other.mkdir(parents=True)
    write_trusted(other, "")
    assert subprocess.run([sys.executable, "-m", "agentbox", "start"], cwd=other, capture_output=True,
                          timeout=300).returncode == 0
    counted.clear()
    result = launch(project, "exec", "x")
    assert result.returncode != 0
    assert f"belongs to {other}".encode() in result.stderr
    assert b"give this workspace its own VM" in result.stderr.replace(b"\n", b" ") or b"Give this" in result.stderr
    assert counted.subcommands() == ["list"]  # its lima.yaml is not the one checked: no shell into it
    assert len(runs(project)) == 1


def test_lima_config_edits_make_the_launch_check_the_vm(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    write(counted.home / "_config" / "override.yaml", "ssh:\n  forwardAgent: true\n")
    result = launch(project, "exec", "x")
    assert result.returncode != 0
    assert counted.subcommands()[0] == "list"  # the host-wide override reaches every shell: checked first
    assert b"forwardAgent" in result.stderr
    assert len(runs(project)) == 1


def test_two_launches_on_a_stopped_vm_start_it_once(project: Path, counted: FakeLima) -> None:
    first_launch(project, counted)
    limactl("stop", NAME)
    counted.clear()
    results: list[subprocess.CompletedProcess] = []
    threads = [threading.Thread(target=lambda n=n: results.append(launch(project, "exec", f"race {n}")))
               for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert counted.subcommands().count("start") == 1
    assert sorted(line.split(" exec ")[1] for line in runs(project)[1:]) == ["race 0", "race 1"]
