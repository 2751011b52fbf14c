"""Find, load, merge and resolve agentbox's config: built-in defaults < global file < local agentbox.yml."""

import copy
import grp
import hashlib
import json
import os
import pwd
import shlex
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from agentbox import paths, sizes
from agentbox.agents.builtin import BUILTIN_AGENTS, endpoints
from agentbox.config import image, keys, naming, yamlio
from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.config.image import Image
from agentbox.config.layers import Layer
from agentbox.config.peek import worktree_project
from agentbox.config.problems import Problems
from agentbox.errors import ConfigError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.git import dirs
from agentbox.net import policy
from agentbox.net.policy import NetworkSettings
from agentbox.progress import warn
from agentbox.safetext import visible

DEFAULTS: dict[str, Any] = keys.defaults()


# Lima refuses these as mount points (pkg/limayaml/validate.go).
RESERVED_MOUNT_POINTS = frozenset({"/", "/bin", "/dev", "/etc", "/home", "/opt", "/sbin", "/tmp", "/usr", "/var"})


class Mount(NamedTuple):
    location: Path  # as configured (~ expanded, relative ones made absolute)
    mount_point: str
    writable: bool
    real: Path  # where it resolved, once (agentbox.config.mountpaths): what trust pins and Lima gets

    def to_json(self) -> dict[str, Any]:
        return {"location": str(self.location), "mountPoint": self.mount_point, "writable": self.writable}


class TaskHost(NamedTuple):
    """One entry of tasks.hosts: `local` or a host's name, and its slots (None: tasks.maxConcurrent)."""

    name: str
    max_concurrent: int | None = None

    def to_json(self) -> str | dict[str, Any]:
        """As written in a config file: the name alone when it keeps the default slots."""
        return self.name if self.max_concurrent is None else {"name": self.name, "maxConcurrent": self.max_concurrent}


class Script(NamedTuple):
    path: Path
    origin: str  # "global" or "local"


