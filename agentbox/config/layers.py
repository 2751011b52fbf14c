"""One config file's validated content: what schema.py produces and config.py merges.

Its own module so that validating (schema.py, which imports PyYAML) and merging (config.py, which
must not, on the warm path) depend on it instead of on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple


class Layer(NamedTuple):
    """One config file's validated content."""

    name: str  # "global" or "local"
    path: Path
    data: dict[str, Any]
    positions: dict[tuple[str, ...], str]
    notices: Sequence[str] = ()
    sha256: str = ""  # of the very bytes that were parsed: what trust compares
