"""How an agent's own files change on their way into the VM: parsed and filtered, never copied blindly.

Each transform takes the host file's bytes and returns the bytes the VM gets, and records in `notes`
what it left out or changed and why (`agentbox sync --show` prints them). A file that cannot be
parsed raises Unusable: it is skipped (the launch goes on and says why). Only parsed values are
changed; the one edit made on raw text is the home-prefix rewrite, in files that have no structure
agentbox reads (skills, memory files).

Left out everywhere: hooks, status lines, `notify` and other helper programs (they are programs on
the host, and hooks run them on the agent's every step), and stdio MCP servers whose command is a
host path or a program the VM does not have. HTTP/SSE servers are kept. The values of an MCP
server's `env` and headers are credentials: their names are kept, their values only with
`agents.<name>.sync.mcpSecrets: true`. A host path under the home folder becomes the same path
under the VM's home, unless it lies in a folder the VM mounts (the workspace, `mounts`), which the
VM sees at its mount point.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from agentbox.agents import claude, codex, gemini
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.agents.record import Settings

# Programs a stdio MCP server may start in the VM: what agentbox's provisioning installs (Node.js with
# npm and npx, Docker, git, gh, curl, jq) and what the Ubuntu image has.
GUEST_COMMANDS = ("node", "npm", "npx", "corepack", "docker", "git", "gh", "curl", "jq", "python3", "bash", "sh", "env")
SECRET_MAPS = ("env", "headers", "http_headers")  # values are credentials; names are kept
SECRET_VALUES = ("bearer_token",)  # Codex's inline token: left out unless mcpSecrets
URL_KEYS = ("url", "httpUrl", "serverUrl")
MAX_PARSED = 4 * 1024 * 1024  # settings files larger than this are not parsed
MAX_REWRITTEN = 1024 * 1024  # text files larger than this are copied as they are

HOOKS = "hooks run programs (usually from your host's paths) on the agent's every step; agentbox never syncs them"
CLAUDE_DROPPED = {
    "hooks": HOOKS,
    "statusLine": "it runs a program to draw the status line",
    "apiKeyHelper": "a helper program on your host (the VM has the login itself)",
    "awsAuthRefresh": "a helper program on your host",
    "awsCredentialExport": "a helper program on your host",
    "otelHeadersHelper": "a helper program on your host",
    "fileSuggestion": "it runs a program to suggest files",
}
GEMINI_DROPPED = {
    ("hooks",): HOOKS,
    ("tools", "discoveryCommand"): "it runs a program on your host to find tools",
    ("tools", "callCommand"): "it runs a program on your host to call tools",
    ("mcp", "serverCommand"): "it starts a program on your host as an MCP server",
    ("tools", "approvalMode"): "current Gemini CLI rejects it (agentbox passes --approval-mode=yolo)",
}
CODEX_DROPPED = {"notify": "it runs a program after each turn", "hooks": HOOKS}


class Unusable(ValueError):
    """The file cannot be parsed; it is not brought into the VM (the message says why)."""


class Note(NamedTuple):
    where: str  # the key path inside the file ("" for the whole file)
    what: str  # "dropped", "changed" or "kept"
    why: str


class Context(NamedTuple):
    agent: str
    host_home: str
    guest_home: str
    mounts: tuple[tuple[str, str], ...]  # (host folder, where the VM sees it)
    synced: tuple[str, ...]  # host folders brought into the VM (a command inside one exists there)
    mcp_secrets: bool
    workspace: str = ""  # the project's folder (the same path in the VM): ~/.claude.json keeps only its entries

    def key(self) -> str:
        """What the transforms' output depends on besides the file: a change re-makes every staged copy."""
        forced = [spec.settings.values for spec in BUILTIN_AGENTS.values() if spec.settings is not None]
        text = json.dumps([FORMAT, list(self), forced, GUEST_COMMANDS], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


FORMAT = 1  # bump when a transform's output changes for the same input


class Rewriter:
    """Host paths under the home folder, rewritten for the VM (a home-prefix rewrite, nothing else)."""

    def __init__(self, context: Context) -> None:
        self.context = context
        homes = sorted({context.host_home.rstrip("/")} - {""}, key=len, reverse=True)
        self.homes = homes
        # The home folder where a path starts: not inside a longer name, followed by / or the end of the path.
        self.pattern = (
            re.compile(
                r"(?<![\w.~/-])(?:" + "|".join(map(re.escape, homes)) + r")(?P<rest>/[^\s\"'`<>|;:,()\[\]{}\\]*)?"
                r"(?![\w.-])"
            )
            if homes
            else None
        )

    def path(self, path: str) -> str:
        """Where the VM finds a host path (unchanged when it is not under the home folder)."""
        for location, mount_point in self.context.mounts:
            if path == location or path.startswith(location.rstrip("/") + "/"):
                return mount_point.rstrip("/") + path[len(location.rstrip("/")):] if location != "/" else path
        for home in self.homes:
            if path == home or path.startswith(home + "/"):
                return self.context.guest_home.rstrip("/") + path[len(home):]
        return path

    def text(self, text: str) -> str:
        if self.pattern is None or not any(home in text for home in self.homes):
            return text
        return self.pattern.sub(lambda match: self.path(match.group(0)), text)

    def tree(self, value: Any) -> Any:
        """Every string of parsed JSON/TOML data, keys included, rewritten."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.tree(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.tree(item) for item in value]
        return value


# -- the transforms --------------------------------------------------------------------------------

Transform = Callable[[bytes, Context, list[Note]], bytes]


def claude_settings(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """~/.claude/settings.json: no hooks or helper programs; approvals off, as in every agentbox VM."""
    settings = _json_object(data)
    result = _without(settings, {(key,): why for key, why in CLAUDE_DROPPED.items()}, notes)
    _apply(result, claude.RECORD.settings, notes)
    return _json_out(data, settings, Rewriter(context).tree(result))


def claude_json(data: bytes, context: Context, notes: list[Note], bring_servers: bool = True) -> bytes:
    """~/.claude.json (a login file, staged with the credentials): its MCP servers filtered, or all left out."""
    state = _json_object(data)
    result = dict(state)
    rewriter = Rewriter(context)
    if "mcpServers" in result:
        if bring_servers:
            result["mcpServers"] = rewriter.tree(_servers(result["mcpServers"], "mcpServers", context, notes))
        else:
            del result["mcpServers"]
            notes.append(Note("mcpServers", "dropped", "sync.agentConfig is false"))
    projects = result.get("projects")
    if isinstance(projects, dict):
        # Only this workspace's entries (its worktrees' too): the VM never sees the other projects' history,
        # paths and allowed tools.
        inside = context.workspace.rstrip("/") + "/"
        projects = {folder: project for folder, project in projects.items()
                    if context.workspace and (folder == context.workspace or folder.startswith(inside))}
        # Per-project servers: the workspace has the same path in the VM, so Claude Code would use them there.
        filtered = {}
        for folder, project in projects.items():
            if isinstance(project, dict) and isinstance(project.get("mcpServers"), dict) and project["mcpServers"]:
                where = f"projects[{folder}].mcpServers"
                servers = _servers(project["mcpServers"], where, context, notes) if bring_servers else {}
                project = {**project, "mcpServers": rewriter.tree(servers)}
            filtered[folder] = project
        result["projects"] = filtered
    return _json_out(data, state, result)


def codex_config(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """~/.codex/config.toml: no notify program; MCP servers filtered; approvals off."""
    if len(data) > MAX_PARSED:
        raise Unusable(f"it is larger than {MAX_PARSED:,} bytes")
    config = _toml(data)
    result = _without(config, {(key,): why for key, why in CODEX_DROPPED.items()}, notes)
    if "mcp_servers" in result:
        result["mcp_servers"] = _servers(result["mcp_servers"], "mcp_servers", context, notes)
    _apply(result, codex.RECORD.settings, notes)
    result = Rewriter(context).tree(result)
    if result == config:
        return data
    # deferred: start-up (tomli_w, ~2.5 ms: only writing codex's config needs it)
    import tomli_w  # (imported here: only a launch that rewrites the file needs it)

    # Comments and layout are not kept (the VM gets a filtered copy; the host's file is never rewritten).
    return tomli_w.dumps(result).encode()


def toml_parser() -> Any:
    """The TOML reader: tomllib, which is tomli 2.0 taken into the standard library in 3.11; tomli before."""
    if sys.version_info >= (3, 11):
        # deferred: start-up (tomllib, ~8 ms: only reading a TOML file needs it)
        import tomllib
    else:
        # deferred: start-up (tomli, the tomllib of Python 3.10, ~8 ms: only reading a TOML file needs it)
        import tomli as tomllib
    return tomllib


def _toml(data: bytes) -> dict[str, Any]:
    tomllib = toml_parser()
    try:
        parsed: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
        return parsed
    except UnicodeDecodeError:
        raise Unusable("it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise Unusable(f"it is not valid TOML ({exc})") from None


def gemini_settings(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """~/.gemini/settings.json (comments allowed, as Gemini CLI reads it): hooks, helper commands and yolo
    in settings left out, MCP servers filtered; the login type of a new VM when none is set."""
    settings = _json_object(strip_json_comments(data))
    result = _without(settings, GEMINI_DROPPED, notes)
    general = result.get("general")
    if isinstance(general, dict) and general.get("defaultApprovalMode") == "yolo":
        result["general"] = {k: v for k, v in general.items() if k != "defaultApprovalMode"}
        notes.append(Note("general.defaultApprovalMode", "dropped",
                          "current Gemini CLI rejects yolo here (agentbox passes --approval-mode=yolo)"))
    for key in ("tools", "general", "mcp"):
        if result.get(key) == {} and settings.get(key) != {}:
            del result[key]
    if "mcpServers" in result:
        result["mcpServers"] = _servers(result["mcpServers"], "mcpServers", context, notes)
    _apply(result, gemini.RECORD.settings, notes)
    return _json_out(data, settings, Rewriter(context).tree(result))


def mcp_file(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """A file whose `mcpServers` are filtered (Kiro's settings/mcp.json, a Gemini extension's manifest)."""
    document = _json_object(data)
    result = dict(document)
    if "mcpServers" in result:
        result["mcpServers"] = _servers(result["mcpServers"], "mcpServers", context, notes)
    return _json_out(data, document, Rewriter(context).tree(result))


def kiro_agent(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """A Kiro agent (~/.kiro/agents/NAME.json): its hooks left out, its MCP servers filtered."""
    document = _json_object(data)
    result = _without(document, {("hooks",): HOOKS}, notes)
    if "mcpServers" in result:
        result["mcpServers"] = _servers(result["mcpServers"], "mcpServers", context, notes)
    return _json_out(data, document, Rewriter(context).tree(result))


def text(data: bytes, context: Context, notes: list[Note]) -> bytes:
    """Any other file: host home paths rewritten in text (UTF-8, no NUL, at most 1 MiB); others as they are."""
    if len(data) > MAX_REWRITTEN or b"\0" in data or context.host_home.encode() not in data:
        return data
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    rewritten = Rewriter(context).text(decoded)
    if rewritten != decoded:
        notes.append(Note("", "changed", "paths under your home folder point to the VM's home"))
    return rewritten.encode("utf-8")


# The transforms by the name an agent's record gives (AgentSpec.sync_transforms).
TRANSFORMS: dict[str, Transform] = {
    "claude_settings": claude_settings,
    "codex_config": codex_config,
    "gemini_settings": gemini_settings,
    "mcp_file": mcp_file,
    "kiro_agent": kiro_agent,
    "text": text,
}


# Login files that also hold the agent's setup (AgentSpec.login_transforms): bring_servers False leaves their
# MCP servers out (sync.agentConfig: false).
LoginTransform = Callable[[bytes, Context, list[Note], bool], bytes]
LOGIN_TRANSFORMS: dict[str, LoginTransform] = {"claude_json": claude_json}


def transform_for(agent: str, inner: str) -> Transform:
    """The transform of a file at `inner` in the agent's folder (`settings.json`, `agents/x.json`): the one its
    record names for the first pattern that matches, else `text`."""
    spec = BUILTIN_AGENTS.get(agent)
    parts = inner.split("/")
    for pattern, name in spec.sync_transforms if spec else ():
        segments = pattern.split("/")
        if len(segments) == len(parts) and all(map(fnmatchcase, parts, segments)):
            return TRANSFORMS[name]
    return text


# -- MCP servers -----------------------------------------------------------------------------------


def _servers(servers: Any, where: str, context: Context, notes: list[Note]) -> dict[str, Any]:
    if not isinstance(servers, dict):
        notes.append(Note(where, "dropped", "not a mapping of servers"))
        return {}
    kept = {}
    for name, server in servers.items():
        at = f"{where}.{name}"
        if not isinstance(server, dict):
            notes.append(Note(at, "dropped", "not a server's settings (a mapping)"))
            continue
        problem = _command_problem(server, context)
        if problem:
            notes.append(Note(at, "dropped", problem))
            continue
        kind = "a stdio server (runs " + str(server["command"]).split()[0] + " in the VM)" if "command" in server \
            else "a remote (http/sse) server"
        notes.append(Note(at, "kept", kind))
        kept[name] = _secrets_left_out(server, at, context, notes)
    return kept


def _command_problem(server: dict[str, Any], context: Context) -> str | None:
    """Why a stdio server cannot start in the VM; None for one that can and for an http/sse server."""
    command = server.get("command")
    if command is None:
        if any(isinstance(server.get(key), str) for key in URL_KEYS):
            return None
        return "it has neither a command nor a url"
    if not isinstance(command, str) or not command.strip():
        return "its command is not a program name"
    program = command.strip().split()[0]
    if "/" in program or program.startswith("~"):
        host = program.replace("~", context.host_home, 1) if program.startswith("~") else program
        inside = [*(location for location, _ in context.mounts), *context.synced]
        if host.startswith("/") and any(host.startswith(folder.rstrip("/") + "/") for folder in inside):
            return None
        return f"its command {program} is a path on your host, which the VM does not have"
    if program not in GUEST_COMMANDS:
        return (f"its command {program} is not installed in agentbox's VM (it has {', '.join(GUEST_COMMANDS)}; "
                "other programs: install them with bootstrap.onCreateScript and add the server in the VM)")
    return None


def _secrets_left_out(server: dict[str, Any], where: str, context: Context, notes: list[Note]) -> dict[str, Any]:
    if context.mcp_secrets:
        return server
    result = dict(server)
    for key in SECRET_MAPS:
        values = server.get(key)
        if isinstance(values, dict) and any(value not in ("", None) for value in values.values()):
            result[key] = dict.fromkeys(values, "")
            notes.append(Note(f"{where}.{key}", "changed",
                              f"values left out, names kept ({', '.join(map(str, values))}); "
                              f"agents.{context.agent}.sync.mcpSecrets: true brings them"))
    for key in SECRET_VALUES:
        if key in server:
            del result[key]
            notes.append(Note(f"{where}.{key}", "dropped",
                              f"a credential; agents.{context.agent}.sync.mcpSecrets: true brings it"))
    return result


# -- helpers ---------------------------------------------------------------------------------------


def _json_object(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_PARSED:
        raise Unusable(f"it is larger than {MAX_PARSED:,} bytes")
    try:
        parsed = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise Unusable("it is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise Unusable(f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(parsed, dict):
        raise Unusable("it is not a JSON object ({...})")
    return parsed


def _json_out(original: bytes, parsed: dict[str, Any], result: dict[str, Any]) -> bytes:
    """The original bytes when nothing changed (its layout kept), else the result as indented JSON."""
    if result == parsed and json.dumps(result) == json.dumps(parsed):
        return original
    return (json.dumps(result, indent=2, ensure_ascii=False) + "\n").encode()


def _without(data: dict[str, Any], dropped: dict[tuple[str, ...], str], notes: list[Note]) -> dict[str, Any]:
    """data without the key paths in `dropped` (copies only the mappings on the way)."""
    result = dict(data)
    for path, why in dropped.items():
        parent: Any = result
        for part in path[:-1]:
            child = parent.get(part) if isinstance(parent, dict) else None
            if not isinstance(child, dict):
                parent = None
                break
            parent[part] = dict(child)
            parent = parent[part]
        if isinstance(parent, dict) and path[-1] in parent:
            del parent[path[-1]]
            notes.append(Note(".".join(path), "dropped", why))
    return result


def _apply(result: dict[str, Any], settings: Settings | None, notes: list[Note]) -> None:
    """agentbox's settings for the agent (its record's): forced, or filled in where the file has none."""
    if settings is not None:
        (_force if settings.forced else _defaults)(result, settings.values, notes, settings.why)


def _force(result: dict[str, Any], values: dict[str, Any], notes: list[Note], why: str, prefix: str = "") -> None:
    """Set agentbox's values (deeply), noting each that differed."""
    for key, value in values.items():
        where = f"{prefix}{key}"
        if isinstance(value, dict):
            child = result.get(key)
            result[key] = dict(child) if isinstance(child, dict) else {}
            _force(result[key], value, notes, why, where + ".")
        elif result.get(key) != value:
            if key in result:
                notes.append(Note(where, "changed", f"{json.dumps(result[key])} -> {json.dumps(value)}: {why}"))
            result[key] = value


