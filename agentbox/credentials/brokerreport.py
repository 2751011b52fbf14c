"""What `status`, `net status`, `doctor`, `describe` and the VM's context file say about the credential broker.

    of(config, vm) -> dict   whether the broker is on, which agents are brokered and which staged, the CA's
                             fingerprint, what the VM holds, and the notes of the last launch

Cheap by design (these run on the launch path and in `describe`): the config, one small record the launch wrote
(`record`, in the VM's state folder) and the CA's record (agentbox.net.certauthority.load: small files, no program). The
host's login files are never parsed here; the launch did that (agentbox.credentials.broker.brokered.prepare).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import paths
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.credentials.loginfiles import guest_path_for
from agentbox.fsutil import private_dir, write_if_changed

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.credentials.broker import brokered

RECORD_NAME = "broker-logins.json"  # in paths.vm_state_dir(VM): {"brokered": [...], "notes": [...]}
MAX_RECORD = 64 << 10


def record_path(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / RECORD_NAME


def record(vm_name: str, prepared: brokered.Prepared, agent: str | None = None) -> None:
    """What the launch of `agent` (None: a shell) found on the host: the logins it brokered and its notes (no
    secret: names and sentences), and every agent launched in the VM so far. Written only when it changed (the
    warm path reads it and writes nothing)."""
    private_dir(paths.vm_state_dir(vm_name))
    launched = set(launched_in(vm_name)) | ({agent} if agent is not None else set())
    data = {"brokered": list(prepared.brokered), "notes": list(prepared.notes),
            "missing": dict(prepared.missing), "launched": sorted(launched),
            # guest paths (relative to the home): the placeholder versions staged, and every login file the
            # broker stands in for (one it lacks a login for is not staged at all)
            "files": sorted(prepared.files),
            "replaced": sorted(guest_path_for(spec)[2:] for spec in prepared.replaced)}
    write_if_changed(record_path(vm_name), (json.dumps(data, indent=1) + "\n").encode())


def staged_for_vm(vm_name: str, present: list[str]) -> list[str]:
    """Of the login files a launch would stage (guest paths), those it stages with the broker: the ones the broker
    stands in for only when the last launch had a login to make a placeholder version of."""
    data = _recorded(vm_name) or {}
    replaced = set(data.get("replaced") or [])
    files = set(data.get("files") or [])
    return [path for path in present if path not in replaced or path in files]


def recorded_notes(vm_name: str) -> list[str]:
    """The notes the last brokered launch recorded (none before the first)."""
    data = _recorded(vm_name)
    return [str(note) for note in data["notes"]] if data is not None else []


def launched_in(vm_name: str) -> list[str]:
    """The agents launched in the VM since the broker's record began (`agentbox AGENT`, `run`): agents in use."""
    data = _recorded(vm_name) or {}
    found = data.get("launched")
    return [str(name) for name in found] if isinstance(found, list) else []


def in_use(config: Config, vm_name: str) -> set[str]:
    """The agents (and "gh") a missing login is worth a warning for: set in a config file (the user's or the
    project's), or launched in the VM before; gh when credentials.gh is set, or an agent that logs in through it
    is in use. (An agent logged in on the host has no missing login to warn about.)"""
    used = {key.split(".")[1] for key, origin in config.origins.items()
            if key.startswith("agents.") and origin != "default"}
    used |= set(launched_in(vm_name))
    if config.origins.get("credentials.gh", "default") != "default" or any(
            BUILTIN_AGENTS[name].login_via_gh for name in used if name in BUILTIN_AGENTS):
        used.add("gh")
    return used


def _recorded(vm_name: str) -> dict[str, Any] | None:
    try:
        with open(record_path(vm_name), "rb") as handle:
            data = json.loads(handle.read(MAX_RECORD))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("notes"), list):
        return None
    return data


def candidates(config: Config) -> list[str]:
    """The agents (and "gh") whose logins the broker holds when it is on (Claude Code, Codex, Gemini CLI, the
    GitHub CLI); every other agent's stay staged."""
    # deferred: start-up (credentials.broker.brokered: a launch with the broker off never loads it)
    from agentbox.credentials.broker import brokered

    request = brokered.request_of(config)
    if request is None:
        return []
    return [*request.agents, *(["gh"] if request.gh else [])]


