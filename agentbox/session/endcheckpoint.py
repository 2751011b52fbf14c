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

from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.fsutil import atomic_write
from agentbox.review import checkpoints
from agentbox.safetext import visible
from agentbox.session.checkpointing import SessionCheckpoints


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    checkpoints.hold_end(str(spec["lockName"]))
    workspace = Path(spec["workspace"])
    said = io.StringIO()
    sys.stderr = said  # agentbox.progress prints on sys.stderr: what it says is kept for the next command
    try:
        settings = CheckpointSettings(enabled=True, keep=int(spec["keep"]), max_file_size=int(spec["maxFileSize"]))
        points = SessionCheckpoints.resumed(settings, workspace, str(spec["agent"]), str(spec["session"]),
                                            bool(spec["verbose"]))
        points.end_now(already_named=set(spec["named"]))
    except BaseException as exc:  # said like any failure of the end checkpoint, never lost
        said.write(f"agentbox: warning: the end checkpoint was not taken: {type(exc).__name__}: "
                   f"{visible(str(exc))}\n")
    finally:
        sys.stderr = sys.__stderr__
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
