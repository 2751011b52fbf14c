"""Progress display modes and the credential staging rules, without a VM."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from agentbox import credentials
from agentbox.progress import Progress, fit, phase_of
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
    assert out.endswith("\r\033[KStarting VM agentbox-x: done (0s)\n")
    assert out.count("\n") == 1  # the live line is rewritten in place; only the final line ends a line


def test_phases_only_move_forward() -> None:
    stream = FakeTerminal()
    with Progress("Starting VM agentbox-x", stream=stream) as progress:
        seen = []
        for message in (
            "Starting the instance `x` with internal VM driver `qemu`",
            "[hostagent] Waiting for the essential requirement 1 of 1: `ssh`",
            "[hostagent] Waiting for the optional requirement 1 of 1: `agentbox provisioning to finish`",
            "[hostagent] The essential requirement 1 of 1 is satisfied",  # a late line of an earlier stage
            "READY. Run `limactl shell x` to open the shell.",
            "Starting the instance `x`",
        ):
            progress.feed(f'level=info msg="{message}"')
            seen.append(progress.phase)
    assert seen == [
        "booting", "waiting for ssh", "waiting for provisioning", "waiting for provisioning", "ready", "ready"
    ]


def test_plain_output_is_one_line_per_step() -> None:
    stream = io.StringIO()
    with Progress("Creating VM agentbox-x", stream=stream) as progress:
        for line in ("Attempting to download the image", "Downloading the image (1/3)", "READY. Run `limactl shell x`"):
            progress.feed(line)
    assert stream.getvalue() == "Creating VM agentbox-x: done (0s)\n"


def test_fit_keeps_the_end_and_marks_the_cut() -> None:
    assert fit("Starting VM agentbox-x", " [3s] booting", 80) == "Starting VM agentbox-x [3s] booting"
    assert fit("Starting VM agentbox-a-long-name", " [3s] booting", 30) == "Starting VM agen… [3s] booting"
    assert len(fit("Starting VM agentbox-a-long-name", " [3s] waiting for provisioning", 20)) == 20


def test_verbose_streams_every_line() -> None:
    stream = FakeTerminal()
    with Progress("Stopping VM x", verbose=True, stream=stream) as progress:
        progress.feed("some limactl line \x1b[31m")
    assert "  some limactl line \\x1b[31m" in stream.getvalue()
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
