"""What a VM's scoped pushes made (`git.allowPush: session`): the broker's record, kept on the host.

    paths.vm_state_dir(VM)/broker/pushes.jsonl   0600, one JSON line per push the broker judged:
        {"time", "updates": [{"ref", "old", "new"}], "outcome": "ok" | "refused: ..." | "failed: ..."}

The broker (agentbox.net.intercept) lets a push update a ref outside creation only when an earlier push of this VM
created it (`created()`); `agentbox status` and `net log` show what was pushed (`read()`). The VM never writes
here: the file is in the host's state folder, written by the broker process alone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentbox import paths
from agentbox.fsutil import private_dir

FILE_NAME = "pushes.jsonl"
ZERO = "0" * 40
MAX_READ = 4 << 20


def ledger_path(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "broker" / FILE_NAME


def namespace(vm_name: str) -> str:
    """The branches a VM's scoped pushes may create: refs/heads/agentbox/VM/."""
    return f"refs/heads/agentbox/{vm_name}/"


class Ledger:
    """One VM's record of its pushes (agentbox.net.broker.PushLedger)."""

    def __init__(self, vm_name: str) -> None:
        self.path = ledger_path(vm_name)

    def created(self) -> Mapping[str, str]:
        """ref -> the value this VM last pushed to it, for the refs a push of this VM created (and did not end)."""
        made: dict[str, str] = {}
        for entry in self.read():
            if entry.get("outcome") != "ok":
                continue
            for update in entry.get("updates", []):
                ref, old, new = update.get("ref"), update.get("old"), update.get("new")
                if not isinstance(ref, str) or not isinstance(new, str):
                    continue
                if old == ZERO or ref in made:
                    made[ref] = new
        return made

    def record(self, updates: Sequence[tuple[str, str, str]], outcome: str) -> None:
        private_dir(self.path.parent)
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "updates": [{"ref": ref, "old": old, "new": new} for ref, old, new in updates],
                 "outcome": outcome}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        """Every recorded push, oldest first (a line that does not parse is skipped)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_READ)
        found = []
        for line in data.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                found.append(entry)
        return found
