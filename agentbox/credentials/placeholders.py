"""A VM's placeholders for the host's secrets: random, stable for the VM's life, kept on the host only.

    paths.vm_state_dir(VM)/broker/              0700
    paths.vm_state_dir(VM)/broker/placeholders.json  0600  {"version": 1, "slots": {slot: 24 hex digits}}

A placeholder is `<kind prefix>agentbox-ph-<24 hex>` (agentbox.net.broker.PLACEHOLDER_MARK). The random part
belongs to a slot ("claude.access", "gh.token", ...) and never changes while the VM exists; the prefix is the
real value's kind, picked from a fixed list (KINDS), so nothing of the real value but its kind is in it.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from agentbox import lazyre, paths
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, locked, private_dir
from agentbox.net.broker import PLACEHOLDER_MARK

# The kinds of real values a placeholder may name, longest first: a real value starting with one of them gets it
# as its placeholder's prefix. Nothing else of a real value is ever copied.
KINDS = (
    "sk-ant-oat01-", "sk-ant-ort01-", "sk-ant-api03-", "sk-ant-admin01-",
    "github_pat_", "gho_", "ghp_", "ghu_", "ghs_", "ghr_",
    "ya29.", "1//",
    "sk-proj-", "sk-svcacct-", "sk-",
    "rt_", "AIza",
)
_RANDOM = lazyre.compile(r"[0-9a-f]{24}")
_PLACEHOLDER = lazyre.compile(re.escape(PLACEHOLDER_MARK) + r"[0-9a-f]{24}")


def kind_of(real: str | None, default: str) -> str:
    """The prefix of the real value's kind, or `default` (the slot's usual kind) when it has none we know."""
    for kind in sorted(KINDS, key=len, reverse=True):
        if real is not None and real.startswith(kind) and len(real) > len(kind):
            return kind
    return default


def is_placeholder(value: str) -> bool:
    """Made by agentbox (for whichever VM)."""
    return _PLACEHOLDER.search(value) is not None


def folder(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "broker"


class Placeholders:
    """The VM's placeholder slots. `get` makes a slot's random part once, then returns it for the VM's life."""

    def __init__(self, vm_name: str) -> None:
        self.vm = vm_name
        self.file = folder(vm_name) / "placeholders.json"
        self._slots: dict[str, str] | None = None

    def get(self, slot: str, kind: str) -> str:
        slots = self._slots if self._slots is not None and slot in self._slots else self._load()
        if slot not in slots:
            with locked(self._lock_file()):
                slots = self._load()
                if slot not in slots:
                    slots[slot] = secrets.token_hex(12)
                    atomic_write(self.file, json.dumps({"version": 1, "slots": slots}, sort_keys=True) + "\n",
                                 mode=0o600)
            self._slots = slots
        return f"{kind}{PLACEHOLDER_MARK}{slots[slot]}"

    def known(self) -> dict[str, str]:
        """slot -> random part, of the slots made so far."""
        return dict(self._load())

    def _lock_file(self) -> Path:
        private_dir(self.file.parent)
        return self.file.parent / ".placeholders.lock"

    def _load(self) -> dict[str, str]:
        try:
            doc = json.loads(self.file.read_bytes())
        except FileNotFoundError:
            self._slots = {}
            return {}
        except (OSError, ValueError) as exc:
            raise StateError(f"{self.file}: the VM's credential placeholders cannot be read ({exc})",
                             "remove the file and relaunch: the VM gets new placeholders") from exc
        slots = doc.get("slots") if isinstance(doc, dict) else None
        if not isinstance(slots, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and _RANDOM.fullmatch(v) for k, v in slots.items()):
            raise StateError(f"{self.file}: the VM's credential placeholders are not in agentbox's format",
                             "remove the file and relaunch: the VM gets new placeholders")
        self._slots = dict(slots)
        return dict(slots)
