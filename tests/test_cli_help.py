"""Help, `agentbox help`, unknown commands and shell completion, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentbox import __version__
from tests.helpers import FakeLima, needs_bwrap, run_agentbox, run_cli, write
from tests.test_launch import NAME, configure, launch

AGENTS = ["codex", "claude", "gemini", "kiro", "opencode", "copilot"]
VM_COMMANDS = ["start", "stop", "restart", "rm", "status", "ls", "shell", "port", "ports"]


def global_config(home: Path, text: str) -> None:
    write(home / ".config" / "agentbox" / "config.yml", text)


# --- agentbox --help and agentbox help ---------------------------------------------------------


def test_group_help_explains_agent_help_shell_and_help_command(project: Path) -> None:
    result = run_cli("--help", cwd=project)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # click wraps the paragraph; compare the words
    assert "`agentbox AGENT --help` shows the agent's own help, run inside the VM" in text
    assert "`agentbox AGENT shell` opens a shell in the agent's VM" in text
    assert "`agentbox help COMMAND` shows agentbox's help for any command" in text


def test_bare_agentbox_prints_the_grouped_help_and_exits_0(project: Path) -> None:
    helped = run_agentbox("--help", cwd=project)
    bare = run_agentbox(cwd=project)  # the console script, as a user types it
    assert (bare.returncode, bare.stdout, bare.stderr) == (0, helped.stdout, "")
    assert "\nThe VM:\n" in bare.stdout and "\nDiagnostics:\n" in bare.stdout
    in_process = run_cli()  # click's command line gives the same
    assert (in_process.exit_code, in_process.stdout, in_process.stderr) == (0, run_cli("--help").stdout, "")


def test_help_command_is_the_group_help(project: Path) -> None:
    assert run_cli("help", cwd=project).stdout == run_cli("--help", cwd=project).stdout


def test_help_of_an_agent_describes_what_agentbox_runs(project: Path, limactl: FakeLima) -> None:
    result = run_cli("help", "claude", cwd=project)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert out.startswith("Usage: agentbox claude [--isolated] [--detach|-d] [--worktree NAME] [ARGS]...\n"
                          "   or: agentbox claude shell [-- CMD...]\n")
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in out.split("What agentbox runs:\n")[1].splitlines()
            if line.startswith("  ") and not line.startswith("   ")}
    assert rows["runs"] == "claude --dangerously-skip-permissions [ARGS]..."
    assert rows["install"].startswith("npm install -g @anthropic-ai/claude-code ")
    assert rows["VM"] == f"{NAME} (the project's VM)"
    assert rows["logins"].startswith("~/.claude/.credentials.json, ~/.claude.json ")
    assert limactl.calls() == []  # help is answered from the host


def test_help_of_an_agent_follows_the_config(project: Path, home: Path) -> None:
    global_config(home, "agents:\n  kiro:\n    model: claude-4\n  aider:\n    binary: aider\n    defaultArgs: --yes\n")
    kiro = " ".join(run_cli("help", "kiro", cwd=project).stdout.split())
    assert "runs kiro-cli chat --model claude-4 --trust-all-tools [ARGS]... (--model is left out" in kiro
    aider = run_cli("help", "aider", cwd=project)
    assert aider.exit_code == 0, aider.stderr
    assert "Run aider in the VM (defined in your config)." in aider.stdout
    assert "runs     aider --yes [ARGS]..." in aider.stdout
    assert "install  none: aider must already be in the VM" in aider.stdout


def test_help_of_opencode_says_where_its_options_go(project: Path, home: Path) -> None:
    global_config(home, "agents:\n  opencode:\n    model: anthropic/claude-sonnet-4-5\n")
    text = " ".join(run_cli("help", "opencode", cwd=project).stdout.split())
    assert ("runs opencode --model anthropic/claude-sonnet-4-5 --auto [ARGS]... (--model is left out when ARGS has "
            "--model or -m); `run ARGS...` runs opencode run --model anthropic/claude-sonnet-4-5 --auto ARGS...; "
            "other sub-commands get none of these options") in text


def test_help_of_an_agent_with_an_unreadable_config_shows_the_builtin_entry(project: Path) -> None:
    write(project / "agentbox.yml", "vm: [\n")
    result = run_cli("help", "codex", cwd=project)
    assert result.exit_code == 0
    assert "runs     codex --dangerously-bypass-approvals-and-sandbox [ARGS]..." in result.stdout
    assert "config   not read: " in result.stdout


@pytest.mark.parametrize(
    ("words", "usage"),
    [
        (["start"], "Usage: agentbox start [OPTIONS]\n"),
        (["ca", "add"], "Usage: agentbox ca add [OPTIONS]\n"),
        (["claude", "shell"], "Usage: agentbox claude shell [OPTIONS] [-- CMD...]\n"),
        (["help"], "Usage: agentbox help [OPTIONS] [COMMAND]...\n"),
    ],
)
def test_help_of_commands_and_subcommands(project: Path, words: list[str], usage: str) -> None:
    result = run_cli("help", *words, cwd=project)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(usage)


def test_help_of_an_unknown_command_suggests_one(project: Path) -> None:
    result = run_cli("help", "cluade", cwd=project)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "agentbox: error: unknown command `cluade`\nhint: Did you mean `agentbox claude`?\n"
    nested = run_cli("help", "start", "now", cwd=project)
    assert nested.exit_code == 2
    assert nested.stderr == (
        "agentbox: error: `agentbox start` has no command `now`\nhint: `agentbox help start` shows what it takes.\n"
    )


def listing(out: str) -> dict[str, list[str]]:
    """--help's command sections: title -> the commands listed under it."""
    sections: dict[str, list[str]] = {}
    for block in out[out.index("\nAgents"):].strip("\n").split("\n\n"):
        title, *lines = block.splitlines()
        sections[title.rstrip(":")] = [line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "]
    return sections


def test_group_help_lists_the_commands_in_groups(project: Path) -> None:
    out = run_cli("--help", cwd=project).stdout
    sections = listing(out)
    assert sections == {
        "Agents (agentbox AGENT [ARGS]... runs it in the project's VM)": AGENTS,
        "The VM": VM_COMMANDS,
        "Review and undo": ["diff", "checkpoints", "checkpoint", "undo", "proposals", "review", "apply", "reject",
                            "instructions"],
        "Background work": ["run", "tasks", "logs", "wait", "cancel", "sessions", "attach", "hosts"],
        "The agent's setup": ["config", "init", "trust", "sync", "update-agents", "base", "describe", "template"],
        "Network": ["net", "ca"],
        "Diagnostics": ["doctor", "audit", "report", "help", "completion"],
    }
    # The summaries start in one column across the sections.
    starts = {line.index(line.split()[1]) for line in out[out.index("\nAgents"):].splitlines()
              if line.startswith("  ") and line[2] != " "}
    assert starts == {len("  update-agents  ")}


def test_every_command_is_in_a_group_of_the_help() -> None:
    from agentbox.cli.main import COMMAND_GROUPS, LAZY_COMMANDS, cli

    grouped = [name for _, rows in COMMAND_GROUPS for name, _ in rows]
    assert sorted(grouped) == sorted({*LAZY_COMMANDS, *cli.commands})  # each once, none left out
    for name, summary in (row for _, rows in COMMAND_GROUPS for row in rows):
        assert summary.endswith(".") and len(summary) <= 65, name


def test_a_command_without_a_group_is_still_listed(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbox.cli import main

    monkeypatch.setitem(main.LAZY_COMMANDS, "extra", ("agentbox.cli.commands.vm", "ls_command"))
    sections = listing(run_cli("--help", cwd=project).stdout)
    assert sections["Other commands"] == ["extra"]


# --- agentbox AGENT --help / --version: never a VM just to answer -------------------------------


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_agent_help_without_a_vm_answers_from_the_host_and_creates_nothing(
    project: Path, limactl: FakeLima, flag: str
) -> None:
    result = run_cli("claude", flag, cwd=project)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Usage: agentbox claude [--isolated] [--detach|-d] [--worktree NAME] [ARGS]...\n")
    assert "claude --dangerously-skip-permissions [ARGS]..." in result.stdout
    assert result.stdout.endswith(
        f"\nThis is agentbox's description; claude was not asked because the VM {NAME} does not exist yet "
        f"(creating it takes minutes). For claude's own help run `agentbox start`, then `agentbox claude {flag}`.\n"
    )
    assert limactl.subcommands() == ["list"]
    assert limactl.status(NAME) is None


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_agent_help_in_the_home_folder_answers_from_the_host(
    home: Path, project: Path, limactl: FakeLima, flag: str
) -> None:
    result = run_cli("claude", flag, cwd=home)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Usage: agentbox claude [--isolated] [--detach|-d] [--worktree NAME] [ARGS]...\n")
    assert "  VM       the project's VM (this folder is no project)\n" in result.stdout
    text = " ".join(result.stdout.split())
    assert text.endswith(
        f"This is agentbox's description; claude was not asked: the workspace would be {home} (the current folder: "
        "no agentbox.yml, not inside a git work tree), but it is or contains your home folder; agentbox never mounts "
        f"it into a VM. For claude's own help run `agentbox claude {flag}` in a project folder (or "
        f"`agentbox -C DIR claude {flag}`)."
    )
    assert limactl.calls() == []
    # The control: in a project, the same question looks for the project's VM.
    assert run_cli("claude", flag, cwd=project).exit_code == 0
    assert limactl.subcommands() == ["list"]


def test_agent_version_in_the_home_folder_says_where_to_ask(home: Path, limactl: FakeLima) -> None:
    result = run_cli("codex", "--version", cwd=home)
    assert result.exit_code == 1
    assert result.stderr.startswith("agentbox: error: codex's version is that of the codex in a project's VM; "
                                    "codex was not asked: the workspace would be ")
    assert "hint: Run `agentbox codex --version` in a project folder (or `agentbox -C DIR codex --version`)." \
        in result.stderr
    assert limactl.calls() == []


def test_agent_help_names_agentboxs_own_options(project: Path) -> None:
    out = run_cli("help", "gemini", cwd=project).stdout
    section = out.split("agentbox's own options (right after `gemini`; every other argument is gemini's):\n")[1]
    options = [line.split("  ")[1].strip() for line in section.split("\n\n")[0].splitlines() if line[2] == "-"]
    assert options == ["--isolated", "--detach, -d", "--worktree NAME", "--on HOST"]
    text = " ".join(section.split())
    assert "--worktree NAME Run gemini in the git worktree .agentbox/worktrees/NAME on the branch agentbox/NAME" in text


def test_agent_version_without_a_vm_says_where_the_version_comes_from(project: Path, limactl: FakeLima) -> None:
    result = run_cli("codex", "--version", cwd=project)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"agentbox: error: codex's version is that of the codex in the VM {NAME}, which does not exist yet "
        "(creating it takes minutes); agentbox does not create or start a VM to ask it\n"
        "hint: Run `agentbox start`, then `agentbox codex --version` asks codex; agentbox installs it at the first "
        f"launch with `npm install -g @openai/codex`. agentbox's own version is {__version__} (`agentbox --version`).\n"
    )
    assert limactl.subcommands() == ["list"]


def test_agent_help_with_its_own_vm_names_that_vm(project: Path, limactl: FakeLima, home: Path) -> None:
    write(project / "agentbox.yml", "agents:\n  gemini:\n    vmName: gem-vm\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = run_cli("gemini", "--help", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "VM       gem-vm (agents.gemini.vmName)" in result.stdout
    assert "own help run `agentbox gemini shell -- true`, then `agentbox gemini --help`." in result.stdout
    assert limactl.subcommands() == ["list"]


def test_agent_help_without_limactl_still_answers(project: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_cli("claude", "--help", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "Usage: agentbox claude [--isolated] [--detach|-d] [--worktree NAME] [ARGS]..." in result.stdout
    assert f"because the VM {NAME} could not be checked (limactl was not found on PATH" in result.stdout


def test_agent_help_with_a_stopped_vm_starts_nothing(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    limactl.clear()
    result = run_cli("claude", "--help", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert f"claude was not asked because the VM {NAME} is stopped." in result.stdout
    assert limactl.subcommands() == ["list"]
    assert limactl.status(NAME) == "Stopped"


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_agent_help_and_version_reach_the_agent_when_the_vm_runs(project: Path, vm: FakeLima, flag: str) -> None:
    configure(project, "")
    result, data = launch(project, "claude", flag)
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["--dangerously-skip-permissions", flag]
    assert b"Usage: agentbox" not in result.stdout
    assert vm.subcommands() == ["list", "shell"]  # exactly a warm launch


def test_agent_help_with_other_arguments_is_a_normal_launch(project: Path, vm: FakeLima) -> None:
    configure(project, "")
    vm.set_status(NAME, "Stopped")
    result, data = launch(project, "claude", "--help", "--verbose")
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["--dangerously-skip-permissions", "--help", "--verbose"]
    assert "start" in vm.subcommands()


# --- agentbox AGENT shell --help -----------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_agent_shell_help_is_agentbox_help_not_the_shells(project: Path, limactl: FakeLima, flag: str) -> None:
    result = run_cli("claude", "shell", flag, cwd=project)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Usage: agentbox claude shell [OPTIONS] [-- CMD...]\n")
    assert "agents.claude.vmName" in result.stdout
    assert limactl.calls() == []


def test_agent_shell_passes_help_after_the_command_to_it(project: Path, vm: FakeLima) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "claude", "shell", "--", "sh", "-c", 'echo "$@"', "sh", "--help"],
        cwd=project, capture_output=True, text=True, timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, "--help\n")


# --- unknown commands ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "hint"),
    [
        ("cluade", "Did you mean `agentbox claude`?"),
        ("Codex", "Did you mean `agentbox codex`?"),
        ("kiro-cli", "Did you mean `agentbox kiro`?"),
        ("sttus", "Did you mean `agentbox status`?"),
        ("stat", "Did you mean `agentbox start` or `agentbox status`?"),
        ("confg", "Did you mean `agentbox config`?"),
        ("aidr", "Did you mean `agentbox aider`?"),
        ("zzz", "`agentbox --help` lists the commands. To run a program in the VM: `agentbox shell -- zzz`; "
                "to add an agent, define agents.NAME (with its binary) in agentbox.yml."),
    ],
)
def test_unknown_command_suggests_the_closest(project: Path, home: Path, limactl: FakeLima, typed: str, hint: str) -> None:
    global_config(home, "agents:\n  aider:\n    binary: aider\n")
    result = run_cli(typed, "some", "args", cwd=project)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"agentbox: error: unknown command `{typed}`\nhint: {hint}\n"
    assert limactl.calls() == []


def test_unknown_command_from_the_console_has_no_click_box(project: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "agentbox", "cluade"], cwd=project, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert result.stderr == "agentbox: error: unknown command `cluade`\nhint: Did you mean `agentbox claude`?\n"


def test_unknown_command_is_shown_escaped(project: Path) -> None:
    result = run_cli("\x1b[2Jx", cwd=project)
    assert result.exit_code == 2
    assert "\x1b" not in result.stderr
    assert "unknown command `\\x1b[2Jx`" in result.stderr


# --- completion, through click's protocol --------------------------------------------------------


def complete(project: Path, words: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """What bash would get for `words` (the last word is the one being completed; "" for a new word)."""
    from agentbox.cli.main import cli

    parts = words.split(" ")
    result = CliRunner().invoke(
        cli, [], prog_name="agentbox", catch_exceptions=False,
        env={"_AGENTBOX_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1), **(env or {})},
    )
    assert result.exit_code == 0, result.output
    return [tuple(line.split(",", 1)) for line in result.stdout.splitlines()]  # type: ignore[misc]


def test_completion_lists_agents_first_then_vm_commands(project: Path, home: Path, monkeypatch) -> None:
    global_config(home, "agents:\n  aider:\n    binary: aider\n")
    monkeypatch.chdir(project)
    items = complete(project, "agentbox ")
    names = [value for kind, value in items]
    assert all(kind == "plain" for kind, _ in items)
    expected = [*AGENTS, "aider", *VM_COMMANDS]
    assert names[:len(expected)] == expected
    assert {"doctor", "config", "help", "completion"} <= set(names[len(expected):])


def test_completion_after_an_agent_offers_shell_login_and_files(project: Path, monkeypatch) -> None:
    monkeypatch.chdir(project)
    assert complete(project, "agentbox claude ") == [("plain", "shell"), ("plain", "login"), ("file", "")]
    assert complete(project, "agentbox claude sh") == [("plain", "shell"), ("file", "sh")]
    assert complete(project, "agentbox claude RE") == [("file", "RE")]
    assert complete(project, "agentbox claude -p ") == [("file", "")]
    assert complete(project, "agentbox claude shell ") == [("file", "")]
    assert complete(project, "agentbox claude lo") == [("plain", "login"), ("file", "lo")]
    assert complete(project, "agentbox -C . kiro ") == [("plain", "shell"), ("plain", "login"), ("file", "")]


def test_completion_of_help_names_commands(project: Path, monkeypatch) -> None:
    monkeypatch.chdir(project)
    assert complete(project, "agentbox help cl") == [("plain", "claude")]
    assert complete(project, "agentbox help claude ") == [("plain", "shell")]
    assert complete(project, "agentbox help ca ") == [("plain", "add"), ("plain", "ls")]


def test_completion_in_a_real_process(project: Path) -> None:
    env = {**os.environ, "_AGENTBOX_COMPLETE": "bash_complete", "COMP_WORDS": "agentbox claude ", "COMP_CWORD": "2"}
    result = subprocess.run([sys.executable, "-m", "agentbox"], env=env, cwd=project, capture_output=True, text=True,
                            timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, "plain,shell\nplain,login\nfile,\n", "")


# --- start-up cost ------------------------------------------------------------------------------


def test_group_help_imports_no_yaml_jinja_or_sh(project: Path) -> None:
    code = (
        "import sys\n"
        "from agentbox.cli.main import main\n"
        "sys.argv = ['agentbox', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('yaml', 'jinja2', 'sh', 'secrets', 'agentbox.config.load', 'agentbox.progress')\n"
        "print(sorted(m for m in sys.modules if m in heavy or m.startswith(('agentbox.session', 'agentbox.vm', "
        "'agentbox.cli.commands.'))), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=30)
    assert result.stderr == "[]\n"
    assert "\nBackground work:\n" in result.stdout