class AgentSync(NamedTuple):
    """agents.<name>.sync: what of the agent's own setup goes beyond or below the built-in set (agentsync.py)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    mcp_secrets: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"include": list(self.include), "exclude": list(self.exclude), "mcpSecrets": self.mcp_secrets}


class AgentConfig(NamedTuple):
    name: str
    binary: str
    default_args: tuple[str, ...]
    model: str | None
    vm_name: str
    install: str | None
    builtin: bool
    credentials: tuple[str, ...] = ()
    sync: AgentSync = AgentSync()
    task_args: tuple[str, ...] = ()  # its non-interactive form (agentbox run)
    endpoints: tuple[str, ...] = ()  # its API's hosts, reachable in network.mode allowlist and offline
    instruction_files: tuple[str, ...] = ()  # agents.<name>.instructionFiles: what it obeys in the workspace

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "binary": self.binary,
            "defaultArgs": list(self.default_args),
            "model": self.model,
            "vmName": self.vm_name,
        }
        if self.install is not None:
            data["install"] = self.install
        data["credentials"] = list(self.credentials)
        data["sync"] = self.sync.to_json()
        data["taskArgs"] = list(self.task_args)
        data["endpoints"] = list(self.endpoints)
        data["instructionFiles"] = list(self.instruction_files)
        return data


class CredentialSettings(NamedTuple):
    enabled: bool = True
    netrc: bool = False
    gh: bool = True
    git: bool = True
    write_back: bool = True
    broker: bool = True

    def to_json(self) -> Any:
        if not self.enabled:
            return False
        return {"netrc": self.netrc, "gh": self.gh, "git": self.git, "writeBack": self.write_back,
                "broker": self.broker}


class UnusableFile(NamedTuple):
    """A config file agentbox will not use, why, and the command that fixes it."""

    path: Path
    layer: str  # "global" or "local"
    shown: str  # the path as shown (with its target when it is a symlink)
    reason: str
    fix: str

    def error(self) -> ConfigError:
        """Commands that act refuse to go on with other settings than the ones the user wrote."""
        return ConfigError(
            f"{self.shown} is not used: {self.reason}; agentbox will not go on with other settings instead",
            hint=f"Fix it with `{self.fix}` (or remove the file), then run the command again.",
        )

    def notice(self) -> str:
        return (f"{self.shown} is not used: {self.reason}. Commands that start or launch refuse until it is fixed: "
                f"{self.fix}")


class Config(NamedTuple):
    cwd: Path
    workspace: Path
    workspace_problem: str | None
    workspace_rule: str  # which rule chose the workspace, in words
    global_file: Path | None
    local_file: Path | None
    vm_name: str
    cpus: int
    memory: str
    disk: str
    vm_type: str | None
    arch: str | None
    mount_type: str | None
    template: Path | None
    lima: dict[str, Any]
    mounts: tuple[Mount, ...]
    env: dict[str, str]
    remote_write: bool
    startup_wait_sec: int
    on_create: tuple[Script, ...]
    on_start: tuple[Script, ...]
    ca_cert: Path | None
    agents: dict[str, AgentConfig]
    origins: dict[str, str]
    credentials: CredentialSettings = CredentialSettings()
    notices: tuple[str, ...] = ()
    local_data: Mapping[str, Any] = MappingProxyType({})  # the local file's own keys, for deciding on trust
    local_sha256: str = ""  # digest of the local file's bytes as they were parsed
    global_data: Mapping[str, Any] = MappingProxyType({})  # the global file's own keys (trust rules compare)
    protect_git_hooks: bool = False
    checkpoints: CheckpointSettings = CheckpointSettings()
    session_mode: str = "live"  # "live" or "isolated" (keys.SESSION_MODES)
    unusable: tuple[UnusableFile, ...] = ()  # files left out (display commands only; the others refuse)
    sync_agent_config: bool = True  # sync.agentConfig: bring the agents' own setup into the VM
    tasks_max_concurrent: int = 2  # tasks.maxConcurrent: background tasks running at once per VM
    task_hosts: tuple[TaskHost, ...] = ()  # tasks.hosts: where `run --on any` may send tasks, in order
    instructions_quarantine: bool = True  # instructions.quarantine: hold sessions' changes to instruction files
    keep_alive: bool = False  # session.keepAlive: an interactive launch on a terminal runs in a tmux session
    notify: bool = True  # notify: desktop notification, bell and title when a session needs the user
    vm_base: str = "auto"  # vm.base: new VMs are clones of the provisioned base (agentbox.vm.golden), or "off"
    base_max_age_days: int = 7  # vm.baseMaxAgeDays: an older base is rebuilt before the next clone
    network: NetworkSettings = NetworkSettings()  # network.*: what the VM may reach (agentbox.net.policy)
    push_scope: str | None = None  # git.allowPush: "session" (keys.PUSH_SESSION), or None for false
    image: Image | None = None  # vm.image: the disk image a new VM boots (None: agentbox's Ubuntu)

    @property
    def scoped_pushes(self) -> bool:
        """git.allowPush: session in effect: pushes only to the VM's own branches. sync.remoteWrite: true allows every
        push, so it wins."""
        return self.push_scope == keys.PUSH_SESSION and not self.remote_write

    def require_workspace(self) -> Path:
        """The workspace, or a config error when it cannot be one (home, /, missing)."""
        if self.workspace_problem:
            raise ConfigError(self.workspace_problem, hint=_workspace_hint(self))
        return self.workspace

    def agent_writable(self) -> list[Path]:
        """The host folders the VM can write: the workspace (when it is one) and the writable mounts."""
        folders = [] if self.workspace_problem else [self.workspace]
        return folders + [Path(mount.location) for mount in self.mounts if mount.writable]

    def agent(self, name: str) -> AgentConfig:
        return self.agents[name]

    def to_json(self) -> dict[str, Any]:
        vm: dict[str, Any] = {
            "name": self.vm_name,
            "cpus": self.cpus,
            "memory": self.memory,
            "disk": self.disk,
            "vmType": self.vm_type,
            "arch": self.arch,
            "mountType": self.mount_type,
            "template": str(self.template) if self.template else None,
            "image": self.image.to_json() if self.image else None,
            "lima": self.lima,
            "protectGitHooks": self.protect_git_hooks,
            "base": self.vm_base,
            "baseMaxAgeDays": self.base_max_age_days,
        }
        return {
            "workspace": str(self.workspace),
            "vm": vm,
            "mounts": [m.to_json() for m in self.mounts],
            "env": dict(self.env),
            "sync": {"remoteWrite": self.remote_write, "agentConfig": self.sync_agent_config},
            "git": {"allowPush": self.push_scope or False},
            "startupWaitSec": self.startup_wait_sec,
            "bootstrap": {
                "onCreateScript": [str(s.path) for s in self.on_create],
                "onStartScript": [str(s.path) for s in self.on_start],
            },
            "caCert": str(self.ca_cert) if self.ca_cert else None,
            "agents": {name: agent.to_json() for name, agent in self.agents.items()},
            "credentials": self.credentials.to_json(),
            "checkpoints": self.checkpoints.to_json(),
            "session": {"mode": self.session_mode, "keepAlive": self.keep_alive},
            "tasks": {"maxConcurrent": self.tasks_max_concurrent,
                      "hosts": [host.to_json() for host in self.task_hosts]},
            "instructions": {"quarantine": self.instructions_quarantine},
            "notify": self.notify,
            "network": self.network.to_json(),
        }


class TrustedText(NamedTuple):
    """The local file's content as it was last trusted (agentbox.config.trust keeps it), standing in for the file."""

    path: Path  # the local file it stands for
    text: str
    sha256: str