def _defaults(result: dict[str, Any], values: dict[str, Any], notes: list[Note], why: str, prefix: str = "") -> None:
    """Fill in agentbox's values where the host's file has none."""
    for key, value in values.items():
        where = f"{prefix}{key}"
        child = result.get(key)
        if isinstance(value, dict):
            if child is None or isinstance(child, dict):
                result[key] = dict(child or {})
                _defaults(result[key], value, notes, why, where + ".")
        elif key not in result:
            result[key] = value
            notes.append(Note(where, "changed", f"set to {json.dumps(value)}: {why}"))


def strip_json_comments(data: bytes) -> bytes:
    """JSON with // and /* */ comments (as Gemini CLI accepts) -> JSON; strings are left alone."""
    if b"/" not in data:
        return data
    out = bytearray()
    i, n = 0, len(data)
    in_string = False
    while i < n:
        char = data[i]
        if in_string:
            out.append(char)
            if char == 0x5C and i + 1 < n:  # backslash: keep the escaped byte
                out.append(data[i + 1])
                i += 2
                continue
            if char == 0x22:
                in_string = False
            i += 1
        elif char == 0x22:
            in_string = True
            out.append(char)
            i += 1
        elif data.startswith(b"//", i):
            end = data.find(b"\n", i)
            i = n if end < 0 else end
        elif data.startswith(b"/*", i):
            end = data.find(b"*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(0x20)
        else:
            out.append(char)
            i += 1
    return bytes(out)
