"""Launching agents through the double's real shell: argv, model, cwd, exit code, env, stdin, call counts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, needs_bwrap, run_cli, staged_logins, write, write_trusted


def launch(project: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
           input: bytes | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    out = project / ".stub-out.json"
    if out.exists():
        out.unlink()
    base = {**os.environ, **(env or {})}
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", *args], cwd=cwd or project, env=base,
        input=input if input is not None else b"", capture_output=True, timeout=120,
    )
    data = json.loads(out.read_text()) if out.exists() else {}
    return result, data


def configure(project: Path, text: str) -> None:
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n" + text)


TRICKY_ARGS = ["--help", "--", "two words", "it's \"quoted\"", "$HOME", "`whoami`", "line1\nline2", "ünïcødé ☃", "", "*"]


def test_arguments_pass_through_verbatim(project: Path, vm: FakeLima) -> None:
    configure(project, "")
    result, data = launch(project, "claude", *TRICKY_ARGS)
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["--dangerously-skip-permissions", *TRICKY_ARGS]


@pytest.mark.parametrize("flag", ["--help", "-h", "--version"])
def test_agent_help_and_version_are_passed_to_the_agent_not_answered_by_agentbox(project: Path, vm: FakeLima,
                                                                                    flag: str) -> None:
    configure(project, "")
    result, data = launch(project, "claude", flag)
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["--dangerously-skip-permissions", flag]
    assert result.stdout == b""  # agentbox printed neither its own help nor its version
    assert vm.subcommands()[-1] == "shell"


def test_warm_launch_makes_two_limactl_calls(project: Path, vm: FakeLima) -> None:
    configure(project, "env:\n  SECRET_TOKEN: s3cr3t-value\n".replace("env:\n", ""))
    result, _ = launch(project, "codex", "exec", "fix the tests")
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]


@pytest.mark.parametrize(
    ("agent", "model_config", "user_args", "expected"),
    [
        ("claude", "opus", ["-p", "hi"], ["--model", "opus", "--dangerously-skip-permissions", "-p", "hi"]),
        ("claude", "opus", ["--model", "haiku"], ["--dangerously-skip-permissions", "--model", "haiku"]),
        ("claude", "opus", ["-m", "haiku"], ["--dangerously-skip-permissions", "-m", "haiku"]),
        ("codex", "o3", ["--model=o4"], ["--dangerously-bypass-approvals-and-sandbox", "--model=o4"]),
        ("kiro", "claude-4", [], ["chat", "--model", "claude-4", "--trust-all-tools"]),
        ("gemini", None, ["-p", "x"], ["--approval-mode=yolo", "--no-sandbox", "-p", "x"]),
        # opencode reads options before a sub-command as its TUI's: they follow `run`, and other
        # sub-commands get none.
        ("opencode", "anthropic/claude-sonnet-4-5", [], ["--model", "anthropic/claude-sonnet-4-5", "--auto"]),
        ("opencode", "anthropic/claude-sonnet-4-5", ["run", "fix it"],
         ["run", "--model", "anthropic/claude-sonnet-4-5", "--auto", "fix it"]),
        ("opencode", "anthropic/claude-sonnet-4-5", ["run", "-m", "openai/gpt-5", "x"],
         ["run", "--auto", "-m", "openai/gpt-5", "x"]),
        ("opencode", "anthropic/claude-sonnet-4-5", ["models", "anthropic"], ["models", "anthropic"]),
        ("opencode", None, ["-c"], ["--auto", "-c"]),
        ("copilot", "gpt-5", ["-p", "fix it"], ["--model", "gpt-5", "--allow-all", "-p", "fix it"]),
        ("copilot", None, [], ["--allow-all"]),
    ],
)
def test_model_is_added_unless_given(project: Path, vm: FakeLima, agent, model_config, user_args, expected) -> None:
    model = f"agents:\n  {agent}:\n    model: {model_config}\n" if model_config else ""
    configure(project, model)
    result, data = launch(project, agent, *user_args)
    assert result.returncode == 0, result.stderr
    assert data["args"] == expected


def test_exit_code_and_working_directory(project: Path, vm: FakeLima, home: Path) -> None:
    configure(project, "")
    sub = project / "src" / "pkg"
    sub.mkdir(parents=True)
    result, data = launch(project, "claude", env={"STUB_EXIT": "0"}, cwd=sub)
    assert data["cwd"] == str(sub)
    configure(project, "env:\n  STUB_EXIT: '42'\n".replace("env:\n", ""))
    result, data = launch(project, "claude", "-p", "x")
    assert result.returncode == 42
    outside = home.parent / "elsewhere"
    outside.mkdir()
    result, data = launch(project, "-C", str(project), "claude", cwd=outside)
    assert data["cwd"] == str(project)


def test_stdin_is_piped_to_the_agent(project: Path, vm: FakeLima) -> None:
    configure(project, "")
    result, data = launch(project, "claude", "-p", input=b"summarize README.md\n")
    assert result.returncode == 0, result.stderr
    assert data["stdin"] == "summarize README.md\n"


ENV_VALUES = {
    "PLAIN": "value",
    "SPACES": "a b  c",
    "QUOTES": "it's \"x\"",
    "DOLLAR": "$HOME and ${PATH} and `id` and $(id)",
    "NEWLINES": "line1\nline2\n",
    "UNICODE": "ünï ☃ 日本",
    "EQUALS": "a=b=c",
    "BACKSLASH": "back\\slash\\n",
}


def test_env_arrives_byte_for_byte_and_never_on_a_command_line(project: Path, vm: FakeLima, isolated_env) -> None:
    lines = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in ENV_VALUES.items())
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n{lines}")
    result, data = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    for key, value in ENV_VALUES.items():
        assert data["env"][key] == value, key
    for argv in vm.calls():
        joined = "\0".join(argv)
        assert "line1" not in joined and "ünï" not in joined
    env_file = isolated_env["state"] / "vms" / NAME / "staging" / "env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700


def test_env_reaches_agentbox_shell_interactive_and_not(project: Path, vm: FakeLima) -> None:
    write_trusted(project, "env:\n  GREETING: \"hello\\nworld $x\"\n")
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "printenv", "GREETING"],
        cwd=project, capture_output=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hello\nworld $x\n"
    interactive = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell"], cwd=project, capture_output=True, timeout=60,
        input=b'printf "%s|" "$GREETING"; pwd; exit 3\n',
    )
    assert interactive.returncode == 3
    assert interactive.stdout == f"hello\nworld $x|{project}\n".encode()


def test_env_file_is_removed_when_env_becomes_empty(project: Path, vm: FakeLima, isolated_env) -> None:
    staged_logins(isolated_env["home"])  # without the broker's proxy variables, nothing else is set
    write_trusted(project, "env:\n  A: b\n")
    assert subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project).returncode == 0
    env_file = isolated_env["state"] / "vms" / NAME / "staging" / "env"
    assert env_file.exists()
    write(project / "agentbox.yml", "")
    assert subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project).returncode == 0
    assert not env_file.exists()


def test_shell_runs_a_command_in_the_current_folder(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    sub = project / "docs"
    sub.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", "pwd; exit 7"],
        cwd=sub, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 7
    assert result.stdout == f"{sub}\n"
    assert vm.subcommands() == ["list", "shell"]


def test_agent_shell_subcommand_uses_the_agent_vm(project: Path, vm: FakeLima) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "claude", "shell", "--", "sh", "-c", "echo in-vm; exit 5"],
        cwd=project, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 5
    assert result.stdout == "in-vm\n"


def test_missing_agent_is_installed_once_with_its_install_command(project: Path, vm: FakeLima) -> None:
    install = "mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho tool-ran \"$@\"\\n' > ~/.local/bin/mytool && chmod +x ~/.local/bin/mytool && echo INSTALLED >&2"
    write(project / "agentbox.yml", f"agents:\n  mytool:\n    binary: mytool\n    install: {json.dumps(install)}\n")
    assert run_cli("trust", cwd=project).exit_code == 0  # binary and install in a project file need trust
    first = subprocess.run([sys.executable, "-m", "agentbox", "mytool", "a b"], cwd=project, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "tool-ran a b\n"
    assert "INSTALLED" in first.stderr
    second = subprocess.run([sys.executable, "-m", "agentbox", "mytool"], cwd=project, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0
    assert "INSTALLED" not in second.stderr


def test_cold_launch_creates_then_runs(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", "test -w . && echo writable"],
        cwd=project, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "writable\n"
    assert limactl.subcommands() == ["list", "create", "start", "list", "shell"]
    assert "--reconnect" in limactl.calls()[-1]


@pytest.mark.parametrize("args", [("codex", "exec", "x"), ("claude", "--help")], ids=["launch", "agent-help"])
def test_a_warm_launch_checks_the_vm_from_its_one_list_row(project: Path, vm: FakeLima, args: tuple[str, ...]) -> None:
    """vm.ensure_running on the launch path: the one `limactl list` row (listed by ensure_running itself, or
    passed in as `known` by an agent's --help) is both the VM's status and the config checked against what
    agentbox rendered; nothing lists the VM again. A widening in that row refuses before any shell."""
    configure(project, "")
    result, data = launch(project, *args)
    assert result.returncode == 0, result.stderr
    assert data["args"][-1] == args[-1]
    assert vm.subcommands() == ["list", "shell"]

    write(vm.home / "_config" / "override.yaml", "ssh:\n  forwardAgent: true\n")  # shows only in the row's config
    vm.clear()
    refused, _ = launch(project, *args)
    assert refused.returncode == 1
    assert b"ssh.forwardAgent is true" in refused.stderr
    assert vm.subcommands() == ["list", "stop"]
    assert vm.status(NAME) == "Stopped"
