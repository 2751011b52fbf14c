"""Config discovery, merging, validation and the JSON view, through the real CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from agentbox.agents.builtin import BUILTIN_AGENTS
from tests.helpers import FakeLima, run_agentbox, run_cli, write


def config_json(cwd: Path) -> dict:
    result = run_cli("config", "--json", "--show-secrets", cwd=cwd)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def global_config(home: Path, text: str) -> Path:
    return write(home / ".config" / "agentbox" / "config.yml", text)


def test_empty_local_file_is_a_valid_config(project: Path) -> None:
    write(project / "agentbox.yml", "")
    data = config_json(project)
    assert data["workspace"] == str(project)
    assert data["vm"] == {
        "name": "agentbox-myproject",
        "cpus": 4,
        "memory": "8GiB",
        "disk": "20GiB",
        "vmType": None,
        "arch": None,
        "mountType": None,
        "template": None,
        "image": None,
        "lima": {},
        "protectGitHooks": False,
        "base": "off",  # AGENTBOX_VM_BASE: the suite creates VMs from scratch (tests/conftest.py)
        "baseMaxAgeDays": 7,
    }
    assert data["mounts"] == []
    assert data["env"] == {}
    assert data["sync"] == {"remoteWrite": False, "agentConfig": True}
    assert data["startupWaitSec"] == 30
    assert data["bootstrap"] == {"onCreateScript": [], "onStartScript": []}
    assert data["caCert"] is None
    assert data["agents"]["claude"] == {
        "binary": "claude",
        "defaultArgs": ["--dangerously-skip-permissions"],
        "model": None,
        "vmName": "agentbox-myproject",
        "install": "npm install -g @anthropic-ai/claude-code",
        "credentials": ["~/.claude/.credentials.json", "~/.claude.json"],
        "sync": {"include": [], "exclude": [], "mcpSecrets": False},
        "taskArgs": ["-p"],
        "endpoints": list(BUILTIN_AGENTS["claude"].endpoints),
        "instructionFiles": list(BUILTIN_AGENTS["claude"].instruction_files),
    }
    assert data["network"] == {"mode": "open", "allowHost": False, "allowLan": False, "presets": [], "allow": [],
                               "agentApi": True, "uploadLimit": "50MiB", "inspect": "credentials",
                               "private": [".env*", "*.pem", "*.key", "id_*", "secrets/**"]}
    assert data["credentials"] == {"netrc": False, "gh": True, "git": True, "writeBack": True, "broker": True}
    assert data["agents"]["kiro"]["binary"] == "kiro-cli"
    assert data["agents"]["kiro"]["defaultArgs"] == ["chat", "--trust-all-tools"]
    assert data["agents"]["gemini"]["defaultArgs"] == ["--approval-mode=yolo", "--no-sandbox"]
    assert data["agents"]["codex"]["defaultArgs"] == ["--dangerously-bypass-approvals-and-sandbox"]
    assert data["agents"]["opencode"] == {
        "binary": "opencode",
        "defaultArgs": ["--auto"],
        "model": None,
        "vmName": "agentbox-myproject",
        "install": "npm install -g opencode-ai",
        "credentials": ["~/.local/share/opencode/auth.json"],
        "sync": {"include": [], "exclude": [], "mcpSecrets": False},
        "taskArgs": ["run"],
        "endpoints": list(BUILTIN_AGENTS["opencode"].endpoints),
        "instructionFiles": list(BUILTIN_AGENTS["opencode"].instruction_files),
    }
    assert data["agents"]["copilot"] == {
        "binary": "copilot",
        "defaultArgs": ["--allow-all"],
        "model": None,
        "vmName": "agentbox-myproject",
        "install": BUILTIN_AGENTS["copilot"].install,
        "credentials": ["~/.copilot/config.json"],
        "sync": {"include": [], "exclude": [], "mcpSecrets": False},
        "taskArgs": ["-p"],
        "endpoints": list(BUILTIN_AGENTS["copilot"].endpoints),
        "instructionFiles": list(BUILTIN_AGENTS["copilot"].instruction_files),
    }


def test_previous_tool_examples_from_a_subdirectory(project: Path, home: Path) -> None:
    """The README examples of the previous agentbox, global plus local, keep their meaning."""
    global_config(
        home,
        """\
sync:
  remoteWrite: false          # git push blocked (default)

vm:
  cpus: 4
  memory: "8GiB"
  disk: "20GiB"

defaults:
  startupWaitSec: 30

env:
  CLAUDE_CODE_OAUTH_TOKEN: "sk-ant-oat01-xxx..."

agents:
  codex:
    binary: codex
    model: o3
  claude:
    model: sonnet
  gemini:
    binary: gemini
""",
    )
    write(
        project / "agentbox.yml",
        f"""\
workspace: {project}

sync:
  remoteWrite: true

vm:
  cpus: 2
  memory: "4GiB"

mounts:
  - location: "~/extra-data"
    mountPoint: "/home/user/data"
    writable: false

startupWaitSec: 10

env:
  MY_PROJECT_KEY: "value"

agents:
  codex:
    vmName: codex-myproj
    model: o4-mini
