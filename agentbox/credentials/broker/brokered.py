"""The credentials side of the broker: for the brokered agents (Claude Code, Codex, Gemini CLI, the GitHub
CLI), what the VM gets instead of the host's logins, and what the proxy needs to put the real values back.

    prepare(vm, config) -> Prepared
        files     guest path (relative to the home) -> bytes: the login files of the real shape, every
                  secret a placeholder (the VM's own, agentbox.credentials.placeholders)
        env       variables the session gets instead of the config's (API keys as placeholders)
        secrets   agentbox.net.broker.Secret: placeholder, the hosts its real value may go to, real()
        endpoints (host, path) -> TokenEndpoint: OAuth refreshes and code exchanges answered on the host
        hosts     every credential host (for agentbox.net.certauthority.ensure and Brokering.leaves)
        replaced  the host files (`~/...` as in the agents' credentials) staging must no longer copy
        notes     what to tell the user (a missing login: "log in on the host with ...")

A login that is missing or logged out is a note and nothing of it is staged; a malformed one is a StateError
naming the file. What the VM gets is scanned for every real value before it is returned.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import lazyre
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.agents.record import AgentSpec, ApiKey
from agentbox.credentials.broker import anthropic, ghcli, google, openai
from agentbox.credentials.filelogin import FileLogin
from agentbox.credentials.hostfile import HostFile, parse_json
from agentbox.credentials.loginfiles import guest_path_for
from agentbox.credentials.placeholders import Placeholders, is_placeholder, kind_of
from agentbox.credentials.tokens import TokenHandler, Upstream
from agentbox.errors import StateError
from agentbox.net.broker import PLACEHOLDER_MARK, Secret, TokenEndpoint, place

if TYPE_CHECKING:
    from agentbox.config.load import Config

# The login files' shapes and their companions' makers, by the names the agents' records use (AgentSpec.broker).
FORMATS: dict[str, type[FileLogin]] = {
    "claude_oauth": anthropic.ClaudeLogin, "codex_auth": openai.CodexLogin,
    "gemini_oauth": google.GeminiLogin,
}
COMPANIONS: dict[str, Callable[[bytes, str | None], bytes]] = {"claude_json": anthropic.claude_json_for_vm}
# The agents whose logins the broker keeps (the GitHub CLI's is kept with them, with `credentials.gh`).
SPECS: dict[str, AgentSpec] = {name: spec for name, spec in BUILTIN_AGENTS.items() if spec.broker is not None}
BROKERED = tuple(SPECS)
GH_PLACES = ("authorization token", "authorization bearer", "authorization basic")
GH_API_KEYS = (ApiKey("GH_TOKEN", "gho_", tuple(ghcli.HOSTS), GH_PLACES),
               ApiKey("GITHUB_TOKEN", "gho_", tuple(ghcli.HOSTS), GH_PLACES))
_PLACEHOLDERS = lazyre.compile(rb"[A-Za-z0-9._/-]*" + re.escape(PLACEHOLDER_MARK.encode()) + rb"[0-9a-f]{24}")
MAX_COMPANION = 32 << 20  # ~/.claude.json keeps per-project history: several MB


class Prepared:
    """What prepare_request gathers, filled in as it goes (a plain class: a launch does not import dataclasses)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.env: dict[str, str] = {}
        self.secrets: list[Secret] = []
        self.endpoints: dict[tuple[str, str], TokenEndpoint] = {}
        self.replaced: set[str] = set()
        self.notes: list[str] = []
        self.brokered: list[str] = []  # the agents (and "gh") whose logins are brokered
        self.missing: dict[str, str] = {}  # {agent (or "gh"): its note} for a login the host lacks
        self.held: list[Callable[[], list[str]]] = []  # each login's real values now (the broker's answer scan)

    def held_now(self) -> list[str]:
        """Every real value the host's logins hold now: no answer from a credential host may carry one back."""
        return [value for read in self.held for value in read()]

    def replaces(self, host_path: Path) -> bool:
        """Whether `host_path` (expanded) is one of the host login files the VM gets a placeholder version of."""
        return any(Path(os.path.expanduser(spec)) == host_path for spec in self.replaced)

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(host for secret in self.secrets for host in secret.hosts) | frozenset(
            host for host, _ in self.endpoints)


