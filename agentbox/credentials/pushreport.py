"""What `agentbox status` (and `--json`) says about pushes from the VM: which it may make (sync.remoteWrite,
git.allowPush) and, under git.allowPush: session, what the credential broker let through or refused (its ledger,
agentbox.net.pushes).

    of(config, vm) -> dict    {"mode": "none" | "session" | "all", "setting", "branches", "checkedOnHost",
                               "pushed", "refused", "recent": [{"time", "outcome", "updates": [{"ref", "old",
                               "new"}]}]}, the last RECENT pushes the broker judged, oldest first
    lines(report) -> [str]    the same for people: a summary, then one line per ref of the recent pushes

The ledger is the broker's file in the host's state folder (the VM cannot write it); it is read whatever the mode
now is, so the pushes of an earlier session stay visible after the setting is turned off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentbox.net import pushes
from agentbox.tables import local_time

if TYPE_CHECKING:
    from agentbox.config.load import Config

RECENT = 5
SHORT = 7  # a sha as `git log --oneline` shows it


def of(config: Config, vm_name: str, history: bool = True) -> dict[str, Any]:
    """`history`: read what the VM's broker recorded (False when the VM of that name is another workspace's)."""
    if config.remote_write:
        mode = "all"
        setting = "sync.remoteWrite: true" + ("; git.allowPush: session has no effect beside it"
                                              if config.push_scope else "")
    elif config.scoped_pushes:
        mode, setting = "session", "git.allowPush: session"
    else:
        mode, setting = "none", "sync.remoteWrite: false, git.allowPush: false"
    entries = pushes.Ledger(vm_name).read() if history else []
    accepted = sum(1 for entry in entries if entry.get("outcome") == "ok")
    return {
        "mode": mode,
        "setting": setting,
        "branches": pushes.namespace(vm_name).removeprefix("refs/heads/") if mode == "session" else None,
        # the broker checks scoped pushes only when it holds the GitHub login (else the VM's guards alone do)
        "checkedOnHost": mode == "session" and config.credentials.enabled and config.credentials.broker,
        "pushed": accepted,
        "refused": len(entries) - accepted,
        "recent": [_entry(entry) for entry in entries[-RECENT:]],
    }


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A ledger line as reported: strings only (the file is agentbox's, but a report never trusts a shape)."""
    updates = entry.get("updates")
    return {
        "time": str(entry.get("time", "")),
        "outcome": str(entry.get("outcome", "")),
        "updates": [{key: str(update.get(key, "")) for key in ("ref", "old", "new")}
                    for update in (updates if isinstance(updates, list) else []) if isinstance(update, dict)],
    }


def lines(report: dict[str, Any]) -> list[str]:
    """The report for people (control characters are the caller's to escape)."""
    if report["mode"] == "all":
        head = f"every push allowed ({report['setting']})"
    elif report["mode"] == "session":
        where = ("checked on the host by the credential broker" if report["checkedOnHost"] else
                 "checked only by the guards in the VM: credentials.broker is off")
        head = f"only to branches under {report['branches']} ({report['setting']}; {where})"
    else:
        head = f"refused ({report['setting']})"
    found = [head]
    if report["pushed"] or report["refused"]:
        found[0] += f"; {report['pushed']} pushed, {report['refused']} refused"
    for entry in report["recent"]:
        outcome = "ok" if entry["outcome"] == "ok" else entry["outcome"]
        for update in entry["updates"] or [{"ref": "-", "old": "", "new": ""}]:
            found.append(f"{local_time(entry['time'])}  {update_words(update)}  {outcome}")
    return found


def update_words(update: dict[str, Any]) -> str:
    """One ref update of a push, as `agentbox/VM/fix new 1a2b3c4` (or `old..new`, `delete old`)."""
    ref = str(update.get("ref", "")).removeprefix("refs/heads/") or "-"
    return f"{ref} {_change(str(update.get('old', '')), str(update.get('new', '')))}"


def _change(old: str, new: str) -> str:
    if old and not old.strip("0"):
        return f"new {new[:SHORT]}"
    if new and not new.strip("0"):
        return f"delete {old[:SHORT]}"
    return f"{old[:SHORT]}..{new[:SHORT]}"
