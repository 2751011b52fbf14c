"""One home per agent: each built-in agent's record is whole, and no other module keeps a per-agent table.

Everything agentbox knows about a built-in agent is its record (agentbox/agents/<name>.py, gathered by
agents/builtin.py). These checks read the records and the code, so a new agent that misses a fact, or a
module that grows its own table keyed by agent names again, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentbox.agents import builtin
from agentbox.agents.builtin import BUILTIN_AGENTS, AgentSpec
from agentbox.agents.logins import COMPANION_PARSERS, PARSERS
from agentbox.sync.transform import LOGIN_TRANSFORMS, TRANSFORMS

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentbox"
PROVISION = ROOT / "provision"

# String constants outside agentbox/agents/ that name an agent's fact and are no per-agent table, each with why.
ALLOWED: dict[tuple[str, str], str] = {
    ("agentbox/net/policy.py", "github.com"): "the `github` network preset, not Copilot's endpoints",
    ("agentbox/credentials/broker/ghcli.py", "github.com"): "the GitHub CLI's login (not an agent's record)",
    ("agentbox/credentials/broker/ghcli.py", "api.github.com"): "the GitHub CLI's login (not an agent's record)",
    ("agentbox/net/github.py", "github.com"): "GitHub's own read-only and push rules, not an agent's",
    ("agentbox/net/github.py", "api.github.com"): "GitHub's own API write rules, not an agent's",
}


# Fields whose empty value means something (only None is unset there), each with what.
EMPTY_IS_A_VALUE = {"login": "(): `agentbox NAME login` starts the agent itself, whose TUI asks how to log in"}


def _empty(field: str, value: object) -> bool:
    return value is None or (field not in EMPTY_IS_A_VALUE and value in ("", (), {}))


def missing_fields(spec: AgentSpec) -> list[str]:
    """What is wrong with a record: fields neither set nor marked none (with a reason), or marked none but set."""
    problems = []
    for field in AgentSpec._fields:
        if field == "none":
            continue
        value = getattr(spec, field)
        reason = spec.none.get(field)
        if _empty(field, value) and not reason:
            problems.append(f"{spec.name}.{field} is not set and `none` gives no reason")
        if not _empty(field, value) and field in spec.none:
            problems.append(f"{spec.name}.{field} is set but `none` says it is not")
    problems += [f"{spec.name}.none names {field}, which is no field" for field in spec.none
                 if field not in AgentSpec._fields]
    return problems


@pytest.mark.parametrize("name", list(BUILTIN_AGENTS))
def test_every_field_of_a_builtin_agent_is_set_or_said_why_not(name: str) -> None:
    assert missing_fields(BUILTIN_AGENTS[name]) == []


def test_a_record_missing_a_field_is_found() -> None:
    """The control: the check above can fail."""
    spec = BUILTIN_AGENTS["claude"]
    assert missing_fields(spec._replace(endpoints=())) == ["claude.endpoints is not set and `none` gives no reason"]
    assert missing_fields(spec._replace(none={**spec.none, "endpoints": "x"})) == [
        "claude.endpoints is set but `none` says it is not"]
    assert missing_fields(spec._replace(none={**spec.none, "endpoint": "x"})) == [
        "claude.none names endpoint, which is no field"]


def test_each_agent_has_its_own_module_and_the_names_a_record_gives_exist() -> None:
    for name, spec in BUILTIN_AGENTS.items():
        assert spec.name == name
        assert getattr(builtin, name).RECORD is spec, f"agentbox/agents/{name}.py holds {name}'s record"
        for login in spec.login_formats:
            assert login.parser in PARSERS
            assert login.companion_parser is None or login.companion_parser in COMPANION_PARSERS
            assert f"~/{login.path}" in spec.credentials
        for _, transform in spec.sync_transforms:
            assert transform in TRANSFORMS
        for relative, transform in spec.login_transforms:
            assert transform in LOGIN_TRANSFORMS and f"~/{relative}" in spec.credentials
        if spec.login_files is not None:
            assert set(spec.login_files) <= set(spec.credentials)
        if spec.settings is not None:
            assert spec.folder is not None and spec.settings.path.startswith(spec.folder + "/")


# -- no per-agent table elsewhere -------------------------------------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def agent_facts_outside_records(package: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """String constants outside agents/ (docstrings aside) that are an agent's name or binary, a path in an
    agent's folder, or one of its endpoints: the signs of a per-agent table or branch."""
    words = {spec.name for spec in BUILTIN_AGENTS.values()} | {spec.binary for spec in BUILTIN_AGENTS.values()}
    folders = {f".{spec.name}" for spec in BUILTIN_AGENTS.values()} | {
        spec.folder for spec in BUILTIN_AGENTS.values() if spec.folder}
    hosts = {host for spec in BUILTIN_AGENTS.values() for host in spec.endpoints}
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).as_posix()
        if relative.startswith("agentbox/agents/"):
            continue
        tree = ast.parse(path.read_text(), relative)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docstrings:
                continue
            text = node.value
            fact = text in words or text in hosts or any(
                text.startswith(folder) or f"~/{folder}" in text or f"/{folder}/" in text for folder in folders)
            if fact and (relative, text) not in ALLOWED:
                found.append((relative, node.lineno, text))
    return found


