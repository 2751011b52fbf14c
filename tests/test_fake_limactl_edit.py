"""The limactl double's edit flags (tests/fake_limactl/editflags.py, yqsubset.py, cmd_edit.py) must
behave as Lima v2.2's (cmd/limactl/editflags/editflags.go, edit.go, clone.go, start.go, restart.go;
README.md in the double's folder lists the facts): each flag's effect on lima.yaml, Lima's fixed
order, the yq subset of --set and its loud refusals, validation with ./lima.REJECTED.yaml, the
disk-shrink check, clone with edit flags, edit on stopped and running instances."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import test_fake_limactl
from tests.test_fake_limactl import Lima, fatal, log_lines, minimal_yaml

lima = test_fake_limactl.lima  # the fixtures of the double's own tests

PARAM_YAML = minimal_yaml("param:\n  FOO: base\nprovision:\n- mode: system\n  script: echo {{.Param.FOO}}\n")


def lima_yaml(lima: Lima, name: str = "vm") -> dict[str, Any]:
    return yaml.safe_load((lima.inst_dir(name) / "lima.yaml").read_text())


def edit(lima: Lima, *args: str, name: str = "vm", cwd: Path | None = None) -> Any:
    return lima.run("--tty=false", "edit", name, *args, cwd=cwd)


def scratch(lima: Lima, name: str) -> Path:
    d = lima.root / name
    d.mkdir(exist_ok=True)
    return d


def mounts_of(lima: Lima, name: str = "vm") -> list[tuple[str, bool]]:
    return [(m["location"], m.get("writable", False)) for m in lima_yaml(lima, name).get("mounts") or []]


# ---------------------------------------------------------------------------------------------
# each flag's effect
# ---------------------------------------------------------------------------------------------

def test_resources_are_edited_in_place_and_listed(lima: Lima) -> None:
    lima.create()
    result = edit(lima, "--cpus", "3", "--memory", "1.5", "--disk", "120")
    assert result.returncode == 0, result.stderr
    assert ("info", "Instance `vm` configuration edited") in log_lines(result.stderr)
    y = lima_yaml(lima)
    assert (y["cpus"], y["memory"], y["disk"]) == (3, "1.5GiB", "120GiB")
    listed = lima.one()
    assert (listed["cpus"], listed["memory"], listed["disk"]) == (3, 1536 * 1024 ** 2, 120 * 1024 ** 3)
    assert listed["config"]["memory"] == "1.5GiB"


@pytest.mark.parametrize("given, written", [("2", "2GiB"), ("0.25", "0.25GiB"), ("16.0", "16GiB"),
                                            ("3.3", "3.3GiB"), ("100000", "100000GiB")])
def test_memory_is_written_as_go_prints_a_float32(lima: Lima, given: str, written: str) -> None:
    lima.ok("--tty=false", "create", "--name", "vm", "--memory", given, "-", input=minimal_yaml())
    assert lima_yaml(lima)["memory"] == written


@pytest.mark.parametrize("args, message", [
    (["--cpus", "x"], 'invalid argument "x" for "--cpus" flag: strconv.ParseInt: parsing "x": invalid syntax'),
    (["--cpus", "-1"], "error while processing flag `cpus`: invalid value for number of cpus, must be >= 0"),
    (["--memory", "lots"], 'invalid argument "lots" for "--memory" flag: strconv.ParseFloat: parsing "lots": '
                           "invalid syntax"),
    (["--disk", "1e40"], 'invalid argument "1e40" for "--disk" flag: strconv.ParseFloat: parsing "1e40": '
                         "value out of range"),
    (["--mount", "/a", "--mount-only", "/b"], "error while processing flag `mount`: flag `--mount` conflicts "
                                              "with `--mount-only`"),
    (["--mount-none", "--mount-only", "/b"], "error while processing flag `mount-none`: flag `--mount-none` "
                                             "conflicts with `mount-only`"),
    (["--mount", "~nobody/x"], "error while processing flag `mount`: unexpandable path `~nobody/x`"),
    (["--param", "FOO"], "error while processing flag `param`: invalid parameter `FOO`, expected NAME=VALUE"),
    (["--param", "NOPE=1"], "error while processing flag `param`: template does not define param `NOPE`"),
    (["--arch", "aarch64"], "unknown flag: --arch"),
    (["--dns", "1.1.1.1"], "fake limactl: flag --dns of `limactl edit` is not implemented by the test double"),
])
def test_bad_edit_flags_are_fatal_and_change_nothing(lima: Lima, args: list[str], message: str) -> None:
    lima.create(yaml_text=PARAM_YAML)
    before = (lima.inst_dir() / "lima.yaml").read_bytes()
    result = edit(lima, *args)
    assert result.returncode == 1
    assert fatal(result.stderr) == message
    assert (lima.inst_dir() / "lima.yaml").read_bytes() == before


def test_mounts_are_comma_split_reversed_and_prepended(lima: Lima) -> None:
    work = scratch(lima, "work")
    for d in ("a", "b", "c", "d"):
        (work / d).mkdir()
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {work}/d\n"))
    result = edit(lima, "--mount", "a:w,b", "--mount", f"{work}/c", cwd=work)
    assert result.returncode == 0, result.stderr
    assert mounts_of(lima) == [(f"{work}/c", False), (f"{work}/b", False), (f"{work}/a", True),
                               (f"{work}/d", False)]
    y = lima_yaml(lima)
    assert y["mounts"][0]["mountPoint"] == f"{work}/c"


def test_mount_tilde_is_the_host_home(lima: Lima) -> None:
    (lima.home / "proj").mkdir()
    lima.create()
    assert edit(lima, "--mount", "~/proj:w").returncode == 0
    assert mounts_of(lima) == [(f"{lima.home}/proj", True)]


def test_mount_only_none_and_writable(lima: Lima) -> None:
    work = scratch(lima, "work2")
    (work / "x").mkdir()
    (work / "y").mkdir()
    lima.create(yaml_text=minimal_yaml(f"mounts:\n- location: {work}/x\n"))
    assert edit(lima, "--mount-only", f"{work}/y").returncode == 0
    assert mounts_of(lima) == [(f"{work}/y", False)]
    assert edit(lima, "--mount", f"{work}/x", "--mount-writable").returncode == 0
    assert mounts_of(lima) == [(f"{work}/x", True), (f"{work}/y", True)]
    assert edit(lima, "--mount-none").returncode == 0
    y = lima_yaml(lima)
    assert "mounts" in y and y["mounts"] is None
    assert "mounts" not in lima.one()["config"]


def test_mount_type_vm_type_and_the_simple_flags(lima: Lima) -> None:
    lima.create()
    result = edit(lima, "--mount-type", "reverse-sshfs", "--vm-type", "qemu", "--mount-inotify", "--nested-virt",
                  "--video", "--ssh-port", "60123", "--shell", "/bin/zsh")
    assert result.returncode == 0, result.stderr
    assert ("warning", "`--mount-inotify` is experimental") in log_lines(result.stderr)
    y = lima_yaml(lima)
    assert (y["mountType"], y["vmType"], y["mountInotify"], y["nestedVirtualization"]) == (
        "reverse-sshfs", "qemu", True, True)
    assert (y["video"], y["ssh"], y["user"]) == ({"display": "default"}, {"localPort": 60123}, {"shell": "/bin/zsh"})
    assert lima.one()["config"]["mountType"] == "reverse-sshfs"


def test_arch_is_for_new_instances_only(lima: Lima) -> None:
    lima.ok("--tty=false", "create", "--name", "vm", "--arch", "aarch64", "-", input=minimal_yaml())
    assert lima_yaml(lima)["arch"] == "aarch64"
    result = lima.run("--tty=false", "start", "vm", "--arch", "x86_64", "--cpus", "2")
    assert ("warning", "`--arch` is not applicable to an existing instance (Hint: create a new instance with "
                       "`limactl create --arch=x86_64 --name=NAME`)") in log_lines(result.stderr)
    y = lima_yaml(lima)
    assert (y["arch"], y["cpus"]) == ("aarch64", 2)


def test_param_sets_a_defined_param(lima: Lima) -> None:
    lima.create(yaml_text=PARAM_YAML)
    assert edit(lima, "--param", "FOO=a=b c").returncode == 0
    assert lima_yaml(lima)["param"] == {"FOO": "a=b c"}
    assert lima.one()["config"]["provision"][0]["script"] == "echo a=b c"


def test_param_on_create_checks_the_template(lima: Lima) -> None:
    result = lima.run("--tty=false", "create", "--name", "vm", "--param", "BAR=1", "-", input=PARAM_YAML)
    assert fatal(result.stderr) == "error while processing flag `param`: template does not define param `BAR`"
    assert not lima.inst_dir().exists()
    lima.ok("--tty=false", "create", "--name", "vm", "--param", "FOO=new", "-", input=PARAM_YAML)
    assert lima_yaml(lima)["param"] == {"FOO": "new"}


# ---------------------------------------------------------------------------------------------
# order
# ---------------------------------------------------------------------------------------------

def test_flags_apply_in_limas_order_not_the_command_lines(lima: Lima) -> None:
    lima.create()
    # cpus, memory before --set; --set before --disk; --mount before --set.
    result = edit(lima, "--set", '.cpus = 7 | .memory = "3GiB" | .disk = "300GiB" | .mounts = []',
                  "--disk", "200", "--memory", "1", "--cpus", "2", "--mount", str(lima.root))
    assert result.returncode == 0, result.stderr
    y = lima_yaml(lima)
    assert (y["cpus"], y["memory"], y["disk"], y["mounts"]) == (7, "3GiB", "200GiB", [])


def test_several_set_flags_run_in_their_order(lima: Lima) -> None:
    lima.create()
    assert edit(lima, "--set", ".cpus = 2", "--set", ".cpus += 3").returncode == 0
    assert lima_yaml(lima)["cpus"] == 5


# ---------------------------------------------------------------------------------------------
# --set: the yq subset
# ---------------------------------------------------------------------------------------------

def test_set_subset_paths_operators_and_json_values(lima: Lima) -> None:
    work = scratch(lima, "setwork")
    lima.create(yaml_text=PARAM_YAML)
    exprs = [
        f'.mounts = [{{"location":"{work}","writable":true}}]',
        '.param.FOO = "v"',
        '.caCerts.certs += ["-----BEGIN ONE"] | .caCerts.certs += ["-----BEGIN TWO"]',
        '.env["MY-VAR"] = "x y"',
        '.provision[0].script = "echo {{.Param.FOO}} again"',
        '.images[0].arch = "x86_64"',
        '.ssh = {"localPort": 60222, "forwardAgent": false}',
    ]
    args = [a for e in exprs for a in ("--set", e)]
    result = edit(lima, *args)
    assert result.returncode == 0, result.stderr
    y = lima_yaml(lima)
    assert y["mounts"] == [{"location": str(work), "writable": True}]
    assert y["param"] == {"FOO": "v"}
    assert y["caCerts"] == {"certs": ["-----BEGIN ONE", "-----BEGIN TWO"]}
    assert y["env"] == {"MY-VAR": "x y"}
    assert y["provision"][0]["script"] == "echo {{.Param.FOO}} again"
    assert y["images"][0]["arch"] == "x86_64" and y["ssh"] == {"localPort": 60222, "forwardAgent": False}
    config = lima.one()["config"]
    assert config["provision"][0]["script"] == "echo v again"
    assert config["caCerts"]["certs"] == ["-----BEGIN ONE", "-----BEGIN TWO"]


def test_set_keeps_multi_line_scripts_and_numbers_as_written(lima: Lima) -> None:
    body = ("images:\n- location: https://example.invalid/ubuntu.img\nprovision:\n- mode: data\n  path: /etc/x\n"
            "  permissions: 0644\n  content: |\n    line one\n    line two\n")
    lima.create(yaml_text=body)
    assert edit(lima, "--cpus", "2").returncode == 0
    text = (lima.inst_dir() / "lima.yaml").read_text()
    assert "permissions: 0644\n" in text and "content: |\n    line one\n    line two\n" in text


def test_set_reads_strings_as_yq_does_not_as_json(lima: Lima) -> None:
    lima.create()
    result = edit(lima, "--set", r'.env.A = "l1\nl2\t\"q\""', "--set", r'.env.B = "a\\b"',
                  "--set", r'.env.C = "\u00e9 \/"', "--set", '.env.D = "1" + "2" | .cpus = 2')
    assert result.returncode == 0, result.stderr
    y = lima_yaml(lima)
    assert y["env"] == {"A": 'l1\nl2\t"q"', "B": "a\\b", "C": "\\u00e9 \\/", "D": "12"}
    assert y["cpus"] == 2


@pytest.mark.parametrize("expr, why", [
    (".cpus |= 2", "expected `=` or `+=` at offset 6"),
    ("del(.cpus)", "expected a path starting with `.` at offset 0"),
    ('.env.X = env(HOME)', "a value that is neither a literal nor a path at offset 9"),
    (r'.env.X = "\(.cpus)"', "string interpolation `\\(...)`"),
    ('.env = {X: "1"}', "an object key that is not a quoted string at offset 8"),
    (".images[5].arch = \"x86_64\"", "index [5] outside an existing list"),
    (".cpus = 2 | .cpus", "expected `=` or `+=` at offset 17"),
    (". = {}", "assigning to the whole document"),
    ('.env = {"A": "1"} + {"B": "2"}', "`+` of a dict and a dict"),
    ('.cpus = 2 garbage', "unexpected text at offset 10"),
])
def test_set_outside_the_subset_fails_loudly(lima: Lima, expr: str, why: str) -> None:
    lima.create()
    before = (lima.inst_dir() / "lima.yaml").read_bytes()
    result = edit(lima, "--set", expr)
    assert fatal(result.stderr) == (f"fake limactl: yq expression `{expr}` is not implemented by the test double "
                                    f"({why})")
    assert (lima.inst_dir() / "lima.yaml").read_bytes() == before


# ---------------------------------------------------------------------------------------------
# validation, lima.REJECTED.yaml, the disk
# ---------------------------------------------------------------------------------------------

def test_shrinking_the_disk_is_rejected_into_the_current_directory(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("disk: 120GiB\n"))
    before = (lima.inst_dir() / "lima.yaml").read_bytes()
    cwd = scratch(lima, "here")
    result = edit(lima, "--disk", "50", cwd=cwd)
    assert fatal(result.stderr) == ("the YAML is invalid, saved the buffer as `lima.REJECTED.yaml`: "
                                    "field `disk`: shrinking the disk (120GiB --> 50GiB) is not supported")
    assert (lima.inst_dir() / "lima.yaml").read_bytes() == before
    assert yaml.safe_load((cwd / "lima.REJECTED.yaml").read_text())["disk"] == "50GiB"
    assert not (lima.root / "lima.REJECTED.yaml").exists()
    assert edit(lima, "--disk", "150", cwd=cwd).returncode == 0
    assert lima.one()["disk"] == 150 * 1024 ** 3


def test_disk_below_the_default_is_shrinking(lima: Lima) -> None:
    lima.create()  # no disk: the default 100GiB
    result = edit(lima, "--set", '.disk = "10GiB"', cwd=scratch(lima, "d"))
    assert fatal(result.stderr).endswith("field `disk`: shrinking the disk (100GiB --> 10GiB) is not supported")


def test_an_invalid_edit_is_rejected_with_limas_message(lima: Lima) -> None:
    lima.create()
    cwd = scratch(lima, "rej")
    result = edit(lima, "--set", '.mounts = [{"location": "/etc/hostname", "mountPoint": "/etc"}]', cwd=cwd)
    assert fatal(result.stderr) == (
        "the YAML is invalid, saved the buffer as `lima.REJECTED.yaml`: field `mounts[0].location` refers to a "
        "non-directory path: `/etc/hostname`: %!w(<nil>)\nfield `mounts[0].mountPoint` must not be a system path "
        "such as /etc or /usr")
    assert yaml.safe_load((cwd / "lima.REJECTED.yaml").read_text())["mounts"][0]["mountPoint"] == "/etc"
    assert "mounts" not in lima_yaml(lima)


def test_unknown_keys_are_rejected_by_the_schema(lima: Lima) -> None:
    lima.create()
    result = edit(lima, "--set", ".cpu = 2", cwd=scratch(lima, "s"))
    assert fatal(result.stderr) == ("the YAML is invalid, saved the buffer as `lima.REJECTED.yaml`: field `cpu` is "
                                    "not a known field (unknown field \"cpu\")")


def test_rejected_yaml_that_cannot_be_saved(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("disk: 120GiB\n"))
    cwd = scratch(lima, "ro")
    (cwd / "lima.REJECTED.yaml").mkdir()
    result = edit(lima, "--disk", "1", cwd=cwd)
    assert fatal(result.stderr) == (
        "the YAML is invalid, attempted to save the buffer as `lima.REJECTED.yaml` but failed: "
        "open lima.REJECTED.yaml: is a directory\nfield `disk`: shrinking the disk (120GiB --> 1GiB) is not supported")


# ---------------------------------------------------------------------------------------------
# edit: stopped, running, missing, no flags, --start
# ---------------------------------------------------------------------------------------------

def test_edit_of_a_running_instance_is_fatal(lima: Lima) -> None:
    lima.create()
    lima.ok("--tty=false", "start", "vm")
    result = edit(lima, "--cpus", "2")
    assert fatal(result.stderr) == "cannot edit a running instance"
    assert "cpus" not in lima_yaml(lima)


def test_edit_of_a_missing_instance(lima: Lima) -> None:
    assert fatal(edit(lima, "--cpus", "2", name="nope").stderr) == "instance `nope` not found"


def test_edit_without_flags_does_nothing(lima: Lima) -> None:
    lima.create()
    before = (lima.inst_dir() / "lima.yaml").read_bytes()
    result = edit(lima)
    assert result.returncode == 0
    assert log_lines(result.stderr) == [("info", "Aborting, as requested by saving the file with empty content")]
    assert (lima.inst_dir() / "lima.yaml").read_bytes() == before


def test_edit_that_changes_nothing_aborts(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("cpus: 2\n"))
    result = edit(lima, "--cpus", "2")
    assert result.returncode == 0
    assert ("info", "Aborting, no changes made to the instance") in log_lines(result.stderr)


def test_edit_start_starts_the_edited_instance(lima: Lima) -> None:
    lima.create()
    result = edit(lima, "--cpus", "2", "--start")
    assert result.returncode == 0, result.stderr
    assert lima.one()["status"] == "Running" and lima.one()["cpus"] == 2


def test_edit_failure_injection_and_call_log(lima: Lima) -> None:
    lima.create()
    result = lima.run("--tty=false", "edit", "vm", "--cpus", "2", env={"FAKE_LIMACTL_FAIL_EDIT": "boom"})
    assert fatal(result.stderr) == "boom"
    assert "cpus" not in lima_yaml(lima)
    calls = [json.loads(line) for line in (lima.lima_home / "_fake" / "calls.jsonl").read_text().splitlines()]
    assert calls[-1]["argv"] == ["--tty=false", "edit", "vm", "--cpus", "2"] and calls[-1]["exit"] == 1


# ---------------------------------------------------------------------------------------------
# clone with edit flags
# ---------------------------------------------------------------------------------------------

def test_clone_applies_edit_flags_to_the_new_instance_only(lima: Lima) -> None:
    work = scratch(lima, "proj")
    lima.create("base", yaml_text=PARAM_YAML)
    base_dir = lima.inst_dir("base")
    (base_dir / "guestfs" / "usr-local" / "marker").write_text("provisioned\n")
    for extra in ("swtpm",):
        (base_dir / extra).mkdir()
        (base_dir / extra / "state").write_text("tpm")
    (base_dir / "vz-identifier").write_text("id")
    lima.ok("protect", "base")
    before = (base_dir / "lima.yaml").read_bytes()
    result = lima.run("--tty=false", "clone", "base", "p1", "--cpus", "2", "--memory", "3", "--disk", "150",
                      "--mount", f"{work}:w", "--param", "FOO=proj", "--set", '.caCerts.certs += ["-----BEGIN C"]')
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and [lvl for lvl, _ in log_lines(result.stderr)] == []
    assert (base_dir / "lima.yaml").read_bytes() == before
    y = lima_yaml(lima, "p1")
    assert (y["cpus"], y["memory"], y["disk"], y["param"]) == (2, "3GiB", "150GiB", {"FOO": "proj"})
    assert mounts_of(lima, "p1") == [(str(work), True)] and y["caCerts"]["certs"] == ["-----BEGIN C"]
    clone = lima.inst_dir("p1")
    assert (clone / "guestfs" / "usr-local" / "marker").read_text() == "provisioned\n"
    assert not (clone / "protected").exists() and not (clone / "swtpm").exists()
    assert (clone / "vz-identifier").read_bytes() == b""
    listed = lima.one("p1")
    assert (listed["status"], listed["cpus"], listed["disk"]) == ("Stopped", 2, 150 * 1024 ** 3)


def test_clone_param_accepts_a_param_of_default_yaml_that_the_file_then_does_not_use(lima: Lima) -> None:
    """clone checks --param against the filled params (default.yaml's too), but the load that follows
    checks that the file's own params are used in the file: an error, not a rejected YAML."""
    lima.create("base")
    (lima.lima_home / "_config").mkdir(exist_ok=True)
    (lima.lima_home / "_config" / "default.yaml").write_text(
        "param:\n  DEF: d\nprovision:\n- mode: system\n  script: echo {{.Param.DEF}}\n")
    cwd = scratch(lima, "defparam")
    result = lima.run("--tty=false", "clone", "base", "p1", "--param", "DEF=x", cwd=cwd)
    assert fatal(result.stderr) == ("field `param` key `DEF` is not used in any provision, probe, copyToHost, "
                                    "or portForward")
    assert not (cwd / "lima.REJECTED.yaml").exists()
    result = lima.run("--tty=false", "clone", "base", "p2", "--param", "UNDEFINED=x")
    assert fatal(result.stderr) == "error while processing flag `param`: template does not define param `UNDEFINED`"


def test_a_rejected_clone_edit_leaves_the_clone_behind_as_lima_does(lima: Lima) -> None:
    lima.create("base", yaml_text=minimal_yaml("disk: 120GiB\n"))
    cwd = scratch(lima, "clonecwd")
    result = lima.run("--tty=false", "clone", "base", "p1", "--disk", "20", cwd=cwd)
    assert fatal(result.stderr) == ("the YAML is invalid, saved the buffer as `lima.REJECTED.yaml`: "
                                    "field `disk`: shrinking the disk (120GiB --> 20GiB) is not supported")
    assert (cwd / "lima.REJECTED.yaml").exists()
    # cmd/limactl/clone.go copies first and edits after: the copy stays, with the source's lima.yaml.
    assert lima.one("p1")["status"] == "Stopped"
    assert lima_yaml(lima, "p1")["disk"] == "120GiB"
    result = lima.run("--tty=false", "clone", "base", "p2", "--param", "NOPE=1")
    assert fatal(result.stderr) == "error while processing flag `param`: template does not define param `NOPE`"
    assert lima.one("p2")["status"] == "Stopped"


def test_clone_start_boots_the_edited_clone(lima: Lima) -> None:
    lima.create("base")
    result = lima.run("--tty=false", "clone", "base", "p1", "--cpus", "1", "--start")
    assert result.returncode == 0, result.stderr
    assert lima.one("p1")["status"] == "Running" and lima.one("p1")["cpus"] == 1
    assert lima.one("base")["status"] == "Stopped"


def test_clone_refuses_create_only_flags(lima: Lima) -> None:
    lima.create("base")
    assert fatal(lima.run("--tty=false", "clone", "base", "p1", "--arch", "aarch64").stderr) == "unknown flag: --arch"
    assert not lima.inst_dir("p1").exists()


# ---------------------------------------------------------------------------------------------
# start and restart with edit flags on an existing instance
# ---------------------------------------------------------------------------------------------

def test_start_edits_an_existing_instance_for_good(lima: Lima) -> None:
    lima.create()
    lima.ok("--tty=false", "start", "vm", "--cpus", "2")
    assert lima_yaml(lima)["cpus"] == 2
    lima.ok("--tty=false", "stop", "vm")
    assert lima.one()["cpus"] == 2
    # start.go's applyYQExpressionToExistingInstance has no disk-shrink check
    lima.ok("--tty=false", "start", "vm", "--disk", "10")
    assert lima.one()["disk"] == 10 * 1024 ** 3


def test_start_with_a_rejected_edit(lima: Lima) -> None:
    lima.create()
    cwd = scratch(lima, "startrej")
    result = lima.run("--tty=false", "start", "vm", "--cpus", "2", "--set", '.mounts = [{"location": "rel"}]', cwd=cwd)
    assert fatal(result.stderr) == (
        "failed to apply yq expression `.cpus = 2 | .mounts = [{\"location\": \"rel\"}]` to instance `vm`: the YAML "
        "is invalid, saved the buffer as `lima.REJECTED.yaml`: field `mounts[0].location` must be an absolute path, "
        "got `rel`")
    assert (cwd / "lima.REJECTED.yaml").exists()
    assert lima.one()["status"] == "Stopped" and "cpus" not in lima_yaml(lima)


def test_restart_edits_then_restarts(lima: Lima) -> None:
    lima.create(yaml_text=minimal_yaml("disk: 120GiB\n"))
    lima.ok("--tty=false", "start", "vm")
    result = lima.run("--tty=false", "restart", "vm", "--memory", "2")
    assert result.returncode == 0, result.stderr
    assert ("info", "Instance `vm` configuration edited") in log_lines(result.stderr)
    assert lima.one()["memory"] == 2 * 1024 ** 3 and lima.one()["status"] == "Running"
    result = lima.run("--tty=false", "restart", "vm", "--disk", "100", cwd=scratch(lima, "rr"))
    assert fatal(result.stderr).endswith("shrinking the disk (120GiB --> 100GiB) is not supported")


def test_edit_writes_no_stray_files(lima: Lima) -> None:
    lima.create()
    assert edit(lima, "--cpus", "2").returncode == 0
    assert sorted(p for p in os.listdir(lima.inst_dir()) if p.startswith("lima")) == ["lima-version", "lima.yaml"]
