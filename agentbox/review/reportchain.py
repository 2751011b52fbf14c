"""The session reports' signed chain: one JSON file per record, one chain per host across every project.

    paths.state_dir()/reports/            0700
        key                               32 random bytes (0600), made on first use: the HMAC-SHA256 key
        NNNNNNNN.json                     one record (0600), NNNNNNNN its seq
        head                              {"seq", "hash", "mac"}: the newest record, signed (0600)
        lock                              held while a record is added

Each record carries `seq` (1, 2, ...), `id`, `prev` (the SHA-256 of the previous record's canonical bytes, "" for
the first) and `mac` (HMAC-SHA256 under the key of its canonical bytes without `mac`). The canonical bytes are the
record as JSON with sorted keys, no spaces, ASCII only. Adding a record reads the head and the key, never the
chain, so a session's end costs the same with ten records or ten thousand. agentbox.review.reportcheck verifies.

HMAC, not a signature pair: the only verifier is this host, which signs too; ed25519 would need the `cryptography`
package (or an openssl process per record) for no gain here. The VM never sees the state folder, so it can neither
read the key nor touch a record; someone with the user's host account can read the key and re-sign.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import lazyre, paths
from agentbox.fsutil import atomic_write, locked, private_dir

KEY_FILE, HEAD_FILE, LOCK_FILE = "key", "head", "lock"
KEY_BYTES = 32
MAX_RECORD_BYTES = 4 << 20
RECORD_NAME = lazyre.compile(r"(\d{8})\.json")


class Corrupt(Exception):
    """A report file that is not a record: unreadable, not JSON, not an object."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


class Head(NamedTuple):
    seq: int
    hash: str
    mac: str


def folder() -> Path:
    return paths.state_dir() / "reports"


def record_path(seq: int) -> Path:
    return folder() / f"{seq:08d}.json"


def canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(record: Mapping[str, Any]) -> str:
    """What the next record's `prev` is: the SHA-256 of this record's canonical bytes (its mac included)."""
    return hashlib.sha256(canonical(record)).hexdigest()


def mac_of(key: bytes, record: Mapping[str, Any]) -> str:
    return hmac.new(key, canonical({k: v for k, v in record.items() if k != "mac"}), hashlib.sha256).hexdigest()


def head_mac(key: bytes, seq: int, hash_: str) -> str:
    return hmac.new(key, b"head\0" + canonical({"seq": seq, "hash": hash_}), hashlib.sha256).hexdigest()


def key(create: bool = True) -> bytes | None:
    """The host's report key; made (0600) the first time a record is written. None when there is none yet."""
    path = folder() / KEY_FILE
    try:
        data = _read(path, KEY_BYTES + 1)
    except FileNotFoundError:
        if not create:
            return None
        private_dir(folder())
        try:
            atomic_write(path, secrets.token_bytes(KEY_BYTES), mode=0o600, overwrite=False)
        except FileExistsError:
            pass  # another agentbox made it first: use theirs
        data = _read(path, KEY_BYTES + 1)
    return data if len(data) == KEY_BYTES else None


def append(record: Mapping[str, Any]) -> dict[str, Any]:
    """Sign `record` into the chain as its newest entry; returns it as written (seq, id, prev, mac added)."""
    private_dir(folder())
    with locked(folder() / LOCK_FILE):
        secret = key()
        if secret is None:
            raise OSError(f"the report key {folder() / KEY_FILE} is not {KEY_BYTES} bytes")
        last = _last()
        seq = last.seq + 1 if last is not None else 1
        signed = {**record, "seq": seq, "id": f"{seq}-{secrets.token_hex(3)}", "prev": last.hash if last else ""}
        signed["mac"] = mac_of(secret, signed)
        atomic_write(record_path(seq), canonical(signed) + b"\n", mode=0o600)
        hash_ = digest(signed)
        atomic_write(folder() / HEAD_FILE, canonical(
            {"seq": seq, "hash": hash_, "mac": head_mac(secret, seq, hash_)}) + b"\n", mode=0o600)
    return signed


def _last() -> Head | None:
    """The newest record's seq and hash: from the head, else (no head yet, or one unreadable) the newest file."""
    found = head()
    if isinstance(found, Head):
        return found
    for seq in reversed(sequence_numbers()):
        try:
            return Head(seq, digest(load(seq)), "")
        except Corrupt:
            continue
    return None


def head() -> Head | Corrupt | None:
    """The signed head (None: there is none)."""
    path = folder() / HEAD_FILE
    try:
        data = json.loads(_read(path, 4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return Corrupt(path, _why(exc))
    if not isinstance(data, dict) or not isinstance(data.get("seq"), int) or not isinstance(data.get("hash"), str) \
            or not isinstance(data.get("mac"), str):
        return Corrupt(path, "not a report head (seq, hash, mac)")
    return Head(data["seq"], data["hash"], data["mac"])


def sequence_numbers() -> list[int]:
    """The seqs of the record files there are, oldest first."""
    try:
        names = os.listdir(folder())
    except FileNotFoundError:
        return []
    return sorted(int(match.group(1)) for name in names if (match := RECORD_NAME.fullmatch(name)))


def load(seq: int) -> dict[str, Any]:
    """One record, parsed (Corrupt: it is not one)."""
    path = record_path(seq)
    try:
        data = json.loads(_read(path, MAX_RECORD_BYTES))
    except (OSError, ValueError) as exc:
        raise Corrupt(path, _why(exc)) from None
    if not isinstance(data, dict):
        raise Corrupt(path, "not a JSON object")
    return data


def newest_first() -> Iterator[tuple[int, dict[str, Any] | Corrupt]]:
    """Every record, newest first; a file that is not one comes as Corrupt (named, never raised)."""
    for seq in reversed(sequence_numbers()):
        try:
            yield seq, load(seq)
        except Corrupt as corrupt:
            yield seq, corrupt


def _read(path: Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


def _why(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
