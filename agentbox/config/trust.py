"""Trust for a project's agentbox.yml: anyone who can write the repository (the agent included) can write it.

A local config that widens what the VM gets from the host, or decides what runs in it with your
logins present, is used only after `agentbox trust`. Trust is recorded in the user's state folder
(outside every workspace) as a manifest: the digest of the file's bytes as agentbox parsed them, and
for every host path the file makes agentbox read, stage, render or mount, where that path resolves to
and, for files agentbox reads, their content (see pins.py). A launch uses the file only while the
current manifest equals the trusted one; any edit, of the file or of a pinned script, and any
retargeted symlink revokes the trust. The global config is always trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from agentbox import paths, sizes
from agentbox.agents.builtin import endpoints
from agentbox.config import image, keys, pins, yamlio
from agentbox.config.load import Config, TrustedText
from agentbox.errors import ConfigError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.net import policy
from agentbox.safetext import visible, visible_text

MAX_KEPT_TEXT = 256 * 1024  # pinned file contents kept in the record, for `trust --show` diffs


def risky_keys(config: Config) -> list[str]:
    """What in the local file needs trust, each as "key: detail (why)", by the rules of keys.py."""
    if config.local_file is None:
        return []
    risky: list[str] = []
    if os.path.islink(config.local_file):
        risky.append(
            f"{config.local_file.name}: a symlink to {visible(os.path.realpath(config.local_file))} "
            "(trusted only for the folder it was found in)"
        )
    for path, key in keys.trust_rules():
        for concrete, value in _set_in(config.local_data, path):
            name = keys.dotted(concrete)
            if key.trust == keys.SET:
                detail = f": {', '.join(sorted(value))}" if isinstance(value, dict) and value else ""
                risky.append(f"{name}{detail} ({key.why})")
            elif key.trust == keys.TRUE and value is True:
                risky.append(f"{name}: true ({key.why})")
            elif key.trust == keys.RULE:
                risky.extend(_RULES[keys.dotted(path)](config, concrete, value))
    return list(dict.fromkeys(risky))


def _set_in(data: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Where a key path (`agents.<name>.binary`) is set in a file's data, with the value found."""
    if not path:
        return [((), data)]
    if not isinstance(data, dict):
        return []
    head, rest = path[0], path[1:]
    names = list(data) if head == "<name>" else [head] if head in data else []
    return [((name, *sub), value) for name in names for sub, value in _set_in(data[name], rest)]


def _workspace_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    assert config.local_file is not None
    if Path(os.path.realpath(config.local_file.parent)) == config.workspace:
        return []
    return [f"workspace: {config.workspace} (a folder other than the config's own)"]


def _mounts_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    found = []
    for mount in config.mounts:
        if not _inside(mount.real, config.workspace):
            found.append(f"mounts: {mount.location} (outside the workspace)")
        elif mount.writable:
            found.append(f"mounts: {mount.location} (writable)")
    return found


def _scripts_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    hook = path[-1]
    found = []
    for script in config.on_create if hook == "onCreateScript" else config.on_start:
        if script.origin != "local":
            continue
        real = Path(os.path.realpath(script.path))
        where = ""
        if not _inside(real, config.workspace):
            outside = f"a symlink to {visible(str(real))}" if real != script.path else "a host file"
            where = f", {outside} outside the workspace"
        found.append(f"bootstrap.{hook}: {script.path} (runs in the VM with your logins present{where})")
    return found


def _agent_credentials_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    return [f"{keys.dotted(path)} (host files brought into the VM)"] if isinstance(value, list) else []


def _global_value(config: Config, path: tuple[str, ...]) -> Any:
    data: Any = config.global_data
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _session_mode_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """Asking for isolation narrows what the agent reaches; turning off the isolation the global file asks for
    widens it."""
    if value == "live" and _global_value(config, ("session", "mode")) == "isolated":
        return ["session.mode: live (the global config says isolated; live gives the agent the workspace, writable)"]
    return []


