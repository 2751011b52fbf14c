"""The base VM (agentbox.vm.golden): built once, cloned per project with edit flags, through the CLI against
the limactl double. The suite runs with AGENTBOX_VM_BASE=off (conftest); these tests turn it back on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from agentbox import sizes
from tests import fake_limactl
from tests.helpers import NAME, FakeLima, needs_bwrap, process_report, run_cli, wait_for, write, write_trusted

# A base VM is what provisioning leaves: its tests run the provisioning for real at every boot, never from
# recorded results (tests/fake_limactl/bootcache.py).
pytestmark = pytest.mark.real_boot

SCHEMA = json.loads((Path(__file__).parent / "lima_schema.json").read_text())
OTHER = "agentbox-other"


@pytest.fixture(autouse=True)
def base_on(monkeypatch: pytest.MonkeyPatch) -> None:
    needs_bwrap()
    monkeypatch.setenv("AGENTBOX_VM_BASE", "auto")


@pytest.fixture
def other(project: Path) -> Path:
    path = project.parent / "other"
    path.mkdir()
    return path


def bases(limactl: FakeLima) -> list[str]:
    return sorted(p.name for p in limactl.home.iterdir() if p.name.startswith("agentbox-base"))


def calls_named(limactl: FakeLima, subcommand: str) -> list[list[str]]:
    return [argv for argv, word in zip(limactl.calls(), limactl.subcommands(), strict=True) if word == subcommand]


def start(project: Path) -> str:
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    return result.stderr


def base_ls(project: Path) -> list[dict]:
    result = run_cli("base", "ls", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_first_project_builds_one_base_second_only_clones(project: Path, other: Path, limactl: FakeLima) -> None:
    start(project)
    subcommands = limactl.subcommands()
    assert subcommands.count("create") == 1 and subcommands.count("rename") == 1
    assert subcommands.count("clone") == 1
    (create,) = calls_named(limactl, "create")
    temporary = create[create.index("--name") + 1]
    assert temporary.startswith("agentbox-basebuild-")
    (rename,) = calls_named(limactl, "rename")
    (base,) = bases(limactl)
    assert rename[-2:] == [temporary, base] and base.startswith("agentbox-base-")
    assert subcommands.index("stop") < subcommands.index("rename") < subcommands.index("clone")
    (clone,) = calls_named(limactl, "clone")
    assert clone[clone.index("clone") + 1: clone.index("clone") + 3] == [base, NAME]
    assert limactl.status(base) == "Stopped" and limactl.status(NAME) == "Running"
    assert not (limactl.home / temporary).exists()

    limactl.clear()
    start(other)
    assert "create" not in limactl.subcommands()
    assert limactl.subcommands().count("clone") == 1
    assert limactl.status(OTHER) == "Running"
    assert bases(limactl) == [base]

    # A base is not a project VM: `ls` and `stop --all` leave it out.
    listed = run_cli("ls", "--json", cwd=project)
    assert {vm["name"] for vm in json.loads(listed.stdout)} == {NAME, OTHER}
    run_cli("stop", "--all", cwd=project)
    assert limactl.status(base) == "Stopped"
    assert not any(base in argv for argv in calls_named(limactl, "stop"))


def test_the_clone_carries_exactly_this_projects_render(project: Path, isolated_env: dict, limactl: FakeLima) -> None:
    write(project / 'da"ta é' / "x", "x")  # a quote and a non-ASCII letter reach Lima's --set exactly
    write(project / "agentbox.yml", "vm:\n  cpus: 2\n  memory: 4GiB\n  disk: 30GiB\n"
          "mounts:\n  - location: 'da\"ta é'\n    mountPoint: /data\n")
    start(project)
    rendered = yaml.safe_load((isolated_env["state"] / "vms" / NAME / "lima.yaml").read_text())
    cloned = yaml.safe_load(limactl.lima_yaml(NAME))
    jsonschema.Draft202012Validator(SCHEMA).validate(cloned)
    assert cloned["mounts"] == rendered["mounts"]
    assert any(mount["mountPoint"] == "/data" for mount in cloned["mounts"])
    assert cloned["param"] == {"agentboxWorkspace": str(project), "agentboxStaging": rendered["param"]["agentboxStaging"]}
    assert cloned["cpus"] == 2
    for size in ("memory", "disk"):
        assert sizes.to_bytes(str(cloned[size])) == sizes.to_bytes(str(rendered[size]))
    assert {k: v for k, v in cloned.items() if k not in ("memory", "disk")} == \
        {k: v for k, v in rendered.items() if k not in ("memory", "disk")}
    # The base itself has nothing of the project's.
    (base,) = bases(limactl)
    own = yaml.safe_load(limactl.lima_yaml(base))
    assert not own["mounts"] and set(own["param"].values()) == {""} and "caCerts" not in own
    # ... and the guest's workspace marker names the project (written at the clone's boot).
    marker = (limactl.home / NAME / "guestfs" / "etc" / "agentbox" / "workspace").read_text()
    assert marker.splitlines()[0] == str(project)


def test_a_provisioning_change_is_noted_and_recreate_clones_a_new_base(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, isolated_env: dict
) -> None:
    from agentbox.vm import golden

    start(project)
    (old,) = bases(limactl)
    assert "older base" not in start(project)
    real = golden._files_digest
    monkeypatch.setattr(golden, "_files_digest", lambda *folders: "changed-" + real(*folders))
    limactl.clear()
    said = start(project)
    assert "cloned from an older base VM (provisioning scripts changed since)" in said
    assert "`agentbox start --recreate` re-clones" in said
    assert limactl.subcommands() == ["list"]  # noted, never recreated on its own

    result = run_cli("start", "--recreate", "--yes", cwd=project)
    assert result.exit_code == 0, result.stderr
    new = [name for name in bases(limactl) if name != old]
    assert len(new) == 1
    (clone,) = calls_named(limactl, "clone")
    assert new[0] in clone
    state = json.loads((isolated_env["state"] / "vms" / NAME / "state.json").read_text())
    assert golden.instance_name(state["base"]["key"]) == new[0]
    assert "older base" not in start(project)


def test_two_first_launches_at_once_build_one_base(project: Path, other: Path, limactl: FakeLima) -> None:
    env = {**os.environ, "AGENTBOX_VM_BASE": "auto", "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [subprocess.Popen([sys.executable, "-m", "agentbox", "start"], cwd=folder, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for folder in (project, other)]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert limactl.subcommands().count("create") == 1
    assert limactl.subcommands().count("clone") == 2
    assert limactl.status(NAME) == "Running" and limactl.status(OTHER) == "Running"
    assert len(bases(limactl)) == 1


def test_base_ls_json(project: Path, limactl: FakeLima) -> None:
    assert base_ls(project) == []
    start(project)
    (row,) = base_ls(project)
    assert set(row) == {"key", "name", "status", "built", "ageDays", "size", "disk", "usedBy", "current", "state",
                        "limaVersion", "agents"}
    assert row["name"] == "agentbox-base-" + row["key"] and row["status"] == "Stopped"
    assert row["usedBy"] == [NAME] and row["current"] is True and row["state"] == "fresh"
    assert isinstance(row["size"], int) and row["size"] > 0
    assert time.time() - time.mktime(time.strptime(row["built"], "%Y-%m-%dT%H:%M:%SZ")) < 3600 + abs(time.timezone)
    assert row["ageDays"] < 1
    assert set(row["agents"]) == {"claude", "codex", "gemini"}  # the ones the double's npm can install


def test_vm_base_off_keeps_todays_create_path(project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_VM_BASE")
    write(project / "agentbox.yml", "vm:\n  base: off\n")
    start(project)
    assert limactl.subcommands() == ["list", "create", "start", "list"]
    assert bases(limactl) == []


def test_vm_template_is_created_from_scratch_said_once(project: Path, home: Path, limactl: FakeLima) -> None:
    from agentbox import resources

    template = write(home / "my.yaml.j2", resources.text("templates", "lima.yaml.j2"))
    write(home / ".config" / "agentbox" / "config.yml", f"vm:\n  template: {template}\n")
    said = start(project)
    assert said.count("from scratch") == 1 and "vm.template" in said
    assert "clone" not in limactl.subcommands() and bases(limactl) == []


def test_a_value_yq_would_read_differently_is_created_from_scratch(project: Path, limactl: FakeLima) -> None:
    write(project / "we\\ird" / "x", "x")
    write(project / "agentbox.yml", "mounts:\n  - location: 'we\\ird'\n")
    said = start(project)
    assert "creating agentbox-myproject from scratch" in said and "backslash" in said
    assert "clone" not in limactl.subcommands() and limactl.status(NAME) == "Running"
    assert any(m["location"].endswith("we\\ird") for m in yaml.safe_load(limactl.lima_yaml(NAME))["mounts"])


def test_a_base_build_failing_halfway_leaves_nothing_and_the_next_attempt_works(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_START", "boom: the image could not boot")
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_START_TIMES", "1")
    result = run_cli("start", cwd=project)
    assert result.exit_code != 0
    assert "building the base VM" in result.stderr and "failed while starting" in result.stderr
    assert "boom" in result.stderr
    assert bases(limactl) == [] and limactl.status(NAME) is None
    assert not any(p.name.startswith("agentbox-basebuild-") for p in limactl.home.iterdir())

    limactl.clear()
    start(project)
    assert limactl.subcommands().count("create") == 1
    assert len(bases(limactl)) == 1 and limactl.status(NAME) == "Running"


def test_a_failed_verification_names_the_step(project: Path, home: Path, limactl: FakeLima) -> None:
    # A global install command that leaves a login file behind: the check refuses to seal such a base.
    write(home / ".config" / "agentbox" / "config.yml",
          "agents:\n  codex:\n    install: mkdir -p ~/.codex && echo secret > ~/.codex/auth.json\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code != 0
    assert "failed while verifying" in result.stderr and ".codex/auth.json" in result.stderr
    assert bases(limactl) == [] and limactl.status(NAME) is None


def test_a_rejected_clone_shows_lima_message_and_leaves_no_file(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, isolated_env: dict
) -> None:
    write_trusted(project, "vm:\n  lima:\n    portForwards:\n      - guestPort: 70000\n")
    monkeypatch.chdir(project)
    result = run_cli("start", cwd=project)
    assert result.exit_code != 0
    assert "rejected" in result.stderr and "portForwards" in result.stderr
    assert not (project / "lima.REJECTED.yaml").exists()
    assert (isolated_env["state"] / "vms" / NAME / "lima.REJECTED.yaml").is_file()
    assert limactl.status(NAME) is None  # the unedited copy Lima left is removed
    assert len(bases(limactl)) == 1  # the base stays for the next attempt


def test_a_first_launch_interrupted_mid_clone_is_finished_by_the_rerun(
    project: Path, home: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # About 25 s: a real base build, so that the interrupt falls in a clone, then two clones that boot.
    assert run_cli("base", "build", cwd=project).exit_code == 0
    marker = tmp_path / "marker"
    monkeypatch.setenv("FAKE_LIMACTL_CLONE_COPIED_DELAY", "120")
    monkeypatch.setenv("FAKE_LIMACTL_LATENCY_MARKER", str(marker))
    # SIGINT to agentbox alone (as `kill -INT`): agentbox ends its limactl child itself.
    proc = subprocess.Popen([sys.executable, "-m", "agentbox", "start"], cwd=project, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: marker.is_file() and "clone-copied" in marker.read_text(), 60, "the clone's copy")
        os.kill(proc.pid, signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agentbox did not end on SIGINT:\n{process_report(proc.pid)}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines()[-2:] == [
        f"agentbox: error: interrupted while creating {NAME}",
        f"hint: Run the same command again to finish, or `agentbox rm --yes` to discard {NAME}.",
    ]
    # What the interrupt left: the copy of the base, without this project's settings.
    assert yaml.safe_load(limactl.lima_yaml(NAME))["param"]["agentboxWorkspace"] == ""
    doctor = run_cli("doctor", cwd=project)
    assert f"{NAME} was left half-made by an interrupted first launch" in doctor.stdout + doctor.stderr
    assert "not created by agentbox" not in doctor.stdout + doctor.stderr

    monkeypatch.delenv("FAKE_LIMACTL_CLONE_COPIED_DELAY")
    limactl.clear()
    again = run_cli("start", cwd=project)
    assert again.exit_code == 0, again.stderr
    assert f"{NAME} was left half-made by an interrupted first launch; making it again" in again.stderr
    assert limactl.subcommands().count("delete") == 1 and limactl.subcommands().count("clone") == 1
    assert limactl.status(NAME) == "Running"
    assert yaml.safe_load(limactl.lima_yaml(NAME))["param"]["agentboxWorkspace"] == str(project)
    assert run_cli("start", cwd=project).exit_code == 0

    # A Lima instance of that name that agentbox did not make is refused, even where a first launch of this
    # project was cut short before it made anything.
    assert run_cli("rm", "--yes", cwd=project).exit_code == 0
    monkeypatch.setenv("FAKE_LIMACTL_FAIL_CLONE", "interrupted by the test")
    assert run_cli("start", cwd=project).exit_code != 0  # leaves agentbox's record of a creation begun
    monkeypatch.delenv("FAKE_LIMACTL_FAIL_CLONE")
    foreign = home.parent / "foreign.yaml"
    foreign.write_text("images:\n- location: https://example.invalid/x.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", NAME, str(foreign)], check=True, capture_output=True)
    refused = run_cli("start", cwd=project)
    assert refused.exit_code == 1 and "was not created by this agentbox" in refused.stderr
    assert limactl.status(NAME) == "Stopped"  # still there, untouched


def test_a_base_deleted_by_hand_is_rebuilt(project: Path, other: Path, limactl: FakeLima) -> None:
    start(project)
    (base,) = bases(limactl)
    subprocess.run(["limactl", "delete", "--force", base], check=True, capture_output=True)
    limactl.clear()
    said = start(other)
    assert "is gone" in said
    assert limactl.subcommands().count("create") == 1 and limactl.subcommands().count("clone") == 1
    assert bases(limactl) == [base] and limactl.status(OTHER) == "Running"


def test_an_old_base_is_rebuilt_before_the_next_clone(
    project: Path, other: Path, limactl: FakeLima, isolated_env: dict
) -> None:
    start(project)
    (base,) = bases(limactl)
    record_file = isolated_env["state"] / "bases" / f"{base.removeprefix('agentbox-base-')}.json"
    record = json.loads(record_file.read_text())
    record["built"] -= 8 * 86400
    record_file.write_text(json.dumps(record))
    assert base_ls(project)[0]["state"] == "stale"
    limactl.clear()
    said = start(other)
    assert "8 days old" in said
    assert limactl.subcommands().count("create") == 1 and limactl.subcommands().count("delete") == 1
    assert bases(limactl) == [base]
    assert base_ls(project)[0]["state"] == "fresh"
    assert "rebuilt since" not in start(project)  # the same provisioning, the same agent versions: nothing to say


def test_a_rebuilt_base_is_noted_once_naming_what_catches_up(
    project: Path, other: Path, home: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, isolated_env: dict
) -> None:
    from agentbox.vm import golden

    start(project)
    (name,) = bases(limactl)
    record_file = isolated_env["state"] / "bases" / f"{name.removeprefix('agentbox-base-')}.json"
    record = json.loads(record_file.read_text())
    record["built"] -= 8 * 86400
    record_file.write_text(json.dumps(record))
    start(other)  # rebuilds the base: same key, and (in the real world) newer agent CLIs
    record = json.loads(record_file.read_text())
    record["agents"]["claude"] = "9.9.9 (Claude Code)"
    record_file.write_text(json.dumps(record))

    said = start(project)
    assert "the base VM was rebuilt since agentbox-myproject was cloned from it, with other agent CLI versions " \
           "(claude claude (stand-in) --version -> 9.9.9 (Claude Code))" in said
    assert "`agentbox update-agents` brings agentbox-myproject's agent CLIs up to date (no new VM)" in said
    assert "--recreate" not in said
    assert "rebuilt since" not in start(project)  # once per VM and base ...
    assert run_cli("stop", cwd=project).exit_code == 0
    assert "rebuilt since" not in start(project)  # ... a restart included

    # Only the agents' install commands changed (a new key): still no new VM needed.
    write(home / ".config" / "agentbox" / "config.yml", "agents:\n  claude:\n    install: npm install -g "
          "@anthropic-ai/claude-code@2\n")
    said = start(project)
    assert "cloned from an older base VM (agent install commands changed since); `agentbox update-agents`" in said
    assert "--recreate" not in said
    assert "older base" not in start(project)

    # Provisioning changed: only a new clone has it.
    real = golden._files_digest
    monkeypatch.setattr(golden, "_files_digest", lambda *folders: "changed-" + real(*folders))
    said = start(project)
    assert "(provisioning scripts, agent install commands changed since); `agentbox start --recreate`" in said
    assert "update-agents" not in said
    assert "older base" not in start(project)


def test_a_smaller_disk_uses_the_bases(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  disk: 10GiB\n")
    said = start(project)
    assert said.count("cannot shrink") == 1
    (clone,) = calls_named(limactl, "clone")
    assert "--disk" not in clone
    assert sizes.to_bytes(str(yaml.safe_load(limactl.lima_yaml(NAME))["disk"])) == 20 << 30


def test_prune_keeps_the_current_base_and_bases_in_use(
    project: Path, other: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentbox.vm import golden

    start(project)
    (old,) = bases(limactl)
    real = golden._files_digest
    monkeypatch.setattr(golden, "_files_digest", lambda *folders: "changed-" + real(*folders))
    start(other)
    (new,) = [name for name in bases(limactl) if name != old]
    result = run_cli("base", "prune", cwd=project)
    assert f"kept {old}: {NAME} was cloned from it" in result.stderr
    assert f"kept {new}: it is the current base" in result.stderr
    assert sorted(bases(limactl)) == sorted([old, new])

    assert run_cli("rm", "--yes", cwd=project).exit_code == 0
    result = run_cli("base", "prune", cwd=project)
    assert f"removed the base VM {old}" in result.stderr
    assert bases(limactl) == [new]

    result = run_cli("base", "rm", new.removeprefix("agentbox-base-"), cwd=project)
    assert result.exit_code == 0 and f"removed the base VM {new}" in result.stderr and OTHER in result.stderr
    assert bases(limactl) == [] and limactl.status(OTHER) == "Running"


def test_doctor_reports_the_base(project: Path, limactl: FakeLima) -> None:
    def base_check() -> dict:
        result = run_cli("doctor", "--json", cwd=project)
        return next(check for check in json.loads(result.stdout) if check["check"] == "base")

    assert "absent" in base_check()["message"]
    start(project)
    assert "fresh" in base_check()["message"]


def test_base_build_command(project: Path, limactl: FakeLima) -> None:
    result = run_cli("base", "build", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert "is ready (built now)" in result.stderr
    limactl.clear()
    result = run_cli("base", "build", cwd=project)
    assert limactl.subcommands() == ["list"]
    (base,) = bases(limactl)
    assert result.exit_code == 0 and result.stderr.splitlines() == [
        f"base VM {base} was already built, just now, and is current: nothing to do "
        "(`agentbox base build --rebuild` builds it again)"]
    result = run_cli("base", "build", "--rebuild", cwd=project)
    assert limactl.subcommands().count("create") == 1


def test_a_clone_boots_without_installing_anything(project: Path, limactl: FakeLima) -> None:
    start(project)
    (base,) = bases(limactl)
    log = Path("guestfs") / "var" / "log" / "cloud-init-output.log"
    base_boots = (limactl.home / base / log).read_text()
    assert "newly installed" in base_boots  # the base's provisioning installed the packages
    clone_boot = (limactl.home / NAME / log).read_text()
    assert clone_boot.startswith(base_boots)  # the clone's log goes on from the copied one
    own_boot = clone_boot[len(base_boots):]
    assert "Executing provision" in own_boot  # its provisioning did run ...
    assert "newly installed" not in own_boot and "Reading package lists" not in own_boot  # ... and installed nothing
    state = fake_limactl.read_state(limactl.home, NAME)
    this_boot = [entry for entry in state["provisionLog"] if entry["boot"] == state["bootCount"]]
    assert this_boot and all(entry["exit"] == 0 for entry in this_boot)


# An install command that notes what it sees of the environment, and leaves a `claude` on PATH.
NOTING_INSTALL = r"""mkdir -p ~/.local/bin
{ echo "NODE_EXTRA_CA_CERTS=${NODE_EXTRA_CA_CERTS-unset}"; echo "HTTPS_PROXY=${HTTPS_PROXY-unset}"
  echo "no_proxy=${no_proxy-unset}"; echo "OPENAI_API_KEY=${OPENAI_API_KEY-unset}"; } > ~/install-env
