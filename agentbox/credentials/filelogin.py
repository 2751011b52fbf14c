"""An agent's OAuth login kept in a JSON file on the host, as the broker uses it: its tokens, the VM's
placeholders for them, the Secret the proxy substitutes, and the token endpoint's answers. Each brokered agent
(broker_claude, broker_codex, broker_gemini) says where its tokens are in the file and in the replies."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agentbox.agents.record import AgentSpec
from agentbox.credentials.hostfile import HostFile
from agentbox.credentials.placeholders import Placeholders, kind_of
from agentbox.credentials.tokens import Tokens
from agentbox.errors import AgentboxError, StateError
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

    def locked(self) -> AbstractContextManager[None]:
        return self.file.locked()

    def access_placeholder(self, tokens: Tokens) -> str:
        return self.placeholders.get(f"{self.agent}.access", kind_of(tokens.access, self.access_kind))

    def refresh_placeholder(self, tokens: Tokens) -> str:
        return self.placeholders.get(f"{self.agent}.refresh", kind_of(tokens.refresh, self.refresh_kind))

    def placeholders_for(self, tokens: Tokens) -> dict[str, str]:
        from agentbox.credentials.tokens import unsigned_jwt

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