def _widens_bool_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """A local true widens only what the global file does not already allow (sync.agentConfig defaults to true)."""
    default = keys.defaults().get(path[0], {}).get(path[-1]) if len(path) == 2 else False
    allowed = _global_value(config, path)
    if value is not True or (allowed if allowed is not None else default) is True:
        return []
    why = {"agentConfig": "brings the agents' own setup from your home into the VM, which the global config turns off",
           "mcpSecrets": "brings the secrets of its MCP servers (env and header values) into the VM"}[path[-1]]
    return [f"{keys.dotted(path)}: true ({why})"]


def _sync_include_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    allowed = _global_value(config, path) or []
    added = [entry for entry in value if entry not in allowed] if isinstance(value, list) else []
    if not added:
        return []
    return [f"{keys.dotted(path)}: {', '.join(visible(entry) for entry in added)} (brings more host files into the VM)"]


def _network_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """A project's file may tighten the network policy; what it loosens against the global config needs trust."""
    global_raw = {**keys.defaults()["network"], **(_global_value(config, ("network",)) or {})}
    return policy.loosened(policy.from_data(global_raw), config.network)


def _endpoints_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """An agent's endpoints matter only where a proxy decides; hosts beyond the global config's need trust."""
    if config.network.mode == "open" or not config.network.agent_api or not isinstance(value, list):
        return []

    allowed = _global_value(config, path)  # the global file's list, else the built-in one
    listed = endpoints(path[1], allowed if isinstance(allowed, list) else None)
    before = {str(host).lower() for host in listed}
    added = [host for host in value if host.lower() not in before]
    if not added:
        return []
    return [f"{keys.dotted(path)}: {', '.join(visible(host) for host in added)} (more hosts the VM may reach)"]


def _checkpoints_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """A project's file may keep more checkpoints, of more files; what weakens review and undo against the global
    config (or the default) needs trust: the agent can write this file and erase its own history."""
    default = keys.defaults()["checkpoints"][path[-1]]
    allowed = _global_value(config, path)
    source = "the default" if allowed is None else "the global config's"
    allowed = default if allowed is None else allowed
    name = keys.dotted(path)
    if path[-1] == "enabled":
        weaker = value is False and allowed is not False
        return [f"{name}: false (no checkpoints: nothing to review or undo)"] if weaker else []
    if path[-1] == "keep":
        weaker = isinstance(value, int) and isinstance(allowed, int) and value < allowed
        return [f"{name}: {value} (fewer than {source} {allowed}: older checkpoints are pruned at the next "
                "launch)"] if weaker else []
    local, limit = sizes.to_bytes(str(value)), sizes.to_bytes(str(allowed))
    if local is None or limit is None or local >= limit:
        return []
    return [f"{name}: {visible(str(value))} (less than {source} {visible(str(allowed))}: more files are left out "
            "of checkpoints)"]


def _quarantine_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """instructions.quarantine: false in a project's file while the global config (or the default) holds changes."""
    allowed = _global_value(config, path)
    if value is not False or allowed is False:
        return []
    return ["instructions.quarantine: false (what an agent writes in CLAUDE.md, .claude/ and the other instruction "
            "files reaches the next agent unreviewed)"]


def _broker_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    if value is not False:
        return []
    return ["credentials.broker: false (puts the real logins of Claude Code, Codex, Gemini CLI and the GitHub CLI "
            "into the VM)"]


def _allow_push_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """`session` lets the agent push (its own branches) with the user's GitHub login, as sync.remoteWrite: true lets
    it push anywhere: a project's file needs trust for it whatever the global config says. false only narrows."""
    if value != keys.PUSH_SESSION:
        return []
    return ["git.allowPush: session (the agent pushes branches under agentbox/<vm>/ with your GitHub login)"]


def _image_rule(config: Config, path: tuple[str, ...], value: Any) -> list[str]:
    """Always: the image is the whole system the VM runs, with your logins present. Each file is named, a URL as it
    is, a host path with where it resolves to (trust pins it)."""
    if config.image is None:
        return []
    found = []
    for key, location in config.image.files():
        if image.is_url(location):
            found.append(f"{key}: {visible(location)} (downloaded: the system the VM runs)")
            continue
        real = os.path.realpath(location)
        target = f", a symlink to {visible(real)}" if real != location else ""
        found.append(f"{key}: {visible(location)} (a host file{target}: the system the VM runs)")
    return found


