"""agentbox's own time on an agent launch: it imports only what it runs (no click: agentbox.cli.main's launch line),
the global options before the agent's name still work there, and the paths are computed once per process."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, run_cli, write, write_trusted

REPO = Path(__file__).resolve().parent.parent
# Measured on a warm launch of `codex --version` (91 in the benchmark's sandbox): the bound catches a module
# tree pulled in again, not one module more. (Issue 39 gave the launch four package __init__s: cli, tasks,
# credentials.broker and vm.workmode's split from review.isolation. Issue 40's plan added four small ones the entry
# point loads first (cli.launchflags, agents.argv, session.plan, config.checkpointkeys) and two that record and save
# a full launch's plan (session.planrecorder, session.planwrite); and two a full launch costs less with: lazyre (no
# pattern compiled at import) and the broker's gh reader ghhosts (no PyYAML).) A launch from its verified plan loads
# far fewer (tests/test_launch_plan.py). Issue 41 added four small ones: session.canaries (a session's canary
# secrets), session.privatefiles and net.fingerprints (network.private's fingerprints, standard library only), and
# net.hold (whether the running VM is held on the host: its firewall's forwards, the context's enforcement). Issue 42
# added seven: the instruction files' list (review.instructionfiles), their quarantine, walk and writer, and after the
# shell session.endreport (the session's report), net.sessionlog (the proxy log's tail since the session began) and
# review.reportchain (the signed chain it is added to).
MAX_AGENTBOX_MODULES = 123
NEVER_ON_A_LAUNCH = ("click", "uuid", "yaml", "jinja2", "ssl", "http.client", "agentbox.cli.commandline",
                     "agentbox.cli.commands.agentcommand",
                     # dataclasses' decorator costs inspect and ast: NamedTuples and plain classes instead
                     "dataclasses", "inspect", "ast", "datetime", "agentbox.review.patchcheck")
# What only the credential broker or agentbox's proxy runs: absent when neither is on (open mode, broker off).
BROKER_OR_PROXY_ONLY = ("agentbox.net.guard", "agentbox.net.certauthority", "agentbox.net.upstream", "agentbox.credentials.broker.brokered",
                        "agentbox.net.broker")
# Python's own: inspect and ast come with dataclasses, urllib.parse with pathlib (3.11); absent unless they do.
STDLIB_DEFERRED = ("inspect", "ast", "urllib.parse")

TRACED = """
import json, os, sys
before = set(sys.modules)
sys.argv = ["agentbox", *json.loads(os.environ["TRACE_ARGS"])]
try:
    from agentbox.cli.main import main
    main()
finally:
    with open(os.environ["TRACE_OUT"], "w") as out:
        json.dump(sorted(set(sys.modules) - before), out)
