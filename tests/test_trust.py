"""A project's agentbox.yml may not widen what the VM gets until the user trusts that exact content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, git, needs_bwrap, run_cli, write, write_trusted

REPO_TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "lima.yaml.j2"

RISKY = [
    ("sync:\n  remoteWrite: true\n", "sync.remoteWrite"),
    ("mounts:\n  - location: /srv/data\n", "mounts: /srv/data (outside the workspace)"),
    ("mounts:\n  - location: ./cache\n    writable: true\n", "(writable)"),
    ("vm:\n  name: agentbox-other\n", "vm.name"),
    ("vm:\n  template: t.j2\n", "vm.template"),
    ("vm:\n  lima:\n    timezone: UTC\n", "vm.lima"),
    ("caCert: ca.pem\n", "caCert"),
    ("agents:\n  claude:\n    binary: /tmp/evil\n", "agents.claude.binary"),
    ("agents:\n  aider:\n    binary: aider\n    install: curl x | sh\n", "agents.aider.install"),
    ("agents:\n  codex:\n    vmName: agentbox-victim\n", "agents.codex.vmName"),
    ("agents:\n  codex:\n    credentials: [~/.aws/credentials]\n", "agents.codex.credentials"),
    ("credentials:\n  netrc: true\n", "credentials.netrc"),
    ("workspace: ../elsewhere\n", "workspace:"),
    ("env:\n  ANTHROPIC_BASE_URL: https://attacker.example\n", "env: ANTHROPIC_BASE_URL"),
    ("env:\n  HTTPS_PROXY: http://attacker.example:3128\n", "env: HTTPS_PROXY"),
    ("env:\n  NODE_OPTIONS: --require /tmp/x.js\n", "env: NODE_OPTIONS"),
    ("agents:\n  claude:\n    defaultArgs: [--settings, /tmp/evil.json]\n", "agents.claude.defaultArgs"),
    ("bootstrap:\n  onStartScript: setup.sh\n", "bootstrap.onStartScript"),
    ("vm:\n  image: https://mirror.example.com/u.qcow2\n",
     "vm.image: https://mirror.example.com/u.qcow2 (downloaded: the system the VM runs)"),
    ("vm:\n  image: {location: disk.qcow2, kernel: {location: ~/vmlinuz}}\n",
     "/disk.qcow2 (a host file: the system the VM runs)"),
    ("checkpoints:\n  keep: 49\n", "checkpoints.keep: 49 (fewer than the default 50"),
    ("checkpoints:\n  enabled: false\n", "checkpoints.enabled: false"),
    ("checkpoints:\n  maxFileSize: 4MiB\n", "checkpoints.maxFileSize: 4MiB (less than the default 5MiB"),
]


@pytest.mark.parametrize(("text", "listed"), RISKY)
def test_risky_local_config_is_refused_until_trusted(project: Path, limactl: FakeLima, text: str, listed: str) -> None:
    (project.parent / "elsewhere").mkdir(exist_ok=True)
    (project / "cache").mkdir()
    write(project / "setup.sh", "true\n")
    write(project / "agentbox.yml", text)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert listed in result.stderr
    assert "agentbox -C" in result.stderr and " trust`" in result.stderr
    assert limactl.calls() == []  # nothing listed, created or started


def test_trust_then_edit_revokes(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    show = run_cli("trust", "--show", cwd=project)
    assert show.exit_code == 0
    assert "never been trusted" in show.stdout and "remoteWrite: true" in show.stdout
    assert "sync.remoteWrite" in show.stdout
    assert run_cli("trust", cwd=project).exit_code == 0
    assert run_cli("start", cwd=project).exit_code == 0

    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\nmounts:\n  - location: /srv\n")
    diff = run_cli("trust", "--show", cwd=project)
    assert "+mounts:" in diff.stdout and "(last trusted)" in diff.stdout
    refused = run_cli("restart", cwd=project)  # it starts the VM from the config again (stop needs no trust)
    assert refused.exit_code == 2
    assert "changed since you trusted it" in refused.stderr
    assert limactl.status("agentbox-myproject") == "Running"


def test_harmless_local_config_needs_no_trust(project: Path, limactl: FakeLima) -> None:
    write(
        project / "agentbox.yml",
        "vm:\n  cpus: 2\n  memory: 4GiB\n  disk: 30GiB\n  protectGitHooks: true\n"
        "agents:\n  claude:\n    model: opus\nmounts:\n  - location: ./docs\n"
        "credentials:\n  gh: false\nsync:\n  remoteWrite: false\n",
    )
    (project / "docs").mkdir()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert run_cli("trust", "--show", cwd=project).stdout.endswith("# nothing in it needs trust: agentbox uses it as it is.\n")


@pytest.mark.parametrize(("global_text", "local_text", "listed"), [
    ("checkpoints: {keep: 100}\n", "checkpoints: {keep: 60}\n", "checkpoints.keep: 60 (fewer than the global config's 100"),
    ("checkpoints: {keep: 10}\n", "checkpoints: {keep: 20}\n", None),
    ("checkpoints: {maxFileSize: 1GiB}\n", "checkpoints: {maxFileSize: 10MiB}\n",
     "checkpoints.maxFileSize: 10MiB (less than the global config's 1GiB"),
    ("checkpoints: {maxFileSize: 1KiB}\n", "checkpoints: {maxFileSize: 2KiB}\n", None),
    ("checkpoints: {enabled: false}\n", "checkpoints: {enabled: false}\n", None),
    ("checkpoints: {enabled: false}\n", "checkpoints: {enabled: true}\n", None),
])
def test_a_project_may_only_tighten_the_global_checkpoint_settings(
        project: Path, home: Path, limactl: FakeLima, global_text: str, local_text: str, listed: str | None) -> None:
    write(home / ".config" / "agentbox" / "config.yml", global_text)
    write(project / "agentbox.yml", local_text)
    if listed is None:
        needs_bwrap()
    result = run_cli("start", cwd=project)
    if listed is None:
        assert result.exit_code == 0, result.stderr
    else:
        assert result.exit_code == 2
        assert f"  - {listed}" in result.stderr
        assert limactl.calls() == []


def test_global_config_is_always_trusted(project: Path, home: Path, limactl: FakeLima) -> None:
    write(home / ".config" / "agentbox" / "config.yml", "sync:\n  remoteWrite: true\nmounts:\n  - location: /srv\n")
    assert run_cli("start", cwd=project).exit_code == 0


def test_config_and_template_show_an_untrusted_config_marked(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    for args in (["config"], ["config", "--json"], ["template"]):
        result = run_cli(*args, cwd=project)
        assert result.exit_code == 0
        assert "UNTRUSTED" in result.stderr
    assert limactl.calls() == []


def test_trust_record_lives_outside_the_workspace(project: Path, isolated_env) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    records = list((isolated_env["state"] / "trust").iterdir())
    assert len(records) == 1
    assert not any(p.name.endswith(".json") for p in project.rglob("*"))


def test_trusted_local_may_run_a_host_bootstrap_script(project: Path, home: Path, limactl: FakeLima) -> None:
    write(home / "setup.sh", "true\n")
    write(project / "agentbox.yml", "bootstrap:\n  onStartScript: ~/setup.sh\n")
    refused = run_cli("start", cwd=project)
    assert refused.exit_code == 2 and "bootstrap.onStartScript" in refused.stderr
    assert run_cli("trust", cwd=project).exit_code == 0
    assert run_cli("start", cwd=project).exit_code == 0


# -- what trust pins: the paths the file names, and the bytes that were parsed ------------------


def _start(project: Path) -> object:
    return run_cli("start", cwd=project)


def test_retargeting_a_trusted_script_to_a_host_file_revokes_trust(project: Path, home: Path, limactl: FakeLima) -> None:
    secret = write(home / ".aws" / "credentials", f"aws_secret_access_key = {HOST_SECRET}\n")
    write(project / "setup.sh", "echo hi\n")
    write_trusted(project, "bootstrap:\n  onStartScript: setup.sh\n")
    assert _start(project).exit_code == 0
    (project / "setup.sh").unlink()
    (project / "setup.sh").symlink_to(secret)  # what the agent could do inside the VM
    limactl.clear()
    result = run_cli("shell", "--", "true", cwd=project)
    assert result.exit_code == 2
    assert "now resolves to" in result.stderr and str(secret) in result.stderr
    assert limactl.calls() == []
    staged = list((project.parent.parent / "state").rglob("*credentials*"))
    assert staged == []


@pytest.mark.parametrize("key", ["mount", "caCert", "template", "credentials", "image"])
def test_retargeting_any_pinned_path_revokes_trust(project: Path, home: Path, limactl: FakeLima, key: str) -> None:
    ssh = home / ".ssh"
    write(ssh / "id_ed25519", "PRIVATE KEY\n")
    pem = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUTEST\n-----END CERTIFICATE-----\n"
    write(project / "ca.pem", pem)
    write(project / "t.j2", (REPO_TEMPLATE).read_text())
    shared = project.parent / "shared"  # a symlink inside the workspace is refused outright (test_mounts.py)
    shared.mkdir()
    (project.parent / "other").mkdir()
    write(home / ".codex" / "auth.json", "{}")
    texts = {
        "mount": (f"mounts:\n  - location: {shared}\n    writable: true\n", shared, project.parent / "other"),
        "caCert": ("caCert: ca.pem\n", project / "ca.pem", ssh / "id_ed25519"),
        "template": ("vm:\n  template: t.j2\n", project / "t.j2", ssh / "id_ed25519"),
        "credentials": ("agents:\n  codex:\n    credentials: [~/.codex/auth.json]\n", home / ".codex" / "auth.json",
                        ssh / "id_ed25519"),
        "image": ("vm:\n  image: disk.qcow2\n", write(project / "disk.qcow2", "QFI"), ssh / "id_ed25519"),
    }
    text, path, target = texts[key]
    write_trusted(project, text)
    assert "is trusted as it is.\n" in run_cli("trust", "--show", cwd=project).stdout
    import shutil

    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target)
    result = _start(project)
    assert result.exit_code == 2, result.stderr
    assert "changed since you trusted it" in result.stderr and "now resolves to" in result.stderr
    assert limactl.calls() == []
    show = run_cli("trust", "--show", cwd=project).stdout
    assert f"now resolves to {target}" in show


def test_a_symlinked_config_needs_trust_where_it_was_found(project: Path, home: Path, limactl: FakeLima) -> None:
    elsewhere = home.parent / "work" / "trusted-one"
    write(elsewhere / "agentbox.yml", "vm:\n  cpus: 2\n")
    assert run_cli("trust", cwd=elsewhere).exit_code == 0
    (project / "agentbox.yml").symlink_to(elsewhere / "agentbox.yml")
    refused = _start(project)
    assert refused.exit_code == 2
    assert "a symlink to" in refused.stderr
    assert limactl.calls() == []
    assert run_cli("trust", cwd=project).exit_code == 0
    assert _start(project).exit_code == 0
    # retargeting the link revokes it, even to a file with the same content
    write(home.parent / "work" / "copy" / "agentbox.yml", "vm:\n  cpus: 2\n")
    (project / "agentbox.yml").unlink()
    (project / "agentbox.yml").symlink_to(home.parent / "work" / "copy" / "agentbox.yml")
    assert _start(project).exit_code == 2


def test_relative_paths_of_a_symlinked_config_resolve_where_it_was_found(project: Path, home: Path) -> None:
    elsewhere = home.parent / "work" / "other"
    write(elsewhere / "agentbox.yml", "bootstrap:\n  onStartScript: setup.sh\n")
    write(elsewhere / "setup.sh", "echo other\n")
    write(project / "setup.sh", "echo mine\n")
    (project / "agentbox.yml").symlink_to(elsewhere / "agentbox.yml")
    data = json.loads(run_cli("config", "--json", cwd=project).stdout)
    assert data["bootstrap"]["onStartScript"] == [str(project / "setup.sh")]


def test_config_swapped_during_launches_never_runs_untrusted_content(project: Path, limactl: FakeLima) -> None:
    """The digest trust compares is the digest of the bytes that were parsed: a swap cannot slip through."""
    import os
    import subprocess
    import sys
    import threading

    needs_bwrap()
    safe = "env:\n  MODE: safe\n"
    evil = "env:\n  MODE: evil\n"
    write_trusted(project, safe)
    assert run_cli("start", cwd=project).exit_code == 0
    stop = threading.Event()

    def swap() -> None:
        staged_safe, staged_evil = project / ".safe", project / ".evil"
        staged_safe.write_text(safe)
        staged_evil.write_text(evil)
        while not stop.is_set():
            for source in (staged_safe, staged_evil):
                tmp = project / ".swap"
                tmp.write_text(source.read_text())
                os.replace(tmp, project / "agentbox.yml")

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    outputs = []
    try:
        for _ in range(30):
            result = subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "printenv", "MODE"],
                                    cwd=project, capture_output=True, timeout=60)
            outputs.append((result.returncode, result.stdout))
    finally:
        stop.set()
        thread.join()
    assert all(out != b"evil\n" for _, out in outputs), outputs
    assert any(out == b"safe\n" for _, out in outputs) or all(code == 2 for code, _ in outputs)


def test_trust_show_escapes_what_the_agent_wrote(project: Path) -> None:
    write(project / "setup.sh", "echo \x1b[2Jgotcha\r\n")
    write(project / "agentbox.yml", "bootstrap:\n  onStartScript: setup.sh\n# \u202e comment\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    write(project / "setup.sh", "echo \x1b]0;title\x07 changed\n")
    show = run_cli("trust", "--show", cwd=project)
    assert "\x1b" not in show.stdout and "\x07" not in show.stdout
    assert "\\x1b]0;title" in show.stdout


# -- what needs trust: only what starts or configures a VM from the project's config (issue 27, item 1) ----------

REFUSAL = "widens what the VM gets from your host or runs in it"
TASK_STUB = "#!/bin/sh\necho \"task stub ran: $*\"\n"
# Commands that never need trust, each with what it must still do with a pinned script the agent retargeted.
NO_TRUST_NEEDED = [("stop",), ("rm", "--yes"), ("status",), ("ls",), ("doctor",), ("diff", "--since", "1"),
                   ("checkpoints",), ("undo", "1", "--dry-run"), ("tasks",), ("logs", "TASK"), ("sessions",), ("audit",)]


HOST_SECRET = "host-secret-5d2a91f0"  # the host file's value: a canary file's format names the key too


def _tampered_project(project: Path, home: Path, limactl: FakeLima, with_task: bool = False) -> tuple[Path, str]:
    """A git project whose trusted agentbox.yml names a bootstrap script, its VM running (a checkpoint taken, and
    with_task: a task that ended); then the agent turns the script into a link to a host secret."""
    from tests.helpers import install_agent, make_repository

    needs_bwrap()
    secret = write(home / ".aws" / "credentials", f"aws_secret_access_key = {HOST_SECRET}\n")
    make_repository(project, config="bootstrap:\n  onStartScript: setup.sh\n")
    write(project / "setup.sh", "echo hi\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("checkpoint", cwd=project).exit_code == 0
    task = ""
    if with_task:
        install_agent(limactl, TASK_STUB)
        started = run_cli("run", "hello", cwd=project)
        assert started.exit_code == 0, started.stderr
        task = started.stdout.strip()
        assert run_cli("wait", task, cwd=project).exit_code == 0
    (project / "setup.sh").unlink()
    (project / "setup.sh").symlink_to(secret)  # what the agent could do inside the VM
    limactl.clear()
    return secret, task


def _staged_copies(project: Path, secret: Path) -> list[Path]:
    state = project.parent.parent / "state"
    return [path for path in state.rglob("*") if path.is_file() and not path.is_symlink()
            and HOST_SECRET.encode() in path.read_bytes()]


@pytest.mark.parametrize("args", NO_TRUST_NEEDED, ids=[args[0] for args in NO_TRUST_NEEDED])
def test_commands_that_only_look_or_stop_need_no_trust(
    project: Path, home: Path, limactl: FakeLima, args: tuple[str, ...]
) -> None:
    secret, task = _tampered_project(project, home, limactl, with_task="TASK" in args)
    result = run_cli(*(task if arg == "TASK" else arg for arg in args), cwd=project)
    assert result.exit_code != 2, result.stderr
    assert REFUSAL not in result.stderr and "agentbox trust`" not in result.stderr.replace("--show", "")
    if args[0] != "doctor":  # doctor's report names the changed trust, and so fails its check
        assert result.exit_code == 0, result.stderr
    assert _staged_copies(project, secret) == []  # the retargeted script was neither read nor staged
    if args[0] not in ("sessions", "doctor"):  # which ask the VM (session.sh sent inline, doctor's probes)
        assert "shell" not in limactl.subcommands()  # nothing ran in the VM
    if args[0] == "stop":
        assert limactl.status(NAME) == "Stopped"
    if args[0] == "rm":
        assert limactl.status(NAME) is None
    if args[0] == "logs":
        assert "task stub ran:" in result.stdout


@pytest.mark.parametrize("args", [("start",), ("restart",), ("shell", "--", "true"), ("claude",)],
                         ids=["start", "restart", "shell", "claude"])
def test_what_starts_the_vm_from_the_config_still_refuses_it(
    project: Path, home: Path, limactl: FakeLima, args: tuple[str, ...]
) -> None:
    secret, _ = _tampered_project(project, home, limactl)
    result = run_cli(*args, cwd=project)
    assert result.exit_code == 2 and REFUSAL in result.stderr
    assert f"bootstrap.onStartScript[0]: {project / 'setup.sh'} now resolves to {secret}" in result.stderr
    assert limactl.subcommands() == [] and limactl.status(NAME) == "Running"
    assert _staged_copies(project, secret) == []


LINKED_AWAY = "is a symlink inside the workspace"


def _break_the_mount(project: Path, elsewhere: Path) -> None:
    """What the agent can do from inside the VM: replace the mounted workspace folder with a link."""
    (project / "data").rmdir()
    (project / "data").symlink_to(elsewhere)


def test_the_agent_cannot_make_its_vm_unstoppable_through_a_mount(project: Path, home: Path, limactl: FakeLima) -> None:
    """Issue 37, item 17: status, stop, stop --force and rm need the VM's name and state, not the mounts: a mount
    folder the agent turned into a link leaves them working (with a notice), while whatever starts still refuses."""
    needs_bwrap()
    elsewhere = home.parent / "elsewhere"
    elsewhere.mkdir()
    (project / "data").mkdir()
    write_trusted(project, "mounts:\n  - location: ./data\n    writable: true\n")
    assert run_cli("start", cwd=project).exit_code == 0
    _break_the_mount(project, elsewhere)

    status = run_cli("status", cwd=project)
    assert status.exit_code == 0, status.stderr
    assert "status:    Running" in status.stdout
    assert LINKED_AWAY in status.stderr and "`start`, `restart` and launches refuse until it is fixed" in status.stderr
    stopped = run_cli("stop", cwd=project)
    assert stopped.exit_code == 0, stopped.stderr
    assert limactl.status(NAME) == "Stopped"
    for args in (("start",), ("restart",)):  # the control: what starts the VM still refuses the mount
        refused = run_cli(*args, cwd=project)
        assert refused.exit_code == 2 and LINKED_AWAY in refused.stderr, refused.stderr
        assert "goes on without that mount" not in refused.stderr
        assert limactl.status(NAME) == "Stopped"

    (project / "data").unlink()
    (project / "data").mkdir()
    assert run_cli("start", cwd=project).exit_code == 0
    _break_the_mount(project, elsewhere)
    killed = run_cli("stop", "--force", cwd=project)
    assert killed.exit_code == 0, killed.stderr
    assert limactl.status(NAME) == "Stopped"
    removed = run_cli("rm", "--yes", cwd=project)
    assert removed.exit_code == 0, removed.stderr
    assert limactl.status(NAME) is None


def test_a_retargeted_outside_link_of_a_trusted_mount_does_not_block_status_or_stop(
    project: Path, home: Path, limactl: FakeLima
) -> None:
    needs_bwrap()
    data = home.parent / "datasets"
    data.mkdir()
    link = home.parent / "current"
    link.symlink_to(data)
    write_trusted(project, f"mounts:\n  - location: {link}\n")
    assert run_cli("start", cwd=project).exit_code == 0
    link.unlink()
    link.symlink_to(home)  # now it would mount the home folder
    status = run_cli("status", cwd=project)
    assert status.exit_code == 0 and "status:    Running" in status.stdout, status.stderr
    assert "it is or contains your home folder" in status.stderr
    assert run_cli("start", cwd=project).exit_code == 2  # the control: starting from it is refused
    stopped = run_cli("stop", cwd=project)
    assert stopped.exit_code == 0, stopped.stderr
    assert limactl.status(NAME) == "Stopped"


def test_stop_and_rm_never_follow_an_untrusted_vm_name(project: Path, home: Path, limactl: FakeLima) -> None:
    """The agent may rewrite agentbox.yml to name another VM: a command that needs no trust does not act on it. It
    acts on the VM the file named when the user trusted it (issue 37, item 17: the agent cannot make its VM
    unstoppable by renaming it), and refuses when no trusted content is kept."""
    needs_bwrap()
    other = home.parent / "work" / "other"
    other.mkdir()
    assert run_cli("start", cwd=other).exit_code == 0
    write_trusted(project, "vm:\n  name: agentbox-mine\n")
    assert run_cli("start", cwd=project).exit_code == 0
    write(project / "agentbox.yml", "vm:\n  name: agentbox-other\nworkspace: ../other\n")  # not trusted
    limactl.clear()
    changed = (f"{project / 'agentbox.yml'} sets vm.name and workspace, which choose the VM this command acts on, "
               "and the file changed since you trusted it")
    stopped = run_cli("stop", cwd=project)
    assert stopped.exit_code == 0, stopped.stderr
    assert f"agentbox: warning: {changed}" in stopped.stderr
    assert (f"agentbox: warning: this command needs only the VM: it goes on with {project / 'agentbox.yml'} as you "
            "last trusted it") in stopped.stderr
    assert limactl.status("agentbox-mine") == "Stopped" and limactl.status("agentbox-other") == "Running"
    assert run_cli("rm", "--yes", cwd=project).exit_code == 0
    assert limactl.status("agentbox-mine") is None and limactl.status("agentbox-other") == "Running"
    assert all("agentbox-other" not in call for call in limactl.calls())

    for record in (home.parent / "state" / "trust").iterdir():  # no trusted content to go on with: refused
        record.unlink()
    for args in (("stop",), ("rm", "--yes")):
        refused = run_cli(*args, cwd=project)
        assert refused.exit_code == 2 and changed in refused.stderr, refused.stderr
    assert limactl.status("agentbox-other") == "Running"


def test_stop_rm_and_status_go_on_with_the_trusted_file_when_the_agent_broke_it(
    project: Path, limactl: FakeLima
) -> None:
    """Issue 37, item 17: an agentbox.yml the agent made invalid does not keep the user from stopping the VM."""
    needs_bwrap()
    write_trusted(project, "vm:\n  name: agentbox-mine\n")
    assert run_cli("start", cwd=project).exit_code == 0
    write(project / "agentbox.yml", "vm: [\n")
    status = run_cli("status", cwd=project)
    assert status.exit_code == 0, status.stderr
    assert "name:      agentbox-mine" in status.stdout and "status:    Running" in status.stdout
    assert "YAML syntax error" in status.stderr and "as you last trusted it" in status.stderr
    refused = run_cli("start", cwd=project)  # the control: what starts from the file refuses it
    assert refused.exit_code == 2 and "YAML syntax error" in refused.stderr, refused.stderr
    stopped = run_cli("stop", cwd=project)
    assert stopped.exit_code == 0, stopped.stderr
    assert limactl.status("agentbox-mine") == "Stopped"
    assert run_cli("rm", "--yes", cwd=project).exit_code == 0
    assert limactl.status("agentbox-mine") is None


def test_undo_never_writes_a_folder_an_untrusted_edit_chose(project: Path, home: Path, limactl: FakeLima) -> None:
    """undo needs no trust, but it writes files: an agent's `workspace: ../other` must not aim it at another folder."""
    other = home.parent / "work" / "other"
    write(other / "notes.txt", "v1\n")
    git(other, "init", "-q")
    write_trusted(project, "workspace: ../other\n")
    taken = run_cli("checkpoint", cwd=project)
    assert taken.exit_code == 0, taken.stderr
    write(other / "notes.txt", "v2\n")
    write(project / "agentbox.yml", "workspace: ../other\nvm:\n  cpus: 2\n")  # an edit nobody trusted
    refused = run_cli("undo", "1", cwd=project)
    assert refused.exit_code == 2, refused.stderr
    assert "sets workspace, which choose the folder undo writes, and the file changed since you trusted it" \
        in refused.stderr
    assert (other / "notes.txt").read_text() == "v2\n"
    write(project / "agentbox.yml", "workspace: ../other\n")  # the control: the file as it was trusted
    done = run_cli("undo", "1", cwd=project)
    assert done.exit_code == 0, done.stderr
    assert (other / "notes.txt").read_text() == "v1\n"