# The keys whose need for trust depends on what their value resolves to (keys.RULE).
_RULES = {
    "git.allowPush": _allow_push_rule,
    "credentials.broker": _broker_rule,
    "vm.image": _image_rule,
    "workspace": _workspace_rule,
    "mounts": _mounts_rule,
    "bootstrap.onCreateScript": _scripts_rule,
    "bootstrap.onStartScript": _scripts_rule,
    "agents.<name>.credentials": _agent_credentials_rule,
    "session.mode": _session_mode_rule,
    "sync.agentConfig": _widens_bool_rule,
    "agents.<name>.sync.include": _sync_include_rule,
    "agents.<name>.sync.mcpSecrets": _widens_bool_rule,
    "agents.<name>.endpoints": _endpoints_rule,
    "instructions.quarantine": _quarantine_rule,
    "checkpoints.enabled": _checkpoints_rule,
    "checkpoints.keep": _checkpoints_rule,
    "checkpoints.maxFileSize": _checkpoints_rule,
    "network.mode": _network_rule,
    "network.allowHost": _network_rule,
    "network.allowLan": _network_rule,
    "network.presets": _network_rule,
    "network.allow": _network_rule,
    "network.agentApi": _network_rule,
    "network.uploadLimit": _network_rule,
    "network.inspect": _network_rule,
    "network.private": _network_rule,
}


def manifest(config: Config) -> dict[str, Any]:
    """The local file's digest and every host path it makes agentbox use, resolved and pinned."""
    assert config.local_file is not None
    data = config.local_data
    found: list[pins.Pin] = []
    if "workspace" in data:
        found.append(pins.pin_path("workspace", config.workspace))
    if "mounts" in data:
        found.extend(pins.pin_path(f"mounts[{i}]", mount.location, mount.real) for i, mount in enumerate(config.mounts))
    for hook, scripts in (("onCreateScript", config.on_create), ("onStartScript", config.on_start)):
        for index, script in enumerate(scripts):
            if script.origin == "local":
                found.append(pins.pin_file(f"bootstrap.{hook}[{index}]", script.path))
    if config.ca_cert is not None and config.origins.get("caCert", "").startswith("local"):
        found.append(pins.pin_file("caCert", config.ca_cert))
    if config.template is not None and "template" in data.get("vm", {}):
        found.append(pins.pin_file("vm.template", config.template))
    if config.image is not None and "image" in data.get("vm", {}):
        # Where each host file resolves to, not its content: an image is gigabytes (pins.MAX_FILE_BYTES).
        found.extend(pins.pin_path(key, path) for key, path in config.image.host_paths())
    for name, agent in data.get("agents", {}).items():
        if isinstance(agent.get("credentials"), list):
            for index, spec in enumerate(agent["credentials"]):
                found.append(pins.pin_path(f"agents.{name}.credentials[{index}]", os.path.expanduser(spec)))
    credentials = data.get("credentials")
    if isinstance(credentials, dict) and credentials.get("netrc"):
        found.append(pins.pin_path("credentials.netrc", paths.home() / ".netrc"))
    pins.save_stat_cache()
    return {
        "config": {
            "path": str(config.local_file),
            "real": os.path.realpath(config.local_file),
            "sha256": config.local_sha256,
        },
        "pins": [pin.to_json() for pin in found],
    }


def record_path(config_file: Path) -> Path:
    """Keyed by where the file was found: a symlinked agentbox.yml is trusted per folder, not per target."""
    digest = hashlib.sha256(str(Path(os.path.abspath(config_file))).encode()).hexdigest()[:24]
    return paths.state_dir() / "trust" / f"{digest}.json"


