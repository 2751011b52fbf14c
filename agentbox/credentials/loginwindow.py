"""The one-shot login window `agentbox AGENT login` opens on the host, and the login it keeps pending there.

With the credential broker, a code exchange from the VM (a login) is the only way the VM can put tokens into the
host's login file, and the VM needs no placeholder to send one: an attacker makes the code on their own machine.
So the broker's token endpoint (agentbox.credentials.tokens) accepts one only while the user runs
`agentbox AGENT login` for that VM, which arms a window here before it runs the agent's login and closes it when
the command ends, however it ends. The broker uses the window once: its first successful exchange consumes it.

A login of another account than the host's (or one whose account cannot be told) is not written by the broker:
its tokens wait here until `agentbox AGENT login` asks the user, after the agent's login ends.

    paths.vm_state_dir(VM)/broker/                    0700 (the host's state folder: the VM mounts none of it)
    paths.vm_state_dir(VM)/broker/login-AGENT.json    0600 {"version", "agent", "expires", "id"}; once used,
                                                       {"version", "agent", "used": true, "account"}
    paths.vm_state_dir(VM)/broker/pending-AGENT.json  0600 {"version", "agent", "at", "response", "new", "old"}

Both files are agentbox's own (written by the CLI and the broker process on the host); they are read with a size
cap all the same, and anything unexpected in them counts as no window, no pending login.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, NamedTuple

from agentbox.credentials.placeholders import folder as broker_folder
from agentbox.fsutil import atomic_write, private_dir

WINDOW = 15 * 60  # seconds: how long after `agentbox AGENT login` starts its window stays open
VERSION = 1
MAX_FILE = 1 << 20

OPEN = "open"
NONE = "none"  # never armed, closed, or already used
EXPIRED = "expired"


def window_file(vm_name: str, agent: str) -> Path:
    return broker_folder(vm_name) / f"login-{agent}.json"


def pending_file(vm_name: str, agent: str) -> Path:
    return broker_folder(vm_name) / f"pending-{agent}.json"


class Used(NamedTuple):
    """The broker used the window: the login it accepted, written to the host file or held pending."""

    account: str | None  # in words (an e-mail address); None: the login names none


class Window:
    """An armed window: `close()` removes it unless another `agentbox AGENT login` has armed its own since, and says
    whether the broker used it."""

    def __init__(self, vm_name: str, agent: str, ident: str) -> None:
        self.vm = vm_name
        self.agent = agent
        self.ident = ident

    def close(self) -> Used | None:
        """Close the window; what the broker did with it (None: nothing)."""
        path = window_file(self.vm, self.agent)
        doc = _read(path)
        if doc is None or doc.get("agent") != self.agent:
            return None
        if doc.get("used") is True:
            _remove(path)
            account = doc.get("account")
            return Used(account if isinstance(account, str) else None)
        if doc.get("id") == self.ident:
            _remove(path)
        return None


def arm(vm_name: str, agent: str, now: float | None = None) -> Window:
    """Open the window for `agent`'s login in `vm` for WINDOW seconds from `now`. A login still pending from an
    earlier run (one that was killed before it asked) is dropped: this run makes its own."""
    start = time.time() if now is None else now
    ident = secrets.token_hex(12)
    private_dir(broker_folder(vm_name))
    discard(vm_name, agent)
    doc = {"version": VERSION, "agent": agent, "expires": start + WINDOW, "id": ident}
    atomic_write(window_file(vm_name, agent), json.dumps(doc) + "\n", mode=0o600)
    return Window(vm_name, agent, ident)


def state(vm_name: str, agent: str, now: float) -> str:
    """OPEN, NONE or EXPIRED: whether a code exchange for `agent` may be accepted now."""
    doc = _read(window_file(vm_name, agent))
    if doc is None or doc.get("agent") != agent or doc.get("version") != VERSION or doc.get("used") is not None:
        return NONE
    expires = doc.get("expires")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        return NONE
    return OPEN if now < expires <= now + WINDOW else EXPIRED


def consume(vm_name: str, agent: str, account: str | None) -> None:
    """The window's one use (the broker's first successful exchange in it, a login of `account`): no exchange is
    accepted after it, and `agentbox AGENT login` names the account when it closes the window."""
    doc = {"version": VERSION, "agent": agent, "used": True, "account": account}
    atomic_write(window_file(vm_name, agent), json.dumps(doc) + "\n", mode=0o600)


class Pending(NamedTuple):
    """A login made in the VM that would replace the host's login of another account: waiting for the user."""

    agent: str
    at: float  # when the tokens were issued (their expiry counts from it)
    response: dict[str, Any]  # the token endpoint's answer: the real tokens
    new: str | None  # the new login's account in words (an e-mail address); None: it names none
    old: str | None  # the host's


def hold(vm_name: str, pending: Pending) -> None:
    private_dir(broker_folder(vm_name))
    doc = {"version": VERSION, **pending._asdict()}
    atomic_write(pending_file(vm_name, pending.agent), json.dumps(doc) + "\n", mode=0o600)


def pending(vm_name: str, agent: str) -> Pending | None:
    doc = _read(pending_file(vm_name, agent))
    if doc is None or doc.get("version") != VERSION or doc.get("agent") != agent:
        return None
    at, response, new, old = doc.get("at"), doc.get("response"), doc.get("new"), doc.get("old")
    if (not isinstance(at, (int, float)) or isinstance(at, bool) or not isinstance(response, dict)
            or not isinstance(response.get("access_token"), str)
            or not all(value is None or isinstance(value, str) for value in (new, old))):
        return None
    return Pending(agent, float(at), response, new, old)


def discard(vm_name: str, agent: str) -> None:
    _remove(pending_file(vm_name, agent))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
