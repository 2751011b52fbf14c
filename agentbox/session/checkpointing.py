"""The checkpoints a launch takes: one before the session starts, one after it ends.

The start checkpoint runs in a thread begun before the VM's state is looked up, so it overlaps
`limactl list`, the staging and `limactl shell` itself: launch.sh does its setup meanwhile and starts the
program only once the host has recorded it (or given up on it), which it learns from this launch's "go"
marker in the staging folder, `go/TOKEN` (launch.sh --go TOKEN; provision/launch/checkpoint.sh). The
marker's first line is the checkpoint's id (empty when none was taken), which the program gets as
AGENTBOX_CHECKPOINT: a per-launch value kept out of the staged description. An isolated session still
waits for it on the host (it is the base of the agent's copy). The end checkpoint of a session, live or
isolated, is taken after the launch returned, by a process of its own (agentbox.session.endcheckpoint), while
every reader of checkpoints waits for it (agentbox.review.checkpoints.settle). A checkpoint never stops a
launch: when one fails, agentbox warns once with the reason and the session goes on.

What the user sees: nothing, normally. `-v` shows the checkpoint's id in one line; files left out
for their size are named in a warning (escaped: the agent writes file names); a workspace that is
not a git repository gets one note, the first time only (remembered in its state folder).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import hosttools, paths, sizes, staginglayout, timing
from agentbox.errors import AgentboxError
from agentbox.fsutil import atomic_write, pid_alive, private_dir
from agentbox.git import store
from agentbox.progress import note, warn
from agentbox.review import checkpoints, scope
from agentbox.safetext import visible

if TYPE_CHECKING:
    from agentbox.config.checkpointkeys import CheckpointSettings
    from agentbox.config.load import Config

MAX_NAMED = 5
TIME_LIMIT = 30  # seconds a launch gives each checkpoint (a FIFO the agent plants can make git wait forever)
NOT_A_REPOSITORY_MARK = "checkpoints-not-a-repository"
NO_GIT_MARK = "checkpoints-no-git"


class SessionCheckpoints:
    """start() before anything else of the launch, go_options() for launch.sh, wait_for_start() when the start
    checkpoint is needed on the host, end() after the shell, done() last.

    `go_folder`: the staging folder's go/, where the go marker tells launch.sh the start checkpoint is recorded.
    """

    def __init__(self, config: Config, workspace: Path, agent: str, verbose: bool,
                 go_folder: Path | None = None, made_in: Path | None = None) -> None:
        self.settings = config.checkpoints
        self.workspace = workspace
        self.made_in = made_in  # workspace is a worktree launch.sh makes in this workspace: wait for it first
        self._shell_ended = threading.Event()
        self.agent = agent
        self.verbose = verbose
        self.session = checkpoints.new_session()
        self.go_folder = go_folder
        self.go: str | None = None  # this launch's go marker's name, once start() began the checkpoint
        self._thread: threading.Thread | None = None
        self._start: checkpoints.Taken | None = None
        self._error: BaseException | None = None
        self.ending = False  # end() handed the end checkpoint to its process (which completes the session's report)

    def start(self) -> None:
        if not self.settings.enabled:
            return
        if self.go_folder is not None:
            sweep_go_markers(self.go_folder)
            self.go = secrets.token_hex(8)
        self._thread = threading.Thread(target=self._take_start, name="agentbox-checkpoint", daemon=True)
        self._thread.start()

    def go_options(self) -> list[str]:
        """launch.sh's --go, when launch.sh must wait for the start checkpoint before the program."""
        return ["--go", self.go] if self.go is not None else []

    def shell_ended(self) -> None:
        """The shell returned: a worktree not made by now will not be (launch.sh stopped before it)."""
        self._shell_ended.set()

    def done(self) -> None:
        """After the session (or a launch that failed): the go marker goes; no thread is left behind."""
        self.shell_ended()
        self.wait_for_start()
        if self.go is not None and self.go_folder is not None:
            (self.go_folder / self.go).unlink(missing_ok=True)

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

    def report_if_done(self) -> None:
        """Say what there is to say about the start checkpoint now, when it is recorded already (before the shell,
        whose program may own the terminal after); else wait_for_start() says it after the session."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait_for_start()

    @property
    def taken(self) -> checkpoints.Taken | None:
        """The start checkpoint, once wait_for_start() has returned (None: none was taken)."""
        return self._start

    def end(self) -> None:
        """The end checkpoint, when the start one was taken: always by a process of its own, after this one returned
        (nothing of a launch needs it: an isolated session's proposal is made from the agent's copy), which holds
        the checkpoints' end lock till it is recorded; what it has to say is said by the next command that reads
        checkpoints."""
        self.wait_for_start()
        if self._start is None:
            return
        named = [path for path, _ in self._start.checkpoint.skipped]
        with timing.phase("end checkpoint (handed to a process of its own)"):
            self.ending = end_later(self.workspace, {
                "workspace": str(self.workspace), "agent": self.agent, "session": self.session,
                "verbose": self.verbose, "maxFileSize": self.settings.max_file_size, "keep": self.settings.keep,
                "named": named, "startTree": self._start.checkpoint.tree})

    @classmethod
    def resumed(cls, settings: CheckpointSettings, workspace: Path, agent: str, session: str,
                verbose: bool) -> SessionCheckpoints:
        """A launch's checkpoints in the process that takes its end checkpoint (agentbox.session.endcheckpoint)."""
        points = cls.__new__(cls)
        points.settings, points.workspace, points.agent, points.verbose = settings, workspace, agent, verbose
        points.session, points.go_folder, points.go, points.ending = session, None, None, False
        points._thread, points._start, points._error = None, None, None
        return points

    def end_now(self, already_named: set[str]) -> checkpoints.Taken | None:
        """Take the end checkpoint and say what there is to say about it."""
        with timing.phase("end checkpoint"):
            try:
                with store.time_limit(TIME_LIMIT):
                    taken = checkpoints.take(self.workspace, "end", self.settings, agent=self.agent,
                                             session=self.session)
            except AgentboxError as exc:
                self._report_failure("end", exc)
                return None
        self._report(taken, already_named=already_named, kind="end")
        return taken

    # -- in the thread ------------------------------------------------------------------------------
    def _take_start(self) -> None:
        if self.made_in is not None and not self._worktree_made(self.made_in):
            return  # no go marker: launch.sh, if it still waits, says the start checkpoint was not recorded
        try:
            with store.time_limit(TIME_LIMIT):
                self._start = checkpoints.take(self.workspace, "start", self.settings, agent=self.agent,
                                               session=self.session)
        except BaseException as exc:  # reported by the main thread, which decides what it means
            self._error = exc
        finally:
            self._write_go()

    def _worktree_made(self, workspace: Path) -> bool:
        """Wait until launch.sh has made the session's worktree (its checkout complete), within the time launch.sh
        waits for the go marker, or until the shell returned."""
        deadline = time.monotonic() + staginglayout.GO_LIMIT
        while not scope.ready(self.workspace, workspace):
            if self._shell_ended.is_set() or time.monotonic() > deadline:
                return False
            self._shell_ended.wait(0.05)
        return True

    def _write_go(self) -> None:
        """The go marker, written whole (atomically): the checkpoint's id, then this process's id (for the sweep)."""
        if self.go is None or self.go_folder is None:
            return
        number = self._start.checkpoint.id if self._start is not None else ""
        try:
            private_dir(self.go_folder)
            atomic_write(self.go_folder / self.go, f"{number}\n{os.getpid()}\n", mode=0o600)
        except OSError as exc:  # launch.sh then waits till its limit and says so
            warn(f"could not write {self.go_folder / self.go}, which tells the VM that the start checkpoint is "
                 f"recorded: {exc}; the session will not start")

    # -- what the user sees -------------------------------------------------------------------------
    def _report(self, taken: checkpoints.Taken, already_named: set[str], kind: str) -> None:
        checkpoint = taken.checkpoint
        same = "" if checkpoint.kind == kind and not checkpoint.uses else f", the workspace as in {checkpoint.label}"
        _forget(self.workspace, NOT_A_REPOSITORY_MARK)
        _forget(self.workspace, NO_GIT_MARK)
        fresh = [(path, size) for path, size in checkpoint.skipped if path not in already_named]
        if fresh:
            names = ", ".join(f"{visible(path)} ({sizes.shown(size)})" for path, size in fresh[:MAX_NAMED])
            more = f" and {len(fresh) - MAX_NAMED} more" if len(fresh) > MAX_NAMED else ""
            warn(f"checkpoint {checkpoint.label} ({kind}{same}) left out {len(fresh)} file"
                 f"{'s' if len(fresh) != 1 else ''} larger than {sizes.shown(self.settings.max_file_size)} "
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
        if isinstance(error, store.GitMissing):
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


def sweep_go_markers(folder: Path) -> None:
    """Remove the go markers of launches whose agentbox process is gone (a crashed launch)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        path = folder / name
        try:
            pid = int(path.read_text().split("\n")[1])
        except (OSError, ValueError, IndexError):
            pid = 0
        if pid <= 0 or not pid_alive(pid):
            path.unlink(missing_ok=True)


_spawned: list[Any] = []  # the end checkpoints' processes, kept so no warning says one still runs


def end_later(workspace: Path, spec: dict[str, Any]) -> bool:
    """Start the end checkpoint in a process of its own (agentbox.session.endcheckpoint), detached from this one's
    terminal and pipes, holding this session's end lock (taken here first, so a reader that comes right after this
    process returns already finds it held). An earlier session's end checkpoint still being taken is that
    process's to wait for, not this launch's."""
    try:
        fd, name = checkpoints.new_end_lock(workspace, str(spec["session"]))
    except OSError as exc:
        warn(f"the end checkpoint was not taken: its lock could not be made: {exc}")
        return False
    try:
        spec = {**spec, "lock": fd, "lockName": name}
        _spawned.append(subprocess.Popen(
            [sys.executable, "-m", "agentbox.session.endcheckpoint", json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(fd,),
            start_new_session=True, cwd="/", env=hosttools.environ()))  # PATH without the workspace's folders
    except OSError as exc:
        warn(f"the end checkpoint was not taken: it could not be started: {exc}")
        checkpoints.release_end_lock(workspace, name, fd)
        return False
    os.close(fd)  # the child holds the lock from here
    return True


def _first_time(workspace: Path, mark: str) -> bool:
    """True once per workspace: leaves a mark in its state folder."""
    path = paths.workspace_state_dir(Path(os.path.realpath(workspace))) / mark
    if path.exists():
        return False
    try:
        private_dir(path.parent)
        path.touch()
    except OSError:
        pass
    return True


def _forget(workspace: Path, mark: str) -> None:
    path = paths.workspace_state_dir(Path(os.path.realpath(workspace))) / mark
    if os.path.lexists(path):
        os.unlink(path)
