"""Host tools come from PATH's absolute entries outside the workspace, never from a file the workspace put there
(agentbox.hosttools)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agentbox import hosttools, paths, staginglayout
from tests.helpers import NAME, FakeLima, run_agentbox, write

IMPOSTOR = '#!/bin/sh\necho "$0" >> "{marker}"\nexec {real} "$@"\n'


def impostors(folder: Path, marker: Path) -> None:
    """A `git` and a `limactl` in folder that note their use in marker, then run the real ones (so a launch works)."""
    real_git, real_limactl = shutil.which("git"), shutil.which("limactl")
    assert real_git and real_limactl
    write(folder / "git", IMPOSTOR.format(marker=marker, real=real_git), mode=0o755)
    write(folder / "limactl", IMPOSTOR.format(marker=marker, real=real_limactl), mode=0o755)


def launch(project: Path, first: str) -> tuple[int, str]:
    env = {**os.environ, "PATH": f"{first}{os.pathsep}{os.environ['PATH']}"}
    result = run_agentbox("shell", "--", "true", cwd=project, timeout=120, env=env)
    return result.returncode, result.stderr


@pytest.fixture
def setup(project: Path, vm: FakeLima, home: Path, tmp_path: Path) -> Path:
    write(home / ".gitconfig", "[user]\n\tname = Ada\n")  # the launch asks host git for the identity
    marker = tmp_path / "impostors-ran"
    impostors(project, marker)
    impostors(project / "tools", marker)
    impostors(tmp_path / "outside", marker)
    return marker


# An empty entry and `.` are the folder agentbox runs in, `tools` is relative to it, and the last is an absolute
# entry inside the workspace (the VM writes there).
@pytest.mark.parametrize("first", ["", ".", "tools", "./tools", "WORKSPACE/tools"])
def test_tools_in_the_workspace_never_run_on_the_host(project: Path, setup: Path, vm: FakeLima, first: str) -> None:
    code, stderr = launch(project, first.replace("WORKSPACE", str(project)))
    assert code == 0, stderr
    assert not setup.exists(), setup.read_text()
    assert vm.subcommands()[-1] == "shell"  # the double itself ran the launch
    assert (paths.staging_dir(NAME) / staginglayout.GIT_IDENTITY).read_text() == "[user]\n\tname = \"Ada\"\n"  # real git answered


def test_control_the_same_tools_at_an_absolute_entry_outside_are_used(project: Path, setup: Path, tmp_path: Path,
                                                                     vm: FakeLima) -> None:
    code, stderr = launch(project, str(tmp_path / "outside"))
    assert code == 0, stderr
    used = setup.read_text().splitlines()
    assert str(tmp_path / "outside" / "limactl") in used and str(tmp_path / "outside" / "git") in used


def test_limactl_only_in_a_skipped_entry_is_explained(project: Path, limactl: FakeLima, tmp_path: Path) -> None:
    write(project / "agentbox.yml", "")
    impostors(project, tmp_path / "marker")
    env = {**os.environ, "PATH": f".{os.pathsep}{os.path.dirname(shutil.which('git') or '/usr/bin/git')}"}
    result = run_agentbox("status", cwd=project, env=env)
    assert result.returncode != 0
    assert "limactl was not found on PATH" in result.stderr
    assert "PATH has ./limactl, in a folder agentbox does not run host tools from" in result.stderr
    assert not (tmp_path / "marker").exists()


def test_search_path_keeps_only_absolute_entries_outside_distrusted_folders(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosttools, "_distrusted", set())
    workspace = tmp_path / "ws"
    (workspace / "bin").mkdir(parents=True)
    (tmp_path / "link").symlink_to(workspace / "bin")
    (tmp_path / "wsx").mkdir()
    hosttools.distrust(workspace)
    entries = ["", ".", "bin", "../x", "/usr/bin", str(workspace), str(workspace / "bin"), str(tmp_path / "link"),
               str(tmp_path / "wsx"), ""]
    assert hosttools.search_path(os.pathsep.join(entries)).split(os.pathsep) == ["/usr/bin", str(tmp_path / "wsx")]
    assert hosttools.environ({"PATH": ":.:/usr/bin"})["PATH"] == "/usr/bin"
    assert hosttools.which("./git") is None and hosttools.which("tools/git") is None