"""


def traced(cwd: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The real CLI in a child process without site's start-up imports (-S), and the modules it imported."""
    out = tmp_path / "modules.json"
    path = [str(REPO), *site.getsitepackages(), site.getusersitepackages()]
    env = {**os.environ, "TRACE_ARGS": json.dumps(args), "TRACE_OUT": str(out), "PYTHONPATH": os.pathsep.join(path)}
    result = subprocess.run([sys.executable, "-S", "-c", TRACED], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    return result, set(json.loads(out.read_text()))


def stdlib_floor() -> set[str]:
    code = "import sys; b = set(sys.modules); import dataclasses, pathlib; print(' '.join(set(sys.modules) - b))"
    return set(subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())


@pytest.fixture
def stub_out(project: Path, vm: FakeLima) -> Path:
    """Where the stub agents write what they got; one launch made, so the next is warm (config cached)."""
    out = project / ".stub-out.json"
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {out}\n")
    result = run_cli("codex", "--version", cwd=project)
    assert result.exit_code == 0, result.stderr
    out.unlink()
    vm.clear()
    return out


def test_a_warm_launch_imports_no_click_and_only_what_it_runs(project: Path, stub_out: Path, vm: FakeLima,
                                                              tmp_path: Path) -> None:
    result, modules = traced(project, tmp_path, "codex", "--version")
    assert result.returncode == 0, result.stderr
    assert json.loads(stub_out.read_text())["args"][-1] == "--version"
    assert vm.subcommands() == ["list", "shell"]
    assert [name for name in NEVER_ON_A_LAUNCH if name in modules] == []
    floor = stdlib_floor()
    assert [name for name in STDLIB_DEFERRED if name in modules and name not in floor] == []
    assert len([name for name in modules if name.startswith("agentbox")]) <= MAX_AGENTBOX_MODULES


def warm_launch_modules(project: Path, vm: FakeLima, tmp_path: Path, config: str) -> set[str]:
    """The modules a warm `codex --version` imported in the project with this config (one launch made first)."""
    out = project / ".stub-out.json"
    write_trusted(project, f"{config}env:\n  AGENTBOX_TEST_OUT: {out}\n")
    assert run_cli("codex", "--version", cwd=project).exit_code == 0  # warm: the config is cached
    vm.clear()
    result, modules = traced(project, tmp_path, "codex", "--version")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["args"][-1] == "--version"
    return modules


@pytest.mark.parametrize("broker", [False, True])
def test_a_launch_without_broker_or_proxy_imports_neither(project: Path, vm: FakeLima, tmp_path: Path,
                                                          broker: bool) -> None:
    """credentials.broker off in open mode: the broker's, the CA's and the proxy's modules stay out. The control,
    the broker on (the default): the same launch imports them (its proxy serves the broker)."""
    modules = warm_launch_modules(project, vm, tmp_path, f"credentials:\n  broker: {str(broker).lower()}\n")
    imported = [name for name in BROKER_OR_PROXY_ONLY if name in modules]
    if broker:
        assert {"agentbox.net.guard", "agentbox.credentials.broker.brokered", "agentbox.net.broker"} <= set(imported)
    else:
        assert imported == []


def test_commands_that_are_no_launch_still_go_through_click(project: Path, stub_out: Path, tmp_path: Path) -> None:
    """The control: `AGENT --help` (click's help), `AGENT shell` and other commands import click."""
    for args in (("codex", "--help"), ("codex", "shell", "--", "true"), ("ls",)):
        result, modules = traced(project, tmp_path, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "click" in modules, args


def test_global_options_before_the_agent_work_on_the_launch_line(project: Path, stub_out: Path, vm: FakeLima,
                                                                 tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result, modules = traced(elsewhere, tmp_path, "-C", str(project), "--debug", "--timings", "codex", "exec", "hi")
    assert result.returncode == 0, result.stderr
    assert "click" not in modules
    assert json.loads(stub_out.read_text())["args"][-2:] == ["exec", "hi"]
    assert "limactl shell" in result.stderr  # --debug: every limactl call
    assert "total" in result.stderr  # --timings: the phases
    for flags in ((), ("-q",)):  # a stopped VM: agentbox says what it does, unless -q
        assert run_cli("stop", cwd=project).exit_code == 0
        result, modules = traced(project, tmp_path, *flags, "codex", "exec", "hi")
        assert result.returncode == 0, result.stderr
        assert "click" not in modules
        assert ("Starting VM" in result.stderr) is not bool(flags), result.stderr
    verbose, modules = traced(project, tmp_path, "-v", "codex", "--version")
    assert verbose.returncode == 0, verbose.stderr
    assert "click" not in modules


@pytest.mark.parametrize("args", [("-q", "-v", "codex"), ("-C", "/nonexistent/folder", "codex"), ("--bogus", "codex"),
                                  ("codex", "--detach", "shell")])
def test_usage_errors_before_the_agent_are_clicks_as_before(project: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    result, _ = traced(project, tmp_path, *args)
    before = run_cli(*args)  # click's command line in-process
    assert (result.returncode, result.stdout, result.stderr) == (before.exit_code, before.stdout, before.stderr)
    assert result.returncode == 2


def test_an_error_on_the_launch_line_is_reported_as_by_click(project: Path, limactl: FakeLima,
                                                             tmp_path: Path) -> None:
    """No VM and `codex --version`: agentbox's own error and exit code, the same through either path."""
    result, modules = traced(project, tmp_path, "codex", "--version")
    assert "click" not in modules
    before = run_cli("codex", "--version", cwd=project)
    assert (result.returncode, result.stderr) == (before.exit_code, before.stderr)
    assert result.returncode != 0 and "agentbox: error: " in result.stderr


def test_the_state_folder_is_computed_once_per_command(project: Path, vm: FakeLima,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    from agentbox import paths

    monkeypatch.delenv("AGENTBOX_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(project.parent / "xdg-state"))
    computed = []
    real = platformdirs.user_state_dir

    def counted(*args: object, **kwargs: object) -> str:
        computed.append(args)
        return str(real(*args, **kwargs))  # type: ignore[arg-type]

    monkeypatch.setattr(platformdirs, "user_state_dir", counted)
    run_cli("codex", "--version", cwd=project)  # the stub agent fails without AGENTBOX_TEST_OUT; it was run
    assert vm.subcommands() == ["list", "shell"]
    assert len(computed) == 1
    assert paths.state_dir() == project.parent / "xdg-state" / "agentbox"
    assert len(computed) == 1
    monkeypatch.setenv("XDG_STATE_HOME", str(project.parent / "other"))  # a new environment: computed anew
    assert paths.state_dir() == project.parent / "other" / "agentbox"
    assert len(computed) == 2


# `agentbox --help` prints click's text without click (agentbox.cli.helpscreen): what it no longer imports.
NEVER_ON_HELP = ("click", "agentbox.cli.commandline", "inspect", "uuid", "dataclasses")


@pytest.mark.parametrize("config", ["", "agents:\n  aider:\n    binary: aider\n  zed-agent-with-a-long-name:\n"
                                        "    binary: zed\n", "agents: [not a mapping\n"])
def test_help_is_clicks_text_without_click(project: Path, home: Path, tmp_path: Path, config: str) -> None:
    """No config, agents defined in the global config, a broken config: the same bytes as click's command line
    prints (`-C DIR --help` is click's), at the narrowest width, the usual one and a wide terminal (a child process
    each: click's test runner forces 80 columns)."""
    if config:
        (home / ".config" / "agentbox").mkdir(parents=True, exist_ok=True)
        (home / ".config" / "agentbox" / "config.yml").write_text(config)
    for columns in ("40", "80", "250"):
        os.environ["COLUMNS"] = columns
        try:
            result, modules = traced(project, tmp_path, "--help")
            clicks, used = traced(project, tmp_path, "-C", str(project), "--help")
        finally:
            del os.environ["COLUMNS"]
        assert "click" in used
        assert (result.returncode, result.stdout, result.stderr) == (0, clicks.stdout, clicks.stderr), columns
        assert [name for name in NEVER_ON_HELP if name in modules] == []
    assert ("aider" in result.stdout) is bool("aider" in config)


def test_help_that_helpscreen_cannot_render_goes_to_click(project: Path, home: Path, tmp_path: Path) -> None:
    """An agent whose summary has a word longer than its line (click breaks it its own way) is click's: the same
    text, click imported."""
    (home / ".config" / "agentbox").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "agentbox" / "config.yml").write_text(f"agents:\n  aider:\n    binary: {'x-' * 40}\n")
    result, modules = traced(project, tmp_path, "--help")
    assert "click" in modules
    clicks, _ = traced(project, tmp_path, "-C", str(project), "--help")
    assert (result.returncode, result.stdout) == (0, clicks.stdout)
    assert "x-x-x-" in result.stdout


COMPILES = """
import importlib, json, os, re, sys
package = os.path.join(os.environ["REPO"], "agentbox") + os.sep
seen = set()

def counted(real):
    def wrapper(*args, **kwargs):
        frame = sys._getframe(1)
        # The first frame outside re that is agentbox's own code, unless an import of another package comes first
        # (yaml's or click's patterns are theirs).
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(package):
                seen.add(f"{name[len(package):]}:{frame.f_lineno}")
                break
            if name.startswith("<frozen importlib"):
                break
            frame = frame.f_back
        return real(*args, **kwargs)
    return wrapper

re.compile, re._compile = counted(re.compile), counted(re._compile)
for name in json.loads(os.environ["MODULES"]):
    importlib.import_module(name)
print(json.dumps(sorted(seen)))
"""


def test_importing_agentbox_compiles_no_regular_expression(tmp_path: Path) -> None:
    """Every module of agentbox imported in one process compiles no pattern: each is compiled on first use
    (agentbox.lazyre). The control: a pattern compiled at import by a module of agentbox's is seen."""
    package = REPO / "agentbox"
    # __main__ runs the command line; remote/far.py is a standalone script (standard library only) that runs on a
    # remote host and is never imported here.
    skipped = {package / "__main__.py", package / "remote" / "far.py"}
    modules = sorted(".".join(("agentbox", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
                     for path in package.rglob("*.py") if path not in skipped)
    assert len(modules) > 150

    def compiles(names: list[str], root: Path = REPO) -> list[str]:
        env = {**os.environ, "MODULES": json.dumps(names), "REPO": str(root), "PYTHONPATH": str(root)}
        # the control in its own folder, -S: the editable install's finder would answer `agentbox` first
        flags = [] if root == REPO else ["-S"]
        result = subprocess.run([sys.executable, *flags, "-c", COMPILES], cwd=root, env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return list(json.loads(result.stdout.splitlines()[-1]))

    assert compiles(modules) == []
    control = tmp_path / "control"
    (control / "agentbox").mkdir(parents=True)
    (control / "agentbox" / "__init__.py").write_text("")
    (control / "agentbox" / "eager.py").write_text("import re, string\nNAME = re.compile('[a-z]+')\n"
                                                   "class Shape(string.Template):\n    delimiter = '%'\n")
    assert compiles(["agentbox.eager"], control) == ["eager.py:2", "eager.py:3"]


GH_LOGIN = ("# what gh writes\ngithub.com:\n    users:\n        octo:\n            oauth_token: gho_REAL123\n"
            "    git_protocol: https\n    user: octo\n    oauth_token: gho_REAL123\n")


@pytest.mark.parametrize("login", [GH_LOGIN, GH_LOGIN.replace("    users:", "    extra: &shared ssh\n    users:")])
def test_a_warm_launch_reads_the_gh_login_without_yaml(project: Path, home: Path, vm: FakeLima, tmp_path: Path,
                                                       login: str) -> None:
    """The broker's handshake reads ~/.config/gh/hosts.yml as gh writes it without PyYAML; the VM gets the same
    hosts.yml either way. The control: a file the small reader does not take (an anchor) is PyYAML's, as before."""
    write(home / ".config" / "gh" / "hosts.yml", login, mode=0o600)
    modules = warm_launch_modules(project, vm, tmp_path, "")
    assert "agentbox.credentials.broker.ghcli" in modules  # the handshake read the login
    assert ("yaml" in modules) is ("&shared" in login)
    vm_login = (vm.guest_home(NAME) / ".config" / "gh" / "hosts.yml").read_text()
    placeholder = vm_login.split("oauth_token: ")[1].split("\n")[0]
    assert placeholder.startswith("gho_agentbox-ph-")
    assert vm_login == (f"github.com:\n  git_protocol: https\n  oauth_token: {placeholder}\n  user: octo\n  users:\n"
                        f"    octo:\n      oauth_token: {placeholder}\n")
