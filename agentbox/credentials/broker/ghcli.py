"""The GitHub CLI's login as the broker keeps it: the token in ~/.config/gh/hosts.yml (or, on macOS, the
Keychain through `gh auth token`) stays on the host; the VM's hosts.yml names the same user with a placeholder.
The token may go to github.com and gist.github.com (git over HTTPS: Basic, as `gh auth git-credential` hands it
to git), api.github.com (`token`, as gh sends it, or Bearer) and uploads.github.com (release assets), and there
only as agentbox.net.github allows. Other hosts in hosts.yml (GitHub Enterprise) are not brokered and do not reach
the VM."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from agentbox.credentials import loginfiles
from agentbox.credentials.broker import ghhosts
from agentbox.credentials.hostfile import HostFile
from agentbox.errors import StateError
from agentbox.net.broker import place

HOST = "github.com"
HOSTS = frozenset({"github.com", "gist.github.com", "api.github.com", "uploads.github.com"})
# GitHub takes a token as `Authorization: token`, Bearer, or Basic's password (git; `https://TOKEN@github.com` puts it
# in the user name), on each of its hosts.
PLACES = tuple(place(text) for text in ("authorization token", "authorization bearer", "authorization basic"))
LOGIN_COMMAND = "gh auth login"


class GhLogin:
    def __init__(self, path: Path | None = None) -> None:
        self.file = HostFile(path or Path(os.path.expanduser(loginfiles.GH_FILES[0])))
        self._keychain: tuple[bytes | None, str | None] | None = None
        self._guard = threading.Lock()

    def entry(self) -> dict[str, Any] | None:
        """hosts.yml's github.com entry (None: no file or no entry); a StateError for a malformed file."""
        data = self.file.read()
        if data is None:
            return None
        try:
            doc = _load(data)
        except _yaml().YAMLError as exc:
            raise StateError(f"{self.file.path} is not valid YAML ({str(exc).splitlines()[0]})",
                             f"log in again on the host with `{LOGIN_COMMAND}`, or fix the file") from exc
        if doc is None:
            return None
        if not isinstance(doc, dict):
            raise StateError(f"{self.file.path} is not a mapping of hosts",
                             f"log in again on the host with `{LOGIN_COMMAND}`, or fix the file")
        entry = doc.get(HOST)
        if entry is not None and not isinstance(entry, dict):
            raise StateError(f"{self.file.path}: its {HOST} entry is not a mapping",
                             f"log in again on the host with `{LOGIN_COMMAND}`, or fix the file")
        return entry

    def others(self) -> list[str]:
        data = self.file.read()
        try:
            doc = _load(data) if data else None
        except _yaml().YAMLError:
            return []
        return sorted(str(host) for host in doc if host != HOST) if isinstance(doc, dict) else []

    def token(self) -> str | None:
        """The host's token now: hosts.yml's, else the Keychain's (asked again only when hosts.yml changed)."""
        entry = self.entry()
        if entry is not None:
            token = _token_of(entry)
            if token:
                return token
        data = self.file.read()
        with self._guard:
            if self._keychain is not None and self._keychain[0] == data:
                return self._keychain[1]
        token = loginfiles.gh_token_from_keychain()
        with self._guard:
            self._keychain = (data, token)
        return token

    def current(self) -> str | None:
        try:
            return self.token()
        except StateError:
            return None

    def vm_hosts_yml(self, placeholder: str) -> bytes:
        entry = self.entry() or {}
        user = entry.get("user")
        vm_entry: dict[str, Any] = {"git_protocol": entry.get("git_protocol") or "https", "oauth_token": placeholder}
        if isinstance(user, str) and user:
            vm_entry["user"] = user
            vm_entry["users"] = {user: {"oauth_token": placeholder}}
        text = ghhosts.dump({HOST: vm_entry})
        if text is None:
            text = _yaml().safe_dump({HOST: vm_entry}, default_flow_style=False, sort_keys=True)
        return text.encode()


def _token_of(entry: dict[str, Any]) -> str | None:
    token = entry.get("oauth_token")
    if isinstance(token, str) and token:
        return token
    users = entry.get("users")
    user = entry.get("user")
    if isinstance(users, dict) and isinstance(users.get(user), dict):
        token = users[user].get("oauth_token")
        if isinstance(token, str) and token:
            return token
    return None


def _load(data: bytes) -> Any:
    """The file as PyYAML reads it: gh's own shape without PyYAML, anything else with it."""
    small = ghhosts.load(data)
    return small[0] if small is not None else _yaml().safe_load(data)


def _yaml() -> Any:
    """PyYAML, loaded only for a hosts.yml that is not in gh's own shape (ghhosts)."""
    # deferred: start-up (yaml, ~22 ms: only a gh login file ghhosts declines is parsed)
    import yaml

    return yaml
