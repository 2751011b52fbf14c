"""vm.cpus, vm.memory and a larger vm.disk reach an existing VM with `limactl edit` (no `--recreate`), and
`agentbox update-agents` updates the agent CLIs inside it: through the CLI, against the limactl double."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    NAME,
    FakeLima,
    needs_bwrap,
    on_terminal,
    run_agentbox,
    run_cli,
    staged_logins,
    without_once_notes,
    write,
    write_trusted,
)

GIB = 1 << 30


@pytest.fixture
def started(project: Path, limactl: FakeLima) -> FakeLima:
    """The project's VM, created with the defaults (4 cpus, 8GiB, 20GiB) and running."""
    needs_bwrap()
    write(project / "agentbox.yml", "")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    limactl.clear()
    return limactl


def listed(name: str = NAME) -> dict:
    """What `limactl list --json` says of the VM (the double is first on PATH)."""
    result = subprocess.run(["limactl", "list", "--json", name], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def edit_calls(limactl: FakeLima) -> list[list[str]]:
    return [argv for argv in limactl.calls() if "edit" in argv]


def launch(project: Path) -> subprocess.CompletedProcess:
    """`agentbox shell -- true` in a child process: stdin is not a terminal."""
    return run_agentbox("shell", "--", "true", cwd=project, timeout=120)


# -- a running VM -------------------------------------------------------------------------------


def test_a_running_vm_keeps_its_cpus_until_its_next_start_and_says_so_once(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n  memory: 4GiB\n")
    first = launch(project)
    assert first.returncode == 0, first.stderr
    assert ("agentbox: cpus 4 -> 2, memory 8GiB -> 4GiB in the config apply at the next `agentbox stop`/start of "
            f"{NAME} (`agentbox restart` applies them now)\n") in first.stderr
    assert "--recreate" not in first.stderr
    assert started.subcommands() == ["list", "shell"]  # no edit while it runs, no restart
    assert listed()["cpus"] == 4
    started.clear()
    second = launch(project)
    assert second.returncode == 0 and "cpus 4 -> 2" not in second.stderr  # said once
    assert started.subcommands() == ["list", "shell"]


def test_a_change_taken_back_and_made_again_is_said_again(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    assert "cpus 4 -> 2 in the config" in launch(project).stderr
    write(project / "agentbox.yml", "vm:\n  cpus: 4\n")
    assert "cpus" not in launch(project).stderr
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    assert "cpus 4 -> 2 in the config" in launch(project).stderr


def test_start_of_a_running_vm_says_when_the_change_applies(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 6\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "cpus 4 -> 6 in the config apply at the next `agentbox stop`/start" in result.stderr
    assert f"{NAME} is already running" in result.stderr
    assert started.subcommands() == ["list"]


def test_a_smaller_disk_is_kept_and_said_once_without_recreate(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  disk: 10GiB\n")
    first = launch(project)
    assert first.returncode == 0, first.stderr
    assert ("agentbox: vm.disk 10GiB is smaller than the VM's disk (20GiB); Lima cannot shrink a disk, so the VM "
            "keeps the larger one\n") in first.stderr
    assert "--recreate" not in first.stderr
    assert started.subcommands() == ["list", "shell"]
    started.clear()
    assert "smaller than the VM's disk" not in launch(project).stderr
    assert run_cli("stop", cwd=project).exit_code == 0
    restarted = run_cli("start", cwd=project)
    assert restarted.exit_code == 0, restarted.stderr
    assert "smaller than the VM's disk" not in restarted.stderr
    assert "edit" not in started.subcommands() and "delete" not in started.subcommands()
    assert listed()["disk"] == 20 * GIB


def test_a_setting_that_needs_a_new_vm_still_asks_for_recreate(project: Path, started: FakeLima) -> None:
    (project / "docs").mkdir()
    write_trusted(project, "vm:\n  cpus: 2\nmounts:\n  - location: ./docs\n")
    result = launch(project)
    assert result.returncode == 0, result.stderr
    assert f"agentbox: mounts changed since {NAME} was created; `agentbox start --recreate` applies it\n" in result.stderr
    assert "cpus changed since" not in result.stderr and "cpus 4 -> 2 in the config apply" in result.stderr


def test_the_warm_launch_stays_list_and_shell(project: Path, started: FakeLima) -> None:
    result = launch(project)
    assert result.returncode == 0, result.stderr
    assert started.subcommands() == ["list", "shell"]
    assert without_once_notes(result.stderr) == ""


# -- a stopped VM: limactl edit, then start -------------------------------------------------------


def test_changed_cpus_are_applied_with_edit_before_the_start(project: Path, started: FakeLima) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    started.clear()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert started.subcommands() == ["list", "edit", "start", "list"]
    assert edit_calls(started) == [["--tty=false", "edit", NAME, "--cpus", "2"]]
    assert f"Applying cpus 4 -> 2 to VM {NAME}: done" in result.stderr
    assert listed()["cpus"] == 2 and listed()["status"] == "Running"
    started.clear()
    warm = launch(project)  # recorded: nothing more to say or do, and the effective-config check is content
    assert warm.returncode == 0, warm.stderr
    assert started.subcommands() == ["list", "shell"]
    assert without_once_notes(warm.stderr) == ""


def test_memory_and_a_larger_disk_are_applied_together(project: Path, started: FakeLima) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0
    write(project / "agentbox.yml", "vm:\n  memory: 4GiB\n  disk: 30GiB\n")
    started.clear()
    result = launch(project)  # a launch that finds the VM stopped starts it: the edit comes first
    assert result.returncode == 0, result.stderr
    assert edit_calls(started) == [["--tty=false", "edit", NAME, "--memory", "4", "--disk", "30"]]
    assert "delete" not in started.subcommands() and "create" not in started.subcommands()
    row = listed()
    assert (row["memory"], row["disk"]) == (4 * GIB, 30 * GIB)


def test_restart_applies_what_a_running_vm_was_waiting_for(project: Path, started: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 3\n")
    assert "cpus 4 -> 3" in launch(project).stderr
    started.clear()
    result = run_cli("restart", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert started.subcommands() == ["list", "stop", "list", "edit", "start", "list"]
    assert listed()["cpus"] == 3
    doctor = run_cli("doctor", cwd=project)
    assert "next starts" not in doctor.stdout


def test_a_rejected_edit_shows_limas_reason_and_leaves_no_file_behind(project: Path, started: FakeLima) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0
    # The VM's lima.yaml, changed by hand, has something Lima's validation of an edit refuses.
    lima_yaml = started.home / NAME / "lima.yaml"
    lima_yaml.write_text(lima_yaml.read_text() + "notALimaField: 1\n")
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    started.clear()
    result = run_agentbox("start", cwd=project, timeout=120)
    assert result.returncode == 1
    assert f"agentbox: error: Lima refused to change {NAME}: the YAML is invalid: field `notALimaField`" in result.stderr
    assert "REJECTED" not in result.stderr
    assert f"{NAME} was not changed and not started" in result.stderr
    assert started.subcommands() == ["list", "edit"]
    edit = [call for call in _raw_calls(started) if "edit" in call["argv"]]
    assert edit[0]["cwd"] != str(project) and not os.path.exists(edit[0]["cwd"])  # Lima's file went with it
    assert not (project / "lima.REJECTED.yaml").exists()
    assert listed()["status"] == "Stopped" and listed()["cpus"] == 4
    again = run_agentbox("start", cwd=project, timeout=120)  # not recorded as applied: tried again
    assert again.returncode == 1 and "Lima refused to change" in again.stderr


def _raw_calls(limactl: FakeLima) -> list[dict]:
    from tests import fake_limactl

    return list(fake_limactl.read_calls(limactl.home))


# -- a terminal asks ----------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [b"y\n", b"n\n"])
def test_on_a_terminal_a_launch_asks_to_restart_the_vm(project: Path, started: FakeLima, answer: bytes) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    code, output = on_terminal(project, ["shell", "--", "true"], answer=answer)
    assert code == 0, output
    assert f"cpus 4 -> 2 in the config: restart VM {NAME} now to apply?" in output
    if answer == b"y\n":
        assert started.subcommands() == ["list", "stop", "edit", "start", "list", "shell"]
        assert listed()["cpus"] == 2
    else:
        assert started.subcommands() == ["list", "shell"]
        assert f"cpus 4 -> 2 apply when {NAME} next starts (`agentbox restart`)" in output
        assert listed()["cpus"] == 4


# -- update-agents --------------------------------------------------------------------------------

# npm in the guest: `npm install -g PACKAGE@latest` puts a newer agent in $NPM_CONFIG_PREFIX/bin (Codex's
# package cannot be fetched); every call is noted in the guest user's home.
NPM = r"""#!/bin/bash
echo "$* prefix=$NPM_CONFIG_PREFIX" >> "$HOME/npm-calls"
case "$3" in
  @anthropic-ai/claude-code@latest) binary=claude; version="2.0.14 (Claude Code)" ;;
  @openai/codex@latest) echo "npm ERR! 404 Not Found - GET https://registry.npmjs.org/@openai%2fcodex" >&2; exit 1 ;;
  *) exit 0 ;;
esac
mkdir -p "$NPM_CONFIG_PREFIX/bin"
printf '#!/bin/sh\necho "%s"\n' "$version" > "$NPM_CONFIG_PREFIX/bin/$binary"
chmod 755 "$NPM_CONFIG_PREFIX/bin/$binary"
"""


def guest_program(limactl: FakeLima, name: str, text: str) -> None:
    path = limactl.home / NAME / "guestfs" / "usr-local" / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def agents_in_vm(started: FakeLima) -> FakeLima:
    """Claude Code 2.0.1 and Codex 0.46.0 installed in the VM, and the npm above."""
    guest_program(started, "npm", NPM)
    guest_program(started, "claude", '#!/bin/sh\necho "2.0.1 (Claude Code)"\n')
    guest_program(started, "codex", '#!/bin/sh\necho "codex-cli 0.46.0"\n')
    return started


def test_update_agents_updates_each_installed_agent_and_names_the_one_that_failed(
    project: Path, agents_in_vm: FakeLima
) -> None:
    result = run_agentbox("update-agents", cwd=project, timeout=120)
    assert result.returncode == 1
    assert result.stdout == "claude: 2.0.1 -> 2.0.14\n"
    assert "agentbox: error: updating codex failed; updated: claude\n" in result.stderr
    assert "codex: npm ERR! 404 Not Found" in result.stderr
    assert "codex: `npm install -g @openai/codex@latest`" in result.stderr
    assert agents_in_vm.subcommands() == ["list", "shell"]
    home = agents_in_vm.guest_home(NAME)
    calls = (home / "npm-calls").read_text().splitlines()
    assert [call.split(" prefix=")[0] for call in calls] == [
        "install -g @openai/codex@latest", "install -g @anthropic-ai/claude-code@latest"]
    assert all(call.endswith("/.local") for call in calls)  # npm's prefix in the user's home: no root needed
    assert (home / ".local" / "bin" / "claude").exists()
    assert "gemini" not in result.stdout + result.stderr  # agents that are not installed are left alone


def test_update_agents_summary_names_the_updated_the_current_and_the_failed(
    project: Path, agents_in_vm: FakeLima
) -> None:
    guest_program(agents_in_vm, "gemini", '#!/bin/sh\necho "0.9.0"\n')  # npm leaves it as it is: the latest
    result = run_agentbox("update-agents", cwd=project, timeout=120)
    assert result.returncode == 1
    assert result.stdout == "claude: 2.0.1 -> 2.0.14\ngemini: 0.9.0 (already the latest)\n"
    assert "agentbox: error: updating codex failed; updated: claude; already the latest: gemini\n" in result.stderr
    assert "the other agents were updated" not in result.stderr

    again = run_agentbox("update-agents", "claude", "gemini", cwd=project, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[-1] == "agentbox: already the latest: claude, gemini"


# The guest's npm for the environment's tests: notes what an update sees of the launch's environment.
NPM_ENV = r"""#!/bin/bash
{
  echo "NODE_EXTRA_CA_CERTS=${NODE_EXTRA_CA_CERTS-unset}"
  echo "HTTPS_PROXY=${HTTPS_PROXY-unset}"
  echo "NO_PROXY=${NO_PROXY-unset}"
  echo "FROM_ENV=${FROM_ENV-unset}"
} > "$HOME/npm-env"
cat "$NODE_EXTRA_CA_CERTS" > "$HOME/npm-ca" 2>/dev/null || true
"""
PROXY_WITH_PASSWORD = "http://me:s3cret-pw@proxy.corp.example:3128"


def corporate_vm(project: Path, limactl: FakeLima, extra: str = "") -> str:
    """The project's VM made with a corporate CA (caCert) and a proxy in env; returns the CA's PEM."""
    from tests.test_ca import make_pem

    needs_bwrap()
    pem = make_pem(project.parent / "corp-ca", "Corp Intercepting Root")
    write(project / "corp-ca.pem", pem)
    write_trusted(project, f"caCert: corp-ca.pem\nenv:\n  HTTPS_PROXY: '{PROXY_WITH_PASSWORD}'\n"
                  f"  NO_PROXY: localhost,.corp.example\n  FROM_ENV: yes-it-is\n{extra}")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    guest_program(limactl, "npm", NPM_ENV)
    guest_program(limactl, "claude", '#!/bin/sh\necho "2.0.1 (Claude Code)"\n')
    limactl.clear()
    return pem


def npm_saw(limactl: FakeLima) -> dict[str, str]:
    lines = (limactl.guest_home(NAME) / "npm-env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_update_agents_runs_with_the_launch_s_ca_and_env(project: Path, home: Path, limactl: FakeLima) -> None:
    staged_logins(home)  # no broker, open mode: no proxy of agentbox's, so the config's proxy is the one
    pem = corporate_vm(project, limactl)
    result = run_agentbox("update-agents", "claude", cwd=project, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = npm_saw(limactl)
    assert seen == {"NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt", "HTTPS_PROXY": PROXY_WITH_PASSWORD,
                    "NO_PROXY": "localhost,.corp.example", "FROM_ENV": "yes-it-is"}
    assert pem.strip() in (limactl.guest_home(NAME) / "npm-ca").read_text()  # the file holds the user's CA
    assert limactl.subcommands() == ["list", "shell"]
    assert not any("s3cret-pw" in arg for argv in limactl.calls() for arg in argv)  # never on a command line


def test_update_agents_in_allowlist_mode_goes_through_the_vm_s_proxy(project: Path, limactl: FakeLima) -> None:
    corporate_vm(project, limactl, "network:\n  mode: allowlist\n")
    result = run_agentbox("update-agents", "claude", cwd=project, timeout=120)
    assert result.returncode == 0, result.stderr
    from agentbox.net import guard

    proxy = guard.running(NAME)  # the broker's proxy serves the VM while it runs
    assert proxy is not None
    seen = npm_saw(limactl)
    # the proxy's, over env's, with the VM's proxy credentials
    assert seen["HTTPS_PROXY"] == f"http://agentbox:{guard.secret(NAME)}@host.lima.internal:{proxy.port}", seen
    assert seen["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/ca-certificates.crt" and seen["FROM_ENV"] == "yes-it-is"


def test_update_agents_named_reports_an_agent_already_current(project: Path, agents_in_vm: FakeLima) -> None:
    first = run_agentbox("update-agents", "claude", cwd=project, timeout=120)
    assert (first.returncode, first.stdout) == (0, "claude: 2.0.1 -> 2.0.14\n"), first.stderr
    again = run_agentbox("update-agents", "claude", cwd=project, timeout=120)
    assert (again.returncode, again.stdout) == (0, "claude: 2.0.14 (already the latest)\n"), again.stderr
    assert "codex" not in (agents_in_vm.guest_home(NAME) / "npm-calls").read_text()


def test_update_agents_named_agent_that_is_not_installed_fails(project: Path, agents_in_vm: FakeLima) -> None:
    result = run_agentbox("update-agents", "gemini", cwd=project, timeout=120)
    assert result.returncode == 1
    assert f"gemini is not installed in {NAME}" in result.stderr
    assert "updating gemini failed" in result.stderr


def test_update_agents_reruns_the_install_command_of_an_agent_you_define(project: Path, agents_in_vm: FakeLima) -> None:
    guest_program(agents_in_vm, "aider", '#!/bin/sh\ncat "$HOME/aider-version" 2>/dev/null || echo "aider 0.1.0"\n')
    write_trusted(project, "agents:\n  aider:\n    binary: aider\n    install: echo aider 0.2.0 > $HOME/aider-version\n")
    result = run_agentbox("update-agents", "aider", cwd=project, timeout=120)
    assert (result.returncode, result.stdout) == (0, "aider: 0.1.0 -> 0.2.0\n"), result.stderr


def test_update_agents_refuses_an_unknown_agent(project: Path, limactl: FakeLima) -> None:
    result = run_cli("update-agents", "nope", cwd=project)
    assert result.exit_code == 2
    assert "no agent `nope`" in result.stderr and "claude" in result.stderr
    assert limactl.calls() == []


def test_update_agents_suggests_the_agent_you_meant(project: Path, limactl: FakeLima) -> None:
    result = run_cli("update-agents", "claud", cwd=project)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "agentbox: error: no agent `claud`: did you mean claude?",
        "hint: Run `agentbox update-agents claude`. Agents: codex, claude, gemini, kiro, opencode, copilot.",
    ]
    assert limactl.calls() == []


def test_update_agents_without_a_vm_creates_nothing(project: Path, limactl: FakeLima) -> None:
    result = run_cli("update-agents", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "does not exist yet" in result.stderr
    assert limactl.subcommands() == ["list"]


# npm as it behaves when it fails to fetch an optional dependency: the first install "succeeds" with no
# platform package, so Copilot CLI cannot start; the second brings the package.
FLAKY_NPM = r"""#!/bin/bash
echo "$*" >> "$HOME/npm-calls"
NPM_CONFIG_PREFIX=${NPM_CONFIG_PREFIX:-$HOME/.local}  # the provisioning's ~/.npmrc says so in a real VM
mkdir -p "$NPM_CONFIG_PREFIX/bin"
if [ "$(wc -l < "$HOME/npm-calls")" -eq 1 ]; then
  printf '#!/bin/sh\necho "GitHub Copilot CLI: no platform package found." >&2\nexit 1\n' > "$NPM_CONFIG_PREFIX/bin/copilot"
else
  printf '#!/bin/sh\necho "1.0.102"\n' > "$NPM_CONFIG_PREFIX/bin/copilot"
fi
chmod 755 "$NPM_CONFIG_PREFIX/bin/copilot"
echo "added 2 packages in 6s"
"""


def test_a_copilot_install_that_left_out_its_platform_package_is_run_again(started: FakeLima, project: Path) -> None:
    guest_program(started, "npm", FLAKY_NPM)
    result = run_agentbox("copilot", "--version", cwd=project, timeout=120)
    assert (result.returncode, result.stdout) == (0, "1.0.102\n"), result.stderr
    assert (started.guest_home(NAME) / "npm-calls").read_text().splitlines() == [
        "install -g @github/copilot", "install -g @github/copilot"]