def local_file_for(cwd: Path) -> Path | None:
    """The local file a command run in cwd reads (the project's, from one of its worktrees)."""
    cwd = Path(os.path.abspath(cwd))
    return find_local_config(worktree_project(cwd) or cwd)


def load(cwd: Path | None = None, describe: bool = False, vm_only: bool = False,
         trusted: TrustedText | None = None) -> Config:
    """Load and validate every layer, then merge and resolve. Raises ConfigError (exit 2).

    A config file agentbox will not use (someone else's, or writable by others) is an error: going on
    with defaults would build a different VM than the one the file describes. With `describe` (the
    display commands) it is left out instead, and recorded in `unusable` and the notices.

    `vm_only`: the command needs only which VM and its state (stop, rm, status). A mount it cannot use (a
    location the agent turned into a symlink) is then left out with a notice instead of stopping it: what the agent
    did to the workspace must never keep the user from stopping or removing its VM. Whatever starts or mounts
    loads without it and refuses. `trusted`: that content is read in place of its file (see TrustedText).
    """
    cwd = Path(os.path.abspath(cwd or os.getcwd()))
    project = worktree_project(cwd)
    if project is not None:
        config = _load_from(cwd, project, describe, vm_only, trusted)
        if config.workspace == project:
            return config
    return _load_from(cwd, cwd, describe, vm_only, trusted)


def _load_from(cwd: Path, start: Path, describe: bool, vm_only: bool = False,
               trusted: TrustedText | None = None) -> Config:
    """The config found from `start` upward, for a command run in cwd."""
    notices: list[str] = []
    unusable: list[UnusableFile] = []
    layers = []
    global_path = paths.global_config_file()
    local_path = find_local_config(start)
    for path, name in ((global_path, "global"), (local_path, "local")):
        if path is None or not os.path.lexists(path):
            continue
        read = trusted if trusted is not None and name == "local" and path == trusted.path else _read_usable(path, name)
        if isinstance(read, UnusableFile):
            if not describe:
                raise read.error()
            unusable.append(read)
            notices.append(read.notice())
            continue
        layers.append(_load_layer(path, name, read))
    for layer in layers:
        notices.extend(layer.notices)
    return resolve(cwd, layers, notices, start, vm_only)._replace(unusable=tuple(unusable))


def _load_layer(path: Path, name: str, read: Any) -> Layer:
    """Validate one file's text, or reuse the result for exactly this content (no YAML import on a hit)."""


    digest = hashlib.sha256(f"{name}\0{path}\0{read.sha256}".encode()).hexdigest()
    cache = paths.state_dir() / "config-cache" / f"{digest[:32]}.json"
    try:
        data = json.loads(cache.read_text())
        if data["digest"] == digest:
            positions = {tuple(key): where for key, where in data["positions"]}
            return Layer(name, path, data["data"], positions, data["notices"], read.sha256)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # deferred: start-up (config.schema: only an uncached config layer is checked)
    from agentbox.config import schema

    layer = schema.validate(yamlio.compose(read.text, path), path, name)._replace(sha256=read.sha256)
    _store_layer(cache, digest, layer)
    return layer


def _store_layer(cache: Path, digest: str, layer: Layer) -> None:


    try:
        payload = json.dumps(
            {"digest": digest, "data": layer.data, "positions": [[list(k), v] for k, v in layer.positions.items()],
             "notices": layer.notices},
            allow_nan=False,
        )
        # Only what JSON gives back unchanged may be cached (no dates or other YAML-only values).
        if json.loads(payload)["data"] != layer.data:
            return
        private_dir(cache.parent)
        atomic_write(cache, payload, mode=0o600)
    except (OSError, TypeError, ValueError):
        pass


def find_local_config(start: Path) -> Path | None:
    """The nearest agentbox.yml from start upward (whether it may be used is decided when it is read)."""
    for directory in (start, *start.parents):
        candidate = directory / paths.LOCAL_CONFIG_NAME
        if os.path.lexists(candidate):
            return candidate
    return None


