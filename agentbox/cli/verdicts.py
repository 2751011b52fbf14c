"""One check's verdict (OK, WARN or FAIL) and the report of a list of them: `agentbox doctor` (agentbox.cli.diagnosis)
and `agentbox hosts doctor` both print them."""

from __future__ import annotations

import re
from typing import NamedTuple

OK = "OK"
WARN = "WARN"
FAIL = "FAIL"


class Check(NamedTuple):
    check: str  # a stable id: "lima", "config", "vm", "credentials.claude", ...
    status: str  # OK, WARN or FAIL
    message: str
    hint: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "message": self.message, "hint": self.hint}


def version_tuple(version: str) -> tuple[int, ...] | None:
    """"2.0.1" -> (2, 0, 1); "2.1.0-beta.1" -> (2, 1, 0); None when it does not start with numbers."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


def format_text(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"  {check.status:<6}{check.message}")
        if check.hint and check.status != OK:
            lines.append(f"{'':8}hint: {check.hint}")
    fails = sum(check.status == FAIL for check in checks)
    warns = sum(check.status == WARN for check in checks)
    if fails or warns:
        lines.append(f"{fails} problem{'s' if fails != 1 else ''}, {warns} warning{'s' if warns != 1 else ''}")
    else:
        lines.append("Everything looks fine.")
    return "\n".join(lines) + "\n"


def failed(checks: list[Check]) -> bool:
    return any(check.status == FAIL for check in checks)