def trusted_record(config_file: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(record_path(config_file).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def as_last_trusted(config_file: Path) -> TrustedText | None:
    """The file's content as the user last trusted it, when the record keeps it whole (its digest is the trusted
    one); None otherwise."""
    record = trusted_record(config_file) or {}
    content = record.get("content")
    trusted = (record.get("manifest") or {}).get("config") or {}
    if not isinstance(content, str) or trusted.get("path") != str(config_file):
        return None
    digest = hashlib.sha256(content.encode()).hexdigest()
    if digest != trusted.get("sha256"):
        return None
    return TrustedText(config_file, content, digest)


def is_trusted(config: Config) -> bool:
    """Whether the local file, and everything it names, is exactly as the user trusted it."""
    if config.local_file is None:
        return True
    record = trusted_record(config.local_file)
    return record is not None and record.get("manifest") == manifest(config)


def trust(config: Config) -> Path:
    """Record the local file and what it names, as they are now."""
    assert config.local_file is not None
    current = manifest(config)
    texts: dict[str, str] = {}
    for pin in map(pins.Pin.from_json, current["pins"]):
        if pin.kind == pins.FILE and pin.sha256 is not None:
            text = _text(pins.read(pin.path, pin.key))
            if text is not None:
                texts[pin.key] = text
    record = {
        "path": str(config.local_file),
        "manifest": current,
        "content": _config_text(config),
        "texts": texts,
    }
    private_dir(paths.state_dir() / "trust")
    target = record_path(config.local_file)
    atomic_write(target, json.dumps(record, indent=2), mode=0o600)
    return target


def show(config: Config) -> str:
    """What `agentbox trust` would record: the changes since the last trust, or everything."""
    # deferred: start-up (difflib: only the trust prompt's diff, never a launch)
    import difflib

    assert config.local_file is not None
    current = manifest(config)
    text = _config_text(config)
    record = trusted_record(config.local_file)
    pinned = [pins.Pin.from_json(p) for p in current["pins"]]
    if record is None:
        lines = [f"# {config.local_file} has never been trusted; its content:\n", text]
        if not text.endswith("\n"):
            lines.append("\n")
        if pinned:
            lines.append("# it makes agentbox use these host paths:\n")
            lines.extend(f"#   {pin.key}: {_describe_pin(pin)}\n" for pin in pinned)
        return visible_text("".join(lines))
    if record.get("manifest") == current:
        return f"# {config.local_file} is trusted as it is.\n"

    lines = []
    if "manifest" not in record:
        lines.append("# it was trusted by an earlier agentbox, which did not pin the files it names\n")
    lines.extend(
        difflib.unified_diff(
            str(record.get("content", "")).splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"{config.local_file} (last trusted)",
            tofile=f"{config.local_file} (now)",
        )
    )
    old_pins = {p["key"]: pins.Pin.from_json(p) for p in (record.get("manifest") or {}).get("pins", [])}
    old_texts = record.get("texts") or {}
    for line, pin in pin_changes(old_pins, pinned):
        lines.append(f"# {line}\n")
        if pin is not None and pin.key in old_texts and pin.kind == pins.FILE:
            new_text = _text(pins.read(pin.path, pin.key))
            if new_text is not None:
                lines.extend(
                    difflib.unified_diff(
                        old_texts[pin.key].splitlines(keepends=True),
                        new_text.splitlines(keepends=True),
                        fromfile=f"{pin.path} (last trusted)",
                        tofile=f"{pin.path} (now)",
                    )
                )
    return visible_text("".join(line if line.endswith("\n") else line + "\n" for line in lines))


def pin_changes(old: dict[str, pins.Pin], new: list[pins.Pin]) -> list[tuple[str, pins.Pin | None]]:
    """In words: every pinned path that appeared, disappeared, points elsewhere or holds other content."""
    result: list[tuple[str, pins.Pin | None]] = []
    current = {pin.key: pin for pin in new}
    for key, pin in current.items():
        before = old.get(key)
        if before is None:
            result.append((f"{key}: new: {_describe_pin(pin)}", None))
        elif before.path != pin.path:
            result.append((f"{key}: was {before.path}, now {_describe_pin(pin)}", None))
        elif before.real != pin.real:
            result.append((visible(f"{key}: {pin.path} now resolves to {pin.real} (it was {before.real})"), None))
        elif before.kind != pin.kind:
            result.append(
                (f"{key}: {pin.path} is now {_kind_words(pin.kind)} (it was {_kind_words(before.kind)})", None)
            )
        elif before.sha256 != pin.sha256:
            result.append((f"{key}: the content of {pin.path} changed", pin))
    result.extend((f"{key}: no longer named ({pin.path})", None) for key, pin in old.items() if key not in current)
    return result


def require_trust(config: Config) -> None:
    """Refuse (exit 2) an untrusted local config that needs trust, naming what needs it and what changed."""
    if config.local_file is None:
        return
    risky = risky_keys(config)
    if not risky:
        return
    record = trusted_record(config.local_file)
    current = manifest(config)
    if record is not None and record.get("manifest") == current:
        return
    listing = "\n".join(f"  - {item}" for item in risky)
    if record is None:
        why = "it is not trusted"
    elif "manifest" not in record:
        why = "it was trusted by an earlier agentbox, which did not pin the files it names"
    else:
        why = "it changed since you trusted it"
        changed = []
        if record["manifest"].get("config") != current["config"]:
            changed.append(f"  - {config.local_file.name} itself")
        old_pins = {p["key"]: pins.Pin.from_json(p) for p in record["manifest"].get("pins", [])}
        changed.extend(
            f"  - {line}" for line, _ in pin_changes(old_pins, list(map(pins.Pin.from_json, current["pins"])))
        )
        if changed:
            why += ":\n" + "\n".join(changed) + "\nand it sets"
    raise ConfigError(
        f"{config.local_file} widens what the VM gets from your host or runs in it, and {why}:\n{listing}",
        hint=(
            f"Read it (`agentbox trust --show` shows {'the changes' if record else 'it'}), then run "
            f"`agentbox -C {config.local_file.parent} trust` to use it. Anyone who can write the repository, "
            "the agent included, can write this file and the files it names."
        ),
    )


# The keys that choose which VM, of which workspace, a command acts on.
_IDENTITY_KEYS = (("vm", "name"), ("workspace",))


def untrusted_identity(config: Config) -> list[str]:
    """The keys of the local file that choose which VM a command acts on (vm.name, a `workspace` other than the
    file's own folder) whose values are not the ones the user trusted. Commands that need no trust (stop, rm) act
    only on the VM a trusted file names: a file the agent rewrote must not point them at another project's VM.

    A file whose bytes are those trusted has its keys as trusted, even when a file it names changed since
    (a bootstrap script); no pinned file is read."""
    if config.local_file is None:
        return []
    found = [keys.dotted(concrete) for path in _IDENTITY_KEYS for concrete, _ in _set_in(config.local_data, path)
             if path != ("workspace",) or _workspace_rule(config, path, None)]
    if not found:
        return []
    trusted = (trusted_record(config.local_file) or {}).get("manifest") or {}
    current = {"path": str(config.local_file), "real": os.path.realpath(config.local_file),
               "sha256": config.local_sha256}
    if trusted.get("config") != current:
        return found
    if "workspace" in found:
        pinned = {pin.get("key"): pin for pin in trusted.get("pins", []) if isinstance(pin, dict)}
        if pinned.get("workspace") != pins.pin_path("workspace", config.workspace).to_json():
            return found
    return []


def _config_text(config: Config) -> str:
    """The local file's text, as long as it is still what agentbox parsed (else the trust would be of other bytes)."""
    assert config.local_file is not None
    read = yamlio.read_config(config.local_file)
    if read.sha256 != config.local_sha256:
        raise ConfigError(
            f"{config.local_file} changed while agentbox was reading it; nothing was recorded",
            hint="Run the command again.",
        )
    return read.text


def _text(data: bytes) -> str | None:
    if len(data) > MAX_KEPT_TEXT or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _describe_pin(pin: pins.Pin) -> str:
    target = pin.path if pin.real == pin.path else f"{pin.path} -> {pin.real}"
    return visible(f"{target} ({_kind_words(pin.kind)})")


def _kind_words(kind: str) -> str:
    return {pins.FILE: "a file", pins.DIR: "a folder", pins.MISSING: "missing"}.get(kind, "not a file or folder")


def _inside(path: Path, workspace: Path) -> bool:
    return path == workspace or workspace in path.parents
