"""The exceptions agentbox shows to people. cli.main() is the one place that prints them."""

from __future__ import annotations


class AgentboxError(Exception):
    """An error with a message for people and an optional hint on what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(AgentboxError):
    """Invalid configuration. Raised before anything is created or started."""

    exit_code = 2


class UsageError(AgentboxError):
    """The command line itself is wrong (an unknown command); nothing was run."""

    exit_code = 2


class StateError(AgentboxError):
    """The VM or the host is in a state agentbox cannot continue from."""


class LimaError(AgentboxError):
    """limactl failed, or could not be run.

    Besides the message, the error boundary (cli.py) prints `tail`, the last lines of a long
    operation's output (create, start, stop), and `log_path`, Lima's log of the instance, when the
    code that knows the instance sets it.
    """

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        stderr_lines: list[str] | None = None,
        tail: list[str] | None = None,
        log_path: str | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.stderr_lines = stderr_lines or []  # Lima's messages, for callers that look for a known one
        self.tail = tail or []
        self.log_path = log_path


class Interrupted(AgentboxError):
    exit_code = 130


class RefusedError(StateError):
    """The VM would reach further than agentbox rendered it; agentbox will not start or use it."""
