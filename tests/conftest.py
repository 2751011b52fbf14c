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


def write_trusted(project: Path, text: str) -> Path:
    """Write the project's agentbox.yml and trust it, as a user who read it would."""
    path = write(project / "agentbox.yml", text)
    result = run_cli("trust", cwd=project)
    assert result.exit_code == 0, result.stderr
    return path


def run_cli(*args: str, cwd: Path | None = None, input: str | None = None, **kwargs: Any) -> Result:
    """Run the real CLI in-process; errors surface as exit codes and stderr, as for users."""
    from agentbox.cli import cli

    runner = CliRunner()
    argv = (["-C", str(cwd)] if cwd else []) + list(args)
    return runner.invoke(cli, argv, input=input, catch_exceptions=False, **kwargs)


@pytest.fixture
def limactl(isolated_env: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> "FakeLima":
    """The limactl test double, first on PATH, with its state in this test's LIMA_HOME."""
    from tests import fake_limactl

    bin_dir = tmp_path / "bin"
    fake_limactl.install(bin_dir, isolated_env["lima_home"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in list(os.environ):
        if name.startswith("FAKE_LIMACTL_"):
            monkeypatch.delenv(name)
    return FakeLima(isolated_env["lima_home"])


class FakeLima:
    def __init__(self, lima_home: Path) -> None:
        self.home = lima_home

    def calls(self) -> list[list[str]]:
        from tests import fake_limactl

        return [call["argv"] for call in fake_limactl.read_calls(self.home)]

    def subcommands(self) -> list[str]:
        """The limactl sub-command of each call, global flags skipped."""
        result = []
        for argv in self.calls():
            words = [a for a in argv if not a.startswith("-")]
            result.append(words[0] if words else "")
        return result

    def clear(self) -> None:
        from tests import fake_limactl

        fake_limactl.clear_calls(self.home)

    def status(self, name: str) -> str | None:
        from tests import fake_limactl

        try:
            return fake_limactl.read_state(self.home, name)["status"]
        except FileNotFoundError:
            return None

    def set_status(self, name: str, status: str) -> None:
        from tests import fake_limactl

        fake_limactl.set_status(self.home, name, status)

    def lima_yaml(self, name: str) -> str:
        return (self.home / name / "lima.yaml").read_text()

    def guest_home(self, name: str) -> Path:
        from tests import fake_limactl

        return fake_limactl.guest_home(self.home, name)


def needs_bwrap() -> None:
    """Skip without bubblewrap, except in CI, where a missing bwrap is a failure."""
    if shutil.which("bwrap"):
        return
    if os.environ.get("CI"):
        pytest.fail("bubblewrap is required in CI (.ci/run installs it)")
    pytest.skip("bubblewrap is not installed")
