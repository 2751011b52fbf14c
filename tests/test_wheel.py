"""A non-editable install from a built wheel finds every file agentbox reads at run time."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        timeout=600,
    )
    return next(out.glob("agentbox_lima-*.whl"))


def test_wheel_contains_the_data_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("templates", "provision", "wrappers"):
        local = sorted(p.relative_to(REPO).as_posix() for p in (REPO / shipped).rglob("*") if p.is_file())
        assert local, f"{shipped}/ is empty"
        for path in local:
            assert f"agentbox/_data/{path}" in names
    assert "agentbox/_data/agentbox.yml.example" in names
    assert any(name.endswith("entry_points.txt") for name in names)


def test_non_editable_install_runs(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # System site-packages provide click & co. without a download; the wheel's agentbox shadows the checkout.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    outside = tmp_path / "elsewhere" / "proj"
    outside.mkdir(parents=True)
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": ""}
    where = subprocess.run(
        [str(python), "-c", "import agentbox.resources as r; print(r.data_dir())"],
        cwd=outside, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)) and where.endswith("_data")
    agentbox = venv / "bin" / "agentbox"
    version = subprocess.run([str(agentbox), "--version"], cwd=outside, env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("agentbox ")
    init = subprocess.run([str(agentbox), "init"], cwd=outside, env=env, capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    assert "onCreateScript" in (outside / "agentbox.yml").read_text()
    template = subprocess.run([str(agentbox), "template"], cwd=outside, env=env, capture_output=True, text=True)
    assert template.returncode == 0, template.stderr
    assert "agentboxWorkspace" in template.stdout