def test_no_module_outside_agents_keeps_a_per_agent_table() -> None:
    assert agent_facts_outside_records() == []


def test_a_per_agent_table_outside_agents_is_found(tmp_path: Path) -> None:
    """The control: a table keyed by agent names, a branch on one, a path in an agent's folder are found."""
    package = tmp_path / "agentbox"
    (package / "agents").mkdir(parents=True)
    (package / "agents" / "claude.py").write_text('NAME = "claude"\n')
    (package / "net").mkdir()
    (package / "net" / "policy.py").write_text(
        '"""Docstrings may say claude."""\n'
        'HOSTS = {"codex": ("api.openai.com",)}\n'
        'def f(name):\n    return name == "gemini" or f"~/.kiro/{name}"\n')
    assert agent_facts_outside_records(package) == [
        ("agentbox/net/policy.py", 2, "codex"),
        ("agentbox/net/policy.py", 2, "api.openai.com"),
        ("agentbox/net/policy.py", 4, "gemini"),
        ("agentbox/net/policy.py", 4, "~/.kiro/"),
    ]


# -- launch.sh's agent-specific steps agree with the records ------------------------------------------------------


def _shell() -> str:
    """provision's scripts: launch.sh and the parts it sources (whatever their split)."""
    return "\n".join(path.read_text() for path in sorted(PROVISION.rglob("*.sh")))


def _function(shell: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}\(\) \{{\n(.*?)^\}}", shell, re.M | re.S)
    assert match, f"provision/**/*.sh defines no function {name}"
    return match.group(1)


def test_launch_sh_answers_the_one_time_prompts_the_records_name() -> None:
    shell = _shell()
    checked = 0
    for spec in BUILTIN_AGENTS.values():
        for prompt in spec.one_time_prompts:
            where, _, what = prompt.answered_by.partition(": ")
            if where != "launch.sh":
                continue
            body = _function(shell, what)
            assert f"$HOME/{prompt.file}" in body, f"{what} writes {prompt.file} ({spec.name}'s record)"
            # Where the step is guarded by the agent's binary, the guard names the record's binary.
            for guard in re.findall(rf'^\[ "\$binary" != (\S+) \] \|\| {re.escape(what)}$', shell, re.M):
                assert guard == spec.binary
            checked += 1
    assert checked >= 2


def test_agent_paths_in_launch_sh_are_the_records() -> None:
    """Each path launch.sh touches in an agent's folder is one its record names (settings, prompts, logins)."""
    known = set()
    for spec in BUILTIN_AGENTS.values():
        known |= {prompt.file for prompt in spec.one_time_prompts}
        known |= {path.removeprefix("~/") for path in spec.credentials}
        known |= {spec.settings.path} if spec.settings else set()
        known |= {f"{spec.folder}"} if spec.folder else set()
    folders = tuple(f".{spec.name}" for spec in BUILTIN_AGENTS.values())
    used = set(re.findall(r'\$HOME/(\.[\w.-]+(?:/[\w.-]+)*)', _shell()))
    agent_paths = {path for path in used if path.startswith(folders)}
    assert agent_paths, "launch.sh writes files of the agents (the onboarding, the trusted folder)"
    assert agent_paths <= known
    binaries = set(re.findall(r'"\$binary" !?= (\w[\w-]*)', _shell()))
    assert binaries <= {spec.binary for spec in BUILTIN_AGENTS.values()}