cat "$NODE_EXTRA_CA_CERTS" > ~/install-ca 2>/dev/null || true
printf '#!/bin/sh\necho "9.9.9 (Claude Code)"\n' > ~/.local/bin/claude && chmod 755 ~/.local/bin/claude
"""
PROXY_WITH_PASSWORD = "http://me:s3cret-pw@proxy.corp.example:3128"


def corporate_config(home: Path, pem: str) -> None:
    """A global config as behind a TLS-intercepting proxy: its CA, the proxy in env, and an API key."""
    write(home / "corp-ca.pem", pem)
    write(home / ".config" / "agentbox" / "config.yml", yaml.safe_dump({
        "caCert": str(home / "corp-ca.pem"),
        "env": {"HTTPS_PROXY": PROXY_WITH_PASSWORD, "no_proxy": "localhost,.corp.example",
                "OPENAI_API_KEY": "sk-not-for-the-base"},
        "agents": {"claude": {"install": NOTING_INSTALL}},
    }))


def test_the_base_is_built_with_the_ca_and_the_proxy_a_launch_gives(
    project: Path, home: Path, limactl: FakeLima, isolated_env: dict
) -> None:
    from tests.test_ca import make_pem

    pem = make_pem(home / "made", "Corp Intercepting Root")
    corporate_config(home, pem)
    start(project)
    (base,) = bases(limactl)
    seen = dict(line.split("=", 1) for line in (limactl.guest_home(base) / "install-env").read_text().splitlines())
    assert seen == {"NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt", "HTTPS_PROXY": PROXY_WITH_PASSWORD,
                    "no_proxy": "localhost,.corp.example", "OPENAI_API_KEY": "unset"}  # only what reaches the network
    assert pem.strip() in (limactl.guest_home(base) / "install-ca").read_text()  # the file holds the user's CA
    assert [cert.strip() for cert in yaml.safe_load(limactl.lima_yaml(base))["caCerts"]["certs"]] == [pem.strip()]
    record = base_ls(project)[0]
    assert record["agents"] == {"claude": "9.9.9 (Claude Code)"}
    # The clone needs no edit for its CA: the base has it already.
    (clone,) = calls_named(limactl, "clone")
    assert not any("caCerts" in arg for arg in clone)
    # The proxy's password is never on a command line, nor in a file agentbox wrote.
    assert not any("s3cret-pw" in arg for argv in limactl.calls() for arg in argv)
    assert not any("s3cret-pw" in path.read_text(errors="replace")
                   for path in (isolated_env["state"] / "bases").iterdir() if path.is_file())

    # A different CA makes another base (the key covers the certificates); a different proxy does not.
    write(home / "corp-ca.pem", make_pem(home / "other", "Another Root"))
    assert not base_ls(project)[0]["current"]
    said = run_cli("doctor", cwd=project).stdout
    assert "the CA certificates (caCert, NODE_EXTRA_CA_CERTS) changed since" in said
    corporate_config(home, pem)
    config = yaml.safe_load((home / ".config" / "agentbox" / "config.yml").read_text())
    config["env"]["HTTPS_PROXY"] = "http://me:another-pw@proxy.corp.example:3128"
    write(home / ".config" / "agentbox" / "config.yml", yaml.safe_dump(config))
    assert base_ls(project)[0]["current"]


def test_a_failed_build_keeps_its_log_and_base_log_shows_it(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, isolated_env: dict
) -> None:
    result = run_cli("base", "log", cwd=project)
    assert result.exit_code == 1 and "no base build has been logged yet" in result.stderr
    monkeypatch.setenv("FAKE_LIMACTL_START_DEGRADED", "1")  # provisioning ran, then Lima reports it degraded
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1 and "failed while starting (provisioning)" in result.stderr
    assert "`agentbox base log` shows it" in result.stderr
    assert bases(limactl) == [] and not any(p.name.startswith("agentbox-basebuild-") for p in limactl.home.iterdir())
    assert (isolated_env["state"] / "bases" / "build.log").stat().st_mode & 0o777 == 0o600

    shown = run_cli("base", "log", cwd=project)
    assert shown.exit_code == 0, shown.stderr
    assert "== starting (provisioning)" in shown.stdout and "DEGRADED." in shown.stdout
    assert "== the VM's provisioning log (/var/log/cloud-init-output.log" in shown.stdout
    assert "Executing provision" in shown.stdout and "newly installed" in shown.stdout  # the guest's own log
    assert "== Lima's host-agent log" in shown.stdout


def test_installs_in_the_base_say_the_real_error_and_leave_no_npm_logs(
    project: Path, home: Path, limactl: FakeLima
) -> None:
    # An install that writes an escape sequence, then fails in npm; and Kiro's installer (curl | bash), whose
    # download fails in the double's guest (no network): with pipefail that is a failure, not an empty install.
    write(home / ".config" / "agentbox" / "config.yml",
          "agents:\n  codex:\n    install: printf '\\033[31mred\\n'; npm install -g agentbox-no-such-package\n"
          "  kiro: {}\n")
    result = run_cli("base", "build", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert ("failed (exit 1: npm error 404 Not Found - GET https://registry.npmjs.org/agentbox-no-such-package - "
            "Not found)") in result.stderr
    assert "A complete log of this run" not in result.stderr
    assert "the base VM will not hold kiro: `curl -fsSL https://cli.kiro.dev/install | bash` failed (exit 6: " \
           "curl: (6) Could not resolve host: cli.kiro.dev)" in result.stderr

    shown = run_cli("base", "log", cwd=project)
    assert "== installing codex:" in shown.stdout and "\\x1b[31mred" in shown.stdout and "\x1b" not in shown.stdout
    assert "npm error A complete log of this run can be found in: " in shown.stdout  # all of it is in the log
    assert "== sealing" in shown.stdout and "== built" in shown.stdout
    (base,) = bases(limactl)
    guest_home = limactl.guest_home(base)
    assert (guest_home / ".npmrc").is_file() and not (guest_home / ".npm" / "_logs").exists()  # sealed away


def test_the_base_is_built_from_the_global_image_and_a_new_image_makes_it_stale(
    project: Path, home: Path, limactl: FakeLima
) -> None:
    config = home / ".config" / "agentbox" / "config.yml"
    write(home / "images" / "debian.qcow2", "QFI")
    write(home / "images" / "vmlinuz", "kernel")
    write(config, "vm:\n  image: {location: ~/images/debian.qcow2, kernel: {location: ~/images/vmlinuz}}\n")
    start(project)
    (built,) = bases(limactl)
    base_yaml = yaml.safe_load(limactl.lima_yaml(built))
    assert "base" not in base_yaml
    assert base_yaml["images"][0]["location"] == str(home / "images" / "debian.qcow2")
    assert base_yaml["images"][0]["kernel"]["location"] == str(home / "images" / "vmlinuz")
    assert "clone" in limactl.subcommands()  # the project's render has the same image: a clone
    assert "older base" not in start(project)

    write(home / "images" / "noble.img", "QFI")
    write(config, "vm:\n  image: ~/images/noble.img\n")
    said = start(project)
    assert "cloned from an older base VM (the image changed since); `agentbox start --recreate` re-clones" in said
    assert not base_ls(project)[0]["current"]


def test_a_project_with_its_own_image_is_created_from_scratch(project: Path, limactl: FakeLima) -> None:
    write(project / "debian.qcow2", "QFI")
    write_trusted(project, "vm:\n  image: debian.qcow2\n")
    said = start(project)
    assert "this project's vm.image (" + str(project / "debian.qcow2") + ") differs from the global config's " \
           "(not set), which the base VM is built with" in said
    assert "clone" not in limactl.subcommands() and bases(limactl) == []
    assert yaml.safe_load(limactl.lima_yaml(NAME))["images"][0]["location"] == str(project / "debian.qcow2")


def test_the_base_takes_the_global_vm_limas_machine_settings_and_a_change_makes_it_stale(
    project: Path, home: Path, limactl: FakeLima
) -> None:
    """A host whose QEMU has no UEFI firmware boots every VM with firmware.legacyBIOS (the real-Lima tier's Debian
    QEMU): set globally, the base is built with it and projects are still clones of it."""
    config = home / ".config" / "agentbox" / "config.yml"
    write(config, "vm:\n  lima:\n    firmware: {legacyBIOS: true}\n    ssh: {localPort: 0}\n")
    said = start(project)
    (built,) = bases(limactl)
    base_yaml = yaml.safe_load(limactl.lima_yaml(built))
    assert base_yaml["firmware"] == {"legacyBIOS": True}
    assert "localPort" not in (base_yaml.get("ssh") or {})  # not a machine setting: the project's edit sets it
    assert "clone" in limactl.subcommands(), said
    assert "created from scratch" not in said and "differs" not in said
    assert yaml.safe_load(limactl.lima_yaml(NAME))["firmware"] == {"legacyBIOS": True}

    write(config, "vm:\n  lima:\n    firmware: {legacyBIOS: false}\n")
    said = start(project)
    assert "cloned from an older base VM (the global vm.lima's machine settings" in said, said
    assert not base_ls(project)[0]["current"]
