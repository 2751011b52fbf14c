"""Every test runs against a home, config, state and LIMA_HOME of its own, never the real ones."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

REAL_HOME = os.path.expanduser("~")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    home = tmp_path / "home"
    home.mkdir()
    state = tmp_path / "state"
    # LIMA_HOME must stay short: Lima's socket paths limit instance names by its length.
    lima_home = Path(tempfile.mkdtemp(prefix="lh", dir="/tmp"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(state))
    monkeypatch.setenv("LIMA_HOME", str(lima_home))
    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "AGENTBOX_TIMING", "NODE_EXTRA_CA_CERTS"):
        monkeypatch.delenv(name, raising=False)
    yield {"home": home, "state": state, "lima_home": lima_home}
    shutil.rmtree(lima_home, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def real_home_untouched():
    """Fail loudly if a test wrote agentbox files into the real home directory."""
    watched = [Path(REAL_HOME) / ".config" / "agentbox", Path(REAL_HOME) / ".lima"]
    before = {p: p.exists() for p in watched}
    yield
    for path, existed in before.items():
        assert path.exists() == existed, f"a test touched the real home: {path}"


@pytest.fixture
def home(isolated_env: dict[str, Path]) -> Path:
    return isolated_env["home"]


@pytest.fixture
def project(home: Path) -> Path:
    """An empty project folder (outside the home directory, as most tests want)."""
    path = home.parent / "work" / "myproject"
    path.mkdir(parents=True)
    return path


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def run_cli(*args: str, cwd: Path | None = None, input: str | None = None, **kwargs: Any) -> Result:
    """Run the real CLI in-process; errors surface as exit codes and stderr, as for users."""
    from agentbox.cli import cli

    runner = CliRunner()
    argv = (["-C", str(cwd)] if cwd else []) + list(args)
    return runner.invoke(cli, argv, input=input, catch_exceptions=False, **kwargs)