""",
    )
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    data = config_json(sub)
    assert data["workspace"] == str(project)
    assert data["sync"] == {"remoteWrite": True, "agentConfig": True}
    assert (data["vm"]["cpus"], data["vm"]["memory"], data["vm"]["disk"]) == (2, "4GiB", "20GiB")
    assert data["mounts"] == [
        {"location": str(home / "extra-data"), "mountPoint": "/home/user/data", "writable": False}
    ]
    assert data["startupWaitSec"] == 10
    assert data["env"] == {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-xxx...", "MY_PROJECT_KEY": "value"}
    assert data["agents"]["codex"]["model"] == "o4-mini"
    assert data["agents"]["codex"]["vmName"] == "codex-myproj"
    assert data["agents"]["claude"]["model"] == "sonnet"
    assert data["agents"]["claude"]["vmName"] == "agentbox-myproject"


def test_merge_rules(project: Path, home: Path) -> None:
    global_config(
        home,
        """\
vm: {cpus: 8, disk: 40GiB}
env: {A: global-a, B: global-b}
mounts: [{location: /opt/global-only}]
bootstrap:
  onCreateScript: ~/g-create.sh
  onStartScript: [~/g-start1.sh, ~/g-start2.sh]
defaults: {startupWaitSec: 45}
caCert: ~/global.pem
agents: {claude: {model: opus, binary: claude-beta}}
""",
    )
    write(
        project / "agentbox.yml",
        """\
vm: {cpus: 2}
env: {B: local-b, C: local-c}
mounts: [{location: ./data, writable: true}]
bootstrap:
  onCreateScript: [setup.sh]
  onStartScript: scripts/start.sh
agents: {claude: {model: sonnet}}
""",
    )
    data = config_json(project)
    assert data["vm"]["cpus"] == 2
    assert data["vm"]["disk"] == "40GiB"
    assert data["env"] == {"A": "global-a", "B": "local-b", "C": "local-c"}
    assert data["mounts"] == [
        {"location": str(project / "data"), "mountPoint": str(project / "data"), "writable": True}
    ]
    assert data["bootstrap"]["onCreateScript"] == [str(home / "g-create.sh"), str(project / "setup.sh")]
    assert data["bootstrap"]["onStartScript"] == [
        str(home / "g-start1.sh"),
        str(home / "g-start2.sh"),
        str(project / "scripts" / "start.sh"),
    ]
    assert data["startupWaitSec"] == 45
    assert data["caCert"] == str(home / "global.pem")
    assert data["agents"]["claude"]["model"] == "sonnet"
    assert data["agents"]["claude"]["binary"] == "claude-beta"


def test_local_startup_wait_overrides_global_defaults_spelling(project: Path, home: Path) -> None:
    global_config(home, "defaults:\n  startupWaitSec: 45\n")
    write(project / "agentbox.yml", "defaults:\n  startupWaitSec: 12\n")
    assert config_json(project)["startupWaitSec"] == 12
    write(project / "agentbox.yml", "startupWaitSec: 7\n")
    assert config_json(project)["startupWaitSec"] == 7


def test_local_empty_mounts_list_clears_global_mounts(project: Path, home: Path) -> None:
    global_config(home, "mounts:\n  - location: /opt/tools\n")
    assert config_json(project)["mounts"][0]["location"] == "/opt/tools"
    write(project / "agentbox.yml", "mounts: []\n")
    assert config_json(project)["mounts"] == []


def test_xdg_config_home_is_honoured(project: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = home / "xdg"
    write(xdg / "agentbox" / "config.yml", "vm: {cpus: 6}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert config_json(project)["vm"]["cpus"] == 6


def test_custom_agent_is_defined_and_listed(project: Path) -> None:
    write(
        project / "agentbox.yml",
        "agents:\n  aider:\n    binary: aider\n    defaultArgs: --yes-always --no-git\n    install: pipx install aider-chat\n",
    )
    data = config_json(project)
    assert data["agents"]["aider"] == {
        "binary": "aider",
        "defaultArgs": ["--yes-always", "--no-git"],
        "model": None,
        "vmName": "agentbox-myproject",
        "install": "pipx install aider-chat",
        "credentials": [],
        "sync": {"include": [], "exclude": [], "mcpSecrets": False},
        "taskArgs": [],
        "endpoints": [],
        "instructionFiles": [],
    }
    lines = run_cli("--help", cwd=project).stdout.splitlines()
    agents = lines[next(i for i, line in enumerate(lines) if line.startswith("Agents (")) + 1:
                   lines.index("The VM:")]
    assert [line.split()[0] for line in agents if line.strip()] == [
        "codex", "claude", "gemini", "kiro", "opencode", "copilot", "aider"]


def test_credentials_switches_and_per_agent_lists(project: Path, home: Path) -> None:
    global_config(home, "credentials:\n  netrc: true\n")
    write(
        project / "agentbox.yml",
        "credentials:\n  gh: false\nagents:\n  claude:\n    credentials: false\n"
        "  codex:\n    credentials: [~/.codex/auth.json, ~/.codex/extra.json]\n"
        "  gemini:\n    credentials: {enabled: false}\n",
    )
    data = config_json(project)
    assert data["credentials"] == {"netrc": True, "gh": False, "git": True, "writeBack": True, "broker": True}
    assert data["agents"]["claude"]["credentials"] == []
    assert data["agents"]["codex"]["credentials"] == ["~/.codex/auth.json", "~/.codex/extra.json"]
    assert data["agents"]["gemini"]["credentials"] == []
    write(project / "agentbox.yml", "credentials: false\n")
    assert config_json(project)["credentials"] is False


def test_workspace_key_relative_and_tilde(project: Path, home: Path) -> None:
    other = project.parent / "other"
    other.mkdir()
    write(project / "agentbox.yml", "workspace: ../other\n")
    assert config_json(project)["workspace"] == str(other)
    (home / "code").mkdir()
    write(project / "agentbox.yml", "workspace: ~/code\n")
    assert config_json(project)["workspace"] == str(home / "code")


def test_no_local_file_uses_the_current_directory(project: Path) -> None:
    data = config_json(project)
    assert data["workspace"] == str(project)
    assert data["vm"]["name"] == "agentbox-myproject"


@pytest.mark.parametrize("where", ["home", "root"])
def test_home_and_root_are_refused_as_workspace(home: Path, where: str, limactl: FakeLima) -> None:
    cwd = home if where == "home" else Path("/")
    result = run_cli("status", cwd=cwd)
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"agentbox: error: the workspace would be {cwd} ")
    assert first.endswith("it is or contains your home folder; agentbox never mounts it into a VM" if where == "home"
                          else "; agentbox never mounts the whole filesystem")
    assert limactl.calls() == []
    # Commands that do not need a project still work there.
    assert run_cli("config", "--json", cwd=cwd).exit_code == 0


def shared_group() -> int | None:
    """A group this user may give a file to that is not the user's private group, or None."""
    import grp

    from agentbox.config.load import shared_group_problem

    allowed = None if os.getuid() == 0 else set(os.getgroups())
    for group in grp.getgrall():
        if (allowed is None or group.gr_gid in allowed) and shared_group_problem(group.gr_gid, os.getuid()):
            return group.gr_gid
    return None


