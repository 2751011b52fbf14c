"""--help, --version, init and completion through the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox import __version__
from tests.helpers import run_cli, write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)


def test_version() -> None:
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"agentbox {__version__}\n"


def test_help_lists_agent_and_vm_commands_one_line_each(project: Path) -> None:
    result = run_cli("--help", cwd=project)
    assert result.exit_code == 0
    out = result.stdout
    assert "\nAgents (" in out and "\nThe VM:\n" in out
    for name in ("claude", "codex", "gemini", "kiro", "opencode", "copilot",
                 "start", "stop", "restart", "rm", "status", "ls", "shell", "port", "ports"):
        rows = [line for line in out.splitlines() if line.strip().startswith(name + " ")]
        assert len(rows) == 1, (name, out)
    commands = out[out.index("Agents ("):]
    continuation = [line for line in commands.splitlines() if line.startswith(" " * 6)]
    assert continuation == [], "every command's description fits on one line"


@pytest.mark.parametrize("broken", ["vm: [\n", "agents:\n  aider: [\n"])  # the second one is read for agents
def test_help_still_works_with_a_broken_config(project: Path, broken: str) -> None:
    write(project / "agentbox.yml", broken)
    result = run_cli("--help", cwd=project)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    agents = lines[next(i for i, line in enumerate(lines) if line.startswith("Agents (")) + 1:]
    assert [line.split()[0] for line in agents[:6]] == ["codex", "claude", "gemini", "kiro", "opencode", "copilot"]


def test_init_writes_the_example_and_refuses_to_overwrite(project: Path) -> None:
    result = run_cli("init", cwd=project)
    assert result.exit_code == 0
    target = project / "agentbox.yml"
    assert result.stdout == f"Wrote {target}\n"
    text = target.read_text()
    assert "# workspace: ." in text and "onCreateScript" in text
    assert os.stat(target).st_mode & 0o777 == 0o644
    # The commented template is itself a valid (empty) config.
    assert run_cli("config", "--json", cwd=project).exit_code == 0

    target.write_text("vm: {cpus: 2}\n")
    again = run_cli("init", cwd=project)
    assert again.exit_code == 1
    assert "already exists; nothing was written" in again.stderr and "Use --overwrite to replace it." in again.stderr
    assert target.read_text() == "vm: {cpus: 2}\n"

    replaced = run_cli("init", "--overwrite", cwd=project)
    assert replaced.exit_code == 0
    assert "onCreateScript" in target.read_text()
    target.write_text("vm: {cpus: 2}\n")
    forced = run_cli("init", "--force", cwd=project)  # the earlier name, kept for scripts
    assert forced.exit_code == 0
    assert "onCreateScript" in target.read_text()
    assert "--force" not in run_cli("init", "--help").stdout.split("Options:")[1]


def test_init_global_uses_the_xdg_path(project: Path, home: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "cfg"))
    result = run_cli("init", "--global", cwd=project)
    assert result.exit_code == 0
    target = home / "cfg" / "agentbox" / "config.yml"
    assert target.is_file()
    assert not (project / "agentbox.yml").exists()


def test_every_documented_key_is_in_the_example() -> None:
    from agentbox.config.schema import AGENT_KEYS, MOUNT_KEYS, SCHEMA

    text = (Path(__file__).parent.parent / "agentbox.yml.example").read_text()
    names = set(SCHEMA) | set(AGENT_KEYS) | set(MOUNT_KEYS)
    for spec in SCHEMA.values():
        names |= set(spec.children)
    missing = [name for name in sorted(names) if f"{name}:" not in text]
    assert missing == []


def test_every_command_is_in_the_readme() -> None:
    import click

    from agentbox.cli.main import cli

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    names = cli.list_commands(click.Context(cli))
    assert {"start", "doctor", "ca", "trust", "audit", "config"} <= set(names)
    for name in names:  # a whole word: `agentbox cancel` does not document `agentbox ca`
        assert re.search(rf"agentbox {re.escape(name)}(?![\w-])", readme), name


def test_completion_scripts() -> None:
    for shell, marker in (("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --no-files")):
        result = run_cli("completion", shell)
        assert result.exit_code == 0
        assert marker in result.stdout
        assert "_AGENTBOX_COMPLETE" in result.stdout


def test_completion_through_click_mechanism(project: Path) -> None:
    env = {**os.environ, "_AGENTBOX_COMPLETE": "bash_complete", "COMP_WORDS": "agentbox cla", "COMP_CWORD": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "agentbox"], env=env, cwd=project, capture_output=True, text=True, timeout=30
    )
    assert "plain,claude" in result.stdout


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "agentbox", "--version"], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == f"agentbox {__version__}"
