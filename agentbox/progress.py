"""What agentbox tells people while it works, on stderr: steps, notes and warnings.

A step (`with Progress("Starting VM agentbox-x"):`) ends with exactly one line, `Starting VM
agentbox-x: done (3s)` (or `failed`, `interrupted`). Meanwhile, on a terminal, one live line shows a
spinner, the elapsed seconds and the last phase limactl's output named (none before it names one);
it is cut to the terminal's width, read again at every tick, so it never wraps, even after a resize
(a wrapped line could not be rewritten in place). Elsewhere (a pipe, a log, TERM=dumb) the step's
line is started at once and completed when the step ends, with no cursor movement at all.

limactl's warnings and errors are always shown, as `agentbox: limactl warning: ...`; its info
chatter only with -v, which streams every line. -q silences steps that succeed and notes, never
warnings, errors or a step that failed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from agentbox.errors import Interrupted
from agentbox.logline import parse_log_line
from agentbox.safetext import visible

# limactl output fragments -> the phase a person cares about. First match wins. A step only moves
# forward through PHASE_ORDER: Lima repeats fragments ("requirement 1 of", "provision") in later
# stages, and a phase must never flip back.
_PHASES = (
    ("Attempting to download", "downloading the image"),
    ("Downloading", "downloading the image"),
    ("Creating an instance", "creating the VM"),
    ("Run `limactl start", "VM created"),
    ("Starting the instance", "booting"),
    ("essential requirement", "waiting for ssh"),
    ("optional requirement", "waiting for provisioning"),
    ("final requirement", "waiting for provisioning"),
    ("provision", "waiting for provisioning"),
    ("READY", "ready"),
    ("Sending SIGINT", "shutting down"),
    ("Sending SIGKILL", "shutting down"),
    ("Waiting for the host agent", "shutting down"),
    ("has shut down", "stopped"),
)
PHASE_ORDER = (
    "",  # nothing said yet: the title names what the step does, so no word of its own (never "starting" on a stop)
    "downloading the image",
    "creating the VM",
    "VM created",
    "booting",
    "waiting for ssh",
    "waiting for provisioning",
    "ready",
    "shutting down",
    "stopped",
)
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_CLEAR_LINE = "\r\033[K"
_TICK = 0.1
_SHOWN_LEVELS = {"warning": "warning", "warn": "warning", "error": "error"}

emitted = 0  # lines emit() was asked to print
_quiet = False
_active: Progress | None = None  # the step whose live line other messages must not break
_output_lock = threading.RLock()


def set_quiet(quiet: bool) -> None:
    """-q: successful steps and notes print nothing; warnings, errors and failed steps still do."""
    global _quiet
    _quiet = quiet


def phase_of(line: str) -> str | None:
    for fragment, phase in _PHASES:
        if fragment in line:
            return phase
    return None


def terminal_width(stream: TextIO) -> int:
    """The stream's terminal width now (it changes when the window is resized); 80 if unknown."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
    return columns if columns > 0 else 80