def nothing_created(limactl: FakeLima, isolated_env: dict[str, Path]) -> bool:
    return limactl.calls() == [] and not (isolated_env["state"] / "vms").exists()


def test_group_writable_config_of_your_private_group_is_used(project: Path, limactl: FakeLima) -> None:
    from agentbox.config.load import shared_group_problem

    if shared_group_problem(os.getgid(), os.getuid()):
        pytest.skip("this user's primary group is not a private group")  # e.g. macOS's shared `staff`
    path = write(project / "agentbox.yml", "vm: {cpus: 2}\n", mode=0o664)  # what umask 002 gives a clone
    os.chown(path, -1, os.getgid())
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "cpus: 2" in limactl.lima_yaml("agentbox-myproject")
    assert "not used" not in result.stderr


def test_group_writable_config_of_a_shared_group_refuses_and_creates_nothing(
    project: Path, limactl: FakeLima, isolated_env: dict[str, Path]
) -> None:
    import grp

    gid = shared_group()
    if gid is None:
        pytest.skip("no group other than a private one to give the file to")
    path = write(project / "agentbox.yml", "vm: {cpus: 2}\n", mode=0o664)
    os.chown(path, -1, gid)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"agentbox: error: {path} is not used: it is writable by the group {grp.getgrgid(gid).gr_name}, which "
    )
    assert "agentbox will not go on with other settings instead\n" in result.stderr
    assert f"hint: Fix it with `chmod g-w,o-w {path}` (or remove the file)" in result.stderr
    assert nothing_created(limactl, isolated_env)
    # The display commands still describe, saying why the file is left out.
    shown = run_cli("config", "--json", cwd=project)
    assert shown.exit_code == 0 and json.loads(shown.stdout)["vm"]["cpus"] == 4
    assert f"agentbox: warning: {path} is not used: it is writable by the group " in shown.stderr
    status = run_cli("status", cwd=project)
    assert status.exit_code == 0 and "status:    NotCreated" in status.stdout
    assert f"{path} is not used" in status.stderr


def test_world_writable_config_refuses_every_acting_command(
    project: Path, home: Path, limactl: FakeLima, isolated_env: dict[str, Path]
) -> None:
    path = write(project / "agentbox.yml", "vm: {cpus: 2}\n", mode=0o666)
    for command in (["start"], ["claude"], ["shell", "--", "true"], ["trust"], ["template"]):
        result = run_cli(*command, cwd=project)
        assert result.exit_code == 2, command
        assert f"{path} is not used: it is writable by group and others;" in result.stderr, command
    assert nothing_created(limactl, isolated_env)
    text = run_cli("config", cwd=project, env={"COLUMNS": "400"}).stdout
    assert f"# local config: none ({path} is not used: it is writable by group and others)\n" in text
    # The global file is held to the same rule.
    os.chmod(path, 0o644)
    gpath = global_config(home, "vm: {cpus: 3}\n")
    os.chmod(gpath, 0o646)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert f"{gpath} is not used: it is writable by others;" in result.stderr
    assert nothing_created(limactl, isolated_env)


def test_dangling_config_symlink_refuses(project: Path, home: Path) -> None:
    (project / "agentbox.yml").symlink_to(home / "dotfiles" / "gone.yml")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert "is a symlink to a file that does not exist" in result.stderr
    assert f"hint: Fix it with `rm {project / 'agentbox.yml'}`" in result.stderr


@pytest.mark.parametrize(
    ("group", "why"),
    [
        (("alice", "x", 1000, []), None),  # primary group, no listed members
        (("alice", "x", 1000, ["alice"]), None),
        (("alice", "x", 2000, []), None),  # not primary, but named like the user (a user private group)
        (("alice", "x", 1000, ["alice", "bob"]), "has other members (bob)"),
        (("devs", "x", 2000, ["alice"]), "is not your private group (that is gid 1000)"),
        (("staff", "x", 20, []), "is not your private group (that is gid 1000)"),
    ],
)
def test_private_group_decision(group: tuple, why: str | None) -> None:
    import grp
    import pwd

    from agentbox.config.load import private_group_problem

    user = pwd.struct_passwd(("alice", "x", 1000, 1000, "", "/home/alice", "/bin/sh"))
    assert private_group_problem(grp.struct_group(group), user) == why


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_config_owned_by_someone_else_refuses(project: Path, limactl: FakeLima, isolated_env) -> None:
    path = write(project / "agentbox.yml", "vm: {cpus: 2}\n")
    os.chown(path, 12345, -1)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert f"{path} is not used: it belongs to uid 12345, not to you (uid 0), so someone else could have written it;" in result.stderr
    assert f"hint: Fix it with `sudo chown $(id -u) {path}`" in result.stderr
    assert nothing_created(limactl, isolated_env)
    shown = run_cli("config", "--json", cwd=project)
    assert json.loads(shown.stdout)["vm"]["cpus"] == 4
    assert "belongs to uid 12345, not to you" in shown.stderr