REAL_CLAUDE_TOKEN = "sk-ant-oat01-REAL-HOST-LOGIN-" + "x" * 32


def _refusal(project: Path, listed: str) -> str:
    return (f"agentbox: error: {project / 'agentbox.yml'} widens what the VM gets from your host or runs in it, and"
            f" it is not trusted:\n  - {listed}\n"
            f"hint: Read it (`agentbox trust --show` shows it), then run `agentbox -C {project} trust` to use it."
            " Anyone who can write the repository, the agent included, can write this file and the files it names.\n")


def test_a_project_file_that_turns_the_broker_off_needs_trust(project: Path, home: Path, vm: FakeLima) -> None:
    """`credentials.broker: false` puts the host's real logins into the VM: the agent must not be able to ask for
    that by writing the project's file."""
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": REAL_CLAUDE_TOKEN, "refreshToken": "sk-ant-ort01-REAL", "expiresAt": 4102444800000}}))
    guest_login = vm.guest_home(NAME) / ".claude" / ".credentials.json"
    write(project / "agentbox.yml", "credentials:\n  broker: false\n")
    refused = run_cli("shell", "--", "true", cwd=project)
    assert (refused.exit_code, refused.stderr) == (2, _refusal(project, (
        "credentials.broker: false (puts the real logins of Claude Code, Codex, Gemini CLI and the GitHub CLI into"
        " the VM)")))
    assert vm.subcommands() == [] and not guest_login.exists()  # nothing ran in the VM, no login was staged
    # The control: trusted, the same file copies the real login into the VM.
    assert run_cli("trust", cwd=project).exit_code == 0
    done = run_cli("shell", "--", "true", cwd=project)
    assert done.exit_code == 0, done.stderr
    assert json.loads(guest_login.read_text())["claudeAiOauth"]["accessToken"] == REAL_CLAUDE_TOKEN


