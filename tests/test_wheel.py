"""The wheel, installed WITH its dependencies into a clean virtual environment, is a working agentbox.

The environment has no system site-packages and never sees this checkout (no PYTHONPATH, run from
elsewhere), so a dependency missing from pyproject.toml or a runtime file missing from the wheel
fails here instead of on a user's machine. Dependencies come from the configured package index
(or pip's cache and local wheel folders), as for a user's `pip install`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from agentbox import __version__
from tests import fake_limactl
from tests.helpers import needs_bwrap

REPO = Path(__file__).resolve().parent.parent
# What agentbox reads at run time, as shipped in the wheel (pyproject.toml force-include).
RUNTIME = ("templates", "provision", "wrappers", "agentbox.yml.example")


def runtime_files() -> list[str]:
    files = []
    for shipped in RUNTIME:
        root = REPO / shipped
        found = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        assert found, f"{shipped} is empty in the checkout"
        files += [p.relative_to(REPO).as_posix() for p in found]
    return files


def third_party_imports() -> set[str]:
    """Top-level names of every module agentbox imports that is neither stdlib nor agentbox itself."""
    names = set()
    for source in (REPO / "agentbox").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != "agentbox"
            and sys.version_info < ONLY_BEFORE.get(name, (99,))}


# Imported only on Pythons whose standard library lacks it (the marker in pyproject.toml says so too).
ONLY_BEFORE = {"tomli": (3, 11)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True, timeout=600,
    )
    return next(out.glob("agentbox_lima-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no --system-site-packages) with the wheel and what it declares it needs."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        env=clean_env(venv.parent), capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return venv


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without anything that would let the checkout or its packages in."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")
           and not k.startswith(("AGENTBOX_", "XDG_", "FAKE_LIMACTL_"))}
    env.update(HOME=str(home), PYTHONNOUSERSITE="1", **extra)
    return env


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A project folder far from the checkout, so nothing can be found relative to it."""
    folder = tmp_path / "elsewhere" / "proj"
    folder.mkdir(parents=True)
    return folder


def run(venv: Path, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)


def test_wheel_contains_every_runtime_file_as_in_the_checkout(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for path in runtime_files():
            assert f"agentbox/_data/{path}" in names, path
            assert archive.read(f"agentbox/_data/{path}") == (REPO / path).read_bytes(), path
        modules = {p.relative_to(REPO).as_posix() for p in (REPO / "agentbox").rglob("*.py")}
        assert modules <= names, sorted(modules - names)
        schema = "agentbox/schemas/context.schema.json"  # context.SCHEMA_FILE, beside the modules
        assert archive.read(schema) == (REPO / schema).read_bytes()
        entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
        assert "agentbox = agentbox.cli.main:main" in archive.read(entry_points).decode()


def test_every_imported_package_is_a_declared_dependency(venv: Path, outside: Path) -> None:
    # The clean venv holds only the wheel and its declared dependencies: an import missing from
    # pyproject.toml fails here, wherever in agentbox it hides (sh is only imported to start a VM).
    modules = sorted(third_party_imports())
    assert {"click", "yaml", "jinja2", "platformdirs", "sh", "tomli_w"} <= set(modules)
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(name, importlib.import_module(name).__file__)\n"
    )
    result = run(venv, [str(venv / "bin" / "python"), "-c", code, "agentbox", *modules], outside,
                 clean_env(outside.parent))
    assert result.returncode == 0, result.stderr
    where = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert sorted(where) == sorted(["agentbox", *modules])
    for name, file in where.items():
        assert file.startswith(str(venv) + os.sep), f"{name} was imported from {file}, not from the venv"


def test_installed_agentbox_answers_renders_and_inits(venv: Path, outside: Path) -> None:
    agentbox = str(venv / "bin" / "agentbox")
    env = clean_env(outside.parent)

    version = run(venv, [agentbox, "--version"], outside, env)
    assert (version.returncode, version.stdout) == (0, f"agentbox {__version__}\n"), version.stderr

    template = run(venv, [agentbox, "template"], outside, env)
    assert template.returncode == 0, template.stderr
    rendered = yaml.safe_load(template.stdout)
    assert rendered["param"]["agentboxWorkspace"] == str(outside)
    scripts = [entry["script"] for entry in rendered["provision"] if "script" in entry]
    for name in ("10-base-packages.sh", "50-user-setup.sh"):  # the shipped scripts, from the wheel
        assert any((REPO / "provision" / name).read_text() in script for script in scripts), name

    init = run(venv, [agentbox, "init"], outside, env)
    assert init.returncode == 0, init.stderr
    assert (outside / "agentbox.yml").read_bytes() == (REPO / "agentbox.yml.example").read_bytes()


def test_installed_agentbox_starts_a_vm_and_installs_its_guards(venv: Path, outside: Path, tmp_path: Path) -> None:
    """A cold start and a launch from the wheel: sh drives limactl, launch.sh and the wrappers reach the VM."""
    import shutil
    import tempfile

    needs_bwrap()
    lima_home = Path(tempfile.mkdtemp(prefix="lh", dir="/tmp"))  # short: Lima's socket paths
    try:
        bin_dir = tmp_path / "bin"
        fake_limactl.install(bin_dir, lima_home)
        env = clean_env(outside.parent, LIMA_HOME=str(lima_home), AGENTBOX_STATE_DIR=str(tmp_path / "state"),
                        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        agentbox = str(venv / "bin" / "agentbox")
        started = run(venv, [agentbox, "start"], outside, env)
        assert started.returncode == 0, started.stderr
        assert fake_limactl.read_state(lima_home, "agentbox-proj")["status"] == "Running"

        launched = run(venv, [agentbox, "shell", "--", "sh", "-c", "command -v git"], outside, env)
        assert launched.returncode == 0, launched.stderr
        guest_bin = fake_limactl.guest_home(lima_home, "agentbox-proj") / ".local" / "bin"
        assert launched.stdout.strip().endswith("/.local/bin/git")
        for guard in ("git", "gh"):
            assert (guest_bin / guard).read_bytes() == (REPO / "wrappers" / guard).read_bytes(), guard
    finally:
        shutil.rmtree(lima_home, ignore_errors=True)