def test_symlinked_config_is_followed_to_a_regular_file(project: Path, home: Path) -> None:
    target = write(home / "dotfiles" / "proj.yml", "vm: {cpus: 3}\n")
    (project / "agentbox.yml").symlink_to(target)
    assert config_json(project)["vm"]["cpus"] == 3
    os.chmod(target, 0o666)
    result = run_cli("config", "--json", cwd=project)
    assert json.loads(result.stdout)["vm"]["cpus"] == 4
    assert f"(-> {target})" in result.stderr


def test_config_that_is_a_directory_is_an_error(project: Path) -> None:
    (project / "agentbox.yml").mkdir()
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert f"{project / 'agentbox.yml'}: is a folder, not a regular file" in result.stderr


def test_config_that_is_a_fifo_is_an_error_not_a_hang(project: Path) -> None:
    os.mkfifo(project / "agentbox.yml", 0o644)
    result = run_agentbox("config", cwd=project)  # a read that blocks fails at the timeout
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"agentbox: error: {project / 'agentbox.yml'}: is a FIFO (named pipe), not a regular file",
        "hint: agentbox reads its config from a regular YAML file; rename or remove this one.",
    ]


def test_non_utf8_config_is_an_error_naming_the_file(project: Path) -> None:
    (project / "agentbox.yml").write_bytes(b"env:\n  A: caf\xe9\n")
    os.chmod(project / "agentbox.yml", 0o644)
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert f"{project / 'agentbox.yml'}:2: the file is not valid UTF-8" in result.stderr


def test_oversized_config_is_refused_unread(project: Path) -> None:
    write(project / "agentbox.yml", "# " + "x" * 1_100_000 + "\n")
    result = run_agentbox("config", cwd=project)
    assert result.returncode == 2
    assert "at most 1,000,000 bytes" in result.stderr


def test_alias_bomb_is_refused_unexpanded(project: Path) -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 10) + "]")
    write(project / "agentbox.yml", "vm:\n  lima:\n" + "".join(f"    {line}\n" for line in lines))
    result = run_agentbox("config", cwd=project)  # expanding it would not end before the timeout
    assert result.returncode == 2
    assert "alias bomb" in result.stderr


