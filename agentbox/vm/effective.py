"""What a VM really runs with, compared with what agentbox rendered for it.

Lima merges $LIMA_HOME/_config/default.yaml and override.yaml into every instance at every load,
so a host-wide setting can widen what the guest reaches: an extra or writable mount, agent or X11
forwarding, proxy variables, a reverse forward of a host socket (the docker socket), files copied
to the host, extra networks, containerd. `limactl list --json` carries the fully merged and
defaulted `config` of each instance; agentbox compares it with the settings it rendered.

The rendered settings are kept as JSON in the VM's state ("expected"), so the warm launch compares
two dicts without importing PyYAML. Only a refusal reads Lima's host-wide files, to say which one
sets the key.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import stat
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import lazyre, paths
from agentbox.errors import RefusedError

# Bump when the record's shape changes: an older record is rebuilt from the kept lima.yaml.
EXPECTED_VERSION = 1
SSH_FLAGS = ("forwardAgent", "forwardX11", "forwardX11Trusted")
HOST_WIDE_FILES = ("override.yaml", "default.yaml")
MAX_HOST_FILE = 1 << 20
_TEMPLATE_VAR = lazyre.compile(r"\{\{\s*\.([A-Za-z]+)(?:\.([A-Za-z0-9_]+))?\s*\}\}")


class Difference(NamedTuple):
    setting: str  # the key as written in lima.yaml, e.g. "ssh.forwardX11"
    text: str
    scalar: bool  # a scalar is decided by one file; list entries add up from all of them


# -- what agentbox rendered ---------------------------------------------------------------------


def expected_from_rendered(rendered_yaml: str) -> dict[str, Any]:
    """The reach-relevant settings of a rendered lima.yaml, as JSON-safe data."""
    # deferred: start-up (yaml, ~22 ms: the warm launch reads the cached config, never YAML)
    import yaml

    data = yaml.safe_load(rendered_yaml) or {}
    ssh = data.get("ssh") or {}
    containerd = data.get("containerd") or {}
    mounts = merged_mounts(data.get("mounts") or [])
    return {
        "version": EXPECTED_VERSION,
        "mounts": [list(mount) for mount in mounts],
        # Where each mount's location resolved when the record was made: Lima follows symlinks.
        "targets": {location: os.path.realpath(location) for location, _, _ in mounts},
        "mountType": data.get("mountType"),
        "ssh": {flag: _flag(ssh.get(flag), False) for flag in SSH_FLAGS},
        "propagateProxyEnv": _flag(data.get("propagateProxyEnv"), True),
        "containerd": {key: containerd.get(key) for key in ("system", "user")},
        "portForwards": [p for p in data.get("portForwards") or [] if _widening_forward(p)],
        "copyToHost": [c for c in data.get("copyToHost") or [] if isinstance(c, dict)],
        "networks": [n for n in data.get("networks") or [] if isinstance(n, dict)],
    }


def _flag(value: Any, default: bool) -> bool:
    """A YAML boolean as Lima reads it: null means unset, so the default."""
    return default if value is None else bool(value)


def is_current(expected: Any) -> bool:
    return isinstance(expected, dict) and expected.get("version") == EXPECTED_VERSION


def merged_mounts(entries: list[Any]) -> list[tuple[str, str, bool]]:
    """(location, mountPoint, writable) as Lima merges them: by mountPoint, the later entry's writable wins."""
    merged: dict[str, list[Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        location = _clean_location(str(entry.get("location")))
        mount_point = str(entry.get("mountPoint") or location)
        if mount_point in merged:
            if entry.get("writable") is not None:
                merged[mount_point][2] = bool(entry["writable"])
        else:
            merged[mount_point] = [location, mount_point, _flag(entry.get("writable"), False)]
    return sorted((m[0], m[1], m[2]) for m in merged.values())


def _clean_location(location: str) -> str:
    if location == "~" or location.startswith("~/"):
        location = os.path.expanduser("~") + location[1:]
    return posixpath.normpath(location)


# -- what the instance has ----------------------------------------------------------------------


def differences(effective: dict[str, Any], expected: dict[str, Any], instance_dir: str) -> list[Difference]:
    """Everything in Lima's merged config that reaches further than agentbox rendered, in words."""
    found = _mount_differences(effective, expected)
    mount_type = effective.get("mountType")
    wanted_type = expected.get("mountType")
    # reverse-sshfs serves the host folder through an sftp server on the host: agentbox never uses it.
    if mount_type == "reverse-sshfs" or (wanted_type and mount_type != wanted_type):
        found.append(Difference("mountType", f"mountType is {mount_type}", True))
    ssh = effective.get("ssh") or {}
    for flag in SSH_FLAGS:
        if _flag(ssh.get(flag), False) and not expected["ssh"].get(flag):
            found.append(Difference(f"ssh.{flag}", f"ssh.{flag} is true", True))
    if _flag(effective.get("propagateProxyEnv"), True) and not expected["propagateProxyEnv"]:
        found.append(Difference("propagateProxyEnv", "propagateProxyEnv is true: the host's proxy variables, "
                                "which can carry passwords, reach the VM", True))
    found += _containerd_differences(effective, expected)
    variables = _TemplateVars(effective, instance_dir)
    found += [
        Difference("portForwards", _describe_forward(entry), False)
        for entry in _unmatched(
            [p for p in effective.get("portForwards") or [] if _widening_forward(p)],
            expected["portForwards"],
            lambda p: _forward_key(p, instance_dir, variables),
        )
    ]
    found += [
        Difference(
            "copyToHost",
            f"copyToHost copies {entry.get('guest')} from the VM to {entry.get('host')} on the host",
            False,
        )
        for entry in _unmatched(
            effective.get("copyToHost") or [], expected["copyToHost"], lambda c: _copy_key(c, variables)
        )
    ]
    found += [
        Difference("networks", f"networks: an extra network ({_describe_network(entry)})", False)
        for entry in _unmatched(effective.get("networks") or [], expected["networks"], _network_key)
    ]
    return found


def _mount_differences(effective: dict[str, Any], expected: dict[str, Any]) -> list[Difference]:
    found = []
    wanted = {mount_point: (location, writable) for location, mount_point, writable in expected["mounts"]}
    actual = merged_mounts(effective.get("mounts") or [])
    for location, mount_point, writable in actual:
        mode = "writable" if writable else "read-only"
        if mount_point not in wanted:
            found.append(Difference("mounts", f"mounts: an extra {mode} mount of {location} at {mount_point}", False))
            continue
        want_location, want_writable = wanted[mount_point]
        if location != want_location:
            found.append(
                Difference("mounts", f"mounts: {mount_point} shows {location} instead of {want_location}", False)
            )
        elif writable != want_writable:
            found.append(
                Difference(
                    "mounts",
                    f"mounts: the mount of {location} at {mount_point} is {mode}, "
                    f"agentbox made it {'writable' if want_writable else 'read-only'}",
                    False,
                )
            )
    present = {mount_point for _, mount_point, _ in actual}
    for mount_point, (location, _) in wanted.items():
        if mount_point not in present:
            found.append(Difference("mounts", f"mounts: the mount of {location} at {mount_point} is missing", False))
    return found


def _containerd_differences(effective: dict[str, Any], expected: dict[str, Any]) -> list[Difference]:
    # Lima's defaults: system off; user on for Linux guests on x86_64 and aarch64.
    user_default = effective.get("os", "Linux") == "Linux" and effective.get("arch") in ("x86_64", "aarch64")
    defaults = {"system": False, "user": user_default}
    actual = effective.get("containerd") or {}
    found = []
    for key in ("system", "user"):
        wanted = _flag(expected["containerd"].get(key), defaults[key])
        if _flag(actual.get(key), defaults[key]) and not wanted:
            found.append(Difference(f"containerd.{key}", f"containerd.{key} is true", True))
    return found


def _unmatched(actual: list[Any], rendered: list[Any], key: Any) -> list[Any]:
    """Entries of `actual` left over once each rendered entry has claimed one equal to it."""
    if not actual:
        return []
    remaining = [key(entry) for entry in rendered if isinstance(entry, dict)]
    extra = []
    for entry in actual:
        if not isinstance(entry, dict):
            continue
        entry_key = key(entry)
        if entry_key in remaining:
            remaining.remove(entry_key)
        else:
            extra.append(entry)
    return extra


def _widening_forward(entry: Any) -> bool:
    """A forward that lets the guest reach the host, or that wires a socket: not Lima's port forwarding."""
    if not isinstance(entry, dict) or entry.get("ignore"):
        return False
    return bool(entry.get("reverse") or entry.get("guestSocket") or entry.get("hostSocket"))


class _TemplateVars:
    """The variables Lima expands in forwards and copyToHost, for rendered entries that use them.

    Worked out only when an entry is compared: the warm launch usually has none.
    """

    def __init__(self, effective: dict[str, Any], instance_dir: str) -> None:
        self._effective = effective
        self._dir = instance_dir

    @functools.cached_property
    def guest(self) -> dict[str, Any]:
        user = self._effective.get("user") or {}
        name = os.path.basename(self._dir)
        return {
            "Name": name,
            "Hostname": f"lima-{name}",
            "UID": user.get("uid"),
            "User": user.get("name"),
            "Home": user.get("home"),
            "Param": self._effective.get("param") or {},
        }

    @functools.cached_property
    def host(self) -> dict[str, Any]:
        # deferred: start-up (getpass and termios: only when Lima's own user is needed)
        import getpass

        name = os.path.basename(self._dir)
        return {
            "Name": name,
            "Instance": name,
            "Dir": self._dir,
            "LimaHome": os.path.dirname(self._dir),
            "Home": os.path.expanduser("~"),
            "UID": os.getuid(),
            "User": getpass.getuser(),
            "Param": self._effective.get("param") or {},
        }


def _expand(text: Any, variables: dict[str, Any]) -> str:
    def replace(match: re.Match[str]) -> str:
        value = variables.get(match.group(1))
        if match.group(2) is not None:
            value = value.get(match.group(2)) if isinstance(value, dict) else None
        return match.group(0) if value is None or isinstance(value, dict) else str(value)

    return _TEMPLATE_VAR.sub(replace, str(text or ""))


def _forward_key(entry: dict[str, Any], instance_dir: str, variables: _TemplateVars) -> tuple[Any, ...]:
    """An entry as Lima fills it in (ports, socket paths), so a rendered one equals its filled form."""
    guest_port, host_port = int(entry.get("guestPort") or 0), int(entry.get("hostPort") or 0)
    guest_range = list(entry.get("guestPortRange") or [0, 0])
    if guest_range == [0, 0]:
        guest_range = [guest_port, guest_port] if guest_port else [1, 65535]
    guest_socket = _expand(entry.get("guestSocket"), variables.guest) if entry.get("guestSocket") else ""
    host_socket = _expand(entry.get("hostSocket"), variables.host) if entry.get("hostSocket") else ""
    host_range: list[int] | None = None
    if host_socket and not host_socket.startswith("/"):
        host_socket = os.path.join(instance_dir, "sock", host_socket)
    if not host_socket:
        host_range = list(entry.get("hostPortRange") or [0, 0])
        if host_range == [0, 0]:
            host_range = [host_port, host_port] if host_port else guest_range
    return (bool(entry.get("reverse")), guest_socket, host_socket, guest_range, host_range)


def _describe_forward(entry: dict[str, Any]) -> str:
    host = entry.get("hostSocket") or f"{entry.get('hostIP', '127.0.0.1')}:{_ports(entry, 'host')}"
    guest = entry.get("guestSocket") or f"port {_ports(entry, 'guest')}"
    if entry.get("reverse"):
        return f"portForwards: a reverse forward gives the VM the host's {host} at {guest}"
    return f"portForwards: the VM's {guest} is forwarded to the host's {host}"


def _ports(entry: dict[str, Any], side: str) -> str:
    port_range = entry.get(f"{side}PortRange")
    if port_range and len(port_range) == 2 and port_range[0] != port_range[1]:
        return f"{port_range[0]}-{port_range[1]}"
    return str(entry.get(f"{side}Port") or (port_range[0] if port_range else "any"))


def _copy_key(entry: dict[str, Any], variables: _TemplateVars) -> tuple[str, str]:
    return (_expand(entry.get("guest"), variables.guest), _expand(entry.get("host"), variables.host))


def _network_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry.get("lima"), entry.get("socket"), bool(entry.get("vzNAT")))


def _describe_network(entry: dict[str, Any]) -> str:
    for key in ("lima", "socket"):
        if entry.get(key):
            return f"{key}: {entry[key]}"
    return "vzNAT" if entry.get("vzNAT") else ", ".join(f"{k}: {v}" for k, v in entry.items())


# -- mount locations before a start ------------------------------------------------------------


def mount_redirections(expected: dict[str, Any], own: frozenset[str] = frozenset()) -> list[str]:
    """Mount locations that no longer resolve where they did, or that the VM must never get.

    `own` are agentbox's own mounts (the staging folder and the outbox, which live in its state folder).
    """
    problems = []
    for location, _, _ in expected["mounts"]:
        real = os.path.realpath(location)
        recorded = expected["targets"].get(location, location)
        if real != recorded:
            problems.append(
                f"{location} now resolves to {real} (a path component became a symlink after the VM was created)"
            )
            continue
        problem = None if real in own else paths.mount_target_problem(Path(real))
        if problem:
            problems.append(f"{location}: {problem}")
    return problems


def check_mount_locations(name: str, expected: dict[str, Any]) -> None:
    own = frozenset({os.path.realpath(paths.staging_dir(name)), os.path.realpath(paths.vm_outbox(name))})
    problems = mount_redirections(expected, own)
    if problems:
        raise RefusedError(
            f"refusing to start {name}: Lima would mount something else than agentbox rendered: " + "; ".join(problems),
            hint="Put the folder back (a real folder, not a symlink), or run `agentbox start --recreate` "
            "to create the VM from the current config.",
        )


# -- the refusal --------------------------------------------------------------------------------


def refusal(name: str, found: list[Difference], lima_home: Path, stopped: bool) -> RefusedError:
    """The error for a VM whose effective config reaches further than rendered, naming the files that do it."""
    config_dir = lima_home / "_config"
    loaded = {file: _read_host_yaml(config_dir / file) for file in HOST_WIDE_FILES}
    lines = []
    sources: list[str] = []
    for difference in found:
        origin = _origin(difference, loaded)
        named = [str(config_dir / file) for file in origin]
        sources += [path for path in named if path not in sources]
        where = " and ".join(named) if named else "a host-wide Lima setting"
        lines.append(f"  - {difference.text} (set by {where})")
    files = " and ".join(sources) if sources else f"{config_dir}/default.yaml or override.yaml"
    if stopped:
        opening = f"{name} runs with settings agentbox did not give it, so agentbox stopped it and will not use it"
    else:
        opening = f"{name} would start with settings agentbox did not give it, so agentbox will not start it"
    return RefusedError(
        f"{opening} until they are gone:\n" + "\n".join(lines),
        hint=(
            f"Lima merges {files} into every instance. Remove those settings there, then run the command "
            "again. To give this VM such a setting on purpose, set it in `vm.lima` in agentbox.yml "
            "(it needs `agentbox trust`) and run `agentbox start --recreate`."
        ),
    )


def _origin(difference: Difference, loaded: dict[str, Any]) -> list[str]:
    keys = difference.setting.split(".")
    found = [file for file in HOST_WIDE_FILES if _lookup(loaded[file], keys) is not None]
    # A scalar comes from one file: override.yaml wins over everything, default.yaml over nothing rendered.
    return found[:1] if difference.scalar else found


def _lookup(data: Any, keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _read_host_yaml(path: Path) -> Any:
    """A host-wide Lima file, if it is a readable regular file; a FIFO or a huge file is not read."""
    # deferred: start-up (yaml, ~22 ms: the warm launch reads the cached config, never YAML)
    import yaml

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_HOST_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_HOST_FILE:
        return None
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError:
        return None
