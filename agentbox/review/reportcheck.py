"""`agentbox report verify`: every record of the chain (agentbox.review.reportchain) checked, and where it breaks.

Each record's MAC under the host's key, its seq against its file's name, its `prev` against the record before it,
the seqs without a gap from 1, and the signed head against the newest record: an edited record, a missing one,
records put in another order and the newest ones removed are each named, by seq and file.
"""

from __future__ import annotations

import hmac
from typing import Any, NamedTuple

from agentbox.review import reportchain

DASH = "\u2013"  # records 13-14


class Verdict(NamedTuple):
    checked: int
    problems: list[str]


def verify() -> Verdict:
    seqs = reportchain.sequence_numbers()
    head = reportchain.head()
    secret = reportchain.key(create=False)
    if not seqs and head is None:
        return Verdict(0, [])
    if secret is None:
        return Verdict(len(seqs), [f"the report key {reportchain.folder() / reportchain.KEY_FILE} is missing or "
                                   "damaged: no record can be checked"])
    problems: list[str] = []
    previous: tuple[int, str] | None = None  # (seq, hash) of the last record read
    expected = 1
    for seq in seqs:
        path = reportchain.record_path(seq)
        if seq > expected:
            problems.append(_missing(expected, seq - 1))
        expected = seq + 1
        try:
            record = reportchain.load(seq)
        except reportchain.Corrupt as corrupt:
            problems.append(f"record {seq} (file {path}) cannot be read: {corrupt.why}")
            previous = None
            continue
        found = _check(secret, seq, path, record, previous)
        problems += found
        # An edited record is named once: the next one's link to it is not broken a second time.
        previous = None if found and "changed after" in found[0] else (seq, reportchain.digest(record))
    problems += _check_head(secret, head, seqs, previous)
    return Verdict(len(seqs), problems)


def _check(secret: bytes, seq: int, path: Any, record: dict[str, Any], previous: tuple[int, str] | None) -> list[str]:
    mac = record.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, reportchain.mac_of(secret, record)):
        return [f"record {seq} (file {path}): its content was changed after it was written (its signature does "
                "not match)"]
    found = []
    if record.get("seq") != seq:
        found.append(f"record {seq} (file {path}) is a signed record {record.get('seq')!r} under another name: "
                     "records were renamed or reordered")
    if seq == 1 and record.get("prev") != "":
        found.append(f"record 1 (file {path}) points to an earlier record: the chain's start was removed")
    elif previous is not None and previous[0] == seq - 1 and record.get("prev") != previous[1]:
        found.append(f"record {seq} (file {path}) does not follow record {seq - 1}: one of them was replaced or "
                     "they were reordered")
    return found


def _check_head(secret: bytes, head: reportchain.Head | reportchain.Corrupt | None, seqs: list[int],
                previous: tuple[int, str] | None) -> list[str]:
    where = reportchain.folder() / reportchain.HEAD_FILE
    if head is None:
        return [f"the chain's head ({where}) is missing: whether the newest records were removed cannot be told"]
    if isinstance(head, reportchain.Corrupt):
        return [f"the chain's head ({where}) cannot be read: {head.why}"]
    if not hmac.compare_digest(head.mac, reportchain.head_mac(secret, head.seq, head.hash)):
        return [f"the chain's head ({where}) was changed after it was written (its signature does not match)"]
    newest = seqs[-1] if seqs else 0
    if head.seq > newest:
        gone = f"record {head.seq}" if head.seq == newest + 1 else f"records {newest + 1}{DASH}{head.seq}"
        return [f"the newest record(s) after {newest} were removed ({gone}; the head says {head.seq} is the newest)"]
    if head.seq < newest:
        return [f"records {head.seq + 1}{DASH}{newest} are newer than the chain's head (which says {head.seq}): they "
                "were added without the key's head, or the head was put back"]
    if previous is not None and previous[0] == head.seq and previous[1] != head.hash:
        return [f"record {head.seq} (file {reportchain.record_path(head.seq)}) is not the record the head signed"]
    return []


def _missing(first: int, last: int) -> str:
    return f"record {first} is missing" if first == last else f"records {first}{DASH}{last} are missing"
