"""A live session's end checkpoint, taken after its launch returned (agentbox.session.checkpointing.end_later).

Run as `python -m agentbox.session.endcheckpoint SPEC` with no terminal and no pipe of the launch's: SPEC (JSON)
names the workspace, the session, the settings, the files the start checkpoint already named, and the file
descriptor of the checkpoints' end lock, which the launch took and this process holds until the checkpoint is
recorded (readers wait for it: agentbox.review.checkpoints.settle). What it would have printed (files left out
for their size, a failure, with -v its id) goes to the workspace's end notes, said by the next command that
reads checkpoints.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.fsutil import atomic_write
from agentbox.review import checkpoints
from agentbox.safetext import visible
from agentbox.session import endreport
from agentbox.session.checkpointing import SessionCheckpoints


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    checkpoints.hold_end(str(spec["lockName"]))
    workspace = Path(spec["workspace"])
    said = io.StringIO()
    taken = None
    sys.stderr = said  # agentbox.progress prints on sys.stderr: what it says is kept for the next command
    try:
        settings = CheckpointSettings(enabled=True, keep=int(spec["keep"]), max_file_size=int(spec["maxFileSize"]))
        points = SessionCheckpoints.resumed(settings, workspace, str(spec["agent"]), str(spec["session"]),
                                            bool(spec["verbose"]))
        taken = points.end_now(already_named=set(spec["named"]))
    except BaseException as exc:  # said like any failure of the end checkpoint, never lost
        said.write(f"agentbox: warning: the end checkpoint was not taken: {type(exc).__name__}: "
                   f"{visible(str(exc))}\n")
    finally:
        sys.stderr = sys.__stderr__
        _report(spec, workspace, taken, said)  # before the lock goes: a reader after it finds the report
        text = said.getvalue()
        if text:
            notes = checkpoints.end_notes(workspace)
            try:
                earlier = notes.read_text(errors="replace")
            except OSError:
                earlier = ""
            atomic_write(notes, earlier + text, mode=0o600)
        checkpoints.release_end_lock(workspace, str(spec["lockName"]), int(spec["lock"]))  # readers go on
    return 0


def _report(spec: dict[str, Any], workspace: Path, taken: checkpoints.Taken | None, said: io.StringIO) -> None:
    """The end checkpoint's half of the session's report (agentbox.session.endreport): its id, the files changed."""
    try:
        files = endreport.between(workspace, str(spec["startTree"]), taken.checkpoint.tree) \
            if taken is not None and spec.get("startTree") else None
        endreport.end_taken(str(spec["session"]), {"end": taken.checkpoint.id if taken else None, "files": files})
    except Exception as exc:  # said like the checkpoint's own failures, by the next command
        said.write(f"agentbox: warning: the session's report was not written: {visible(str(exc))}\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