class Request(NamedTuple):
    """What `prepare` reads from the config: the brokered agents' login files, the GitHub CLI, the API keys.

    The launch writes it (with its real API keys) to a 0600 file in the VM's state folder for the broker
    process, which makes the same Prepared from it (agentbox.credentials.broker.process)."""

    agents: dict[str, tuple[str, ...]]  # brokered agent -> its credentials (`~/...`)
    gh: bool
    env: dict[str, str]  # the config's env, only the variables of API_KEYS

    def to_json(self) -> dict[str, object]:
        return {"agents": {name: list(files) for name, files in self.agents.items()}, "gh": self.gh,
                "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: object) -> Request:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        agents = data.get("agents")
        env = data.get("env")
        if not isinstance(agents, dict) or not isinstance(env, dict):
            raise ValueError("agents and env must be objects")
        return cls({str(k): tuple(str(f) for f in v) for k, v in agents.items() if isinstance(v, list)},
                   bool(data.get("gh")), {str(k): str(v) for k, v in env.items()})


def title_of(agent: str) -> str | None:
    """The brokered agent's name as its notes begin ("Claude Code"), None for an agent that is not brokered."""
    spec = SPECS.get(agent)
    return spec.title if spec is not None else None


def _api_keys_of(name: str) -> tuple[ApiKey, ...]:
    spec = SPECS.get(name)
    if spec is not None and spec.broker is not None:
        return spec.broker.api_keys
    return GH_API_KEYS if name == "gh" else ()


def request_of(config: Config, agents: Iterable[str] | None = None) -> Request | None:
    """The broker's request for `agents` (None: every configured one); None when credentials are off."""
    settings = config.credentials
    if not settings.enabled:
        return None
    names = list(config.agents) if agents is None else list(agents)
    chosen = {name: tuple(config.agents[name].credentials) for name in names
              if name in BROKERED and name in config.agents and config.agents[name].builtin}
    variables = {key.variable for name in [*chosen, "gh"] for key in _api_keys_of(name)}
    return Request(chosen, settings.gh, {k: v for k, v in config.env.items() if k in variables})


def prepare(vm_name: str, config: Config, agents: Iterable[str] | None = None, upstream: Upstream | None = None
            ) -> Prepared:
    """What the VM gets for the brokered agents among `agents` (None: every configured one) and the GitHub CLI."""
    request = request_of(config, agents)
    return Prepared() if request is None else prepare_request(vm_name, request, upstream)


def prepare_request(vm_name: str, request: Request, upstream: Upstream | None = None) -> Prepared:
    prepared = Prepared()
    placeholders = Placeholders(vm_name)
    reals: list[str] = []
    for name, credentials in request.agents.items():
        spec = SPECS.get(name)
        if spec is None or spec.broker is None:
            continue
        _file_login(prepared, placeholders, spec, credentials, upstream, reals)
        _api_keys(prepared, placeholders, name, request.env, reals)
        _companion(prepared, spec, credentials)
        if name in prepared.brokered:  # an API key in the env is a login: no note about the file
            prepared.notes[:] = [note for note in prepared.notes if not note.startswith(spec.title + ":")]
    if request.gh:
        _gh(prepared, placeholders, request.env, reals)
    _scan(prepared, reals)
    return prepared


def file_login(vm_name: str, config: Config, agent: str) -> FileLogin | None:
    """The agent's brokered login file on the host (None: the agent is not brokered, or its credentials do not
    name its login file), as the broker process for `vm` keeps it."""
    spec = SPECS.get(agent)
    if spec is None or agent not in config.agents:
        return None
    host_path = _login_file(spec, config.agents[agent].credentials)
    return _format_login(spec, host_path, Placeholders(vm_name)) if host_path is not None else None


def _login_file(spec: AgentSpec, credentials: Iterable[str]) -> str | None:
    """Which of the agent's credentials (`~/...`) is its login file."""
    assert spec.broker is not None
    return next((c for c in credentials if guest_path_for(c) == f"~/{spec.broker.login_file}"), None)


def _format_login(spec: AgentSpec, host_path: str, placeholders: Placeholders) -> FileLogin:
    assert spec.broker is not None
    return FORMATS[spec.broker.format](Path(os.path.expanduser(host_path)), placeholders, spec)


def foreign_tokens(vm_name: str, agent: str, host_path: Path, data: bytes) -> bool:
    """Whether the VM's copy of the agent's brokered login file (for the host file `host_path`) holds a credential
    that is not a placeholder: a login that did not come through the broker. A copy that is not such a login
    file holds none."""
    spec = SPECS.get(agent)
    if spec is None or spec.broker is None:
        return False
    login = FORMATS[spec.broker.format](host_path, Placeholders(vm_name), spec)
    try:
        doc = parse_json(host_path, data)
        tokens = login.parse(doc)
    except StateError:
        return False
    values = [tokens.access, tokens.refresh] if tokens is not None else []
    return any(value and not is_placeholder(value) for value in [*values, login.file_api_key(doc)])


def _file_login(prepared: Prepared, placeholders: Placeholders, spec: AgentSpec, credentials: Iterable[str],
                upstream: Upstream | None, reals: list[str]) -> None:
    broker = spec.broker
    assert broker is not None
    name = spec.name
    host_path = _login_file(spec, credentials)
    if host_path is None:
        return
    prepared.replaced.add(host_path)
    login = _format_login(spec, host_path, placeholders)
    doc = login.file.json()
    tokens = login.parse(doc) if doc is not None else None
    handler = TokenHandler(login, upstream, vm=placeholders.vm)
    for key in broker.token_endpoints:
        prepared.endpoints[key] = handler
    if tokens is not None and doc is not None:
        ph = login.placeholders_for(tokens)
        prepared.files[broker.login_file] = _dump(login.vm_file(doc, tokens, ph))
        prepared.secrets.append(login.secret(tokens))
        reals.extend(login.reals(tokens))
    else:
        # No login on the host yet: one made inside the VM (`agentbox AGENT login`) reaches the host through the
        # token endpoint, and the VM then uses this placeholder, whose real value is read when it is used.
        placeholder = placeholders.get(f"{name}.access", login.access_kind)
        prepared.secrets.append(login.access_secret(placeholder))
    prepared.held.append(login.held)
    file_key = login.file_api_key(doc) if doc is not None and broker.file_api_key_hosts else None
    if file_key is not None:
        _file_api_key(prepared, placeholders, login, broker.login_file, file_key,
                      frozenset(broker.file_api_key_hosts), reals)
    if tokens is not None or file_key is not None:
        prepared.brokered.append(name)
    else:
        missing = "is missing" if doc is None else "holds no login"
        text = (f"{login.title}: no login on the host ({login.file.path} {missing}); log in with `agentbox {name} "
                f"login` (in the VM; the login is kept on this machine), or, if you also run {name} outside agentbox, "
                f"on the host with `{login.login_command}`")
        prepared.notes.append(text)
        prepared.missing[name] = text


def _file_api_key(prepared: Prepared, placeholders: Placeholders, login: FileLogin, relative: str, key: str,
                  hosts: frozenset[str], reals: list[str]) -> None:
    """An API key the login file holds (Codex's auth.json: an API-key login, or one beside the ChatGPT tokens): its
    service takes it where it takes the access token."""
    login_places = login.access_places
    placeholder = placeholders.get(f"{login.agent}.file_api_key", kind_of(key, "sk-"))

    def real() -> str | None:
        try:
            doc = login.file.json()
        except StateError:
            return None
        return login.file_api_key(doc) if doc is not None else None

    prepared.secrets.append(Secret(login.agent, placeholder, hosts, real, login_places))
    reals.append(key)
    current = json.loads(prepared.files[relative]) if relative in prepared.files else {}
    prepared.files[relative] = _dump(login.with_file_api_key(current, placeholder))


def _companion(prepared: Prepared, spec: AgentSpec, credentials: Iterable[str]) -> None:
    """The VM's version of another file of the login (~/.claude.json without the secrets it may hold), made with
    the placeholder of the agent's API key when the env has one (Claude Code approves that key)."""
    assert spec.broker is not None
    if spec.broker.companion is None:
        return
    relative, maker = spec.broker.companion
    host_path = next((c for c in credentials if guest_path_for(c) == f"~/{relative}"), None)
    if host_path is None:
        return
    path = Path(os.path.expanduser(host_path))
    data = HostFile(path, MAX_COMPANION).read()
    prepared.replaced.add(host_path)
    if data is None:
        return
    key = next((prepared.env[k.variable] for k in spec.broker.api_keys if k.variable in prepared.env), None)
    try:
        prepared.files[relative] = COMPANIONS[maker](data, key)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{path} is not a JSON object ({exc})", f"fix or remove the file; {spec.title} remakes it"
                         ) from exc


