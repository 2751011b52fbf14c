"""Memory and disk sizes as Lima reads them (go-units RAMInBytes: binary multiples, bare number = bytes), and a
file's size as people read it."""

from __future__ import annotations

from typing import Any

from agentbox import lazyre

_SIZE = lazyre.compile(r"^(\d+(?:\.\d+)*) ?([kKmMgGtTpP])?[iI]?[bB]?$")
_MULTIPLIER = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

# A bare number is bytes to Lima; below this it was almost certainly meant as GiB.
_SMALLEST_PLAUSIBLE = 1 << 20


def to_bytes(text: str) -> int | None:
    match = _SIZE.match(text)
    if not match:
        return None
    try:
        number = float(match.group(1))
    except ValueError:
        return None
    return int(number * _MULTIPLIER[(match.group(2) or "").lower()])


def bytes_problem(value: Any) -> str | None:
    """A size of a file, not of a VM: anything above zero bytes."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f'expected a size such as "5MiB", found {value!r}'
    size = to_bytes(str(value))
    if size is None:
        return f'{str(value)!r} is not a size (examples: "5MiB", "512KiB", "1G"; a bare number is bytes)'
    return "must be larger than zero" if size == 0 else None


def size_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f'expected a size such as "8GiB", found {value!r}'
    text = str(value)
    size = to_bytes(text)
    if size is None:
        return f'{text!r} is not a size Lima understands (examples: "8GiB", "512MiB", "20G")'
    if size == 0:
        return "must be larger than zero"
    if size < _SMALLEST_PLAUSIBLE:
        return f"{text} is {size} bytes, which cannot run a VM (Lima reads a bare number as bytes)"
    return None


def shown(size: int) -> str:
    """A file's size for people: "5 MiB", "1.5 KiB", "12 bytes"."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"
