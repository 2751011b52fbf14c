"""The markers a running session or a waiting or running task keeps fresh in the VM's outbox.

provision/session.sh and task-runner.sh touch `outbox/sessions/events/live/NAME` every 20 seconds while the
session or task lasts and remove it at its end; a VM that stops leaves them to go stale. The host's attention
watcher and network proxy (agentbox.session.attention, agentbox.net.guard) stay while one is fresh. The folder is the
VM's to write: it is read without following links, and only the markers' times count.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentbox import paths, vmread

STALE_SEC = 90  # a marker older than this belongs to a session that ended with its VM
PARTS = ("sessions", "events", "live")  # contract.OUTBOX_SESSIONS, sessions.EVENTS, then this folder


def folder(vm_name: str) -> Path:
    return paths.vm_outbox(vm_name).joinpath(*PARTS)


def any_fresh(vm_name: str) -> bool:
    """Whether a session or task of the VM keeps its marker fresh."""
    try:
        with vmread.folder(paths.vm_outbox(vm_name), *PARTS) as live:
            return fresh_in(live)
    except OSError:
        return False


def fresh_in(live: int) -> bool:
    now = time.time()
    for name in os.listdir(live):
        try:
            if now - os.stat(name, dir_fd=live, follow_symlinks=False).st_mtime < STALE_SEC:
                return True
        except OSError:
            continue
    return False