BAD_CONFIGS = [
    ("mount: []\n", "1:1: mount: unknown key", "Did you mean `mounts`?"),
    ("vm:\n  cpu: 3\n", "2:3: vm.cpu: unknown key", "Did you mean `vm.cpus`?"),
    ("cpus: 3\n", "1:1: cpus: unknown key", "vm.cpus"),
    ("vm:\n  cpus: 0\n", "2:9: vm.cpus: must be at least 1, found 0", None),
    ("vm:\n  cpus: two\n", "vm.cpus: expected a whole number, found 'two' (a string)", None),
    ("vm:\n  memory: lots\n", "vm.memory: 'lots' is not a size Lima understands", None),
    ("vm:\n  disk: -5GiB\n", "vm.disk: '-5GiB' is not a size Lima understands", None),
    ("vm:\n  memory: 8\n", "vm.memory: 8 is 8 bytes", None),
    ("env:\n  1BAD: x\n", "2:3: env.1BAD: is not a valid environment variable name", None),
    ("env:\n  MY-VAR: x\n", "env.MY-VAR: is not a valid environment variable name", None),
    ("env: [A]\n", "env: expected a mapping of NAME: value, found a list", None),
    ("env:\n  A: [1, 2]\n", "env.A: expected a string value, found a list", None),
    ("- a\n", "1:1: the top level must be a mapping", None),
    ("just a string\n", "the top level must be a mapping", None),
    ("sync:\n  remoteWrite: 'false'\n", "sync.remoteWrite: expected true or false, found 'false' (a string)", None),
    ("vm:\n  cpus: [1\n", "YAML syntax error", None),
    ("vm: {cpus: 2\n", "YAML syntax error", None),
    ("mounts:\n  - mountPoint: /x\n", "mounts.[0]: a mount needs `location`", None),
    ("mounts:\n  - location: /x\n    writeable: true\n", "mounts.[0].writeable: unknown key", "Did you mean `mounts.[0].writable`?"),
    ("mounts: /opt\n", "mounts: expected a list of mounts", None),
    ("mounts:\n  - location: /opt\n", "2:15: mounts[0].mountPoint: /opt would hide the VM's own /opt", "/mnt/opt"),
    ("mounts:\n  - location: /srv\n    mountPoint: data\n", "must be an absolute path inside the VM", None),
    ("bootstrap:\n  onCreateScript: 5\n", "bootstrap.onCreateScript: expected a string or a list of strings", None),
    ("agents:\n  cladue:\n    model: x\n", "agents.cladue: `cladue` is not a built-in agent", "Did you mean `agents.claude`?"),
    ("agents:\n  claude:\n    modle: x\n", "agents.claude.modle: unknown key", "Did you mean `agents.claude.model`?"),
    ("agents:\n  Bad_Name:\n    binary: x\n", "agents.Bad_Name: is not a valid agent name", None),
    ("vm:\n  name: my vm\n", "vm.name: 'my vm' is not a valid Lima instance name", None),
    ("vm:\n  name: agentbox-x.yaml\n", "must not end with .yml or .yaml", None),
    ("agents:\n  claude:\n    vmName: 'bad name'\n", "agents.claude.vmName: 'bad name' is not a valid Lima instance name", None),
    ("vm:\n  vmType: docker\n", "vm.vmType: expected one of qemu, vz, krunkit, wsl2, found 'docker'", None),
    ("vm:\n  mountType: reverse-sshfs\n", "vm.mountType: reverse-sshfs is refused", None),
    ("vm:\n  lima: [1]\n", "vm.lima: expected a mapping of Lima settings, found a list", None),
    ("startupWaitSec: 0\n", "startupWaitSec: must be at least 1", None),
    ("vm:\n  cpus: 2\nvm:\n  cpus: 3\n", "3:1: vm: the key appears twice (first at line 1)", None),
    ("workspace: ''\n", "workspace: must not be empty", None),
    ("vm:\n  image: ftp://mirror.example.com/u.img\n",
     "2:10: vm.image: 'ftp://mirror.example.com/u.img' is not an http(s) URL; write an https:// (or http://) URL, or "
     "a host path to the file (`~` and relative paths allowed)", None),
    ("vm:\n  image: [https://a.example/x86.img, https://a.example/arm.img]\n",
     "2:10: vm.image: expected the image's location or a mapping, found a list",
     "One image, for the VM's arch: `image: https://mirror.example.com/disk.qcow2`"),
    ("vm:\n  image: {location: u.img, digest: 'sha256:ABC'}\n",
     "vm.image.digest: 'sha256:ABC' is not a digest as Lima reads it: write `sha256:` and the 64 lowercase hex digits "
     "of the file's sha256sum (or `sha512:` and 128)", None),
    ("vm:\n  image: {digest: 'sha256:" + "a" * 64 + "'}\n",
     "vm.image: needs `location`: an https:// URL or a host path", None),
    ("vm:\n  image: {location: u.img, kernel: {cmdline: quiet}}\n",
     "vm.image.kernel: needs `location`: an https:// URL or a host path", None),
    ("vm:\n  image: {location: u.img, initrd: {location: i.img}}\n",
     "vm.image.initrd: an initrd is only used with a kernel", "Add `kernel: {location: ...}` beside it"),
    ("vm:\n  image: {location: u.img, arch: x86_64}\n", "vm.image.arch: unknown key", None),
    ("vm:\n  image: '~bob/u.img'\n", "vm.image: '~bob/u.img': only your own home can be written with ~", None),
    ("vm:\n  image: 'https:///u.img'\n", "vm.image: 'https:///u.img' names no host", None),
]


@pytest.mark.parametrize(("text", "message", "hint"), BAD_CONFIGS)
def test_bad_local_config_exits_2_naming_file_and_key(project: Path, text: str, message: str, hint: str | None) -> None:
    path = write(project / "agentbox.yml", text)
    result = run_cli("config", "--json", cwd=project)
    assert result.exit_code == 2, result.stdout
    assert result.stdout == ""
    assert f"agentbox: error: {path}:" in result.stderr
    assert message in result.stderr
    if hint:
        assert hint in result.stderr