@pytest.mark.parametrize(("global_text", "endpoints", "listed"), [
    ("network:\n  mode: allowlist\n", "[api.anthropic.com, exfil.example.com]",
     "agents.claude.endpoints: exfil.example.com (more hosts the VM may reach)"),
    ("network:\n  mode: offline\n", "['*.example.net']", "agents.claude.endpoints: *.example.net (more hosts the VM"
     " may reach)"),
    # The controls: the built-in hosts again, or open mode (where endpoints open nothing), need no trust.
    ("network:\n  mode: allowlist\n", None, None),
    ("", "[exfil.example.com]", None),
], ids=["allowlist-added", "offline-added", "allowlist-builtin", "open-added"])
def test_a_project_file_that_adds_agent_endpoints_needs_trust(project: Path, home: Path, limactl: FakeLima,
                                                              global_text: str, endpoints: str | None,
                                                              listed: str | None) -> None:
    from agentbox.agents.builtin import BUILTIN_AGENTS

    write(home / ".config" / "agentbox" / "config.yml", global_text)
    hosts = endpoints or json.dumps(list(BUILTIN_AGENTS["claude"].endpoints))
    write(project / "agentbox.yml", f"agents:\n  claude:\n    endpoints: {hosts}\n")
    if listed is None:
        needs_bwrap()
    result = run_cli("start", cwd=project)
    if listed is None:
        assert result.exit_code == 0, result.stderr
        assert limactl.status(NAME) == "Running"
        return
    assert (result.exit_code, result.stderr) == (2, _refusal(project, listed))
    assert limactl.calls() == []  # nothing listed, created or started


def test_a_trusted_image_path_changed_in_the_file_is_refused(project: Path, home: Path, limactl: FakeLima) -> None:
    write(project / "disk.qcow2", "QFI")
    write(home / "other.qcow2", "QFI")
    write_trusted(project, "vm:\n  image: disk.qcow2\n")
    show = run_cli("trust", "--show", cwd=project).stdout
    assert "is trusted as it is.\n" in show
    write(project / "agentbox.yml", f"vm:\n  image: {home / 'other.qcow2'}\n")  # as the agent could
    result = _start(project)
    assert result.exit_code == 2, result.stderr
    assert "changed since you trusted it" in result.stderr
    assert limactl.calls() == []
    assert f"vm.image: {home / 'other.qcow2'} (a host file: the system the VM runs)" in \
        run_cli("trust", "--show", cwd=project).stdout
