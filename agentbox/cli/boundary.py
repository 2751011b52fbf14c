"""What every invocation shares, with or without click: its set-up, and the single error boundary (what an
exception becomes on stderr and as the exit code).

Imports no click: an agent launch reaches it without the click command line (agentbox.cli.main).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from agentbox import paths, progress, timing
from agentbox.config import pins
from agentbox.errors import AgentboxError, LimaError
from agentbox.progress import silence
from agentbox.safetext import visible

CLOSED_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `yes | head -1`
INTERRUPTED_EXIT = 130


def begin(quiet: bool, timings: bool) -> None:
    """The global options' effects, at the start of one invocation (tests run many in one process)."""
    if timings:
        timing.enable()
    progress.set_quiet(quiet)
    pins.forget()  # one invocation, one read of every pinned file


def end() -> None:
    progress.set_quiet(False)


def closed_pipe() -> int:
    """The reader of stdout or stderr has gone (`agentbox ls | head -1`): end quietly, as with SIGPIPE.

    Nothing more can reach that reader. Both streams are pointed at /dev/null, so Python's flush
    at exit prints no "Exception ignored ... BrokenPipeError" either. Returns the exit status.
    """
    silence(sys.stdout)
    silence(sys.stderr)
    return CLOSED_PIPE_EXIT


def say(line: str) -> None:
    """One line on stderr, flushed (what click.echo(line, err=True) does)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def report_error(exc: AgentboxError) -> None:
    """The error on stderr: a failed limactl's last lines and log first, then the message and its hint."""
    if isinstance(exc, LimaError):
        if exc.tail:
            say("Last lines from limactl:")
            for line in exc.tail:
                say(f"  {visible(line)}")
        if exc.log_path:
            say(f"Lima's logs: {exc.log_path}")
    say(f"agentbox: error: {exc.message}")
    if exc.hint:
        say(f"hint: {exc.hint}")


def interrupted() -> int:
    say("\nagentbox: interrupted")
    return INTERRUPTED_EXIT


def internal_error(exc: Exception) -> int:
    """An exception nobody expected: its traceback goes to the crash log, one line to the user."""
    log = write_crash_log()
    say(f"agentbox: internal error: {type(exc).__name__}: {exc}")
    say(f"The details are in {log}; please include them when you report this.")
    return 1


def write_crash_log() -> str:
    # deferred: start-up (traceback: only on that path, not on a launch)
    import traceback

    path = paths.state_dir() / "crash.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(traceback.format_exc())
        return str(path)
    except OSError:
        return "(could not be written)"


def guarded(call: Callable[[], int]) -> int:
    """call()'s exit code, behind the same boundary as the click command line's (agentbox.cli.commandline): an
    AgentboxError reported, ^C, a closed pipe, an internal error logged; and what click's own main does with
    its exceptions, should the command have used click (a prompt's ^D, say)."""
    try:
        try:
            return call()
        except AgentboxError as exc:
            report_error(exc)
            return exc.exit_code
        except KeyboardInterrupt:
            return interrupted()
        except BrokenPipeError:
            raise
        except Exception as exc:
            click_code = _click_exit(exc)
            if click_code is not None:
                return click_code
            return internal_error(exc)
    except BrokenPipeError:
        return closed_pipe()


def _click_exit(exc: Exception) -> int | None:
    """The exit code click's main gives its own exceptions (after printing what it prints); None for others."""
    if "click" not in sys.modules:  # only a command that imported click can raise its exceptions
        return None
    # deferred: start-up (click: click is never imported on a launch)
    import click

    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, click.ClickException):
        exc.show()
        return exc.exit_code
    if isinstance(exc, click.exceptions.Abort):
        say("Aborted!")
        return 1
    return None