def _read_usable(path: Path, layer: str) -> Any:
    """Read a config file once, if it may be used (the checks apply to the file that was read), or say why not.

    Like git's safe.directory: only the user's own regular files, writable by nobody else. A file that is
    group-writable is accepted when the group is the user's private group (Ubuntu's and Fedora's umask 002
    makes every clone's files 0664, with the user's own group).
    """


    real = os.path.realpath(path)
    shown = visible(f"{path} (-> {real})" if os.path.islink(path) else str(path))
    quoted = shlex.quote(real)
    if os.path.islink(path) and not os.path.exists(path):
        missing = "it is a symlink to a file that does not exist"
        return UnusableFile(path, layer, shown, missing, f"rm {shlex.quote(str(path))}")
    read = yamlio.read_config(path)
    st = read.st
    if st.st_uid != os.getuid():
        return UnusableFile(
            path,
            layer,
            shown,
            f"it belongs to {_user_name(st.st_uid)}, not to you (uid {os.getuid()}), so someone else "
            "could have written it",
            f"sudo chown $(id -u) {quoted}",
        )
    if st.st_mode & 0o002:
        who = "group and others" if st.st_mode & 0o020 else "others"
        return UnusableFile(path, layer, shown, f"it is writable by {who}", f"chmod g-w,o-w {quoted}")
    if st.st_mode & 0o020:
        problem = shared_group_problem(st.st_gid, os.getuid())
        if problem:
            return UnusableFile(path, layer, shown, f"it is writable by {visible(problem)}", f"chmod g-w,o-w {quoted}")
    return read


def shared_group_problem(gid: int, uid: int) -> str | None:
    """Why the group gid is not the private group of uid, as "the group NAME, which ...", or None when it is."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return f"the group with gid {gid}, which is not in the group database"
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return f"the group {group.gr_name}, and your uid {uid} has no account entry to compare it with"
    why = private_group_problem(group, user)
    return f"the group {group.gr_name}, which {why}" if why else None


def private_group_problem(group: Any, user: Any) -> str | None:
    """The decision itself, on grp/pwd entries: only the user may be a member, and the group must be the
    user's primary group or carry the user's name (as user private groups do)."""
    others = [member for member in group.gr_mem if member != user.pw_name]
    if others:
        return f"has other members ({', '.join(others)})"
    if group.gr_gid != user.pw_gid and group.gr_name != user.pw_name:
        return f"is not your private group (that is gid {user.pw_gid})"
    return None


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def merge(layers: list[Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge defaults and layers by agentbox's rules; return data and the origin of every value."""
    data = copy.deepcopy(DEFAULTS)
    origins: dict[str, str] = {}
    _note_origins(origins, DEFAULTS, "default")
    for layer in layers:
        raw = copy.deepcopy(layer.data)
        wait = raw.pop("defaults", {}).get("startupWaitSec")
        if "startupWaitSec" not in raw and wait is not None:
            raw["startupWaitSec"] = wait
        label = f"{layer.name} ({layer.path})"
        for key, value in raw.items():
            if key == "env":
                data["env"].update(value)
                _note_origins(origins, {"env": value}, label)
            elif key == "bootstrap":
                for hook in ("onCreateScript", "onStartScript"):
                    for script in value.get(hook, []):
                        origins[f"bootstrap.{hook}[{len(data['bootstrap'][hook])}]"] = label
                        data["bootstrap"][hook].append((script, layer))
            elif key == "mounts":
                data["mounts"] = [(m, layer) for m in value]
                for name in [k for k in origins if k.startswith("mounts")]:
                    del origins[name]
                origins["mounts"] = label
            elif key == "credentials":
                previous = data.get("credentials", {})
                if isinstance(value, dict) and isinstance(previous, dict):
                    value = {**previous, **value}
                data["credentials"] = value
                origins["credentials"] = label
            elif key in ("vm", "sync", "git", "agents", "checkpoints", "instructions", "session", "tasks", "network"):
                if key == "agents":
                    value = _with_excludes_added(data.get("agents", {}), value)
                if key == "network":
                    value = _with_lists_added(data.get("network", {}), value, ("presets", "allow"))
                if key == "vm" and "image" in value:
                    # One image, whole: a project's location never boots with the global file's kernel.
                    data.get("vm", {}).pop("image", None)
                    for name in [k for k in origins if k == "vm.image" or k.startswith("vm.image.")]:
                        del origins[name]
                deep_merge(data.setdefault(key, {}), value)
                _note_origins(origins, {key: value}, label)
            else:
                data[key] = (value, layer) if key in ("workspace", "caCert") else value
                origins[key] = label
    return data, origins


