"""The fake limactl (tests/fake_limactl) must behave like Lima v2.2 as described in
tests/fake_limactl/README.md: texts, exit codes, list JSON, state transitions, shell, copy."""

from __future__ import annotations

import getpass
import json
import os
import re
import resource
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:
    from tests import fake_limactl
except ImportError:  # tests/ is not a package
    import fake_limactl  # type: ignore[no-redef]
from tests.helpers import as_root, echo_server, needs, scratch_root

FATAL_RE = re.compile(r'^time="[^"]+" level=fatal msg=(.*)$')
LOG_RE = re.compile(r'^time="([^"]+)" level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S*)(.*)$')
NAME_RE_TEXT = r"^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$"


def guest_user() -> str:
    """Lima's guest user is the host user; run as root (which real Lima refuses) the double picks `lima`."""
    if os.geteuid() == 0:
        return "lima"
    user = getpass.getuser()
    return user if re.fullmatch(r"[a-z_][a-z0-9_-]*", user) and user != "admin" else "lima"


def guest_uid() -> int:
    return os.getuid() or 1000


def unquote(value: str) -> str:
    return json.loads(value) if value.startswith('"') else value


def log_lines(stderr: str) -> list[tuple[str, str]]:
    """(level, msg) of every logrus line; non-log lines are returned as ("", line)."""
    out = []
    for line in stderr.splitlines():
        m = LOG_RE.match(line)
        out.append((m[2], unquote(m[3])) if m else ("", line))
    return out


def fatal(stderr: str) -> str:
    fatals = [msg for level, msg in log_lines(stderr) if level == "fatal"]
    assert len(fatals) == 1, stderr
    return fatals[0]