def test_bad_global_config_names_the_global_file(project: Path, home: Path) -> None:
    path = global_config(home, "vm:\n  cpus: -1\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert f"{path}:2:9: vm.cpus: must be at least 1, found -1" in result.stderr


def test_bad_config_starts_nothing(project: Path, isolated_env: dict[str, Path], limactl: FakeLima) -> None:
    # The double is first on PATH: any limactl call, let alone a VM, would be recorded.
    write(project / "agentbox.yml", "vm: {cpus: 0}\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert f"agentbox: error: {project / 'agentbox.yml'}:1:12: vm.cpus: must be at least 1, found 0" \
        in result.stderr.splitlines()
    assert limactl.calls() == []
    assert [p.name for p in isolated_env["lima_home"].iterdir()] == []
    assert not isolated_env["state"].exists()


def test_every_error_of_a_file_is_reported_at_once_in_file_order(
        project: Path, isolated_env: dict[str, Path], limactl: FakeLima) -> None:
    path = write(project / "agentbox.yml", "env:\n  1BAD: x\nvm:\n  cpus: 0\n  memry: 4GiB\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"agentbox: error: 3 problems in {path}:",
        f"  {path}:2:3: env.1BAD: is not a valid environment variable name",
        "    hint: Use letters, digits and _, not starting with a digit.",
        f"  {path}:4:9: vm.cpus: must be at least 1, found 0",
        f"  {path}:5:3: vm.memry: unknown key",
        "    hint: Did you mean `vm.memory`?",
        "hint: Nothing was created or started. Fix them, then run the command again.",
    ]
    assert limactl.calls() == []
    assert [p.name for p in isolated_env["lima_home"].iterdir()] == []


def test_agent_and_mount_errors_are_reported_together(project: Path) -> None:
    path = write(project / "agentbox.yml", "mounts:\n  - location: /srv\n    mountPoint: data\n"
                 "agents:\n  cladue:\n    model: x\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == f"agentbox: error: 2 problems in {path}:"
    assert lines[1] == f"  {path}:3:17: mounts[0].mountPoint: 'data' must be an absolute path inside the VM"
    assert lines[2].startswith(f"  {path}:6:5: agents.cladue: `cladue` is not a built-in agent")
    assert lines[3] == "    hint: Did you mean `agents.claude`?"


@pytest.mark.parametrize("indent", ["\t", "  \t"])
def test_a_tab_in_the_indentation_is_named(project: Path, limactl: FakeLima, indent: str) -> None:
    path = write(project / "agentbox.yml", f"vm:\n  cpus: 2\n{indent}memory: 4GiB\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"agentbox: error: {path}:3:{len(indent)}: a tab in the indentation: YAML allows no tabs there",
        "hint: Replace the tab with spaces (YAML indents with spaces only), then run the command again.",
    ]
    assert limactl.calls() == []


def test_local_only_keys_in_global_config_are_ignored_with_a_warning(project: Path, home: Path) -> None:
    global_config(home, "workspace: /somewhere\nagents:\n  codex:\n    vmName: shared\n")
    result = run_cli("config", "--json", cwd=project)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["workspace"] == str(project)
    assert data["agents"]["codex"]["vmName"] == "agentbox-myproject"
    assert "workspace is ignored: it only has a meaning in a project's agentbox.yml" in result.stderr


def test_docker_era_keys_are_ignored_with_a_warning(project: Path) -> None:
    write(project / "agentbox.yml", "network:\n  policy: deny\nsync:\n  files: [~/.npmrc]\n")
    result = run_cli("config", "--json", cwd=project)
    assert result.exit_code == 0
    assert "network.policy is ignored: Docker Sandboxes' proxy setting; agentbox's is network.mode" in result.stderr
    assert "sync.files is ignored" in result.stderr


def test_env_values_keep_the_text_as_written(project: Path) -> None:
    write(
        project / "agentbox.yml",
        "env:\n  YES: yes\n  PORT: 8080\n  MODE: 0755\n  VERSION: 1.10\n  on: off\n  MULTI: \"a\\nb 'c' $HOME `x`\"\n",
    )
    assert config_json(project)["env"] == {
        "YES": "yes",
        "PORT": "8080",
        "MODE": "0755",
        "VERSION": "1.10",
        "on": "off",
        "MULTI": "a\nb 'c' $HOME `x`",
    }


def test_text_view_shows_origins(project: Path, home: Path) -> None:
    gpath = global_config(home, "vm:\n  cpus: 6\n")
    lpath = write(project / "agentbox.yml", "vm:\n  memory: 4GiB\n")
    out = run_cli("config", cwd=project, env={"COLUMNS": "400"}).stdout
    assert out.startswith(f"# global config: {gpath}\n# local config: {lpath}\n")
    lines = {line.split(":")[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert lines["vm.cpus"] == "vm.cpus: 6  # global"
    assert lines["vm.memory"] == 'vm.memory: "4GiB"  # local'
    assert lines["vm.disk"] == 'vm.disk: "20GiB"  # default'
    assert lines["workspace"] == f'workspace: "{project}"  # the folder of {lpath}'


def test_dash_c_targets_another_project(project: Path, tmp_path: Path) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 3\n")
    assert config_json(project)["vm"]["cpus"] == 3
    from click.testing import CliRunner

    from agentbox.cli.main import cli

    result = CliRunner().invoke(cli, ["-C", str(project / "nope"), "config"])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_validated_config_is_reused_only_for_identical_content(project: Path, isolated_env) -> None:
    write(project / "agentbox.yml", "vm:\n  cpus: 3\n")
    assert config_json(project)["vm"]["cpus"] == 3
    cached = list((isolated_env["state"] / "config-cache").iterdir())
    assert len(cached) == 1
    code = (
        "import sys, agentbox.config.load as c; cfg = c.load(); "
        "print(cfg.cpus, 'yaml' in sys.modules)"
    )
    import os
    import subprocess
    import sys

    hit = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, env=os.environ)
    assert hit.stdout.split() == ["3", "False"], hit.stderr  # a cache hit does not even import PyYAML
    write(project / "agentbox.yml", "vm:\n  cpus: 0\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert "vm.cpus: must be at least 1" in result.stderr


def test_config_masks_env_values_unless_asked(project: Path, home: Path) -> None:
    global_config(home, "env:\n  ANTHROPIC_API_KEY: sk-ant-api03-secret\n")
    for args in (["config"], ["config", "--json"]):
        result = run_cli(*args, cwd=project)
        assert result.exit_code == 0
        assert "sk-ant-api03-secret" not in result.output
        assert "<set, 19 chars>" in result.stdout
    assert json.loads(run_cli("config", "--json", cwd=project).stdout)["env"] == {"ANTHROPIC_API_KEY": "<set, 19 chars>"}
    shown = run_cli("config", "--show-secrets", cwd=project)
    assert "sk-ant-api03-secret" in shown.stdout


def test_config_masks_env_values_with_sources_too(project: Path, home: Path) -> None:
    global_config(home, "env:\n  ANTHROPIC_API_KEY: sk-ant-api03-secret\n")
    masked = run_cli("config", "--json", "--sources", cwd=project)
    assert "sk-ant-api03-secret" not in masked.output
    assert json.loads(masked.stdout)["config"]["env"] == {"ANTHROPIC_API_KEY": "<set, 19 chars>"}
    shown = json.loads(run_cli("config", "--json", "--sources", "--show-secrets", cwd=project).stdout)
    assert shown["config"]["env"] == {"ANTHROPIC_API_KEY": "sk-ant-api03-secret"}


def joined(lines: list[str]) -> str:
    """Lines of `agentbox config` cut to fit, without the indents, the `#`s and the spaces where they were cut."""
    return "".join("".join(line.split()).removeprefix("#") for line in lines)


def test_config_text_is_readable_in_100_columns(project: Path, home: Path) -> None:
    long_dir = "data-" + "x" * 70
    (project / long_dir).mkdir()
    gpath = global_config(home, "env:\n  LONG_TOKEN: " + "t" * 120 + "\n  SHORT: s\n")
    lpath = write(project / "agentbox.yml", f"vm:\n  cpus: 2\nmounts:\n  - location: ./{long_dir}\n")
    result = run_cli("config", "--show-secrets", cwd=project, env={"COLUMNS": "100"})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    header = [line for line in lines if line.startswith("#")]
    assert joined(header) == joined([f"# global config: {gpath}", f"# local config: {lpath}"])
    for index, line in enumerate(lines[len(header):], start=len(header)):
        if line.startswith("    "):  # a value (or a long origin) on its own line, below its key
            assert lines[index - 1].startswith(" ") or re.fullmatch(r"[\w.\[\]-]+:(  # .+)?", lines[index - 1]), line
            continue
        assert len(line) <= 100, line
        # unpadded `key: value  # origin`, or `key:  # origin` above the value, or `key:` above value and origin
        assert re.fullmatch(r"[\w.\[\]-]+(: \S(.*\S)?  # \S.*|:  # \S.*|:)", line), line
    at = lines.index("workspace:")  # its origin names the config file's long path: below the value
    assert lines[at + 1] == f'    "{project}"'
    assert joined(lines[at + 2:at + 4]) == joined([f"# the folder of {lpath}"])
    at = lines.index("env.LONG_TOKEN:  # global")  # a word longer than the line: cut, the rest indented deeper
    assert lines[at + 1:at + 3] == ['    "' + "t" * 95, "      " + "t" * 25 + '"']
    assert "env.SHORT: \"s\"  # global" in lines
    assert "vm.cpus: 2  # local" in lines
    at = lines.index("mounts[0].location:  # local")
    assert joined(lines[at + 1:at + 3]) == joined([f'"{project / long_dir}"'])
    at = lines.index("agents.gemini.credentials:  # default")  # a list too long for one line: one item per line
    assert lines[at + 1:at + 3] == ['    - "~/.gemini/oauth_creds.json"', '    - "~/.gemini/google_accounts.json"']


@pytest.mark.parametrize("install", [None, "curl -fsSL https://example.com/very/long/path/to/an/installer/script.sh"
                                           " | bash -s -- --prefix ~/.local --channel stable && "
                                           + "x" * 130 + " --version"])
def test_config_text_fits_100_columns(project: Path, install: str | None) -> None:
    if install:
        write(project / "agentbox.yml", f"agents:\n  mytool:\n    binary: mytool\n    install: '{install}'\n")
    result = run_cli("config", cwd=project, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if len(line) > 100] == []
    at = lines.index("agents.copilot.install:  # default")  # the built-in one is long too: cut between words
    assert lines[at + 1:at + 3] == ['    "npm install -g @github/copilot && { copilot --version >/dev/null 2>&1 || '
                                    'npm install -g', '      @github/copilot; }"']
    if install:
        at = lines.index("agents.mytool.install:  # local")
        below = [line for line in lines[at + 1:] if line.startswith("      ")]
        # the pieces, joined again, are the whole command (the cuts are at spaces, or inside the long word)
        pieces = [lines[at + 1].strip(), *(line.strip() for line in lines[at + 2:at + 1 + len(below) + 1]
                                          if line.startswith("      "))]
        assert "".join(pieces).replace(" ", "") == json.dumps(install).replace(" ", "")


def test_config_changed_shows_only_what_differs_from_the_defaults(project: Path, home: Path) -> None:
    gpath = global_config(home, "vm:\n  memory: 6GiB\n")
    default_disk = config_json(project)["vm"]["disk"]
    write(project / "agentbox.yml", f"vm:\n  cpus: 7\n  disk: {default_disk}\nagents:\n  claude:\n    model: opus\n")
    result = run_cli("config", "--changed", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if not line.startswith("#")] == [
        "vm.cpus: 7  # local", 'vm.memory: "6GiB"  # global', 'agents.claude.model: "opus"  # local',
    ]  # the disk is set, but to the default: not a change
    header = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert joined(header) == joined([f"# global config: {gpath}", f"# local config: {project / 'agentbox.yml'}"])
    as_json = run_cli("config", "--changed", "--json", cwd=project)
    assert json.loads(as_json.stdout) == {"vm.cpus": 7, "vm.memory": "6GiB", "agents.claude.model": "opus"}


def test_config_changed_without_config_files_is_empty(project: Path) -> None:
    assert json.loads(run_cli("config", "--changed", "--json", cwd=project).stdout) == {}


def test_config_get_prints_one_keys_effective_value(project: Path, home: Path) -> None:
    global_config(home, "vm:\n  memory: 6GiB\nenv:\n  TOKEN: sekrit\n")
    write(project / "agentbox.yml", "vm:\n  cpus: 3\nmounts:\n  - location: /srv\n    mountPoint: /mnt/srv\n")
    data = config_json(project)

    def get(*args: str) -> str:
        result = run_cli("config", "get", *args, cwd=project)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    assert get("vm.cpus") == "3\n"
    assert get("vm.memory") == "6GiB\n"  # a string as it is, for $(agentbox config get ...)
    assert get("vm.name") == f"{data['vm']['name']}\n"
    assert get("mounts[0].mountPoint") == "/mnt/srv\n"
    assert get("sync.remoteWrite") == "false\n"
    assert get("agents.claude.model") == "null\n"
    assert json.loads(get("vm")) == data["vm"]  # a section: one JSON object
    assert json.loads(get("agents.claude.defaultArgs")) == data["agents"]["claude"]["defaultArgs"]
    assert get("env.TOKEN") == "<set, 6 chars>\n"
    assert get("env.TOKEN", "--show-secrets") == "sekrit\n"


def test_config_get_never_prints_the_files_control_characters_raw(project: Path) -> None:
    # agentbox.yml is the agent's to write: what `config get` prints of it must not act on the terminal.
    write(project / "agentbox.yml", 'env:\n  NOTE: "a\\e[2J\\u202eb"\nagents:\n  claude:\n    defaultArgs: ["\\x9b31m"]\n')
    text = run_cli("config", "get", "env.NOTE", "--show-secrets", cwd=project)
    assert (text.exit_code, text.stdout) == (0, "a\\x1b[2J\\u202eb\n")
    listed = run_cli("config", "get", "agents.claude.defaultArgs", cwd=project)
    assert listed.exit_code == 0 and "\x9b" not in listed.stdout and json.loads(listed.stdout) == ["\x9b31m"]


@pytest.mark.parametrize(("key", "message"), [
    ("vm.cpu", "no config key `vm.cpu`: did you mean vm.cpus?"),
    ("agents.claude.modle", "no config key `agents.claude.modle`: did you mean agents.claude.model?"),
    ("nothing.like.it", "no config key `nothing.like.it`"),
    ("mounts[0]", "no config key `mounts[0]`: did you mean mounts?"),
])
def test_config_get_of_an_unknown_key_exits_2_with_the_nearest(project: Path, key: str, message: str) -> None:
    result = run_cli("config", "get", key, cwd=project)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"agentbox: error: {message}", "hint: `agentbox config` lists every key with its value and where it came from."]


def test_config_json_sources(project: Path, home: Path) -> None:
    gpath = global_config(home, "vm:\n  memory: 6GiB\n")
    lpath = write(project / "agentbox.yml", "vm:\n  cpus: 2\n")
    plain = run_cli("config", "--json", cwd=project)
    assert list(json.loads(plain.stdout))[:2] == ["workspace", "vm"]  # scripts reading the plain object keep working
    result = run_cli("config", "--json", "--sources", cwd=project)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert list(data) == ["config", "sources"]
    assert data["config"] == json.loads(plain.stdout)
    sources = data["sources"]
    assert sources["vm.cpus"] == f"local ({lpath})"
    assert sources["vm.memory"] == f"global ({gpath})"
    assert sources["vm.disk"] == "default"
    assert sources["vm.name"] == "default (from the workspace folder name)"
    assert sources["workspace"] == f"the folder of {lpath}"
    assert sources["agents.claude.binary"] == "default"
    text_keys = [line.split(":")[0] for line in run_cli("config", cwd=project).stdout.splitlines()
                 if line and not line.startswith(("#", " "))]
    assert list(sources) == text_keys  # the same keys the text view shows
    usage = run_cli("config", "--sources", cwd=project)
    assert usage.exit_code == 2 and "--sources goes with --json" in usage.stderr


@pytest.mark.parametrize("bad", ["/srv/a\nb", "/srv/a\rb", "/srv/\x1b[2Jx"])
def test_paths_with_control_characters_are_refused(project: Path, bad: str) -> None:
    for text in (f"mounts:\n  - {json.dumps(bad)}\n", f"caCert: {json.dumps(bad)}\n",
                 f"bootstrap:\n  onStartScript: {json.dumps(bad)}\n", f"mounts:\n  - location: {json.dumps(bad)}\n"):
        write(project / "agentbox.yml", text)
        result = run_cli("config", cwd=project)
        assert result.exit_code == 2, text
        assert "control character" in result.stderr


def test_a_workspace_path_with_a_newline_is_refused(home: Path, limactl) -> None:
    odd = home.parent / "work" / "two\nlines"
    odd.mkdir(parents=True)
    result = run_cli("start", cwd=odd)
    assert result.exit_code == 2
    assert "control character" in result.stderr
    assert limactl.calls() == []


def test_a_bad_image_stops_start_before_limactl_runs(project: Path, limactl) -> None:
    write(project / "agentbox.yml", "vm:\n  image: {location: u.img, digest: sha256:abc}\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert f"{project / 'agentbox.yml'}:2:36: vm.image.digest: 'sha256:abc' is not a digest" in result.stderr
    assert limactl.calls() == []


def test_config_shows_the_image_and_a_project_replaces_the_global_one_whole(project: Path, home: Path) -> None:
    global_config(home, "vm:\n  image:\n    location: ~/images/debian.qcow2\n    kernel: {location: ~/images/vmlinuz}\n")
    shown = json.loads(run_cli("config", "--json", cwd=project).stdout)["vm"]["image"]
    assert shown == {"location": str(home / "images" / "debian.qcow2"),
                     "kernel": {"location": str(home / "images" / "vmlinuz")}}
    write(project / "agentbox.yml", "vm:\n  image: https://mirror.example.com/noble.img\n")
    result = run_cli("config", "--json", cwd=project)
    assert json.loads(result.stdout)["vm"]["image"] == {"location": "https://mirror.example.com/noble.img"}
    text = run_cli("config", cwd=project).stdout
    assert 'vm.image.location: "https://mirror.example.com/noble.img"  # local' in text
    assert "vm.image.kernel" not in text