def _with_excludes_added(merged: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's agents with each `sync.exclude` list added to the one merged so far: a project's file can
    exclude more than the global file does, never less (it could otherwise bring back what the user left out)."""
    result = dict(layer)
    for name, agent in layer.items():
        excluded = agent.get("sync", {}).get("exclude") if isinstance(agent, dict) else None
        before = merged.get(name, {}).get("sync", {}).get("exclude", [])
        if excluded is not None and before:
            result[name] = {**agent, "sync": {**agent["sync"], "exclude": list(dict.fromkeys([*before, *excluded]))}}
    return result


def _with_lists_added(merged: dict[str, Any], layer: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """A layer's mapping with each listed key's list added to the one merged so far (local and global add up)."""
    result = dict(layer)
    for name in names:
        if name in layer and merged.get(name):
            result[name] = list(dict.fromkeys([*merged[name], *layer[name]]))
    return result


def deep_merge(target: dict[str, Any], source: dict[str, Any]) -> None:
    """Merge source into target: mappings key by key, everything else replaced."""
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _note_origins(origins: dict[str, str], data: dict[str, Any], label: str, prefix: str = "") -> None:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name != "vm.lima":
            _note_origins(origins, value, label, name + ".")
        else:
            origins[name] = label


def resolve(cwd: Path, layers: list[Any], notices: list[str], start: Path | None = None,
            vm_only: bool = False) -> Config:
    """The Config of a command run in cwd; `start`: where the workspace is looked for (cwd unless cwd is in
    a worktree agentbox made, see worktree_project); `vm_only`: see load."""
    data, origins = merge(layers)
    local = next((layer for layer in layers if layer.name == "local"), None)
    global_layer = next((layer for layer in layers if layer.name == "global"), None)

    workspace, workspace_rule, problem = _resolve_workspace(start or cwd, data, local)
    if start is not None and start != cwd and not problem:
        workspace_rule += f" (the current folder {cwd} is a worktree of it)"
    origins["workspace"] = workspace_rule
    lima_home = paths.lima_home()
    vm = data["vm"]
    if "name" in vm:
        vm_name = vm["name"]
        _check_socket_length(vm_name, lima_home, _position(layers, ("vm", "name")))
    else:
        vm_name = naming.default_vm_name(workspace, lima_home)
        origins["vm.name"] = "default (from the workspace folder name)"
        _check_socket_length(vm_name, lima_home, None)

    agents = {}
    configured = data.get("agents", {})
    problems = Problems()  # the agents' and mounts' errors together, in file order
    for name in [*BUILTIN_AGENTS, *sorted(set(configured) - set(BUILTIN_AGENTS))]:
        with problems.gathering():
            agents[name] = _resolve_agent(name, configured.get(name, {}), vm_name, layers, lima_home)
    mounts = _resolve_mounts(data["mounts"], workspace, problems, notices if vm_only else None)
    problems.raise_any(" and ".join(str(layer.path) for layer in layers))
    ca_cert = None
    if "caCert" in data:
        value, layer = data["caCert"]
        ca_cert = _expand(value, _base_dir(layer, workspace))
    vm_image = None
    if "image" in vm:
        owner = local if local and "image" in local.data.get("vm", {}) else global_layer
        vm_image = image.resolve(vm["image"], _base_dir(owner, workspace))
    template = None
    if "template" in vm:
        owner = local if local and "template" in local.data.get("vm", {}) else global_layer
        template = _expand(vm["template"], _base_dir(owner, workspace))

    def scripts(hook: str) -> tuple[Script, ...]:
        return tuple(Script(_expand(path, workspace), layer.name) for path, layer in data["bootstrap"][hook])

    credentials = _credential_settings(data.get("credentials", True), global_layer, local, notices)
    network = policy.from_data(data["network"])
    _check_inspect(network, credentials, local if local and "inspect" in local.data.get("network", {})
                   else global_layer, notices)

    return Config(
        cwd=cwd,
        workspace=workspace,
        workspace_problem=problem,
        workspace_rule=workspace_rule,
        global_file=global_layer.path if global_layer else None,
        local_file=local.path if local else None,
        vm_name=vm_name,
        cpus=vm["cpus"],
        memory=vm["memory"],
        disk=vm["disk"],
        vm_type=vm.get("vmType"),
        arch=vm.get("arch"),
        mount_type=vm.get("mountType"),
        template=template,
        image=vm_image,
        lima=vm.get("lima", {}),
        mounts=tuple(mounts),
        env=data["env"],
        remote_write=data["sync"].get("remoteWrite", False),
        sync_agent_config=data["sync"].get("agentConfig", True),
        startup_wait_sec=data["startupWaitSec"],
        on_create=scripts("onCreateScript"),
        on_start=scripts("onStartScript"),
        ca_cert=ca_cert,
        agents=agents,
        origins=origins,
        credentials=credentials,
        notices=tuple(notices),
        local_data=local.data if local else {},
        global_data=global_layer.data if global_layer else {},
        local_sha256=local.sha256 if local else "",
        protect_git_hooks=vm.get("protectGitHooks", False),
        checkpoints=_checkpoint_settings(data["checkpoints"]),
        session_mode=data["session"]["mode"],
        tasks_max_concurrent=data["tasks"]["maxConcurrent"],
        task_hosts=_task_hosts(data["tasks"]["hosts"]),
        keep_alive=data["session"]["keepAlive"],
        instructions_quarantine=data["instructions"]["quarantine"],
        notify=data["notify"],
        vm_base=_vm_base(vm["base"]),
        base_max_age_days=vm["baseMaxAgeDays"],
        network=network,
        push_scope=data["git"]["allowPush"] or None,
    )


def _check_inspect(network: NetworkSettings, credentials: CredentialSettings, layer: Any, notices: list[str]) -> None:
    """network.inspect: all needs the VM's CA, which only the credential broker makes and installs; in open mode it
    has nothing to inspect (said when the project's file asks for it)."""
    if network.inspect != policy.INSPECT_ALL:
        return
    if network.mode == "open":
        if layer is None or layer.name != "local":
            return  # the global config's standing choice, for the projects that use allowlist or offline mode
        notices.append("network.inspect: all has no effect in network.mode open (traffic leaves directly, not "
                       "through the broker); it applies in allowlist and offline mode")
        return
    if credentials.enabled and credentials.broker:
        return
    where = (layer.positions.get(("network", "inspect")) if layer is not None else None) or (
        str(layer.path) if layer is not None else "network.inspect")
    setting = "credentials: false" if not credentials.enabled else "credentials.broker: false"
    raise ConfigError(
        f"{where}: network.inspect: all needs the VM's own certificate authority, which the credential broker "
        f"makes and installs in the VM, and the config says {setting}",
        hint="Nothing was created or started. Turn the broker on (`credentials: {broker: true}`, the default) or "
             "write `network.inspect: credentials`.")


def _vm_base(configured: str) -> str:
    """vm.base, unless $AGENTBOX_VM_BASE (auto or off) overrides it for this run (CI, tests)."""
    override = os.environ.get("AGENTBOX_VM_BASE")
    if not override:
        return configured
    if override not in keys.BASE_MODES:
        raise ConfigError(f"AGENTBOX_VM_BASE: expected auto or off, found {override!r}")
    return override


def _task_hosts(raw: list[Any]) -> tuple[TaskHost, ...]:
    found = []
    for item in raw:
        entry: dict[str, Any] = {"name": item} if isinstance(item, str) else item
        slots = entry.get("maxConcurrent")
        found.append(TaskHost(str(entry["name"]), int(slots) if slots is not None else None))
    return tuple(found)


def _checkpoint_settings(raw: dict[str, Any]) -> CheckpointSettings:
    size = sizes.to_bytes(str(raw["maxFileSize"]))
    assert size is not None  # validated by the schema
    return CheckpointSettings(raw["enabled"], size, raw["keep"], str(raw["maxFileSize"]))


def _credential_settings(raw: Any, global_layer: Any, local: Any, notices: list[str]) -> CredentialSettings:
    if raw is False:
        return CredentialSettings(enabled=False)
    if not isinstance(raw, dict):
        raw = {}
    write_back = raw.get("writeBack", True)
    # writeBack writes host files: a project's agentbox.yml may turn it off, never on against the global config.
    in_global = global_layer.data.get("credentials", True) if global_layer is not None else True
    if write_back and (in_global is False or (isinstance(in_global, dict) and in_global.get("writeBack") is False)):
        write_back = False
        in_local = local.data.get("credentials") if local is not None else None
        if isinstance(in_local, dict) and in_local.get("writeBack") is True:
            notices.append(
                f"credentials.writeBack: true in {local.path} is not used: the global config ({global_layer.path}) "
                "turns write-back off, and a project file can only turn it off"
            )
    return CredentialSettings(
        True, raw.get("netrc", False), raw.get("gh", True), raw.get("git", True), write_back=write_back,
        broker=raw.get("broker", True),
    )


def _resolve_workspace(cwd: Path, data: dict[str, Any], local: Any) -> tuple[Path, str, str | None]:
    """The workspace, the rule that chose it (in words) and why it cannot be one (or None).

    A local file decides (its `workspace`, else its folder), even when it lies below the top of a
    git work tree: its place was chosen by whoever wrote it. Without one, the workspace is the git
    work tree the current folder is in, so a launch from any subfolder uses the repository's VM.
    """
    if "workspace" in data:
        value, layer = data["workspace"]
        workspace = _expand(value, layer.path.parent)
        source = f"`workspace` in {layer.path}"
    elif local is not None:
        workspace = local.path.parent
        source = f"the folder of {local.path}"
    else:
        here = Path(os.path.realpath(cwd))
        top = _work_tree_top(here)
        if top is not None:
            workspace, source = top, "the git work tree containing the current folder"
        else:
            workspace, source = here, "the current folder: no agentbox.yml, not inside a git work tree"
    workspace = Path(os.path.realpath(workspace))
    if local is not None:
        top = _work_tree_top(workspace)
        if top is not None and top != workspace:
            source += f", inside the git work tree {top} (the VM does not see the rest of it, nor its .git)"
    control = paths.control_character_problem(str(workspace))
    if control:
        return workspace, source, f"the workspace path {str(workspace)!r} ({source}) {control}"
    if workspace == Path("/"):
        return workspace, source, f"the workspace would be / ({source}); agentbox never mounts the whole filesystem"
    problem = paths.mount_target_problem(workspace)
    if problem:
        return (
            workspace,
            source,
            (f"the workspace would be {workspace} ({source}), but {problem}; agentbox never mounts it into a VM"),
        )
    if not workspace.is_dir():
        return workspace, source, f"the workspace {workspace} ({source}) does not exist or is not a folder"
    return workspace, source, None


def _work_tree_top(folder: Path) -> Path | None:
    return dirs.work_tree_top(folder, Path(os.path.realpath(paths.home())))


def _workspace_hint(config: Config) -> str:
    if config.local_file is None:
        # Not `agentbox init` here: that would write agentbox.yml into the home folder (or /).
        return (
            "Run agentbox in a project folder, or pass -C DIR. Settings for every project go in the global "
            "config: `agentbox init --global`."
        )
    if Path(os.path.realpath(config.local_file.parent)) == Path(os.path.realpath(paths.home())):
        return (
            f"{config.local_file} is found from every folder below your home folder that has no agentbox.yml "
            f"of its own: move its settings to {paths.global_config_file()} and remove it."
        )
    return f"Fix `workspace` in {config.local_file}, or run agentbox from another project."


def _resolve_agent(name: str, raw: dict[str, Any], vm_name: str, layers: list[Any], lima_home: Path) -> AgentConfig:
    builtin = BUILTIN_AGENTS.get(name)
    if builtin is None and "binary" not in raw:
        # deferred: start-up (difflib: only a misspelt agent's suggestion, never a launch)
        import difflib

        position = _position(layers, ("agents", name))
        close = difflib.get_close_matches(name, list(BUILTIN_AGENTS), n=1, cutoff=0.6)
        hint = (
            f"Did you mean `agents.{close[0]}`?"
            if close
            else f"Add `binary: <executable>` under agents.{name} to define a new agent."
        )
        raise ConfigError(
            f"{position}: agents.{name}: `{name}` is not a built-in agent "
            f"({', '.join(BUILTIN_AGENTS)}), so it needs `binary`",
            hint=hint,
        )
    if "vmName" in raw:
        _check_socket_length(raw["vmName"], lima_home, _position(layers, ("agents", name, "vmName")))
    return AgentConfig(
        name=name,
        binary=raw.get("binary", builtin.binary if builtin else ""),
        default_args=tuple(raw["defaultArgs"]) if "defaultArgs" in raw else (builtin.default_args if builtin else ()),
        model=raw.get("model"),
        vm_name=raw.get("vmName", vm_name),
        install=raw.get("install", builtin.install if builtin else None),
        builtin=builtin is not None,
        credentials=_agent_credentials(raw.get("credentials", True), builtin.credentials if builtin else ()),
        sync=_agent_sync(name, raw.get("sync", {}), layers),
        task_args=tuple(raw["taskArgs"]) if "taskArgs" in raw else (builtin.task_args if builtin else ()),
        endpoints=endpoints(name, raw.get("endpoints")),
        instruction_files=tuple(raw.get("instructionFiles", builtin.instruction_files if builtin else ())),
    )


def _agent_sync(name: str, raw: dict[str, Any], layers: list[Layer]) -> AgentSync:
    """agents.<name>.sync, its paths checked: relative to the agent's folder, never leaving it."""
    builtin = BUILTIN_AGENTS.get(name)
    folder = f"~/{builtin.folder}" if builtin and builtin.folder else "the agent's folder"
    for key in ("include", "exclude"):
        for index, entry in enumerate(raw.get(key, [])):
            parts = entry.replace("\\", "/").split("/")
            if entry.startswith(("/", "~")) or ".." in parts or not entry.strip("/ "):
                raise ConfigError(
                    f"{_position(layers, ('agents', name, 'sync', key, f'[{index}]'))}: agents.{name}.sync.{key}"
                    f"[{index}]: {entry!r} must be a path or glob inside {folder} (relative, without ..)",
                    hint=f"Write it relative to {folder}: `skills/my-skill` for {folder}/skills/my-skill.",
                )
    return AgentSync(
        include=tuple(raw.get("include", ())),
        exclude=tuple(raw.get("exclude", ())),
        mcp_secrets=raw.get("mcpSecrets", False),
    )


def _agent_credentials(raw: Any, builtin: tuple[str, ...]) -> tuple[str, ...]:
    if raw is False:
        return ()
    if raw is True:
        return builtin
    return tuple(raw)


def _resolve_mounts(raw: list[Any], workspace: Path, problems: Problems,
                    left_out: list[str] | None) -> tuple[Mount, ...]:
    """Every mount, each one's error kept in `problems`; with `left_out` (load's vm_only) a mount in error is left
    out instead and its error becomes a notice there."""
    mounts = []
    for index, (entry, layer) in enumerate(raw):
        if left_out is None:
            with problems.gathering():
                mounts.append(_resolve_mount(entry, layer, index, workspace))
            continue
        try:
            mounts.append(_resolve_mount(entry, layer, index, workspace))
        except ConfigError as exc:
            left_out.append(f"{exc.message}. This command needs only the VM and goes on without that mount; "
                            "`start`, `restart` and launches refuse until it is fixed")
    return tuple(mounts)


def _resolve_mount(raw: dict[str, Any], layer: Any, index: int, workspace: Path) -> Mount:
    # deferred: start-up (config.mountpaths: only a configured mount needs it)
    from agentbox.config import mountpaths

    written = raw["location"]
    location = _expand(written, _base_dir(layer, workspace))
    real, refused = mountpaths.refusal(location, written, workspace, layer.name == "global")
    if refused:
        where = layer.positions.get(("mounts", f"[{index}]", "location")) or layer.positions.get(
            ("mounts", f"[{index}]"), str(layer.path))

        shown, hint = written, refused.hint
        relative = not os.path.isabs(os.path.expanduser(written))
        if str(location) != written:
            shown += f" ({location}{', relative to the folder of the file' if relative else ''})"
        if relative and layer.name == "global":
            hint += (" A relative location in the global config is relative to its folder, never to the workspace: "
                     "write the folder as an absolute path or as ~/...")
        raise ConfigError(
            f"{where}: mounts[{index}].location: {visible(shown)}: {visible(refused.reason)}",
            hint=f"Nothing was created or started. {hint}",
        )
    mount_point = raw.get("mountPoint")
    at = layer.positions.get(("mounts", f"[{index}]", "mountPoint")) or layer.positions.get(
        ("mounts", f"[{index}]", "location"), str(layer.path))
    if mount_point is None:
        mount_point = str(location)
    elif mount_point.startswith("~"):
        raise ConfigError(
            f"{at}: mounts[{index}].mountPoint: {mount_point!r} starts with ~, which Lima does not allow",
            hint="Give the path inside the VM as an absolute path.",
        )
    if not mount_point.startswith("/"):
        raise ConfigError(
            f"{at}: mounts[{index}].mountPoint: {mount_point!r} must be an absolute path inside the VM",
        )
    if os.path.normpath(mount_point) in RESERVED_MOUNT_POINTS:
        raise ConfigError(
            f"{at}: mounts[{index}].mountPoint: {mount_point} would hide the VM's own {mount_point}; Lima refuses it",
            hint="Mount it below, for example at /mnt" + mount_point.rstrip("/") + ".",
        )
    return Mount(location=location, mount_point=mount_point, writable=raw.get("writable", False), real=real)


def _base_dir(layer: Any, workspace: Path) -> Path:
    """Relative paths in a config file are relative to its folder (the folder it was found in).

    Never to the workspace for the global file: a cloned repository would then decide what a global
    mount, template or CA file is (a symlink at that relative path).
    """
    return layer.path.parent if layer is not None else workspace


def _expand(value: str, base: Path) -> Path:
    path = Path(os.path.expanduser(value))
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _position(layers: list[Layer], keypath: tuple[str, ...]) -> str:
    for layer in layers[::-1]:
        if keypath in layer.positions:
            return layer.positions[keypath]
    return "config"


def _check_socket_length(name: str, lima_home: Path, where: str | None) -> None:
    limit = naming.socket_limit(lima_home)
    if len(name) <= limit:
        return
    prefix = f"{where}: " if where else ""
    raise ConfigError(
        f"{prefix}the VM name {name!r} is {len(name)} characters, but with LIMA_HOME={lima_home} "
        f"Lima's socket paths allow at most {limit}",
        hint="Choose a shorter `vm.name`, or use a shorter LIMA_HOME.",
    )


def print_notices(config: Config) -> None:
    for notice in config.notices:
        warn(notice)
