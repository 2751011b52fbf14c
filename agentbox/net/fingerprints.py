"""Fingerprints of private files' content, shared by the host side that makes them (agentbox.session.privatefiles)
and the proxy that looks for them (agentbox.net.doors): every WINDOW-byte run of a file, as a crc32 (found fast)
and an 8-byte blake2b (which confirms). Standard library only: a launch imports it.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from typing import Any

WINDOW = 64
STRIDE = 32  # the proxy hashes a body's windows this far apart: a run of WINDOW + STRIDE - 1 bytes is always caught
MIN_VARIETY = 8  # a window of fewer distinct bytes (padding, indentation, a run of one letter) is no fingerprint
CANARIES_FILE = "canaries.json"  # in the VM's network folder: agentbox.session.canaries.FILE writes it
PRIVATE_FILE = "private.json"  # in the VM's network folder: agentbox.session.privatefiles writes it


def window_hashes(data: bytes) -> tuple[array, array]:
    """Every WINDOW-byte run of `data` (each start) with MIN_VARIETY distinct bytes: its crc32s and blake2b-8s."""
    crcs, checks = array("I"), array("Q")
    view = memoryview(data)
    seen: set[int] = set()
    for start in range(len(data) - WINDOW + 1):
        window = view[start:start + WINDOW]
        check = confirm(window)
        if check in seen or len(set(window)) < MIN_VARIETY:
            continue
        seen.add(check)
        crcs.append(zlib.crc32(window))
        checks.append(check)
    return crcs, checks


def confirm(window: Any) -> int:
    return int.from_bytes(hashlib.blake2b(window, digest_size=8).digest(), "little")
