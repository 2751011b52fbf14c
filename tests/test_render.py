"""The rendered lima.yaml: valid against Lima's schema, meaning exactly the config, never mounting home."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers import READ_ONLY_CACHE, run_cli, write, write_trusted

SCHEMA = json.loads((Path(__file__).parent / "lima_schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
REPO = Path(__file__).resolve().parent.parent


def rendered(project: Path, *args: str) -> dict:
    result = run_cli("template", *args, cwd=project)
    assert result.exit_code == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    errors = sorted(VALIDATOR.iter_errors(data), key=str)
    assert errors == [], [e.message for e in errors]
    return data


TRICKY = [
    "plain",
    "with space",
    "quote's \"double\"",
    "hash # and: colon",
    "ünïcödé-☃",
    "{{.Home}} braces",
    "- dash [x] {y} & *star !bang %pct @at `tick`",
    "yes",
]


@pytest.mark.parametrize("folder", TRICKY)
def test_tricky_workspace_paths_render_to_valid_yaml_meaning_the_path(home: Path, folder: str) -> None:
    project = home.parent / "work" / folder
    project.mkdir(parents=True)
    data = rendered(project)
    workspace_mount = data["mounts"][0]
    assert workspace_mount == {"location": str(project), "mountPoint": str(project), "writable": True}
    assert data["param"]["agentboxWorkspace"] == str(project)


def test_config_values_reach_the_template(project: Path, home: Path) -> None:
    data_dir = home.parent / "data dir: #1"
    data_dir.mkdir()
    write(
        project / "agentbox.yml",
        f"""\
vm:
  cpus: 6
  memory: 12GiB
  disk: 50GiB
  vmType: vz
  arch: aarch64
  mountType: virtiofs
mounts:
  - location: "{data_dir}"
    mountPoint: /data
  - location: /srv/tools
    writable: true
