"""Progress display modes and the credential staging rules, without a VM."""

from __future__ import annotations

import io
import os
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentbox import progress
from agentbox.credentials import loginfiles as credentials
from agentbox.progress import Progress, fit, phase_of
from agentbox.session.staging import stage_credentials
from tests.helpers import write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)


class FakeTerminal(io.StringIO):
    """A terminal to write to; wait_for() returns as soon as a text has appeared (no fixed sleeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.changed:
            written = super().write(text)
            self.changed.notify_all()
            return written

    def wait_for(self, text: str, timeout: float = 10) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: text in self.getvalue(), timeout), self.getvalue()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The clock progress reads elapsed time from; tests move it forward by hand."""
    fake = SimpleNamespace(now=1000.0)
    fake.monotonic = lambda: fake.now
    monkeypatch.setattr(progress, "time", fake)
    return fake


def test_terminal_gets_one_live_line_with_spinner_elapsed_and_phase(clock: SimpleNamespace) -> None:
    stream = FakeTerminal()
    with Progress("Starting VM agentbox-x", stream=stream) as live:
        stream.wait_for("Starting VM agentbox-x [0s]\r")  # no phase word before limactl names one
        live.feed('time="x" level=info msg="[hostagent] Waiting for the essential requirement 1 of 2: `ssh`"')
        stream.wait_for("Starting VM agentbox-x [0s] waiting for ssh")
        clock.now += 7.2
        stream.wait_for("Starting VM agentbox-x [7s] waiting for ssh")
        clock.now += 5
    out = stream.getvalue()
    assert out.startswith("\r\033[K")
    assert out.endswith("\r\033[KStarting VM agentbox-x: done (12s)\n")
    assert out.count("\n") == 1  # the live line is rewritten in place; only the final line ends a line


def test_phases_only_move_forward() -> None:
    stream = FakeTerminal()
    with Progress("Starting VM agentbox-x", stream=stream) as live:
        seen = []
        for message in (
            "Starting the instance `x` with internal VM driver `qemu`",
            "[hostagent] Waiting for the essential requirement 1 of 1: `ssh`",
            "[hostagent] Waiting for the optional requirement 1 of 1: `agentbox provisioning to finish`",
            "[hostagent] The essential requirement 1 of 1 is satisfied",  # a late line of an earlier stage
            "READY. Run `limactl shell x` to open the shell.",
            "Starting the instance `x`",
        ):
            live.feed(f'level=info msg="{message}"')
            seen.append(live.phase)
    assert seen == [
        "booting", "waiting for ssh", "waiting for provisioning", "waiting for provisioning", "ready", "ready"
    ]


def test_plain_output_is_one_line_per_step(clock: SimpleNamespace) -> None:
    stream = io.StringIO()
    with Progress("Creating VM agentbox-x", stream=stream) as plain:
        for line in ("Attempting to download the image", "Downloading the image (1/3)", "READY. Run `limactl shell x`"):
            plain.feed(line)
        clock.now += 42
    assert stream.getvalue() == "Creating VM agentbox-x: done (42s)\n"


def test_a_step_inside_another_ends_on_its_own_line_and_the_outer_one_last(clock: SimpleNamespace) -> None:
    plain = io.StringIO()
    with Progress("Starting VM agentbox-x", stream=plain):
        clock.now += 1
        with Progress("Applying cpus to VM agentbox-x", stream=plain):
            clock.now += 2
        clock.now += 3
    assert plain.getvalue().splitlines() == [
        "Starting VM agentbox-x:", "Applying cpus to VM agentbox-x: done (2s)", "Starting VM agentbox-x: done (6s)"]
    stream = FakeTerminal()
    with Progress("Starting VM agentbox-x", stream=stream):
        stream.wait_for("Starting VM agentbox-x [0s]")
        with Progress("Applying cpus to VM agentbox-x", stream=stream):
            stream.wait_for("Applying cpus to VM agentbox-x [0s]")
            mark = len(stream.getvalue())
            stream.wait_for("\r\033[K⠙ Applying")  # the spinner turns: the outer step would have drawn by now
            assert "Starting VM" not in stream.getvalue()[mark:]
        stream.wait_for("Applying cpus to VM agentbox-x: done (0s)\n")
        mark = len(stream.getvalue())
        stream.wait_for("Starting VM agentbox-x [0s]")  # the outer step has the line again
    lines = [line.rsplit("\r\033[K", 1)[-1] for line in stream.getvalue().split("\n")]
    assert lines == ["Applying cpus to VM agentbox-x: done (0s)", "Starting VM agentbox-x: done (0s)", ""]


def test_fit_keeps_the_end_and_marks_the_cut() -> None:
    assert fit("Starting VM agentbox-x", " [3s] booting", 80) == "Starting VM agentbox-x [3s] booting"
    assert fit("Starting VM agentbox-a-long-name", " [3s] booting", 30) == "Starting VM agen… [3s] booting"
    assert len(fit("Starting VM agentbox-a-long-name", " [3s] waiting for provisioning", 20)) == 20


def test_verbose_streams_every_line() -> None:
    stream = FakeTerminal()
    with Progress("Stopping VM x", verbose=True, stream=stream) as verbose:
        verbose.feed("some limactl line \x1b[31m")
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
    staged, warnings = stage_credentials(
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
    stage_credentials(staging, [], include_git_identity=False)
    assert not target.exists()
    assert os.path.getsize(staging / "creds" / "manifest") == 0
