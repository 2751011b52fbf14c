"""Attention on the host: a small watcher turns a detached session's "I need you" into a desktop notification.

In the VM, Claude Code's Notification and Stop hooks (provision/attention.sh) and the end of a session's agent
(provision/session.sh) leave an event in the outbox (outbox/sessions/events/*.event: kind, session, agent and
message, one a line; written as *.partial, then renamed) when no terminal is attached to the session (a
background task's end may leave one too: kind `task`, the task's id in the session line); attached, the
terminal's bell and title say it instead. This watcher, one per VM, started in the background by a launch that
leaves a session in the VM (`--detach`, session.keepAlive), by `agentbox attach` or by `agentbox run`, reads
those events every second, shows each with agentbox.session.notify and removes it (a task's end also moves its outputs
to the host's record at once: the watcher's process is agentbox.tasks.watcher, which knows the records). It ends
on its own once no session of the VM has been
alive for IDLE_EXIT_SEC: each running session and each waiting or running task keeps a marker in events/live
fresh (session.sh, task-runner.sh), which stops when the VM does. No daemon stays behind.

The events are written by the VM: read with size caps and no links followed; only the kind (a fixed set),
checked names and a short message made visible reach the notification.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentbox import livemarkers, paths, staginglayout, vmread
from agentbox.session import detached, notify

POLL_SEC = 1.0
IDLE_EXIT_SEC = 30
EVENT_LIMIT = 4096
PER_POLL = 5  # notifications shown per poll at most; the rest of a burst is dropped
# The watcher's program, started by name (a process, not an import): the tasks package's, so that a task's end moves
# its outputs into its record at once (session's modules cannot read the records, a layer above them).
WATCHER = "agentbox.tasks.watcher"
TaskEnded = Callable[[str, str], None]  # (VM, task id)
KINDS = ("notification", "stop", "exit", "task")  # task: a background task ended (its id in the session line)


def lock_path(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "attention.lock"


def ensure_watcher(vm_name: str) -> None:
    """Start the VM's watcher in the background unless one runs."""
    lock = lock_path(vm_name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # one runs
        fcntl.flock(handle, fcntl.LOCK_UN)
    log = paths.vm_state_dir(vm_name) / "attention.log"
    with open(log, "ab") as errors:
        subprocess.Popen(
            [sys.executable, "-m", WATCHER, vm_name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
            close_fds=True,
        )


def message(kind: str, session: str, agent: str, text: str, vm_name: str) -> tuple[str, str]:
    """The notification's title and body for one event."""
    who = agent or "the agent"
    if kind == "task":
        return f"agentbox: task {session} ended", f"{who} in {vm_name}: {text}. `agentbox logs {session}` shows it."
    where = f"session {session} in {vm_name}"
    if kind == "exit":
        return f"agentbox: {who} ended", f"{where}: {text}. `agentbox attach {session}` shows its last screen."
    if kind == "stop":
        return f"agentbox: {who} is waiting", f"{where}: {text}. `agentbox attach {session}` to answer."
    return f"agentbox: {who} needs you", f"{where}: {text}. `agentbox attach {session}` to answer."


def parse_event(data: bytes) -> tuple[str, str, str, str] | None:
    lines = data.decode(errors="replace").split("\n")
    if len(lines) < 4 or lines[0] not in KINDS or not detached.NAME_PATTERN.match(lines[1]):
        return None
    agent = lines[2] if detached.NAME_PATTERN.match(lines[2]) else ""
    return lines[0], lines[1], agent, lines[3][:300]


def poll(vm_name: str, on_task_end: TaskEnded | None = None) -> tuple[bool, bool]:
    """Show and remove the waiting events, telling `on_task_end` of each task that ended. Returns (the events
    folder could be read, a session is alive)."""
    outbox = paths.vm_outbox(vm_name)
    try:
        with vmread.folder(outbox, staginglayout.OUTBOX_SESSIONS, detached.EVENTS) as events:
            names = sorted(name for name in os.listdir(events) if name.endswith(".event"))
            shown = 0
            for name in names:
                data = vmread.read(events, name, EVENT_LIMIT)
                vmread.remove(events, name)
                event = parse_event(data) if data is not None else None
                if event is not None and event[0] == "task" and on_task_end is not None:
                    on_task_end(vm_name, event[1])
                if event is not None and shown < PER_POLL:
                    notify.notify(*message(*event, vm_name))
                    shown += 1
            return True, _alive(events)
    except OSError:
        return False, False


def _alive(events: int) -> bool:
    try:
        live = os.open("live", vmread.DIR_FLAGS, dir_fd=events)
    except OSError:
        return False
    try:
        return livemarkers.fresh_in(live)
    finally:
        os.close(live)


def watch(vm_name: str, on_task_end: TaskEnded | None = None) -> int:
    """The watcher's loop; returns when no session has been alive for IDLE_EXIT_SEC, or the VM's folder is gone."""
    lock = lock_path(vm_name)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0
        idle_since = time.monotonic()
        while True:
            _, alive = poll(vm_name, on_task_end)
            if not paths.vm_outbox(vm_name).is_dir():
                return 0
            if alive:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_SEC:
                return 0
            time.sleep(POLL_SEC)