def live_terminal(stream: TextIO) -> bool:
    """A terminal that understands carriage return and erase-line: not a pipe, not TERM=dumb."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def fit(head: str, tail: str, width: int) -> str:
    """head + tail in at most width columns: head loses its end first (marked …), so tail stays."""
    if len(head) + len(tail) <= width:
        return head + tail
    room = width - len(tail) - 1
    if room >= 8:
        return head[:room] + "…" + tail
    return (head + tail)[: max(width - 1, 0)] + "…" if width > 1 else ""


class Progress:
    """One step (`Creating VM agentbox-x`): feed it limactl's lines; it ends with one line of outcome."""

    def __init__(self, title: str, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.title = title
        self.verbose = verbose
        self.stream = stream or sys.stderr
        self.quiet = _quiet and not verbose
        self.live = not verbose and not self.quiet and live_terminal(self.stream)
        self.phase = PHASE_ORDER[0]
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._frame = 0
        self._open_line = False  # plain mode: the step's line is started and not yet completed
        self._broken = False  # its stream failed (a closed pipe): nothing more is written to it
        self._outer: Progress | None = None  # the step this one runs inside: paused until this one ends
        self._shown: set[tuple[str, str]] = set()  # limactl's warnings and errors said so far (Lima repeats some)

    def __enter__(self) -> Progress:
        global _active
        self.started = time.monotonic()
        with _output_lock:
            self._outer = _active
            if self._outer is not None and not self.verbose and not self.quiet:
                self._outer._interrupt_line()  # its line is finished or cleared, never shared with this one
        if self.live:
            with _output_lock:
                _active = self
                self._draw()
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        elif self.verbose:
            self._write(f"{self.title}...\n")
        elif not self.quiet:
            with _output_lock:
                _active = self
                self._write(f"{self.title}:")
                self._open_line = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        global _active
        self._stop.set()
        if self._thread:
            self._thread.join()
        elapsed = time.monotonic() - self.started
        if exc_type is None:
            outcome = "done"
        elif issubclass(exc_type, (KeyboardInterrupt, Interrupted)):
            outcome = "interrupted"
        else:
            outcome = "failed"
        tail = f": {outcome} ({elapsed:.0f}s)"
        with _output_lock:
            if _active is self:
                _active = self._outer
            if self.live:
                self._write(_CLEAR_LINE + fit(self.title, tail, terminal_width(self.stream) - 1) + "\n")
            elif self._open_line:
                self._write(f" {outcome} ({elapsed:.0f}s)\n")
            elif not self.quiet or outcome != "done":
                self._write(self.title + tail + "\n")
            self._open_line = False
            if _active is not None and _active is self._outer:
                _active._resume_line()

    def feed(self, line: str) -> None:
        """One line of limactl's output (called from the reader threads)."""
        entry = parse_log_line(line)
        if self.verbose:
            with _output_lock:  # stdout and stderr have a reader thread each
                self._write(f"  {visible(line)}\n")
        else:
            label = _SHOWN_LEVELS.get(entry.level)
            if label and (label, entry.message) not in self._shown:
                self._shown.add((label, entry.message))
                emit(f"agentbox: limactl {label}: {visible(entry.message)}")
        phase = phase_of(entry.message)
        if phase and PHASE_ORDER.index(phase) > PHASE_ORDER.index(self.phase):
            self.phase = phase

    # -- output ---------------------------------------------------------------------------------
    def _spin(self) -> None:
        while not self._stop.wait(_TICK):
            with _output_lock:
                if not self._stop.is_set() and _active is self:  # a step inside this one owns the line
                    self._draw()

    def _draw(self) -> None:
        """Rewrite the live line, cut to the width the terminal has now."""
        elapsed = time.monotonic() - self.started
        spinner = _SPINNER[self._frame % len(_SPINNER)]
        self._frame += 1
        # One column is kept free: writing the last column leaves some terminals waiting to wrap.
        tail = f" [{elapsed:.0f}s] {self.phase}" if self.phase else f" [{elapsed:.0f}s]"
        text = fit(f"{spinner} {self.title}", tail, terminal_width(self.stream) - 1)
        self._write(_CLEAR_LINE + text)

    def _interrupt_line(self) -> None:
        """Make room for a whole line of another message (the caller holds the output lock)."""
        if self.live:
            self._write(_CLEAR_LINE)
        elif self._open_line:
            self._write("\n")
            self._open_line = False

    def _resume_line(self) -> None:
        if self.live and not self._stop.is_set():
            self._draw()

    def _write(self, text: str) -> None:
        if self._broken:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:  # nobody reads stderr any more (`agentbox start 2>&1 | head -1`)
            self._broken = True
            silence(self.stream)


def emit(line: str, always: bool = True) -> None:
    """Print one whole line on stderr without breaking a live step line; `always=False` obeys -q."""
    global emitted
    emitted += 1  # said or not (-q): a launch that had something to say saves no plan (agentbox.session.plan)
    if _quiet and not always:
        return
    with _output_lock:
        step = _active
        if step is not None:
            step._interrupt_line()
        try:
            print(line, file=sys.stderr, flush=True)
        except BrokenPipeError:
            silence(sys.stderr)
        if step is not None:
            step._resume_line()


def say(text: str) -> None:
    """A short status message (`agentbox-x stopped`); -q silences it."""
    emit(text, always=False)


def note(text: str) -> None:
    """`agentbox: TEXT`, something worth knowing that needs no action; -q silences it."""
    emit(f"agentbox: {text}", always=False)


def warn(text: str) -> None:
    """`agentbox: warning: TEXT`, something that may be wrong; shown even with -q."""
    emit(f"agentbox: warning: {text}")


def silence(stream: TextIO) -> None:
    """A closed pipe on stream: point its file descriptor at /dev/null.

    Later writes, and Python's flush at exit, then succeed without a word: no "Exception ignored
    ... BrokenPipeError", no exit status 120.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test runner's capture)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
