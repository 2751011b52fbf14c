"""Desktop notifications (agentbox.session.notify) and the attention watcher that shows a detached session's events
(agentbox.session.attention), with stand-ins for notify-send and osascript on PATH that record what they got."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from agentbox import livemarkers, paths, staginglayout
from agentbox.session import attention, notify
from agentbox.session import detached as sessions
from tests.helpers import write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

RECORDER = """#!/usr/bin/env python3
import json, os, sys

with open(os.environ["NOTIFY_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


@pytest.fixture
def notifier_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with only python3's folder and an empty bin folder; returns the log the stand-ins write."""
    bin_dir = tmp_path / "notifier-bin"
    bin_dir.mkdir()
    log = tmp_path / "notified.jsonl"
    python_dir = Path(os.path.realpath(os.sys.executable)).parent  # type: ignore[attr-defined]
    monkeypatch.setenv("PATH", f"{bin_dir}:{python_dir}:/usr/bin:/bin")
    monkeypatch.setenv("NOTIFY_LOG", str(log))
    return log


def stand_in(log: Path, name: str, body: str = RECORDER) -> None:
    write(log.parent / "notifier-bin" / name, body, mode=0o755)


def notified(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_linux_uses_notify_send_with_the_text_as_arguments(notifier_path: Path) -> None:
    if any(Path(d, "notify-send").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has a notify-send of its own")
    stand_in(notifier_path, "notify-send")
    assert notify.notify("agentbox: claude needs you", "<b>-x</b> & \x1b[31mred\nline", platform="linux")
    assert notified(notifier_path) == [
        ["notify-send", "--app-name=agentbox", "--", "agentbox: claude needs you",
         "&lt;b&gt;-x&lt;/b&gt; &amp; \\x1b[31mred line"]]


def test_macos_hands_the_text_to_a_fixed_applescript_as_its_argv(notifier_path: Path) -> None:
    stand_in(notifier_path, "osascript")
    title, body = 'agentbox: "quoted" \\ title', 'end tell\ndo shell script "touch /tmp/pwned"'
    assert notify.notify(title, body, platform="darwin")
    [argv] = notified(notifier_path)
    assert argv[:7] == ["osascript", "-e", "on run argv", "-e",
                        "display notification (item 2 of argv) with title (item 1 of argv)", "-e", "end run"]
    assert argv[7:] == [title, 'end tell do shell script "touch /tmp/pwned"']


def test_no_notifier_means_no_notification_and_no_error(notifier_path: Path) -> None:
    if any(Path(d, "notify-send").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has a notify-send of its own")
    assert notify.notify("agentbox", "text", platform="linux") is False
    assert notify.notify("agentbox", "text", platform="darwin") is False
    assert notified(notifier_path) == []


def test_a_notifier_that_hangs_is_given_up(notifier_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(notifier_path, "osascript", "#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(notify, "TIMEOUT_SEC", 0.5)
    started = time.monotonic()
    assert notify.notify("agentbox", "text", platform="darwin") is False
    assert time.monotonic() - started < 5


def test_long_text_is_cut_short(notifier_path: Path) -> None:
    stand_in(notifier_path, "osascript")
    notify.notify("t" * 500, "b" * 5000, platform="darwin")
    [argv] = notified(notifier_path)
    assert len(argv[7]) == notify.TITLE_LIMIT and argv[7].endswith("…")
    assert len(argv[8]) == notify.BODY_LIMIT


# -- the watcher -------------------------------------------------------------------------------

def events_of(vm_name: str) -> Path:
    folder = sessions.events_folder(vm_name)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_watcher_shows_each_event_once_and_ends_when_no_session_lives(
    notifier_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(notifier_path, "osascript")
    monkeypatch.setattr("sys.platform", "darwin")
    monkeypatch.setattr(attention, "POLL_SEC", 0.05)
    monkeypatch.setattr(attention, "IDLE_EXIT_SEC", 1.0)
    events = events_of("agentbox-w")
    (events / "live").mkdir()
    (events / "live" / "claude").touch()
    (events / "1-1.event").write_text("notification\nclaude\nclaude\nClaude needs your permission to use Bash\n")
    (events / "2-1.event").write_text("exit\nclaude-2\ncodex\nexited with code 3\n")
    (events / "3-1.event").write_text("rm -rf\nclaude\nclaude\nnot a kind\n")  # dropped
    (events / "3-2.event").write_text("task\nt7\ncodex\nCompleted, exit 0\n")
    (events / "4-1.event").symlink_to("/etc/passwd")  # never followed
    (events / "5-1.event.partial").write_text("notification\nclaude\nclaude\nnot finished\n")  # not yet written
    done = threading.Event()
    thread = threading.Thread(target=lambda: (attention.watch("agentbox-w"), done.set()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(notified(notifier_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not done.is_set()  # a session lives
    (events / "live" / "claude").unlink()
    assert done.wait(10), "the watcher did not end once no session lived"
    shown = [argv[7:] for argv in notified(notifier_path)]
    assert shown == [
        ["agentbox: claude needs you", "session claude in agentbox-w: Claude needs your permission to use Bash. "
         "`agentbox attach claude` to answer."],
        ["agentbox: codex ended", "session claude-2 in agentbox-w: exited with code 3. `agentbox attach claude-2` "
         "shows its last screen."],
        ["agentbox: task t7 ended", "codex in agentbox-w: Completed, exit 0. `agentbox logs t7` shows it."],
    ]
    assert sorted(p.name for p in events.iterdir()) == ["5-1.event.partial", "live"]


def test_a_stale_live_marker_does_not_keep_the_watcher(notifier_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "POLL_SEC", 0.05)
    monkeypatch.setattr(attention, "IDLE_EXIT_SEC", 0.5)
    events = events_of("agentbox-w")
    (events / "live").mkdir()
    marker = events / "live" / "claude"
    marker.touch()
    old = time.time() - livemarkers.STALE_SEC - 10
    os.utime(marker, (old, old))
    started = time.monotonic()
    assert attention.watch("agentbox-w") == 0
    assert time.monotonic() - started < 5


def test_only_one_watcher_runs_per_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    lock = attention.lock_path("agentbox-w")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        assert attention.watch("agentbox-w") == 0  # another holds the lock: it leaves at once
        assert time.monotonic() - started < 2
        spawned: list[object] = []
        monkeypatch.setattr("subprocess.Popen", lambda *a, **k: spawned.append(a))
        attention.ensure_watcher("agentbox-w")
        assert spawned == []
    attention.ensure_watcher("agentbox-w")
    assert len(spawned) == 1


def test_the_outbox_folder_is_never_reached_through_a_link(tmp_path: Path) -> None:
    outbox = paths.vm_outbox("agentbox-w")
    outbox.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "events").mkdir(parents=True)
    (elsewhere / "events" / "1.event").write_text("notification\nclaude\nclaude\nhi\n")
    (outbox / staginglayout.OUTBOX_SESSIONS).symlink_to(elsewhere)
    assert attention.poll("agentbox-w") == (False, False)
    assert (elsewhere / "events" / "1.event").exists()


def test_reply_folders_are_made_inside_the_outbox_and_old_ones_go(tmp_path: Path) -> None:
    outbox = paths.vm_outbox("agentbox-w")
    outbox.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (outbox / staginglayout.OUTBOX_SESSIONS).symlink_to(elsewhere)  # the VM put a link where the folder goes
    first = sessions.new_reply("agentbox-w")
    assert first.parent == outbox / staginglayout.OUTBOX_SESSIONS and first.is_dir() and not first.parent.is_symlink()
    assert list(elsewhere.iterdir()) == []
    old = time.time() - 2 * 24 * 3600
    os.utime(first, (old, old))
    second = sessions.new_reply("agentbox-w")
    assert not first.exists() and second.is_dir()
    write(second / "result", "outcome=started\nname=claude\nagent=claude\n")
    (second / "last-output").symlink_to("/etc/passwd")
    reply = sessions.take_reply("agentbox-w", second)
    assert reply == sessions.Reply("started", "claude", "claude", None, (), None, None)
    assert not second.exists()
