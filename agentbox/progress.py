"""Progress of long operations, on stderr: a live line on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

# limactl stderr fragments -> the phase a person cares about. First match wins.
_PHASES = (
    ("Downloading", "downloading the image"),
    ("Attempting to download", "downloading the image"),
    ("Creating an instance", "creating the VM"),
    ("Run `limactl start", "VM created"),
    ("Starting the instance", "booting"),
    ("requirement 1 of", "waiting for ssh"),
    ("`ssh`", "waiting for ssh"),
    ('"ssh"', "waiting for ssh"),
    ("boot scripts must have finished", "running provisioning"),
    ("provision", "running provisioning"),
    ("READY", "ready"),
    ("Sending SIGINT", "shutting down"),
    ("has shut down", "stopped"),
)
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def phase_of(line: str) -> str | None:
    for fragment, phase in _PHASES:
        if fragment in line:
            return phase
    return None


class Progress:
    """One operation (`Creating VM agentbox-x`): feed it limactl's lines; it shows phase changes."""

    def __init__(self, title: str, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.title = title
        self.verbose = verbose
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and not verbose
        self.phase = "starting"
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if self.live:
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        else:
            self._print(f"{self.title}...")
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
            self.stream.write("\r\033[K")
        elapsed = time.monotonic() - self.started
        outcome = "done" if exc_type is None else "failed"
        self._print(f"{self.title}: {outcome} ({elapsed:.0f}s)")

    def feed(self, line: str) -> None:
        if self.verbose:
            self._print(f"  {line}")
        phase = phase_of(line)
        if phase and phase != self.phase:
            self.phase = phase
            if not self.live and not self.verbose:
                self._print(f"  {self.title}: {phase}")

    def _spin(self) -> None:
        index = 0
        while not self._stop.wait(0.1):
            elapsed = time.monotonic() - self.started
            with self._lock:
                self.stream.write(f"\r\033[K{_SPINNER[index % len(_SPINNER)]} {self.title} [{elapsed:.0f}s] {self.phase}")
                self.stream.flush()
            index += 1

    def _print(self, text: str) -> None:
        with self._lock:
            print(text, file=self.stream, flush=True)


def note(text: str) -> None:
    print(f"agentbox: {text}", file=sys.stderr, flush=True)
