"""An agent's OAuth login kept in a JSON file on the host, as the broker uses it: its tokens, the VM's
placeholders for them, the Secret the proxy substitutes, the token endpoint's answers, and whose login a new one
would replace. Each brokered agent (broker_claude, broker_codex, broker_gemini) says where its tokens are in the
file and in the replies; whose account a login is comes from agentbox.agents.logins, as for the write-back."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agentbox import paths
from agentbox.agents import logins
from agentbox.agents.record import AgentSpec
from agentbox.credentials.hostfile import BACKUP_SUFFIX, HostFile
from agentbox.credentials.placeholders import Placeholders, kind_of
from agentbox.credentials.tokens import Switch, Tokens, unsigned_jwt
from agentbox.errors import AgentboxError, StateError
from agentbox.fsutil import atomic_write
from agentbox.net.broker import Route, Secret, place, route


class FileLogin(ABC):
    """A login file's format: subclasses set the token kinds and parse/apply/reply/vm_file; whose login it is and
    where its tokens may go come from the agent's record (AgentSpec.broker)."""

    access_kind = ""  # the placeholder's prefix when the real value's kind is not one we know
    refresh_kind = ""

    def __init__(self, path: Path, placeholders: Placeholders, spec: AgentSpec) -> None:
        assert spec.broker is not None
        self.file = HostFile(path)
        self.placeholders = placeholders
        self.agent = spec.name
        self.title = spec.title
        self.login_command = spec.broker.login_command
        self.access_hosts = frozenset(spec.broker.access_hosts)
        self.access_places = tuple(place(text) for text in spec.broker.access_places)
        self.access_routes = routes_of(spec.broker.access_routes)
        self.format = logins.FORMATS.get(spec.broker.login_file)  # how logins.py reads it: whose account it is
        companion = self.format.companion if self.format is not None else None
        self.companion = HostFile(paths.home() / companion, logins.MAX_COMPANION) if companion else None

    # -- what a subclass says -----------------------------------------------------------------------------------

    @abstractmethod
    def parse(self, doc: dict[str, Any]) -> Tokens | None:
        """The tokens in the file (None: logged out); StateError (via self.bad) when the file is malformed."""

    @abstractmethod
    def apply(self, doc: dict[str, Any], response: dict[str, Any], now: float) -> dict[str, Any]:
        """The file's new contents with a token response's tokens."""

    @abstractmethod
    def reply(self, tokens: Tokens, ph: dict[str, str], upstream: dict[str, Any] | None, now: float
              ) -> dict[str, Any]:
        """The token endpoint's answer; ph holds "access", "refresh" and "id_token" (unsigned) for the VM."""

    @abstractmethod
    def vm_file(self, doc: dict[str, Any], tokens: Tokens, ph: dict[str, str]) -> dict[str, Any]:
        """The file the VM gets: the real shape, every secret a placeholder."""

    def without_login(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The file with the login taken out (what a login of another account is written over): the whole file,
        unless the format keeps something else in it."""
        return {}

    def account_companion(self, response: dict[str, Any]) -> bytes | None:
        """A login response's account in the form of the format's companion file (logins.Format.companion), for
        a format whose login file names no account (Claude Code's); None: the file itself names it."""
        return None

    def file_api_key(self, doc: dict[str, Any]) -> str | None:
        """An API key the login file itself holds (AgentSpec.broker.file_api_key_hosts); None: none."""
        return None

    def with_file_api_key(self, vm_doc: dict[str, Any], placeholder: str) -> dict[str, Any]:
        """The VM's file (its tokens' placeholders, or {} without tokens) with the key's placeholder; a format
        whose file holds no API key (file_api_key is None) leaves it as it is."""
        return vm_doc

    # -- shared ---------------------------------------------------------------------------------------------------

    def bad(self, what: str) -> StateError:
        return StateError(f"{self.file.path}: {what}, so it is not {self.title}'s login file agentbox can use",
                          f"log in again on the host with `{self.login_command}`, or fix or remove the file")

    def tokens(self) -> Tokens | None:
        doc = self.file.json()
        return None if doc is None else self.parse(doc)

    def store(self, response: dict[str, Any], now: float) -> None:
        doc = self.file.json() or {}
        self.file.write_json(self.apply(doc, response, now))

    def tokens_of(self, response: dict[str, Any], now: float) -> Tokens | None:
        return self.parse(self.apply({}, response, now))

    def account_of(self, response: dict[str, Any], now: float) -> str | None:
        new = self._new_account(response, now)
        return new.shown if new is not None else None

    def replaces(self, response: dict[str, Any], now: float) -> Switch | None:
        new = self._new_account(response, now)
        try:
            doc = self.file.json()
            held = self.parse(doc) if doc is not None else None
        except AgentboxError:  # a host file agentbox cannot read: whose login it is cannot be told
            return Switch(new.shown if new else None, None)
        if doc is None or (held is None and self.file_api_key(doc) is None):
            return None  # no login on the host: nothing is replaced
        host = self._account(self.file.read(), self._companion())
        if new is not None and host is not None and logins.same_account(new, host) is True:
            return None
        return Switch(new.shown if new else None, host.shown if host else None)

    def replace_with(self, response: dict[str, Any], issued: float) -> Path | None:
        """Make a login's token response the host's login, over another account's (the user said yes): the
        previous file is kept as FILE.agentbox-backup (returned; None when there was none)."""
        with self.locked():
            current = self.file.read()
            try:
                doc = self.file.json() or {}
            except StateError:  # a file agentbox cannot read is replaced whole (it is the backup)
                doc = {}
            backup = None
            if current is not None:
                backup = self.file.path.with_name(self.file.path.name + BACKUP_SUFFIX)
                atomic_write(backup, current, mode=0o600)
            self.file.write_json(self.apply(self.without_login(doc), response, issued))
        return backup

    def _new_account(self, response: dict[str, Any], now: float) -> logins.Login | None:
        return self._account(_dump(self.apply({}, response, now)), self.account_companion(response))

    def _account(self, data: bytes | None, companion: bytes | None) -> logins.Login | None:
        """Whose login `data` is, as agentbox.agents.logins reads it; None when it is not one it can read."""
        if self.format is None or data is None:
            return None
        try:
            login = self.format.parse(data)
        except logins.Unusable:
            return None
        return logins.with_companion(self.format, login, companion)

    def _companion(self) -> bytes | None:
        if self.companion is None:
            return None
        try:
            return self.companion.read()
        except StateError:
            return None

    def locked(self) -> AbstractContextManager[None]:
        return self.file.locked()

    def access_placeholder(self, tokens: Tokens) -> str:
        return self.placeholders.get(f"{self.agent}.access", kind_of(tokens.access, self.access_kind))

    def refresh_placeholder(self, tokens: Tokens) -> str:
        return self.placeholders.get(f"{self.agent}.refresh", kind_of(tokens.refresh, self.refresh_kind))

    def placeholders_for(self, tokens: Tokens) -> dict[str, str]:
        ph = {"access": self.access_placeholder(tokens), "refresh": self.refresh_placeholder(tokens)}
        unsigned = unsigned_jwt(tokens.id_token)
        if unsigned is not None:
            ph["id_token"] = unsigned
        return ph

    def placeholder_reply(self, tokens: Tokens, upstream: dict[str, Any] | None, now: float) -> dict[str, Any]:
        return self.reply(tokens, self.placeholders_for(tokens), upstream, now)

    def current_access(self) -> str | None:
        """The host's access token now (Secret.real): None when logged out or unreadable, never an exception."""
        try:
            tokens = self.tokens()
        except AgentboxError:
            return None
        return tokens.access if tokens is not None else None

    def secret(self, tokens: Tokens) -> Secret:
        return self.access_secret(self.access_placeholder(tokens))

    def access_secret(self, placeholder: str) -> Secret:
        """The access token's Secret with `placeholder`: its hosts, where they take it, and for which requests."""
        return Secret(self.agent, placeholder, self.access_hosts, self.current_access, self.access_places,
                      self.access_routes)

    def held(self) -> list[str]:
        """Every real value of the host's login now (none when logged out or unreadable): no answer may carry one."""
        try:
            tokens = self.tokens()
        except AgentboxError:
            return []
        return self.reals(tokens) if tokens is not None else []

    def reals(self, tokens: Tokens) -> list[str]:
        """Every real value of this login, for the scan of what the VM gets."""
        return [value for value in (tokens.access, tokens.refresh, tokens.id_token) if value]


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def string(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) and value else None


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def expires_in(response: dict[str, Any]) -> float | None:
    return number(response.get("expires_in"))


def remaining(tokens: Tokens, now: float) -> int:
    return max(0, int((tokens.expires_at or now) - now))


def routes_of(pairs: Iterable[tuple[str, str]]) -> Mapping[str, tuple[Route, ...]]:
    """host -> its routes, from a record's (host, "METHODS PATH") pairs."""
    found: dict[str, tuple[Route, ...]] = {}
    for host, text in pairs:
        found[host] = (*found.get(host, ()), route(text))
    return MappingProxyType(found)