""",
    )
    data = rendered(project)
    assert (data["cpus"], data["memory"], data["disk"]) == (6, "12GiB", "50GiB")
    assert (data["vmType"], data["arch"], data["mountType"]) == ("vz", "aarch64", "virtiofs")
    assert data["mounts"][3:] == [
        {"location": str(data_dir), "mountPoint": "/data", "writable": False, **READ_ONLY_CACHE},
        {"location": "/srv/tools", "mountPoint": "/srv/tools", "writable": True},
    ]
    staging = data["mounts"][1]
    assert staging["mountPoint"] == staging["location"] and staging["writable"] is False
    assert staging["location"].endswith("/vms/agentbox-myproject/staging")
    outbox = data["mounts"][2]  # the one folder of agentbox's the VM may write
    assert outbox["mountPoint"] == outbox["location"] and outbox["writable"] is True
    assert outbox["location"].endswith("/vms/agentbox-myproject/outbox")
    assert data["containerd"] == {"system": False, "user": False}
    assert data["ssh"]["forwardAgent"] is False
    assert data["propagateProxyEnv"] is False


def test_defaults_leave_driver_choices_to_lima(project: Path) -> None:
    data = rendered(project)
    for key in ("vmType", "arch", "mountType"):
        assert key not in data
    assert data["base"] == ["template:_images/ubuntu-24.04"]
    assert data["minimumLimaVersion"] == "2.0.0"


def test_home_is_never_mounted(project: Path, home: Path) -> None:
    data = rendered(project)
    for mount in data["mounts"]:
        location = Path(mount["location"])
        assert location != home and location not in home.parents
    for bad in (str(home), "~", "/"):
        write(project / "agentbox.yml", f"mounts:\n  - location: '{bad}'\n")
        result = run_cli("template", cwd=project)
        assert result.exit_code == 2
        assert "never mounts it" in result.stderr


def test_git_worktree_mounts_the_common_git_dir(home: Path) -> None:
    repo = home.parent / "work" / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    tree = home.parent / "work" / "tree"
    subprocess.run([*git, "-C", str(repo), "worktree", "add", "-q", str(tree)], check=True)
    data = rendered(tree)
    locations = [m["location"] for m in data["mounts"]]
    assert locations[0] == str(tree)
    assert str(repo / ".git") in locations


def test_vm_lima_is_deep_merged(project: Path) -> None:
    write(project / "agentbox.yml", "vm:\n  lima:\n    ssh:\n      localPort: 60123\n    timezone: UTC\n")
    data = rendered(project)
    assert data["ssh"] == {"forwardAgent": False, "loadDotSSHPubKeys": False, "localPort": 60123}
    assert data["timezone"] == "UTC"


def test_user_template_gets_the_same_context(project: Path) -> None:
    write(
        project / "my.yaml.j2",
        "images:\n- location: https://example.invalid/img.qcow2\n  arch: x86_64\ncpus: {{ cpus | yaml }}\n"
        "mounts:\n{% for m in mounts %}- location: {{ m.location | yaml }}\n  writable: {{ m.writable | yaml }}\n{% endfor %}",
    )
    write_trusted(project, "vm:\n  cpus: 3\n  template: my.yaml.j2\n")
    data = rendered(project)
    assert data["cpus"] == 3
    assert data["mounts"][0] == {"location": str(project), "writable": True}


def test_user_template_errors_are_config_errors(project: Path) -> None:
    write(project / "bad.j2", "cpus: {{ nope }}\n")
    write_trusted(project, "vm:\n  template: bad.j2\n")
    result = run_cli("template", cwd=project)
    assert result.exit_code == 2
    assert "vm.template" in result.stderr and "nope" in result.stderr


def test_shipped_scripts_have_no_go_template_braces() -> None:
    """Lima evaluates {{...}} in provisioning scripts; ours must mean what they say."""
    for path in (REPO / "provision").rglob("*"):
        assert path.is_dir() or "{{" not in path.read_text(), path


@pytest.mark.needs("shellcheck")
def test_shell_scripts_pass_shellcheck() -> None:
    """As `make lint` runs it: launch.sh's parts (provision/launch) each on its own, and -x so launch.sh is
    checked with the parts it sources (an option a part reads is not "unused")."""
    scripts = sorted(str(p) for p in (REPO / "provision").glob("*.sh")) + sorted(str(p) for p in (REPO / "wrappers").iterdir())
    parts = sorted(str(p) for p in (REPO / "provision" / "launch").glob("*.sh"))
    assert len(scripts) > 10 and len(parts) > 5
    result = subprocess.run(["shellcheck", "-x", "--severity=style", *scripts, *parts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


TEMPLATE_PAYLOADS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ self._TemplateReference__context }}",
    "{{ mounts[0].__class__.__init__ }}",
    "{{ '{0.__class__.__base__}'.format(cpus) }}",
    "{% set x = [] %}{{ x.append(1) }}",
    "{{ namespace.__init__.__globals__ }}",
]


@pytest.mark.parametrize("payload", TEMPLATE_PAYLOADS)
def test_template_code_cannot_reach_python(project: Path, payload: str) -> None:
    marker = project / "MARKER"
    write(project / "evil.j2", f"cpus: 1\n# line two\n{payload.replace('MARKER', str(marker))}\n")
    write_trusted(project, "vm:\n  template: evil.j2\n")
    result = run_cli("template", cwd=project)
    assert result.exit_code == 2, result.stdout
    assert f"{project / 'evil.j2'}:3:" in result.stderr
    assert not marker.exists()
    assert result.stdout == ""


def test_untrusted_template_is_never_rendered(project: Path) -> None:
    marker = project / "MARKER"
    write(project / "t.j2", "cpus: {{ cpus }}\n{{ 'x' * 3 }}\n")
    write(project / "agentbox.yml", "vm:\n  template: t.j2\n")
    result = run_cli("template", cwd=project)
    assert result.exit_code == 2
    assert "not trusted" in result.stderr and "renders nothing" in result.stderr
    assert "xxx" not in result.output and not marker.exists()


def test_trusted_template_edited_afterwards_is_not_rendered(project: Path, limactl) -> None:
    write(project / "t.j2", (REPO / "templates" / "lima.yaml.j2").read_text())
    write_trusted(project, "vm:\n  template: t.j2\n")
    assert run_cli("template", cwd=project).exit_code == 0
    write(project / "t.j2", "cpus: {{ 7 * 6 }}\n")  # as the agent would, through the workspace mount
    for args in (["template"], ["start"]):
        result = run_cli(*args, cwd=project)
        assert result.exit_code == 2
        assert "42" not in result.output
    assert "vm.template" in result.stderr and "t.j2 changed" in result.stderr
    assert limactl.calls() == []


def test_mounts_of_agentbox_state_or_lima_home_are_refused(project: Path, isolated_env) -> None:
    state, lima_home = isolated_env["state"], isolated_env["lima_home"]
    (state / "trust").mkdir(parents=True)
    for bad in (state, state / "trust", lima_home, lima_home.parent, state.parent):
        write(project / "agentbox.yml", f"mounts:\n  - location: {bad}\n")
        result = run_cli("template", cwd=project)
        assert result.exit_code == 2, bad
        assert "never mounts it" in result.stderr, result.stderr


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_vm_image_renders_one_images_entry_for_the_vm_arch_and_no_base(project: Path) -> None:
    for name in ("debian.qcow2", "boot/vmlinuz", "boot/initrd.img"):
        write(project / name, "x")
    write_trusted(project, "vm:\n  arch: aarch64\n  image:\n    location: debian.qcow2\n"
                  f"    digest: {DIGEST}\n    kernel:\n      location: boot/vmlinuz\n"
                  "      cmdline: root=/dev/vda console=ttyS0\n    initrd: {location: ./boot/../boot/initrd.img}\n")
    data = rendered(project)
    assert "base" not in data
    assert data["images"] == [{
        "location": str(project / "debian.qcow2"), "arch": "aarch64", "digest": DIGEST,
        "kernel": {"location": str(project / "boot" / "vmlinuz"), "arch": "aarch64",
                   "cmdline": "root=/dev/vda console=ttyS0"},
        "initrd": {"location": str(project / "boot" / "initrd.img"), "arch": "aarch64"},
    }]


def test_vm_image_url_from_the_global_config_is_rendered_for_the_hosts_arch(project: Path, home: Path) -> None:
    import platform

    url = "https://mirror.example.com/ubuntu/noble-server-cloudimg.img"
    write(home / ".config" / "agentbox" / "config.yml", f"vm:\n  image: {url}\n")
    data = rendered(project)
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    assert data["images"] == [{"location": url, "arch": arch}] and "base" not in data
    write(home / ".config" / "agentbox" / "config.yml", "vm:\n  cpus: 2\n")  # the control: Ubuntu's template
    assert rendered(project)["base"] == ["template:_images/ubuntu-24.04"]


def test_a_missing_image_file_is_refused_before_lima_is_asked(project: Path, limactl) -> None:
    write_trusted(project, "vm:\n  image: {location: debian.qcow2, kernel: {location: vmlinuz}}\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(
        f"agentbox: error: vm.image: {project / 'debian.qcow2'} is not a file on this machine (missing)\n")
    assert "create" not in limactl.subcommands()
    write(project / "debian.qcow2", "x")
    assert run_cli("trust", cwd=project).exit_code == 0  # the pin was of a missing file
    result = run_cli("start", cwd=project)
    assert f"vm.image.kernel: {project / 'vmlinuz'} is not a file on this machine (missing)" in result.stderr
    assert "create" not in limactl.subcommands()
    write(project / "vmlinuz", "x")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = run_cli("start", cwd=project)  # the control: with both files there, Lima (the double) creates it
    assert result.exit_code == 0, result.stderr
    created = yaml.safe_load(limactl.lima_yaml("agentbox-myproject"))
    assert created["images"][0]["kernel"]["location"] == str(project / "vmlinuz") and "base" not in created