def of(config: Config, vm_name: str) -> dict[str, Any]:
    """The broker's part of the reports (JSON-ready; never a secret)."""
    settings = config.credentials
    on = settings.enabled and settings.broker
    if not settings.enabled:
        return {"enabled": False, "brokered": [], "staged": [], "caFingerprint": None, "notes": [],
                "notesChecked": False,
                "vmHolds": "no login: credentials are off (credentials: false), so no login goes into the VM"}
    every = [*config.agents, *(["gh"] if settings.gh else [])]
    chosen = candidates(config) if on else []
    staged = [name for name in every if name not in chosen]
    if not on:
        return {"enabled": False, "brokered": [], "staged": staged, "caFingerprint": None, "notes": [],
                "notesChecked": False,
                "vmHolds": "copies of the host's login files and API keys of every agent brought in "
                           "(credentials.broker is off)"}
    # deferred: start-up (net.certauthority: a launch with the broker off never loads it)
    from agentbox.net import certauthority

    authority = certauthority.load(vm_name)
    seen = _recorded(vm_name)
    notes = [str(note) for note in seen["notes"]] if seen is not None else []
    missing = seen.get("missing") if seen is not None else None
    if isinstance(missing, dict) and missing:  # a missing login is said only for an agent in use
        used = in_use(config, vm_name)
        unused = {str(text) for name, text in missing.items() if name not in used}
        notes = [note for note in notes if note not in unused]
    holds = (f"no secret of {', '.join(chosen)}: their login files and API keys in the VM hold placeholders; the "
             "real tokens stay on the host and agentbox's proxy puts them only where their own services take them"
             if chosen else "no brokered login (no agent the broker supports is configured)")
    if staged:
        holds += f"; copies of the real logins of {', '.join(staged)} (staged: the broker does not support them)"
    return {"enabled": True, "brokered": chosen, "staged": staged,
            "caFingerprint": authority.fingerprint if authority is not None else None,
            "notes": notes, "notesChecked": seen is not None, "vmHolds": holds}


def lines(report: dict[str, Any]) -> list[str]:
    """The report as a few sentences for people (net status, status, doctor, describe)."""
    if not report["enabled"]:
        out = [f"off (credentials.broker): {report['vmHolds']}"]
        if report["staged"]:
            out.append(f"staged: {', '.join(report['staged'])}")
        return out
    out = [f"on (credentials.broker): the VM holds {report['vmHolds']}",
           f"brokered: {', '.join(report['brokered']) or 'none'}",
           f"staged: {', '.join(report['staged']) or 'none'}",
           "CA: " + (report["caFingerprint"] or "not made yet (the next launch makes it)")]
    out += [f"note: {note}" for note in report["notes"]]
    if not report["notesChecked"]:
        out.append("note: the host's logins are checked at the next launch")
    return out


def summary(report: dict[str, Any]) -> str:
    """One line (`agentbox status`)."""
    if not report["enabled"]:
        return ("off: every login brought in is a copy of the host's (credentials.broker)" if report["staged"]
                else "off: no login goes into the VM (credentials: false)")
    notes = f"; {len(report['notes'])} note(s)" if report["notes"] else ""
    return (f"on: brokered {', '.join(report['brokered']) or 'none'}; staged {', '.join(report['staged']) or 'none'}"
            f"{notes} (`agentbox net status`)")


SHORT_DIGITS = 16


def short_fingerprint(fingerprint: str) -> str:
    """"SHA256:D31C7E45CE69E9BB..." of "SHA256:D3:1C:7E:...": enough to tell the VM's CA from another at a glance
    (`net status` and `doctor` show it whole)."""
    algorithm, _, digits = fingerprint.partition(":")
    return f"{algorithm}:{digits.replace(':', '')[:SHORT_DIGITS]}..."


def ca_line(report: dict[str, Any]) -> str | None:
    """The VM's agentbox CA (the broker's) in one short line (`agentbox status`), None with the broker off."""
    if not report["enabled"]:
        return None
    if not report["caFingerprint"]:
        return "not made yet (the next launch makes it)"
    return f"{short_fingerprint(report['caFingerprint'])} (`agentbox net status` shows it whole)"