@dataclass
class Lima:
    """A private LIMA_HOME/HOME with the shim first on PATH."""

    root: Path
    home: Path
    lima_home: Path
    bin_dir: Path
    env: dict[str, str]

    def run(self, *args: str, input: str | bytes | None = None, cwd: Path | None = None,
            env: dict[str, str] | None = None, text: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        full_env = dict(self.env, **(env or {}))
        if input is None:
            input = "" if text else b""
        return subprocess.run(["limactl", *args], input=input, capture_output=True, text=text,
                              cwd=cwd or self.root, env=full_env, timeout=timeout)

    def ok(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        result = self.run(*args, **kwargs)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    def create(self, name: str = "vm", yaml_text: str | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
        return self.ok("--tty=false", "create", "--name", name, "-", input=yaml_text or minimal_yaml(), **kwargs)

    def listing(self, *names: str) -> list[dict[str, Any]]:
        result = self.run("list", "--json", *names)
        return [json.loads(line) for line in result.stdout.splitlines()]

    def one(self, name: str = "vm") -> dict[str, Any]:
        return next(i for i in self.listing() if i["name"] == name)

    def inst_dir(self, name: str = "vm") -> Path:
        return self.lima_home / name


def minimal_yaml(extra: str = "") -> str:
    return "images:\n- location: https://example.invalid/ubuntu.img\n" + extra


@pytest.fixture
def lima(tmp_path: Path) -> Lima:
    # LIMA_HOME must stay short: Lima's socket path limit counts it.
    lima_home = Path(tempfile.mkdtemp(prefix="fl", dir=scratch_root()))
    home = tmp_path / "fake-home"  # (tmp_path/"home" may belong to conftest)
    home.mkdir()
    bin_dir = tmp_path / "fake-bin"
    fake_limactl.install(bin_dir, lima_home)
    env = fake_limactl.make_env(lima_home, home=home, bin_dir=bin_dir)
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "CI"):
        env.pop(name, None)
    yield Lima(tmp_path, home, lima_home, bin_dir, env)
    shutil.rmtree(lima_home, ignore_errors=True)


@pytest.fixture
def bwrap() -> None:
    needs("bwrap")


@pytest.fixture
def running(lima: Lima) -> Lima:
    lima.create()
    lima.ok("--tty=false", "start", "vm")
    return lima


# ---------------------------------------------------------------------------------------------
# global behaviour
# ---------------------------------------------------------------------------------------------

def test_version(lima: Lima) -> None:
    result = lima.ok("--version")
    assert result.stdout == "limactl version 2.2.0\n"
    assert result.stderr == ""


def test_unknown_flag_is_fatal(lima: Lima) -> None:
    result = lima.run("list", "--bogus")
    assert result.returncode == 1
    assert fatal(result.stderr) == "unknown flag: --bogus"


def test_global_flags_accepted_before_and_after_the_subcommand(lima: Lima) -> None:
    lima.ok("--tty=false", "--debug", "list")
    lima.ok("list", "--tty=false", "--log-level", "error")
    lima.ok("list", "-y", "--log-format=text")
    assert lima.ok("--log-level=error", "list").stderr == ""  # the "No instance found" warning is filtered
    result = lima.run("--yes", "--tty", "list")
    assert result.returncode == 1
    assert fatal(result.stderr) == "cannot use both --tty and --yes flags at the same time"


def test_fatal_message_uses_go_quoting(lima: Lima) -> None:
    lima.create()
    result = lima.run("start", "vm", env={"FAKE_LIMACTL_FAIL_START": 'say "hi"\\ and\nbye'})
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert last.endswith(r'level=fatal msg="say \"hi\"\\ and\nbye"'), last


def test_log_format_json(lima: Lima) -> None:
    result = lima.run("--log-format=json", "list", "nope")
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(r["level"], r["msg"]) for r in records] == [
        ("warning", "No instance matching nope found."), ("fatal", "unmatched instances")]
    assert all(set(r) == {"level", "msg", "time"} for r in records)


def test_refuses_root_only_when_asked(lima: Lima) -> None:
    def list_as_root(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(as_root(["limactl", "list"]), env={**lima.env, **extra}, cwd=lima.root,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    result = list_as_root(FAKE_LIMACTL_REFUSE_ROOT="1")
    assert (result.returncode, result.stdout, result.stderr) == (1, "", "limactl: must not run as the root user\n")
    assert list_as_root().returncode == 0


# ---------------------------------------------------------------------------------------------
# list / create
# ---------------------------------------------------------------------------------------------

def test_list_empty_warns_and_exits_0(lima: Lima) -> None:
    result = lima.ok("list", "--json")
    assert result.stdout == ""
    assert log_lines(result.stderr) == [("warning", "No instance found. Run `limactl create` to create an instance.")]


def test_create_from_stdin_then_list_shows_stopped_instance(lima: Lima, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    text = minimal_yaml(f"memory: 8G\ndisk: 20GiB\ncpus: 2\nmounts:\n- location: {project}\n# comment kept\n")
    result = lima.create(yaml_text=text)
    assert result.stdout == ""
    lines = log_lines(result.stderr)
    assert ("info", "Terminal is not available, proceeding without opening an editor") in lines
    assert lines[-1] == ("info", "Run `limactl start vm` to start the instance.")
    assert (lima.inst_dir() / "lima.yaml").read_bytes() == text.encode()
    assert (lima.inst_dir() / "lima-version").read_text() == "v2.2.0"

    out = lima.ok("list", "--json").stdout
    assert out.count("\n") == 1 and out.endswith("}\n") and ": " not in out  # compact JSON Lines
    inst = json.loads(out)
    assert list(inst)[:9] == ["name", "hostname", "status", "dir", "vmType", "arch", "cpus", "memory", "disk"]
    assert list(inst)[-4:] == ["HostOS", "HostArch", "LimaHome", "IdentityFile"]
    assert inst["name"] == "vm" and inst["hostname"] == "lima-vm" and inst["status"] == "Stopped"
    assert inst["dir"] == str(lima.inst_dir()) and inst["vmType"] == "qemu"
    assert (inst["cpus"], inst["memory"], inst["disk"]) == (2, 8 * 1024 ** 3, 20 * 1024 ** 3)
    assert "sshLocalPort" not in inst
    assert inst["sshConfigFile"] == str(lima.inst_dir() / "ssh.config")
    assert inst["sshAddress"] == "127.0.0.1" and inst["protected"] is False and inst["limaVersion"] == "v2.2.0"
    config = inst["config"]
    assert config["memory"] == "8G" and config["mountType"] == "9p"
    assert config["mounts"][0]["location"] == config["mounts"][0]["mountPoint"] == str(project)
    assert config["mounts"][0]["writable"] is False
    assert config["user"] == {"name": guest_user(), "comment": config["user"]["comment"],
                              "home": f"/home/{guest_user()}.guest", "shell": "/bin/bash",
                              "uid": guest_uid(), "passwordlessSudo": True}
    assert config["containerd"] == {"system": False, "user": True}


@pytest.mark.parametrize("memory,expected", [
    ("8GiB", 8 * 1024 ** 3), ("8G", 8 * 1024 ** 3), ("8GB", 8 * 1024 ** 3),
    ("512MiB", 512 * 1024 ** 2), ('"1073741824"', 1073741824)])
def test_memory_is_reported_in_bytes(lima: Lima, memory: str, expected: int) -> None:
    lima.create(yaml_text=minimal_yaml(f"memory: {memory}\n"))
    assert lima.one()["memory"] == expected


def test_create_twice_is_fatal_and_leaves_the_first(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("cpus: 1\n"))
    result = lima.run("--tty=false", "create", "--name", "vm", "-", input=minimal_yaml("cpus: 3\n"))
    assert result.returncode == 1
    assert fatal(result.stderr) == "instance `vm` already exists"
    assert lima.one()["cpus"] == 1


def test_create_from_a_file_names_the_instance_after_it(lima: Lima, tmp_path: Path) -> None:
    path = tmp_path / "My-Box.yaml"
    path.write_text(minimal_yaml())
    lima.ok("--tty=false", "create", str(path))
    assert [i["name"] for i in lima.listing()] == ["my-box"]
    missing = lima.run("--tty=false", "create", "--name", "x", str(tmp_path / "nope.yaml"))
    assert fatal(missing.stderr) == f"open {tmp_path / 'nope.yaml'}: no such file or directory"


def test_create_stdin_requires_name(lima: Lima) -> None:
    result = lima.run("--tty=false", "create", "-", input=minimal_yaml())
    assert result.returncode == 1
    assert fatal(result.stderr) == "must pass instance name with --name when reading template from stdin"


@pytest.mark.parametrize("name,message", [
    ("bad name",
     f"instance name `bad name` is not a valid identifier: identifier `bad name` must match {NAME_RE_TEXT}"),
    ("a" * 77, f"instance name `{'a' * 77}` is not a valid identifier: identifier `{'a' * 77}` greater than "
               "maximum length (76 characters)"),
    ("vm.yaml", "instance name `vm.yaml` must not end with .yml or .yaml suffix"),
    ("vm.YML", "instance name `vm.YML` must not end with .yml or .yaml suffix"),
])
def test_invalid_instance_names(lima: Lima, name: str, message: str) -> None:
    result = lima.run("--tty=false", "create", "--name", name, "-", input=minimal_yaml())
    assert result.returncode == 1
    assert fatal(result.stderr) == message


def test_instance_name_too_long_for_the_socket_path(lima: Lima) -> None:
    name = "n" * (108 - len(f"{lima.lima_home}/") - len("/ssh.sock.1234567890123456") + 2)
    assert len(name) <= 76
    sock = f"{lima.lima_home}/{name}/ssh.sock.1234567890123456"
    result = lima.run("--tty=false", "create", "--name", name, "-", input=minimal_yaml())
    assert result.returncode == 1
    assert fatal(result.stderr) == (f"instance name `{name}` too long: `{sock}` must be less than "
                                    f"UNIX_PATH_MAX=108 characters, but is {len(sock)}")


@pytest.mark.parametrize("body,message", [
    ("cpus: 2\n", "field `images` must be set"),
    (minimal_yaml("param:\n  UNUSED: x\n"),
     "field `param` key `UNUSED` is not used in any provision, probe, copyToHost, or portForward"),
    (minimal_yaml("minimumLimaVersion: 2.3.0\n"), "template requires Lima version `2.3.0`; this is only `v2.2.0`"),
    (minimal_yaml("vmType: qemuu\n"), "field `vmType` is invalid"),
    (minimal_yaml("mounts:\n- location: /srv\n  writeable: true\n"),
     "field `mounts[0].writeable` is not a known field"),
])
def test_create_validation_errors(lima: Lima, body: str, message: str) -> None:
    result = lima.run("--tty=false", "create", "--name", "vm", "-", input=body)
    assert result.returncode == 1
    assert fatal(result.stderr).startswith(message), result.stderr
    assert not lima.inst_dir().exists()


_KERNEL_IMAGE = ("images:\n- location: /nonexistent/debian.qcow2\n  arch: x86_64\n  digest: sha256:" + "a" * 64 + "\n"
                 "  kernel:\n    location: /nonexistent/vmlinuz\n    arch: x86_64\n    cmdline: root=/dev/vda\n"
                 "  initrd:\n    location: /nonexistent/initrd.img\n    arch: x86_64\n")


def test_local_image_with_kernel_and_initrd_need_not_exist(lima: Lima, tmp_path: Path) -> None:
    """validate.go validateFileObject: "f.Location does NOT need to be accessible"; arch pinned so the test is the
    same on any host."""
    template = tmp_path / "debian.yaml"
    template.write_text(_KERNEL_IMAGE + "arch: x86_64\n")
    assert log_lines(lima.ok("validate", str(template)).stderr) == [("info", f"`{template}`: OK")]
    lima.ok("--tty=false", "create", "--name", "vm", str(template))
    assert lima.one("vm")["config"]["images"][0]["kernel"]["cmdline"] == "root=/dev/vda"


@pytest.mark.parametrize("image,message", [
    ("- location: /i.qcow2\n  digest: sha256:abc\n",  # the double's schema check, stricter than Lima here
     "field `images[0].digest` is invalid: 'sha256:abc' does not match "
     "'^$|^(sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128})$'"),
    ("- location: ~other/i.qcow2\n",
     "field `images[0].location` refers to an invalid local file path: `~other/i.qcow2`: unexpandable path "
     "`~other/i.qcow2`"),
    ("- location: /i.qcow2\n  arch: x86_64\n  kernel:\n    location: /k\n    arch: aarch64\n",
     "images[0].kernel has unexpected architecture `aarch64`, must be `x86_64`"),
])
def test_image_entries_are_validated_as_lima_does(lima: Lima, image: str, message: str) -> None:
    result = lima.run("--tty=false", "create", "--name", "vm", "-", input="arch: x86_64\nimages:\n" + image)
    assert result.returncode == 1
    assert fatal(result.stderr) == message, result.stderr
    assert not lima.inst_dir().exists()


def test_mount_location_must_be_a_directory(lima: Lima, tmp_path: Path) -> None:
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    result = lima.run("--tty=false", "create", "--name", "vm", "-",
                      input=minimal_yaml(f"mounts:\n- location: {afile}\n"))
    assert result.returncode == 1
    assert fatal(result.stderr).startswith(f"field `mounts[0].location` refers to a non-directory path: `{afile}`")


def test_list_missing_name_prints_the_found_ones_then_fails(lima: Lima) -> None:
    lima.create()
    result = lima.run("list", "--json", "vm", "nope")
    assert result.returncode == 1
    assert [json.loads(line)["name"] for line in result.stdout.splitlines()] == ["vm"]
    assert log_lines(result.stderr) == [("warning", "No instance matching nope found."),
                                        ("fatal", "unmatched instances")]


def test_list_is_alphabetical_and_supports_quiet_and_templates(lima: Lima) -> None:
    for name in ("zeta", "alpha", "mid"):
        lima.create(name)
    assert [i["name"] for i in lima.listing()] == ["alpha", "mid", "zeta"]
    assert lima.ok("list", "-q").stdout == "alpha\nmid\nzeta\n"
    result = lima.ok("list", "--format", "{{.Name}} {{.Status}} {{.SSHLocalPort}} {{.Dir}}", "mid")
    assert result.stdout == f"mid Stopped 0 {lima.lima_home / 'mid'}\n"
    bad = lima.run("list", "--format", "{{.Nope}}")
    assert bad.returncode == 1 and bad.stdout == ""
    assert "can't evaluate field Nope" in fatal(bad.stderr)


def test_default_and_override_yaml_are_merged_into_config(lima: Lima, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    config_dir = lima.lima_home / "_config"
    config_dir.mkdir()
    (config_dir / "default.yaml").write_text(
        f"cpus: 1\nmemory: 2GiB\nenv: {{A: default, B: default}}\nmounts:\n- location: {shared}\n")
    (config_dir / "override.yaml").write_text(
        f"memory: 6GiB\nenv: {{B: override}}\nmounts:\n- location: {shared}\n  writable: true\n")
    text = minimal_yaml("cpus: 3\nmemory: 1GiB\nenv: {A: instance, C: instance}\n")
    lima.create(yaml_text=text)
    inst = lima.one()
    assert inst["cpus"] == 3                       # instance beats default.yaml
    assert inst["memory"] == 6 * 1024 ** 3         # override.yaml beats the instance
    assert inst["config"]["env"] == {"A": "instance", "B": "override", "C": "instance"}
    assert len(inst["config"]["mounts"]) == 1      # merged by mountPoint, the later entry wins
    assert inst["config"]["mounts"][0]["writable"] is True
    assert (lima.inst_dir() / "lima.yaml").read_text() == text  # defaults are not written into it


def test_unparsable_lima_yaml_shows_empty_status(lima: Lima) -> None:
    lima.create()
    (lima.inst_dir() / "lima.yaml").write_text("images: [\n")
    result = lima.ok("list", "--json")
    inst = json.loads(result.stdout)
    assert inst["status"] == "" and "config" not in inst and inst["vmType"] == "" and inst["errors"] == []
    assert any(level == "warning" and msg == "instance `vm` has errors" for level, msg in log_lines(result.stderr))


def test_directory_without_lima_yaml_is_broken(lima: Lima) -> None:
    (lima.lima_home / "ghost").mkdir()
    (lima.lima_home / "_ignored").mkdir()
    inst = lima.one("ghost")
    assert inst["status"] == "Broken" and inst["hostname"] == "" and "config" not in inst
    assert [i["name"] for i in lima.listing()] == ["ghost"]
    result = lima.run("delete", "ghost")
    assert result.returncode == 1
    assert "exists but its `lima.yaml` could not be read; it was NOT deleted" in fatal(result.stderr)


def test_concurrent_creates_exactly_one_wins(lima: Lima) -> None:
    for round_ in range(3):
        name = f"race{round_}"
        env = dict(lima.env, FAKE_LIMACTL_LATENCY="create=0.1")
        procs = [subprocess.Popen(["limactl", "--tty=false", "create", "--name", name, "-"], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        results = [(p, *p.communicate(minimal_yaml(f"cpus: {i + 1}\n"), timeout=60)) for i, p in enumerate(procs)]
        codes = sorted(p.returncode for p, _, _ in results)
        assert codes == [0, 1], results
        loser = next(err for p, _, err in results if p.returncode == 1)
        assert re.fullmatch(rf"instance `{name}` already exists( \(`.*`\))?", fatal(loser)), loser
        assert lima.one(name)["status"] == "Stopped"
    assert not [p for p in (lima.lima_home / "_fake").iterdir() if p.name.startswith("staging")]


# ---------------------------------------------------------------------------------------------
# start / stop / restart / delete / protect
# ---------------------------------------------------------------------------------------------

def test_start_stop_transitions(lima: Lima) -> None:
    lima.create()
    started = lima.ok("--tty=false", "start", "--timeout=600s", "vm")
    lines = log_lines(started.stderr)
    assert started.stdout == ""
    assert ("info", "Using the existing instance `vm`") in lines
    assert ("info", "Starting the instance `vm` with internal VM driver `qemu`") in lines
    assert ("info", "[hostagent] Waiting for the essential requirement 1 of 3: `ssh`") in lines
    assert ("info", "[hostagent] The essential requirement 1 of 3 is satisfied") in lines
    assert lines[-1] == ("info", "READY. Run `limactl shell vm` to open the shell.")
    inst = lima.one()
    assert inst["status"] == "Running" and isinstance(inst["sshLocalPort"], int) and inst["sshLocalPort"] > 0
    port_line = f"SSH Local Port: {inst['sshLocalPort']}"
    assert ("info", port_line) in lines

    again = lima.ok("start", "vm")
    assert log_lines(again.stderr)[-1] == (
        "info", "The instance `vm` is already running. Run `limactl shell vm` to open the shell.")

    stopped = lima.ok("stop", "vm")
    assert log_lines(stopped.stderr)[-1] == ("info", "The instance vm has shut down")
    inst = lima.one()
    assert inst["status"] == "Stopped"
    assert inst["sshLocalPort"] == int(port_line.split()[-1])  # from ssh.config of the last run

    twice = lima.run("stop", "vm")
    assert twice.returncode == 1
    assert fatal(twice.stderr) == "expected status `Running`, got `Stopped` (maybe use `limactl stop -f`?)"
    forced = lima.ok("stop", "-f", "vm")
    assert ("info", "The host agent process seems already stopped") in log_lines(forced.stderr)
    assert lima.ok("list", "--format", "{{.Status}}", "vm").stdout == "Stopped\n"


def test_boot_count_and_port_change_on_every_start(running: Lima) -> None:
    import socket

    first = running.one()
    # Lima picks a free port at every start: hold the old one so that a port merely kept is caught.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first["sshLocalPort"]))
        running.ok("restart", "vm")
    second = running.one()
    assert second["status"] == "Running"
    assert (fake_limactl.read_state(running.lima_home, "vm")["bootCount"]) == 2
    assert second["sshLocalPort"] != first["sshLocalPort"]
    assert f"  Port {second['sshLocalPort']}\n" in (running.inst_dir() / "ssh.config").read_text()


def test_a_configured_ssh_port_stays_across_starts(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("ssh:\n  localPort: 60222\n"))
    lima.ok("start", "vm")
    lima.ok("restart", "vm")
    assert lima.one()["sshLocalPort"] == 60222


def test_stop_missing_instance(lima: Lima) -> None:
    result = lima.run("stop", "nope")
    assert result.returncode == 1
    assert fatal(result.stderr) == f"open {lima.lima_home}/nope/lima.yaml: no such file or directory"


def test_start_missing_instance_is_made_visible(lima: Lima) -> None:
    result = lima.run("--tty=false", "start", "nope")
    assert result.returncode == 1
    assert fatal(result.stderr) == "fake limactl: start of a non-existent instance would create a default Ubuntu VM"
    assert not (lima.lima_home / "nope").exists()


def test_delete_running_needs_force(running: Lima) -> None:
    result = running.run("delete", "vm")
    assert result.returncode == 1
    assert fatal(result.stderr) == "failed to delete instance `vm`: expected status `Stopped`, got `Running`"
    deleted = running.ok("delete", "--force", "vm")
    assert log_lines(deleted.stderr)[-1] == ("info", f"Deleted `vm` (`{running.inst_dir()}`)")
    assert not running.inst_dir().exists()


def test_delete_missing_instance_warns_and_exits_0(lima: Lima) -> None:
    result = lima.ok("delete", "--force", "nope")
    assert log_lines(result.stderr) == [("warning", "Ignoring non-existent instance `nope`")]


def test_protect_blocks_delete(lima: Lima) -> None:
    lima.create()
    assert log_lines(lima.ok("protect", "vm").stderr) == [("info", "Protected `vm`")]
    assert log_lines(lima.ok("protect", "vm").stderr) == [("warning", "Instance `vm` is already protected. Skipping.")]
    assert lima.one()["protected"] is True
    result = lima.run("delete", "-f", "vm")
    assert result.returncode == 1
    assert fatal(result.stderr) == ("failed to delete instance `vm`: instance is protected to prohibit accidental "
                                    "removal (Hint: use `limactl unprotect`)")
    lima.ok("unprotect", "vm")
    lima.ok("delete", "vm")
    missing = lima.run("protect", "vm")
    assert fatal(missing.stderr) == (f"failed to inspect instance `vm`: open {lima.lima_home}/vm/lima.yaml: "
                                     "no such file or directory")


def test_broken_instance_recovers_with_stop_force(running: Lima) -> None:
    fake_limactl.set_status(running.lima_home, "vm", "Broken")
    inst = running.one()
    assert inst["status"] == "Broken" and inst["errors"] == []
    start = running.run("start", "vm")
    assert start.returncode == 1
    assert fatal(start.stderr) == "errors inspecting instance: [host agent is running but driver is not]"
    assert running.run("stop", "vm").returncode == 1
    running.ok("stop", "--force", "vm")
    assert running.one()["status"] == "Stopped"
    running.ok("start", "vm")
    assert running.one()["status"] == "Running"


def test_clone_copies_a_stopped_instance(lima: Lima) -> None:
    lima.create()
    lima.ok("protect", "vm")
    lima.ok("clone", "vm", "vm2")
    assert lima.one("vm2")["status"] == "Stopped" and lima.one("vm2")["protected"] is False
    lima.ok("start", "vm")
    assert fatal(lima.run("clone", "vm", "vm3").stderr) == "cannot clone a running instance"


@pytest.mark.parametrize("verb", ["clone", "rename"])
def test_clone_and_rename_check_the_socket_path_as_create_does(lima: Lima, verb: str) -> None:
    """pkg/instance/clone.go: LIMA_HOME/NEW/ssh.sock.1234567890123456 must stay under UNIX_PATH_MAX (108)."""
    lima.create()
    longest = 108 - 1 - len(f"{lima.lima_home}/") - len("/ssh.sock.1234567890123456")  # a 107-char path
    too_long, fits = "n" * (longest + 1), "f" * longest
    sock = f"{lima.lima_home}/{too_long}/ssh.sock.1234567890123456"
    assert len(sock) == 108 and len(too_long) <= 76
    before = sorted(os.listdir(lima.lima_home))
    result = lima.run(verb, "vm", too_long)
    assert (result.returncode, result.stdout) == (1, "")
    assert fatal(result.stderr) == (f"instance name `{too_long}` too long: `{sock}` must be less than "
                                    f"UNIX_PATH_MAX=108 characters, but is 108")
    assert sorted(os.listdir(lima.lima_home)) == before and lima.one("vm")["status"] == "Stopped"
    lima.ok(verb, "vm", fits)  # the control: one character less works
    assert [i["name"] for i in lima.listing()] == (["f" * longest] if verb == "rename" else ["f" * longest, "vm"])


def test_info_and_validate(lima: Lima, tmp_path: Path) -> None:
    info = json.loads(lima.ok("info").stdout)
    assert info["version"] == "v2.2.0" and info["limaHome"] == str(lima.lima_home)
    assert {"vmTypes", "hostOS", "hostArch", "identityFile", "templates"} <= set(info)
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(minimal_yaml())
    bad.write_text("cpus: 1\n")
    assert log_lines(lima.ok("validate", str(good)).stderr) == [("info", f"`{good}`: OK")]
    result = lima.run("validate", str(bad))
    assert fatal(result.stderr) == f"failed to validate YAML file `{bad}`: field `images` must be set"


# ---------------------------------------------------------------------------------------------
# provisioning
# ---------------------------------------------------------------------------------------------

def test_data_provisioning_is_written_at_every_start(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml(
        "param:\n  WHO: world\n"
        "provision:\n"
        "- mode: data\n  path: '{{.Home}}/greeting'\n  content: 'hello {{.Param.WHO}} from {{.User}}@{{.Hostname}}'\n"
        "  permissions: '0600'\n"
        "- mode: data\n  path: /etc/keep.conf\n  content: original\n  overwrite: false\n"
        "- mode: system\n  script: |\n    #!/bin/sh\n    echo {{.Name}}\n"))
    home = fake_limactl.guest_home(lima.lima_home, "vm")
    greeting = home / "greeting"
    assert not greeting.exists()
    lima.ok("start", "vm")
    assert greeting.read_text() == f"hello world from {guest_user()}@lima-vm"
    assert greeting.stat().st_mode & 0o777 == 0o600
    keep = fake_limactl.guest_dir(lima.lima_home, "vm", "etc") / "keep.conf"
    keep.write_text("edited")
    greeting.write_text("stale")
    lima.ok("restart", "vm")
    assert greeting.read_text().startswith("hello world")   # overwrite defaults to true
    assert keep.read_text() == "edited"                    # overwrite: false
    state = fake_limactl.read_state(lima.lima_home, "vm")
    assert [(e["boot"], e["mode"], e["script"]) for e in state["provisionLog"]] == [
        (1, "system", "#!/bin/sh\necho vm\n"), (2, "system", "#!/bin/sh\necho vm\n")]


def test_data_provisioning_outside_the_writable_guest_dirs_never_finishes_booting(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("provision:\n- mode: data\n  path: /opt/fake-limactl\n  content: x\n"))
    result = lima.run("start", "vm")
    assert result.returncode == 1
    assert fatal(result.stderr) == "did not receive an event with the `running` status"
    assert lima.one()["status"] == "Running"  # like a real start that timed out
    assert not Path("/opt/fake-limactl").exists()


def boot_log(lima: Lima, name: str = "vm") -> str:
    return (fake_limactl.guest_dir(lima.lima_home, name, "var") / "log" / "cloud-init-output.log").read_text()


def script(body: str) -> str:
    """A provisioning or probe script as a YAML block scalar value."""
    return "|\n" + "".join(f"    {line}\n" for line in ["#!/bin/bash", *body.splitlines()])


@pytest.fixture
def root_host() -> None:
    """The guest user is unprivileged only when the double runs as root (as CI does)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs the tests as root")
        pytest.skip("the double separates guest root from the guest user only when run as root")


def test_boot_done_is_written_after_provisioning_not_at_boot(lima: Lima, bwrap: None) -> None:
    lima.create(yaml_text=minimal_yaml(
        "provision:\n- mode: system\n  script: " + script("touch /var/lib/by-system")))
    slow = {"FAKE_LIMACTL_PROVISION_DELAY": "3"}
    result = lima.run("start", "--timeout", "1s", "vm", env=slow)
    assert result.returncode == 1
    assert fatal(result.stderr) == "did not receive an event with the `running` status"
    assert lima.one()["status"] == "Running"  # like a real start that timed out: the guest boots on
    booting = lima.run("shell", "vm", "sh", "-c", "test -e /run/lima-boot-done || echo not-yet; "
                       "test -e /var/lib/by-system || echo no-system-script-yet")
    assert booting.stdout == "not-yet\nno-system-script-yet\n"
    run = fake_limactl.guest_dir(lima.lima_home, "vm", "run")
    deadline = time.monotonic() + 20
    while not (run / "lima-boot-done").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (run / "lima-boot-done").read_text() == fake_limactl.read_state(lima.lima_home, "vm")["iid"] + "\n"
    assert lima.ok("shell", "vm", "ls", "/var/lib/by-system").stdout == "/var/lib/by-system\n"


def test_a_boot_that_never_finishes_stops_with_the_vm(lima: Lima, bwrap: None) -> None:
    lima.create()
    result = lima.run("start", "--timeout", "1s", "vm", env={"FAKE_LIMACTL_PROVISION_HANG": "1"})
    assert fatal(result.stderr) == "did not receive an event with the `running` status"
    pid = fake_limactl.read_state(lima.lima_home, "vm")["bootPID"]
    assert Path(f"/proc/{pid}").exists()
    lima.ok("stop", "vm")
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and b"zombie" not in _proc_state(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or b"zombie" in _proc_state(pid)
    assert not (fake_limactl.guest_dir(lima.lima_home, "vm", "run") / "lima-boot-done").exists()


def _proc_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes().lower()
    except OSError:
        return b"zombie"


def test_provisioning_runs_by_mode_system_as_root_user_as_the_user(lima: Lima, bwrap: None, root_host: None) -> None:
    # Listed user first and data last: Lima's boot script runs data, then system, then user.
    lima.create(yaml_text=minimal_yaml(
        "provision:\n"
        "- mode: user\n  script: " + script(
            'echo "$(id -un) $HOME $(tr "\\n" , < /etc/order)" > ~/user.txt\n'
            "touch /etc/by-user 2>~/user-etc.err || true\n"
            "sudo touch /etc/by-sudo") +
        "- mode: system\n  script: " + script('echo "$(id -u) $HOME" > /var/lib/system.txt; echo system >> /etc/order') +
        "- mode: data\n  path: /etc/order\n  content: |\n    data\n"))
    lima.ok("start", "vm")
    home = fake_limactl.guest_home(lima.lima_home, "vm")
    etc = fake_limactl.guest_dir(lima.lima_home, "vm", "etc")
    assert (fake_limactl.guest_dir(lima.lima_home, "vm", "var") / "lib" / "system.txt").read_text() == "0 /root\n"
    assert (home / "user.txt").read_text() == "lima /home/lima.guest data,system,\n"
    assert "Permission denied" in (home / "user-etc.err").read_text()
    assert not (etc / "by-user").exists() and (etc / "by-sudo").exists()
    log = [(e["mode"], e["exit"]) for e in fake_limactl.read_state(lima.lima_home, "vm")["provisionLog"]]
    assert log == [("system", 0), ("user", 0)]


def test_a_failing_provisioning_script_is_logged_and_start_still_succeeds(lima: Lima, bwrap: None) -> None:
    lima.create(yaml_text=minimal_yaml(
        "provision:\n- mode: system\n  script: " + script("echo about to fail; exit 3") +
        "- mode: user\n  script: " + script("touch ~/user-ran")))
    result = lima.ok("start", "vm")
    assert log_lines(result.stderr)[-1] == ("info", "READY. Run `limactl shell vm` to open the shell.")
    log = boot_log(lima)
    assert "about to fail\n" in log
    assert re.search(r"^LIMA \S+\| WARNING: Failed to execute /run/fake-limactl/cidata/provision.system/00000001$",
                     log, re.M), log
    assert (fake_limactl.guest_home(lima.lima_home, "vm") / "user-ran").exists()
    assert [e["exit"] for e in fake_limactl.read_state(lima.lima_home, "vm")["provisionLog"]] == [3, 0]


def test_a_failing_probe_is_a_degraded_start(lima: Lima, bwrap: None) -> None:
    lima.create(yaml_text=minimal_yaml(
        "containerd:\n  user: false\n"
        "provision:\n- mode: system\n  script: " + script("touch /var/lib/ready") +
        "probes:\n- description: the marker\n  script: " + script("test -e /var/lib/ready") +
        "- description: never\n  hint: see the log\n  script: " + script("echo nope >&2; exit 1")))
    result = lima.run("start", "vm")
    assert result.returncode == 1
    lines = log_lines(result.stderr)
    assert ("info", "[hostagent] The optional requirement 1 of 2 is satisfied") in lines  # ran after provisioning
    error = 'failed to satisfy the optional requirement 2 of 2 "never": see the log: stdout="", stderr="nope\\n": exit status 1'
    assert ("error", f"[{error}]") in lines  # pkg/instance/start.go logs the event's errors as one list
    assert ("warning", "DEGRADED. The VM seems running, but file sharing and port forwarding may not work. "
            f"(hint: see `{lima.inst_dir()}/ha.stderr.log`)") in lines
    assert fatal(result.stderr).startswith(f"degraded, status={{Running:true Degraded:true Exiting:false Errors:[{error}]")
    assert lima.one()["status"] == "Running"


def test_ca_certs_reach_the_guest_trust_store_once(lima: Lima, bwrap: None) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
    indented = "".join(f"      {line}\n" for line in pem.splitlines())
    lima.create(yaml_text=minimal_yaml(f"caCerts:\n  certs:\n  - |\n{indented}"))
    lima.ok("start", "vm")
    lima.ok("restart", "vm")
    bundle = lima.ok("shell", "vm", "cat", "/etc/ssl/certs/ca-certificates.crt").stdout
    assert bundle.count(pem) == 1
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if host_bundle.exists():
        assert bundle.startswith(host_bundle.read_text())  # the image's own certificates stay
    crt = lima.ok("shell", "vm", "cat", "/usr/local/share/ca-certificates/cloud-init-ca-cert-1.crt").stdout
    assert crt == pem


def test_ca_certs_remove_defaults_leaves_only_them(lima: Lima, bwrap: None) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIBonly\n-----END CERTIFICATE-----\n"
    indented = "".join(f"      {line}\n" for line in pem.splitlines())
    lima.create(yaml_text=minimal_yaml(f"caCerts:\n  removeDefaults: true\n  certs:\n  - |\n{indented}"))
    lima.ok("start", "vm")
    assert lima.ok("shell", "vm", "cat", "/etc/ssl/certs/ca-certificates.crt").stdout == pem


def test_the_guest_user_is_not_root_and_owns_the_mounts(lima: Lima, tmp_path: Path, bwrap: None,
                                                       root_host: None) -> None:
    rw = tmp_path / "rw"
    rw.mkdir()
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {rw}\n  writable: true\n"))
    lima.ok("start", "vm")
    result = lima.run("shell", "vm", "sh", "-c",
                      f"id -un; id -u; stat -c %u /etc/passwd /usr/local/bin; echo x > {rw}/mine; "
                      "touch /usr/local/bin/tool || echo refused; sudo touch /usr/local/bin/tool && echo sudo-ok")
    assert result.stdout == "lima\n1000\n0\n0\nrefused\nsudo-ok\n", result.stderr
    assert "Permission denied" in result.stderr
    assert (rw / "mine").stat().st_uid == os.getuid()  # the host user's file, as over 9p/virtiofs
    assert lima.ok("shell", "vm", "stat", "-c", "%u", "/usr/local/bin/tool").stdout == "0\n"


def test_sudo_runs_as_root_with_the_callers_stdio_and_exit_code(running: Lima, bwrap: None) -> None:
    result = running.run("shell", "vm", "sh", "-c", "echo in | sudo sh -c 'id -u; cat; echo err >&2; exit 7'")
    assert (result.returncode, result.stdout, result.stderr) == (7, "0\nin\n", "err\n")
    env = running.ok("shell", "vm", "sudo", "env").stdout
    assert "HOME=/root\n" in env and "SUDO_USER=" in env


def test_system_scripts_find_stand_ins_for_the_network(lima: Lima, bwrap: None) -> None:
    lima.create(yaml_text=minimal_yaml("provision:\n- mode: system\n  script: " + script(
        "apt-get install -y gh || echo no-update-no-package\n"
        "apt-get update -q && apt-get install -y -q gh\n"
        "command -v gh; dpkg-query -W -f='${Status}\\n' gh; dpkg-query -W nothing || echo not-installed\n"
        "cd /tmp && curl -fsSLO https://nodejs.org/dist/v22.22.0/node-v22.22.0-linux-x64.tar.xz\n"
        "curl -fsSL https://nodejs.org/dist/v22.22.0/SHASUMS256.txt | grep ' node-v22.22.0-linux-x64.tar.xz$' "
        "| sha256sum -c -\n"
        "tar -tJf node-v22.22.0-linux-x64.tar.xz | sort | head -3\n"
        "curl -fsS https://example.com/ || echo curl=$?")))
    lima.ok("start", "vm")
    log = boot_log(lima)
    assert "E: Unable to locate package gh\nno-update-no-package\n" in log
    assert "/usr/local/bin/gh\ninstall ok installed\n" in log
    assert "dpkg-query: no packages found matching nothing\nnot-installed\n" in log
    assert "node-v22.22.0-linux-x64.tar.xz: OK\n" in log
    assert ("node-v22.22.0-linux-x64/CHANGELOG.md\nnode-v22.22.0-linux-x64/LICENSE\n"
            "node-v22.22.0-linux-x64/README.md\n") in log
    assert "curl: (6) Could not resolve host: example.com\ncurl=6\n" in log


def test_apt_waits_for_a_held_dpkg_lock_only_when_told_to(lima: Lima, bwrap: None) -> None:
    lima.create(yaml_text=minimal_yaml("provision:\n- mode: system\n  script: " + script(
        "apt-get update || echo update=$?\n"
        "apt-get install -y jq || echo no-wait=$?\n"
        "apt-get -o DPkg::Lock::Timeout=30 install -y jq || echo waited=$?\n"
        "apt-get update -q && apt-get install -y jq && echo installed")))
    lima.ok("start", "vm", env={"FAKE_LIMACTL_APT_LOCK_SECONDS": "3"})
    log = boot_log(lima)
    assert ("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1234 (apt-get)\n"
            "E: Unable to lock directory /var/lib/apt/lists/\nupdate=100\n") in log
    assert ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1234 (unattended-upgr)\n"
            "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?\n"
            "no-wait=100\n") in log
    # With the timeout it waits for the lock (and then finds no package lists: nothing was updated).
    assert ("Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1234 "
            "(unattended-upgr)\n") in log
    assert "E: Unable to locate package jq\nwaited=100\n" in log and "installed\n" in log


# ---------------------------------------------------------------------------------------------
# shell (works with or without bwrap)
# ---------------------------------------------------------------------------------------------

def test_shell_errors_for_missing_and_stopped(lima: Lima) -> None:
    missing = lima.run("shell", "nope", "true")
    assert missing.returncode == 1
    assert fatal(missing.stderr) == "instance `nope` does not exist, run `limactl create nope` to create a new instance"
    lima.create()
    stopped = lima.run("shell", "vm", "true")
    assert stopped.returncode == 1
    assert fatal(stopped.stderr) == "instance `vm` is stopped, run `limactl start vm` to start the instance"


def _shell_on_a_terminal(lima: Lima, *args: str, answer: bytes) -> tuple[int, bytes]:
    """limactl with stdin and stdout on a pty (as a user's terminal), `answer` typed once it asks."""
    import pty

    primary, secondary = pty.openpty()
    process = subprocess.Popen(["limactl", *args], stdin=secondary, stdout=secondary, stderr=subprocess.DEVNULL,
                               env=lima.env, cwd=lima.root)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 30
    while b"(Y/n)" not in seen and process.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.2)
        if ready:
            try:
                seen += os.read(primary, 4096)
            except OSError:
                break
    if b"(Y/n)" in seen:
        os.write(primary, answer)
    code = process.wait(timeout=60)
    os.close(primary)
    return code, seen


def test_shell_on_a_terminal_asks_to_start_a_stopped_instance_unless_tty_false(lima: Lima) -> None:
    lima.create()
    code, seen = _shell_on_a_terminal(lima, "shell", "vm", "true", answer=b"n\n")
    assert b"? Do you want to start the instance now? (Y/n)" in seen  # shell.go's askWhetherToStart
    assert code == 1 and lima.one()["status"] == "Stopped"
    code, seen = _shell_on_a_terminal(lima, "shell", "--tty=false", "vm", "true", answer=b"y\n")
    assert b"Do you want" not in seen and code == 1  # the fatal, as without a terminal
    assert lima.one()["status"] == "Stopped"


def test_shell_start_flag_starts_first(lima: Lima) -> None:
    lima.create()
    result = lima.ok("shell", "--start", "vm", "echo", "ran")
    assert result.stdout == "ran\n"
    assert not any(msg.startswith("READY.") for _, msg in log_lines(result.stderr))
    assert lima.one()["status"] == "Running"


def test_shell_propagates_exit_code_silently(running: Lima) -> None:
    result = running.run("shell", "vm", "sh", "-c", "exit 7")
    assert (result.returncode, result.stdout, result.stderr) == (7, "", "")


def test_shell_preserves_argv_byte_for_byte(running: Lima) -> None:
    args = ["a b", "it's", '"dq"', "$HOME", "`id`", "line1\nline2", "ünïcødé ✓", "", "*", "--x=1", "\\n"]
    result = running.run("shell", "vm", "--", "printf", "%s\\0", *args, text=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(a.encode() + b"\0" for a in args)


def test_shell_one_argument_is_a_program_name(running: Lima) -> None:
    result = running.run("shell", "vm", "echo hi")
    assert result.returncode == 127
    assert "echo hi: command not found" in result.stderr


def test_shell_flags_after_the_name_are_the_command(running: Lima) -> None:
    assert running.ok("shell", "vm", "echo", "--workdir", "/tmp").stdout == "--workdir /tmp\n"
    # Lima quotes it as the -c string of `bash -l -c`, which bash then rejects as an option.
    result = running.run("shell", "vm", "--workdir", "/tmp", "pwd")
    assert result.returncode == 2
    assert "invalid option" in result.stderr


def test_shell_missing_workdir_exits_1_without_running(running: Lima) -> None:
    result = running.run("shell", "--workdir", "/nonexistent-dir", "vm", "sh", "-c", "echo RAN")
    assert result.returncode == 1
    assert "RAN" not in result.stdout
    assert re.search(r"^bash: (line 1: )?cd: /nonexistent-dir: No such file or directory$", result.stderr, re.M)


def test_shell_env_assignments_and_stdin(running: Lima) -> None:
    assert running.ok("shell", "vm", "GREETING=a b", "sh", "-c", 'echo "$GREETING"').stdout == "a b\n"
    assert running.ok("shell", "vm", "cat", input="piped\n").stdout == "piped\n"
    assert running.ok("shell", "vm", input="echo $((6*7))\n").stdout == "42\n"


def test_without_bwrap_commands_run_on_the_host_after_one_warning(running: Lima) -> None:
    env = {"FAKE_LIMACTL_NO_BWRAP": "1"}
    first = running.run("shell", "vm", "sh", "-c", 'echo "$HOME"', env=env)
    assert first.returncode == 0
    assert first.stdout == f"{fake_limactl.guest_home(running.lima_home, 'vm')}\n"
    assert "bwrap not found" in first.stderr
    assert running.run("shell", "vm", "true", env=env).stderr == ""


def test_shell_separates_stdout_and_stderr(running: Lima) -> None:
    result = running.ok("shell", "vm", "sh", "-c", "echo out; echo err >&2")
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


# ---------------------------------------------------------------------------------------------
# shell inside bubblewrap: the guest filesystem
# ---------------------------------------------------------------------------------------------

def test_read_only_mount_refuses_writes(lima: Lima, tmp_path: Path, bwrap: None) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "existing").write_text("keep")
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {ro}\n"))
    lima.ok("start", "vm")
    result = lima.run("shell", "vm", "sh", "-c", f"cat {ro}/existing; echo x > {ro}/new")
    assert result.returncode != 0
    assert result.stdout == "keep"
    assert "Read-only file system" in result.stderr
    assert not (ro / "new").exists()


def test_writable_mount_writes_to_the_host(lima: Lima, tmp_path: Path, bwrap: None) -> None:
    rw = tmp_path / "rw"
    rw.mkdir()
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {rw}\n  writable: true\n"))
    lima.ok("start", "vm")
    result = lima.ok("shell", "vm", "sh", "-c", "pwd; echo hello > made-in-guest", cwd=rw)
    assert result.stdout == f"{rw}\n"  # the host cwd lies under a mount: used verbatim
    assert (rw / "made-in-guest").read_text() == "hello\n"


def test_mount_points_that_do_not_exist_on_the_host(lima: Lima, tmp_path: Path, bwrap: None) -> None:
    rw, ro = tmp_path / "src", tmp_path / "staging"
    rw.mkdir()
    ro.mkdir()
    (ro / "file").write_text("staged\n")
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {rw}\n  mountPoint: /workspace\n  writable: true\n"
                                       f"- location: {ro}\n  mountPoint: /mnt/fake-limactl/staging\n"))
    lima.ok("start", "vm")
    lima.ok("shell", "--workdir", "/workspace", "vm", "touch", "inside")
    assert (rw / "inside").exists()
    assert not Path("/workspace").exists()
    result = lima.run("shell", "vm", "sh", "-c", "cat /mnt/fake-limactl/staging/file; touch /mnt/x 2>/dev/null || echo RO")
    assert result.stdout == "staged\nRO\n", result.stderr
    assert not Path("/mnt/fake-limactl").exists()


def test_host_home_and_root_are_not_writable_or_visible(running: Lima, bwrap: None) -> None:
    (running.home / "secret").write_text("s")
    result = running.run("shell", "vm", "sh", "-c",
                         f"test -e {running.home}/secret && echo SEEN; test -e {running.lima_home} && echo LIMA; "
                         "touch /usr/fake-limactl-probe 2>/dev/null || echo RO")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "RO\n"
    assert not Path("/usr/fake-limactl-probe").exists()


def test_guest_home_is_private_and_persistent(running: Lima, bwrap: None) -> None:
    user = guest_user()
    first = running.ok("shell", "vm", "sh", "-c", 'echo "$HOME $USER"; pwd; echo kept > ~/note')
    assert first.stdout == f"/home/{user}.guest {user}\n/home/{user}.guest\n"
    assert running.ok("shell", "vm", "cat", f"/home/{user}.linux/note").stdout == "kept\n"
    assert (fake_limactl.guest_home(running.lima_home, "vm") / "note").read_text() == "kept\n"
    running.ok("stop", "vm")
    running.ok("start", "vm")
    assert running.ok("shell", "vm", "cat", "note").stdout == "kept\n"


def test_run_is_emptied_by_stop_and_start(running: Lima, bwrap: None) -> None:
    running.ok("shell", "vm", "sh", "-c", "sudo sh -c 'echo x > /run/leftover'; echo y > /tmp/kept")
    assert running.ok("shell", "vm", "cat", "/run/leftover").stdout == "x\n"
    running.ok("stop", "vm")
    running.ok("start", "vm")
    result = running.run("shell", "vm", "sh", "-c", "test -e /run/leftover && echo STILL; cat /tmp/kept")
    assert result.stdout == "y\n"
    assert running.ok("shell", "vm", "cat", "/run/lima-boot-done").stdout.startswith("iid-")


def test_env_values_arrive_byte_for_byte(lima: Lima, bwrap: None) -> None:
    value = "line1\nline2 'single' \"double\" $HOME `cmd` \\ ünï ✓"
    lima.create(yaml_text=minimal_yaml("env:\n  TRICKY: " + json.dumps(value) + "\n  NUM: 42\n"))
    lima.ok("start", "vm")
    result = lima.run("shell", "vm", "sh", "-c", 'printf %s "$TRICKY"; printf "|%s" "$NUM"', text=False,
                      env={"LEAKED_FROM_HOST": "1"})
    assert result.stdout == value.encode() + b"|42"
    leaked = lima.run("shell", "vm", "sh", "-c", 'echo "${LEAKED_FROM_HOST:-absent}"', env={"LEAKED_FROM_HOST": "1"})
    assert leaked.stdout == "absent\n"
    preserved = lima.run("shell", "--preserve-env", "vm", "sh", "-c", 'echo "$LEAKED_FROM_HOST $HOME"',
                         env={"LEAKED_FROM_HOST": "1"})
    assert preserved.stdout == f"1 /home/{guest_user()}.guest\n"


# ---------------------------------------------------------------------------------------------
# copy
# ---------------------------------------------------------------------------------------------

def test_copy_between_host_and_guest(lima: Lima, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {ro}\n"))
    src = tmp_path / "file.txt"
    src.write_text("payload")
    stopped = lima.run("copy", str(src), "vm:/tmp/")
    assert fatal(stopped.stderr) == "instance `vm` is stopped, run `limactl start vm` to start the instance"
    lima.ok("start", "vm")

    assert lima.ok("copy", str(src), "vm:/tmp/").stdout == ""
    assert (fake_limactl.guest_dir(lima.lima_home, "vm", "tmp") / "file.txt").read_text() == "payload"
    lima.ok("copy", str(src), "vm:relative.txt")
    assert (fake_limactl.guest_home(lima.lima_home, "vm") / "relative.txt").read_text() == "payload"
    lima.ok("copy", "vm:/tmp/file.txt", str(tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_text() == "payload"

    denied = lima.run("copy", str(src), f"vm:{ro}/x.txt")
    assert denied.returncode == 1 and "Permission denied" in denied.stderr
    assert not (ro / "x.txt").exists()

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "leaf").write_text("leaf")
    no_r = lima.run("copy", str(tree), "vm:/tmp/")
    assert no_r.returncode == 1 and "not a regular file" in no_r.stderr
    lima.ok("copy", "-r", str(tree), "vm:/tmp/")
    assert (fake_limactl.guest_dir(lima.lima_home, "vm", "tmp") / "tree" / "sub" / "leaf").read_text() == "leaf"

    missing = lima.run("copy", str(src), "nope:/tmp/")
    assert fatal(missing.stderr) == "instance `nope` does not exist, run `limactl create nope` to create a new instance"


# ---------------------------------------------------------------------------------------------
# call log, latency, failure injection
# ---------------------------------------------------------------------------------------------

def test_call_log_records_every_invocation(lima: Lima) -> None:
    lima.run("list", "--json")
    lima.run("stop", "nope")
    lima.create()
    calls = fake_limactl.read_calls(lima.lima_home)
    assert [c["argv"] for c in calls] == [["list", "--json"], ["stop", "nope"],
                                          ["--tty=false", "create", "--name", "vm", "-"]]
    assert [c["exit"] for c in calls] == [0, 1, 0]
    for c in calls:
        assert set(c) == {"argv", "cwd", "start", "duration", "exit", "cpu"}
        assert c["cwd"] == str(lima.root) and c["duration"] >= 0 and abs(c["start"] - time.time()) < 120
        assert 0 < c["cpu"] < 5


def test_call_log_counts_the_cpu_of_a_shells_guest_command(running: Lima) -> None:
    """benchmarks/compare.py takes each call's "cpu" out of the caller's CPU: a shell's must include the command
    it waited for (the guest burns 0.6 s of CPU time, not of wall time, so a busy machine does not matter)."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    fake_limactl.clear_calls(running.lima_home)
    running.ok("shell", "vm", "python3", "-c", burn, timeout=120)
    running.ok("shell", "vm", "true")  # the control: the double's own CPU alone is well under it
    burned, idle = fake_limactl.read_calls(running.lima_home)
    assert burned["cpu"] >= 0.6 and burned["cpu"] - idle["cpu"] >= 0.5, (burned, idle)


def test_call_log_cpu_is_what_the_caller_waited_for(lima: Lima) -> None:
    """The caller's view of its children's CPU (getrusage) exceeds the logged "cpu" only by the process's start
    and exit, a few ms: clock-tick counts (os.times) would lose 10-20 ms a call, counted as the caller's own."""
    fake_limactl.clear_calls(lima.lima_home)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(10):
        lima.ok("list")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seen = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    logged = sum(call["cpu"] for call in fake_limactl.read_calls(lima.lima_home))
    assert 0 <= seen - logged < 0.06, (seen, logged)


def test_call_log_records_shell_exit_codes(running: Lima) -> None:
    fake_limactl.clear_calls(running.lima_home)
    running.run("shell", "vm", "sh", "-c", "exit 3")
    assert fake_limactl.read_calls(running.lima_home)[-1]["exit"] == 3


def test_latency_is_simulated_per_subcommand(lima: Lima) -> None:
    # list sleeps its own 0.4 s (a lower bound: sleeping never ends early), never shell's 600 s
    # (the call would hit its timeout), and a sub-command without an entry does not sleep at all.
    began = time.monotonic()
    lima.ok("list", env={"FAKE_LIMACTL_LATENCY": "list=0.4,shell=600"}, timeout=60)
    assert time.monotonic() - began >= 0.4
    assert fake_limactl.read_calls(lima.lima_home)[-1]["duration"] >= 0.4
    lima.ok("list", "--json", env={"FAKE_LIMACTL_LATENCY": "create=600"}, timeout=60)


def test_injected_start_failure_keeps_the_instance_stopped(lima: Lima) -> None:
    lima.create()
    result = lima.run("start", "vm", env={"FAKE_LIMACTL_FAIL_START": "boom"})
    assert result.returncode == 1
    assert ("info", "Starting the instance `vm` with internal VM driver `qemu`") in log_lines(result.stderr)
    assert fatal(result.stderr) == "boom"
    assert lima.one()["status"] == "Stopped"
    left = lima.run("start", "vm", env={"FAKE_LIMACTL_FAIL_START": "timeout", "FAKE_LIMACTL_START_LEAVE_RUNNING": "1"})
    assert left.returncode == 1 and lima.one()["status"] == "Running"


def test_injected_failure_only_the_first_times(lima: Lima) -> None:
    lima.create()
    env = {"FAKE_LIMACTL_FAIL_START": "flaky", "FAKE_LIMACTL_FAIL_START_TIMES": "1"}
    assert lima.run("start", "vm", env=env).returncode == 1
    assert lima.run("start", "vm", env=env).returncode == 0


def test_injected_create_failure_leaves_a_stopped_instance(lima: Lima) -> None:
    result = lima.run("--tty=false", "create", "--name", "vm", "-", input=minimal_yaml(),
                      env={"FAKE_LIMACTL_FAIL_CREATE": "failed to download the image"})
    assert result.returncode == 1 and fatal(result.stderr) == "failed to download the image"
    assert lima.one()["status"] == "Stopped"


def test_injected_list_failures(lima: Lima) -> None:
    lima.create()
    malformed = lima.ok("list", "--json", env={"FAKE_LIMACTL_LIST_MALFORMED": "1"})
    first, *rest = malformed.stdout.splitlines()
    with pytest.raises(json.JSONDecodeError):
        json.loads(first)
    assert [json.loads(line)["name"] for line in rest] == ["vm"]
    failed = lima.run("list", "--json", env={"FAKE_LIMACTL_LIST_FAIL": "permission denied"})
    assert (failed.returncode, failed.stdout, fatal(failed.stderr)) == (1, "", "permission denied")


def test_injected_shell_failure(running: Lima) -> None:
    result = running.run("shell", "vm", "true", env={"FAKE_LIMACTL_FAIL_SHELL": "ssh broke"})
    assert result.returncode == 1 and fatal(result.stderr) == "ssh broke"
    unreachable = running.run("shell", "vm", "true", env={"FAKE_LIMACTL_SHELL_SSH_FAIL": "1"})
    assert unreachable.returncode == 255 and "Connection refused" in unreachable.stderr


# ---------------------------------------------------------------------------------------------
# port forwarding (hostagent.py) and the ssh that reaches a guest (ssh.py)
# ---------------------------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forward_events(lima: Lima, name: str = "vm") -> list[dict[str, Any]]:
    lines = (lima.inst_dir(name) / "ha.stdout.log").read_text().splitlines()
    return [json.loads(line)["status"]["portForward"] for line in lines if '"portForward"' in line]


def ha_log(lima: Lima, name: str = "vm") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (lima.inst_dir(name) / "ha.stderr.log").read_text().splitlines()]


def listen(lima: Lima, name: str, *addrs: str) -> None:
    fake_limactl.set_guest_listeners(lima.lima_home, name, list(addrs))


def test_guest_listeners_are_forwarded_to_the_same_port_on_host_localhost(running: Lima) -> None:
    first = (running.inst_dir() / "ha.stdout.log").read_text().splitlines()
    assert len(first) == 1
    event = json.loads(first[0])
    assert set(event) == {"time", "status"}
    assert event["status"] == {"running": True, "sshLocalPort": running.one()["sshLocalPort"]}
    a, b = free_port(), free_port()
    listen(running, "vm", f"127.0.0.1:{a}", f"0.0.0.0:{b}")
    assert forward_events(running) == [
        {"type": "forwarding", "protocol": "tcp", "guestAddr": f"127.0.0.1:{a}", "hostAddr": f"127.0.0.1:{a}"},
        {"type": "forwarding", "protocol": "tcp", "guestAddr": f"0.0.0.0:{b}", "hostAddr": f"127.0.0.1:{b}"},
    ]
    logged = ha_log(running)
    assert [(e["level"], e["msg"]) for e in logged] == [
        ("info", f"Forwarding TCP from 127.0.0.1:{a} to 127.0.0.1:{a}"),
        ("info", f"Forwarding TCP from 0.0.0.0:{b} to 127.0.0.1:{b}"),
    ]
    assert list(logged[0]) == ["level", "msg", "time"]  # logrus's JSON formatter: keys sorted
    listen(running, "vm", f"0.0.0.0:{b}")
    assert forward_events(running)[-1] == {"type": "stopping", "protocol": "tcp", "guestAddr": f"127.0.0.1:{a}",
                                           "hostAddr": f"127.0.0.1:{a}"}
    running.ok("stop", "vm")
    running.ok("--tty=false", "start", "vm")
    assert forward_events(running) == [] and ha_log(running) == []  # recreated at every start


def test_port_forward_rules_first_match_wins(lima: Lima) -> None:
    p1, h1, p2, h2, p3, p4, p5, h5a, h5b = (free_port() for _ in range(9))
    lima.create(yaml_text=minimal_yaml(
        f"portForwards:\n"
        f"- guestPort: {p1}\n  hostPort: {h1}\n"
        f"- guestPortRange: [{p2}, {p2}]\n  hostPortRange: [{h2}, {h2}]\n"
        f"- guestPort: {p3}\n  ignore: true\n"
        f"- guestIP: 0.0.0.0\n  guestPort: {p4}\n  ignore: true\n"
        f"- guestPort: {p5}\n  hostPort: {h5a}\n"
        f"- guestPort: {p5}\n  hostPort: {h5b}\n"))
    lima.ok("--tty=false", "start", "vm")
    listen(lima, "vm", f"127.0.0.1:{p1}", f"[::1]:{p2}", f"127.0.0.1:{p3}", f"0.0.0.0:{p3}",
           f"0.0.0.0:{p4}", f"127.0.0.1:{p4}", f"127.0.0.1:{p5}", "0.0.0.0:22")
    assert [(e["type"], e["guestAddr"], e.get("hostAddr")) for e in forward_events(lima)] == [
        ("forwarding", f"127.0.0.1:{p1}", f"127.0.0.1:{h1}"),
        ("forwarding", f"[::1]:{p2}", f"127.0.0.1:{h2}"),  # ::1 matches a 127.0.0.1 rule
        ("not-forwarding", f"127.0.0.1:{p3}", None),
        # an ignore rule for 127.0.0.1 is skipped by a listener on 0.0.0.0, which the catch-all forwards
        ("forwarding", f"0.0.0.0:{p3}", f"127.0.0.1:{p3}"),
        # guestIP 0.0.0.0 alone means guestIPMustBeZero: only a listener on 0.0.0.0 is ignored
        ("not-forwarding", f"0.0.0.0:{p4}", None),
        ("forwarding", f"127.0.0.1:{p4}", f"127.0.0.1:{p4}"),
        ("forwarding", f"127.0.0.1:{p5}", f"127.0.0.1:{h5a}"),
        ("not-forwarding", "0.0.0.0:22", None),  # the guest's sshd is never forwarded
    ]
    assert ("info", f"Not forwarding TCP 127.0.0.1:{p3}") in [(e["level"], e["msg"]) for e in ha_log(lima)]


def test_ignoring_both_guest_ips_turns_forwarding_off_silently(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("portForwards:\n- guestIP: 0.0.0.0\n  proto: any\n  ignore: true\n"
                                       "- guestIP: 127.0.0.1\n  proto: any\n  ignore: true\n"))
    lima.ok("--tty=false", "start", "vm")
    listen(lima, "vm", f"127.0.0.1:{free_port()}", f"0.0.0.0:{free_port()}")
    assert forward_events(lima) == [] and ha_log(lima) == []


def test_a_host_port_that_is_taken_is_only_a_warning(lima: Lima) -> None:
    import socket

    for name in ("vm", "vm2"):
        lima.create(name)
        lima.ok("--tty=false", "start", name)
    shared, busy = free_port(), free_port()
    listen(lima, "vm", f"127.0.0.1:{shared}")
    listen(lima, "vm2", f"0.0.0.0:{shared}")
    with socket.socket() as program:
        program.bind(("127.0.0.1", busy))
        program.listen(1)
        listen(lima, "vm2", f"0.0.0.0:{shared}", f"127.0.0.1:{busy}")
    # Lima emits the forwarding event and logs the forward before it tries to listen.
    assert [e["type"] for e in forward_events(lima, "vm2")] == ["forwarding", "forwarding"]
    warnings = [e for e in ha_log(lima, "vm2") if e["level"] == "warning"]
    assert warnings == [
        {"error": f"listen tcp 127.0.0.1:{shared}: bind: address already in use", "level": "warning",
         "msg": f"failed to listen tcp: 127.0.0.1:{shared}", "time": warnings[0]["time"]},
        {"error": f"listen tcp 127.0.0.1:{busy}: bind: address already in use", "level": "warning",
         "msg": f"failed to listen tcp: 127.0.0.1:{busy}", "time": warnings[1]["time"]},
    ]
    assert [e["level"] for e in ha_log(lima, "vm")] == ["info"]  # the first one holds it
    # Once vm stops, its host ports are free: vm2's next listener there is forwarded.
    lima.ok("stop", "vm")
    listen(lima, "vm2")
    listen(lima, "vm2", f"0.0.0.0:{shared}")
    assert len([e for e in ha_log(lima, "vm2") if e["level"] == "warning"]) == 2


def ssh_forward(lima: Lima, *extra: str, name: str = "vm") -> list[str]:
    return ["ssh", "-F", str(lima.inst_dir(name) / "ssh.config"), "-N", *extra, f"lima-{name}"]


def connect_when_up(port: int, payload: bytes, seconds: float = 20) -> bytes:
    import socket

    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(payload)
                return conn.recv(100)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_ssh_forwards_a_local_port_into_the_guest_until_the_vm_stops(running: Lima) -> None:
    server, guest_port = echo_server()
    host_port = free_port()
    spec = f"127.0.0.1:{host_port}:127.0.0.1:{guest_port}"
    child = subprocess.Popen(ssh_forward(running, "-o", "ExitOnForwardFailure=yes", "-L", spec),
                             env=running.env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert connect_when_up(host_port, b"hi") == b"echo:hi"
        running.ok("stop", "vm")
        assert child.wait(timeout=20) == 255
        assert child.stderr is not None and child.stderr.read() == b"Connection to 127.0.0.1 closed by remote host.\r\n"
    finally:
        child.kill()
        server.close()
    assert fake_limactl.read_ssh_calls(running.lima_home)[0]["argv"][-1] == "lima-vm"


def test_ssh_forward_to_a_taken_host_port_fails_with_exit_on_forward_failure(running: Lima) -> None:
    import socket

    with socket.socket() as program:
        program.bind(("127.0.0.1", 0))
        program.listen(1)
        taken = program.getsockname()[1]
        result = subprocess.run(ssh_forward(running, "-o", "ExitOnForwardFailure=yes", "-L",
                                            f"127.0.0.1:{taken}:127.0.0.1:80"),
                                env=running.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert result.returncode == 255
    assert result.stderr.decode() == (f"bind [127.0.0.1]:{taken}: Address already in use\r\n"
                                      f"channel_setup_fwd_listener_tcpip: cannot listen to port: {taken}\r\n"
                                      "Could not request local forwarding.\r\n")


def test_ssh_to_a_stopped_vm_is_refused(lima: Lima) -> None:
    lima.create()
    lima.ok("--tty=false", "start", "vm")
    port = lima.one()["sshLocalPort"]
    lima.ok("stop", "vm")
    result = subprocess.run(ssh_forward(lima, "-L", f"127.0.0.1:{free_port()}:127.0.0.1:80"), env=lima.env,
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert (result.returncode, result.stderr.decode()) == (
        255, f"ssh: connect to host 127.0.0.1 port {port}: Connection refused\r\n")
