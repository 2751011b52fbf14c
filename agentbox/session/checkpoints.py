"""The checkpoints a launch takes: one before the session starts, one after it ends.

The start checkpoint runs in a thread begun before the VM's state is looked up, so it overlaps
`limactl list` (and a boot, when there is one) and is joined before `limactl shell`: a warm launch
pays only for what is left of it, and makes no limactl call for it. A checkpoint never stops a
launch: when one fails, agentbox warns once with the reason and the session goes on.

What the user sees: nothing, normally. `-v` shows the checkpoint's id in one line; files left out
for their size are named in a warning (escaped: the agent writes file names); a workspace that is
not a git repository gets one note, the first time only (remembered in its state folder).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from agentbox import paths, timing
from agentbox.config.load import Config
from agentbox.errors import AgentboxError
from agentbox.git import store as hostgit
from agentbox.progress import note, warn
from agentbox.review import checkpoints
from agentbox.safetext import visible

MAX_NAMED = 5
TIME_LIMIT = 30  # seconds a launch gives each checkpoint (a FIFO the agent plants can make git wait forever)
NOT_A_REPOSITORY_MARK = "checkpoints-not-a-repository"
NO_GIT_MARK = "checkpoints-no-git"


class SessionCheckpoints:
    """start() before anything else of the launch, wait_for_start() before the shell, end() after it."""

    def __init__(self, config: Config, workspace: Path, agent: str, verbose: bool) -> None:
        self.settings = config.checkpoints
        self.workspace = workspace
        self.agent = agent
        self.verbose = verbose
        self.session = checkpoints.new_session()
        self._thread: threading.Thread | None = None
        self._start: checkpoints.Taken | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if not self.settings.enabled:
            return
        self._thread = threading.Thread(target=self._take_start, name="agentbox-checkpoint", daemon=True)
        self._thread.start()

    def wait_for_start(self) -> None:
        """Join the start checkpoint and say what there is to say about it (once)."""
        if self._thread is None:
            return
        with timing.phase("start checkpoint (not overlapped)"):
            self._thread.join()
        self._thread = None
        if self._error is not None:
            self._report_failure("start", self._error)
        elif self._start is not None:
            self._report(self._start, already_named=set(), kind="start")

    @property
    def taken(self) -> checkpoints.Taken | None:
        """The start checkpoint, once wait_for_start() has returned (None: none was taken)."""
        return self._start

    def end(self) -> None:
        """The end checkpoint, when the start one was taken."""
        if self._start is None:
            return
        with timing.phase("end checkpoint"):
            try:
                with hostgit.time_limit(TIME_LIMIT):
                    taken = checkpoints.take(self.workspace, "end", self.settings, agent=self.agent,
                                             session=self.session)
            except AgentboxError as exc:
                self._report_failure("end", exc)
                return
        self._report(taken, already_named={path for path, _ in self._start.checkpoint.skipped}, kind="end")

    # -- in the thread ------------------------------------------------------------------------------
    def _take_start(self) -> None:
        try:
            with hostgit.time_limit(TIME_LIMIT):
                self._start = checkpoints.take(self.workspace, "start", self.settings, agent=self.agent,
                                               session=self.session)
        except BaseException as exc:  # reported by the main thread, which decides what it means
            self._error = exc

    # -- what the user sees -------------------------------------------------------------------------
    def _report(self, taken: checkpoints.Taken, already_named: set[str], kind: str) -> None:
        checkpoint = taken.checkpoint
        same = "" if checkpoint.kind == kind and not checkpoint.uses else f", the workspace as in {checkpoint.label}"
        _forget(self.workspace, NOT_A_REPOSITORY_MARK)
        _forget(self.workspace, NO_GIT_MARK)
        fresh = [(path, size) for path, size in checkpoint.skipped if path not in already_named]
        if fresh:
            names = ", ".join(f"{visible(path)} ({size_text(size)})" for path, size in fresh[:MAX_NAMED])
            more = f" and {len(fresh) - MAX_NAMED} more" if len(fresh) > MAX_NAMED else ""
            warn(f"checkpoint {checkpoint.label} ({kind}{same}) left out {len(fresh)} file"
                 f"{'s' if len(fresh) != 1 else ''} larger than {size_text(self.settings.max_file_size)} "
                 f"(checkpoints.maxFileSize): {names}{more}; `agentbox undo` cannot bring back their content")
        elif self.verbose:
            note(f"checkpoint {checkpoint.label} ({kind}{same}) of {self.workspace}: {checkpoint.commit[:12]}")
        if self.verbose:
            for text in taken.notes:
                note(f"checkpoint {checkpoint.label}: {text}")

    def _report_failure(self, which: str, error: BaseException) -> None:
        if isinstance(error, checkpoints.NotARepository):
            if _first_time(self.workspace, NOT_A_REPOSITORY_MARK):
                note(f"{error.message} (said once)")
            return
        if isinstance(error, hostgit.GitMissing):
            if _first_time(self.workspace, NO_GIT_MARK):
                note("checkpoints are off: git is not installed on this computer (said once)")
            return
        if isinstance(error, AgentboxError):
            warn(f"the {which} checkpoint was not taken, the session goes on without it: {error.message}")
            return
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error
        warn(f"the {which} checkpoint was not taken, the session goes on without it: "
             f"{type(error).__name__}: {visible(str(error))}")


def _first_time(workspace: Path, mark: str) -> bool:
    """True once per workspace: leaves a mark in its state folder."""
    path = paths.workspace_state_dir(Path(os.path.realpath(workspace))) / mark
    if path.exists():
        return False
    try:
        from agentbox.fsutil import private_dir

        private_dir(path.parent)
        path.touch()
    except OSError:
        pass
    return True


def _forget(workspace: Path, mark: str) -> None:
    path = paths.workspace_state_dir(Path(os.path.realpath(workspace))) / mark
    if os.path.lexists(path):
        os.unlink(path)


def size_text(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"
