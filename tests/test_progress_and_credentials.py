"""Progress display modes and the credential staging rules, without a VM."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from agentbox import credentials
from agentbox.progress import Progress, phase_of
from tests.conftest import write


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_one_live_line_with_spinner_elapsed_and_phase() -> None:
    stream = FakeTerminal()
    with Progress("Starting VM agentbox-x", stream=stream) as progress:
        progress.feed('time="x" level=info msg="[hostagent] Waiting for the essential requirement 1 of 2: `ssh`"')
        import time

        time.sleep(0.35)
    out = stream.getvalue()
    assert "\r\033[K" in out
    assert "Starting VM agentbox-x [0s] waiting for ssh" in out
    assert out.rstrip().endswith("Starting VM agentbox-x: done (0s)")
    assert out.count("\n") == 1  # the live line is rewritten in place; only the final line ends a line


def test_plain_output_prints_each_phase_once() -> None:
    stream = io.StringIO()
    with Progress("Creating VM agentbox-x", stream=stream) as progress:
        for line in ("Attempting to download the image", "Downloading the image (1/3)", "READY. Run `limactl shell x`"):
            progress.feed(line)
    assert stream.getvalue().splitlines() == [
        "Creating VM agentbox-x...",
        "  Creating VM agentbox-x: downloading the image",
        "  Creating VM agentbox-x: ready",
        "Creating VM agentbox-x: done (0s)",
    ]


def test_verbose_streams_every_line() -> None:
    stream = FakeTerminal()
    with Progress("Stopping VM x", verbose=True, stream=stream) as progress:
        progress.feed("some limactl line")
    assert "  some limactl line" in stream.getvalue()
    assert phase_of("unrelated") is None


def test_kiro_macos_path_lands_in_the_linux_location() -> None:
    assert credentials.guest_path_for("~/Library/Application Support/kiro-cli/data.sqlite3") == (
        "~/.local/share/kiro-cli/data.sqlite3"
    )
    assert credentials.guest_path_for("~/.codex/auth.json") == "~/.codex/auth.json"


def test_staging_copies_only_listed_files_privately_and_reports_problems(home: Path, tmp_path: Path) -> None:
    write(home / ".codex" / "auth.json", '{"a": 1}', mode=0o644)
    write(home / ".codex" / "other-secret.json", "{}")
    (home / ".gemini" / "oauth_creds.json").mkdir(parents=True)  # a folder where a file belongs
    staging = tmp_path / "staging"
    staged, warnings = credentials.refresh(
        staging, ["~/.codex/auth.json", "~/.gemini/oauth_creds.json", "~/.missing/file"], include_git_identity=False
    )
    assert [s.guest_path for s in staged] == [".codex/auth.json"]
    assert warnings == [f"credential {home / '.gemini' / 'oauth_creds.json'} is a folder, not a file; skipped"]
    files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    assert files == ["creds/gitconfig.stamp", "creds/home/.codex/auth.json", "creds/manifest", "creds/stamps.json"]
    target = staging / "creds" / "home" / ".codex" / "auth.json"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    # A file dropped from the list is removed from the staging folder at the next launch.
    credentials.refresh(staging, [], include_git_identity=False)
    assert not target.exists()
    assert os.path.getsize(staging / "creds" / "manifest") == 0
