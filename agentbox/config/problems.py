"""Several config errors reported as one: every problem of a file at once, in the order they appear in it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentbox import lazyre
from agentbox.errors import ConfigError

_POSITION = lazyre.compile(r"^.*?:(\d+):(\d+): ")


class StopsReading(ConfigError):
    """A problem found while reading that stops the reading (an alias bomb): never gathered with the others."""


class Problems:
    """Collects the ConfigErrors of one file, so that reading can go on to the next key."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """Run the block; a ConfigError it raises is kept, and the code after the block goes on."""
        try:
            yield
        except StopsReading:
            raise
        except ConfigError as exc:
            self.errors.append(exc)

    def raise_any(self, source: str) -> None:
        """Raise the one error there is, or one listing every error of `source`, in file order."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise combined(source, self.errors)


def combined(source: str, errors: list[ConfigError]) -> ConfigError:
    """One error whose message lists each error (file:line:column first) with its hint below it."""
    lines = [f"{len(errors)} problems in {source}:"]
    for error in sorted(errors, key=_file_order):
        lines.append(f"  {error.message}")
        if error.hint:
            lines.append(f"    hint: {error.hint}")
    return ConfigError("\n".join(lines), hint="Nothing was created or started. Fix them, then run the command again.")


def _file_order(error: ConfigError) -> tuple[int, int]:
    """(line, column) of an error that starts with file:line:column; errors without one go last (sorting is
    stable, so they keep the order they were found in)."""
    found = _POSITION.match(error.message)
    return (int(found.group(1)), int(found.group(2))) if found else (1 << 30, 0)
