"""A cheap look at the raw config files, without parsing them: what `agentbox --help` may skip.

Imports only the ground floor (paths), so that listing the commands costs no YAML and no key table.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import paths


def may_define_agents(cwd: Path) -> bool:
    """A cheap look at the raw files: could any of them define an agent?"""
    candidates = [paths.global_config_file()]
    for directory in (cwd, *cwd.parents):
        candidate = directory / paths.LOCAL_CONFIG_NAME
        if os.path.lexists(candidate):
            candidates.append(candidate)
            break
    for candidate in candidates:
        try:
            if not os.path.isfile(candidate):
                continue
            fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                if b"agents" in handle.read(1_000_001):
                    return True
        except OSError:
            continue
    return False