def _api_keys(prepared: Prepared, placeholders: Placeholders, name: str, env: dict[str, str],
              reals: list[str]) -> None:
    for key in _api_keys_of(name):
        value = env.get(key.variable)
        if not value:
            continue
        placeholder = placeholders.get(f"env.{key.variable}", kind_of(value, key.kind))
        prepared.env[key.variable] = placeholder
        prepared.secrets.append(Secret(name, placeholder, frozenset(key.hosts), _constant(value),
                                       tuple(place(text) for text in key.places)))
        prepared.held.append(_constant_list(value))
        reals.append(value)
        if name not in prepared.brokered:
            prepared.brokered.append(name)


def _gh(prepared: Prepared, placeholders: Placeholders, env: dict[str, str], reals: list[str]) -> None:
    _api_keys(prepared, placeholders, "gh", env, reals)
    login = ghcli.GhLogin()
    prepared.replaced.add(ghcli.loginfiles.GH_FILES[0])
    token = login.token() if "GH_TOKEN" not in env else None
    others = login.others()
    if others:
        prepared.notes.append(f"GitHub CLI: the logins for {', '.join(others)} in {login.file.path} stay on the "
                              "host (only github.com is brokered)")
    if token is None:
        if "GH_TOKEN" not in env and "GITHUB_TOKEN" not in env:
            text = (f"GitHub CLI: no login on the host ({login.file.path}); log in on the host with "
                    f"`{ghcli.LOGIN_COMMAND}`")
            prepared.notes.append(text)
            prepared.missing["gh"] = text
        return
    placeholder = placeholders.get("gh.token", kind_of(token, "gho_"))
    prepared.files[".config/gh/hosts.yml"] = login.vm_hosts_yml(placeholder)
    if login.entry() is None or not ghcli._token_of(login.entry() or {}):
        prepared.env["GH_TOKEN"] = placeholder  # the Keychain's token: the VM's gh gets it as today, by GH_TOKEN
    prepared.secrets.append(Secret("gh", placeholder, ghcli.HOSTS, login.current, ghcli.PLACES))
    prepared.held.append(lambda: [value for value in (login.current(),) if value])
    reals.append(token)
    if "gh" not in prepared.brokered:
        prepared.brokered.append("gh")


def _constant(value: str) -> Callable[[], str | None]:
    return lambda: value


def _constant_list(value: str) -> Callable[[], list[str]]:
    return lambda: [value]


def _dump(doc: object) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def _scan(prepared: Prepared, reals: list[str]) -> None:
    """No real value reaches the VM, whatever a host file holds where agentbox did not expect it. The placeholders
    themselves are taken out first: a short real value may be the start of one (`sk-ant-oat01-a...`)."""
    files = {path: _PLACEHOLDERS.sub(b"", data) for path, data in prepared.files.items()}
    env = [_PLACEHOLDERS.sub(b"", value.encode()) for value in prepared.env.values()]
    for value in reals:
        if len(value) < 8:
            continue
        needle = value.encode()
        for path, data in files.items():
            if needle in data:
                raise StateError(f"the VM's ~/{path} would hold a real credential; agentbox stages nothing for it",
                                 "report this as a bug in agentbox")
        if any(needle in env_value for env_value in env):
            raise StateError("the VM's environment would hold a real credential", "report this as a bug in agentbox")
