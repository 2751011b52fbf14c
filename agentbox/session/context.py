"""The sandbox described for the agent: /run/agentbox/context.json and the block in its memory files.

An agent that does not know what its sandbox allows wastes turns probing it. At every launch the host
builds one document (`build`): the VM, the workspace and how live it is, every mount with read/write,
the staging folder, the network facts that hold, what remote writes are blocked, which login files
and env keys came in (names only: no value ever goes into it), the tools, and which config key gives
more. It is staged (`stage`); launch.sh adds what `command -v` finds for the tools and installs it as
/run/agentbox/context.json (root's, 0644), and keeps a short block derived from it
(`memory_block`) between BEGIN/END AGENTBOX markers in each agent's user-level memory file
(provision/agent-memory.sh). `agentbox describe` prints the same document on the host, without a
limactl call. Its fields are described in agentbox/schemas/context.schema.json (`SCHEMA_FILE`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from agentbox import __version__, paths, sizes, staginglayout
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.config import keys
from agentbox.credentials import brokerreport, loginfiles
from agentbox.fsutil import private_dir, write_if_changed
from agentbox.net import hold, policy, pushes
from agentbox.session import guestenv
from agentbox.vm import effective, render, statefile, workmode

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.vm.lima import Instance

SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "context.schema.json"
GUEST_FILE = "/run/agentbox/context.json"
ENV_NAME = "AGENTBOX_CONTEXT_FILE"
BEGIN_MARKER = "<!-- BEGIN AGENTBOX: written by agentbox at every launch; edits between these lines are replaced -->"
END_MARKER = "<!-- END AGENTBOX -->"

# Commands the provisioning installs (provision/10-base-packages.sh to 40-github-cli.sh), and python3, which
# the Ubuntu image brings. tests/test_context.py checks them against the scripts.
PROVISIONED_TOOLS = ("git", "curl", "jq", "make", "gcc", "g++", "unzip", "gpg", "tmux", "docker", "node", "npm", "gh")
IMAGE_TOOLS = ("python3",)

# What the gh guard lets through (wrappers/gh's allowlist; a test compares them).
GH_ALLOWED = (
    "gh pr view|list|checks|diff|status|create, gh issue list|view|status|create|comment, gh repo view|clone|list, "
    "gh search, gh auth status, gh api (GET, and graphql queries without mutations), gh help, gh version"
)

# What the agent may want, and the key that gives it (keys.py says whether a project file needs trust for it).
ASK_FOR = (
    ("another host folder in the VM (read-only, or writable)", ("mounts",)),
    ("git push to branches of your own only (agentbox/<vm>/...), checked on the host", ("git", "allowPush")),
    ("git push and other remote writes anywhere", ("sync", "remoteWrite")),
    ("an environment variable (an API key, a proxy)", ("env",)),
    ("a login file of an agent", ("agents", "<name>", "credentials")),
    ("~/.netrc", ("credentials", "netrc")),
    ("more CPUs", ("vm", "cpus")),
    ("more memory", ("vm", "memory")),
    ("a larger disk", ("vm", "disk")),
    ("a script that sets the VM up once (packages, services)", ("bootstrap", "onCreateScript")),
    ("a script run at every boot of the VM", ("bootstrap", "onStartScript")),
    ("extra CA certificates", ("caCert",)),
)


class Seen(NamedTuple):
    """What a launch staged (credential files relative to the guest home, env keys, whether the git identity went
    in) and what Lima reported of the VM (its facts, its mounts)."""

    staged_credentials: list[str]
    env_keys: Iterable[str]
    git_identity: bool
    vm_facts: dict[str, Any] | None
    mounts: list[tuple[str, str, bool]] | None


def build(config: Config, vm_name: str, agent: AgentConfig | None, seen: Seen | None = None, mode: str = "live",
          checkpoint: int | None = None) -> dict[str, Any]:
    """The document for a launch of `agent` (None: `agentbox shell`) in the VM `vm_name`.

    A launch passes what it staged and what Lima reported (`seen`); `describe` leaves it out and gets what a launch
    would stage now and what the VM was last seen with (`seen_now`). `mode` and `checkpoint` are the workspace's
    session mode (live, or isolated) and the checkpoint taken when the session started, where those features run.
    """
    seen = seen if seen is not None else seen_now(config, vm_name, agent)
    workspace = config.require_workspace()
    mounts = seen.mounts if seen.mounts is not None else mounts_for(config, vm_name)
    mount_list = [_mount(location, point, writable, config, str(workspace), vm_name)
                  for location, point, writable in mounts]
    # Isolated: the agent's copy in the VM, which it may change (its changes reach the host as a proposal).
    workspace_writable = mode == "isolated" or any(
        m["guestPath"] == str(workspace) and m["writable"] for m in mount_list
    )
    return {
        "schema": SCHEMA_VERSION,
        "about": (
            "What agentbox's sandbox gives you and what it does not. agentbox writes this file on the host side "
            f"at every launch (read-only here; {ENV_NAME} names it). Field meanings: agentbox's "
            "agentbox/schemas/context.schema.json. No secret value is ever written here: names only."
        ),
        "agentbox": {"version": __version__},
        "contextFile": GUEST_FILE,
        "vm": _vm(config, vm_name, seen.vm_facts if seen.vm_facts is not None else vm_facts_for(config, vm_name)),
        "workspace": {"path": str(workspace), "writable": workspace_writable, "mode": mode,
                      "meaning": _MODE_MEANING[mode], "checkpoint": checkpoint},
        "mounts": mount_list,
        "staging": {
            "path": str(paths.staging_dir(vm_name)),
            "writable": False,
            "holds": "launch.sh, the git/gh guards, bootstrap scripts, the env file and the login files of this "
                     "launch; agentbox rewrites it on the host before each launch",
        },
        "network": _network(config, vm_name),
        "remoteWrite": _remote_write(config, vm_name),
        "credentials": _credentials(config, vm_name, agent, seen),
        "env": {
            "keys": sorted(set(seen.env_keys) | {ENV_NAME}),
            "note": "Names of the variables agentbox sets for the session (from the user's config); values are "
                    "never written here.",
        },
        "tools": {
            "checkedInVm": False,
            "list": _tools(config),
            "installMore": "You may use sudo: `sudo apt-get install PACKAGE`; `npm install -g` installs into ~/.local "
                           "without root. What you install stays in this VM (until it is recreated) and never "
                           "reaches the host.",
        },
        "memoryFiles": memory_files(),
        "askForMore": _ask_for_more(config),
    }


def seen_now(config: Config, vm_name: str, agent: AgentConfig | None) -> Seen:
    """What a launch of `agent` would stage now, for `describe` (the VM's facts and mounts: as last seen)."""
    brokered = config.credentials.enabled and config.credentials.broker
    staged = present_credentials(loginfiles.launch_files(config, agent))
    if brokered:
        staged = brokerreport.staged_for_vm(vm_name, staged)
    # the proxy's variables when a proxy serves the VM (its port does not matter here: names only)
    proxied = brokered or config.network.proxied
    env_keys = guestenv.of(config, policy.ProxyAccess(1, "") if proxied else None)
    settings = config.credentials
    git_identity = settings.enabled and settings.git and (Path(os.path.expanduser("~")) / ".gitconfig").is_file()
    return Seen(staged, env_keys, git_identity, None, None)


def _credentials(config: Config, vm_name: str, agent: AgentConfig | None, seen: Seen) -> dict[str, Any]:
    return {
        "stagedFor": agent.name if agent is not None else None,
        "files": [{"path": f"~/{path}", "for": owner} for path, owner in _owners(config, seen.staged_credentials)],
        "gitIdentity": bool(seen.git_identity),
        "broker": _broker(config, vm_name),
        "note": "Names only. A launch of one agent brings that agent's login files (plus gh's and the safe part "
                "of ~/.gitconfig); `agentbox shell` brings every agent's. They are copies: a file changed "
                "here does not change the host's.",
    }


def _broker(config: Config, vm_name: str) -> dict[str, Any]:
    report = brokerreport.of(config, vm_name)
    report["meaning"] = (
        "The credential broker (credentials.broker). Brokered: the login files and API keys of these agents in "
        "the VM hold placeholders, not secrets; requests to their own hosts go through agentbox's proxy "
        "(HTTPS_PROXY, with this VM's proxy credentials in its URL), which puts the real value in on the host, "
        "only in the header (or documented query parameter) its service takes it in and only for the requests "
        "its CLI makes; a placeholder anywhere else (another host, header, cookie, "
        "query or a request body: do not paste a login file into a conversation), or another credential sent to "
        "their hosts, is refused (HTTP 403). GitHub is read-only through it. Staged: real copies of the host's "
        "logins. A note says what the user must do on the host (`log in on the host with ...`): ask them; do not "
        "log in inside the VM (a login from the VM is accepted only while the user runs `agentbox AGENT login`)."
        if report["enabled"] else
        "The credential broker (credentials.broker) is off: every login brought in is a copy of the host's.")
    return report


def memory_files() -> list[str]:
    """The agents' user-level memory files in the guest that carry agentbox's block (the agents' records)."""
    return [spec.memory_file for spec in BUILTIN_AGENTS.values() if spec.memory_file]


_MODE_MEANING = {
    "live": "the workspace is the user's own folder on the host: every change you make there is on the host at "
            "once, with no copy to review first",
    "isolated": "the workspace is a copy: your changes reach the user's folder only as a proposal they review "
                "and apply on the host",
}


def shown_location(location: str) -> str:
    """An image's location without what may hold a password (a URL's user part, its query)."""
    parts = urlsplit(location)
    if not parts.netloc:
        return location
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _vm(config: Config, vm_name: str, facts: dict[str, Any]) -> dict[str, Any]:
    image = None
    if config.template is None and not {"base", "images"} & set(config.lima):
        image = render.IMAGE_BASE if config.image is None else shown_location(config.image.location)
    return {
        "name": vm_name,
        "cpus": facts.get("cpus"),
        "memory": facts.get("memory"),
        "disk": facts.get("disk"),
        "vmType": facts.get("vmType"),
        "arch": facts.get("arch"),
        "image": image,
        "root": "the VM's user has sudo without a password: you are root in the VM, not on the host",
    }


def vm_facts(instance: Instance) -> dict[str, Any]:
    """What Lima reports of a VM (`limactl list`): cpus, memory and disk in bytes, vmType, arch."""
    return {
        "cpus": instance.cpus or None,
        "memory": instance.memory or None,
        "disk": instance.disk or None,
        "vmType": instance.vm_type or None,
        "arch": instance.arch or None,
    }


def vm_facts_for(config: Config, vm_name: str) -> dict[str, Any]:
    """Without asking Lima: what the last launch saw (the VM's record), else what the config asks for."""
    seen = statefile.read(vm_name).get("seen")
    if isinstance(seen, dict):
        return seen
    return {
        "cpus": config.cpus,
        "memory": sizes.to_bytes(config.memory),
        "disk": sizes.to_bytes(config.disk),
        "vmType": config.vm_type,
        "arch": config.arch,
    }


def effective_mounts(instance: Instance) -> list[tuple[str, str, bool]] | None:
    """The mounts Lima reports the VM runs with (merged by mount point, as Lima merges them)."""
    mounts = instance.config.get("mounts")
    return effective.merged_mounts(mounts) if isinstance(mounts, list) else None


def mounts_for(config: Config, vm_name: str) -> list[tuple[str, str, bool]]:
    """Without asking Lima: the mounts the VM was created with (its record), else those the config renders."""

    expected = statefile.read(vm_name).get("expected")
    if isinstance(expected, dict) and isinstance(expected.get("mounts"), list):
        return [(str(m[0]), str(m[1]), bool(m[2])) for m in expected["mounts"]]
    return [(m.location, m.mount_point, m.writable) for m in render.mounts_for(config, vm_name)]


def _mount(
    location: str, point: str, writable: bool, config: Config, workspace: str, vm_name: str
) -> dict[str, Any]:
    configured = {m.mount_point for m in config.mounts}
    if point == workspace:
        role = "workspace"
    elif point == workmode.GUEST_SOURCE:
        role = "workspaceSource"
    elif point == str(paths.staging_dir(vm_name)):
        role = "staging"
    elif point == str(paths.vm_outbox(vm_name)):
        role = "outbox"
    elif point in configured:
        role = "mounts"
    elif not writable and os.path.basename(point) == "hooks":
        role = "gitHooks"
    else:
        role = "gitCommonDir"
    return {"hostPath": location, "guestPath": point, "writable": writable, "role": role}


def present_credentials(host_files: list[str]) -> list[str]:
    """The guest paths (relative to the guest home) a launch would stage from host_files: the regular files
    that exist, the first one for each guest path (stat only: no file is read)."""
    found: list[str] = []
    for spec in host_files:
        guest = loginfiles.guest_path_for(spec)
        if not guest.startswith("~/") or guest[2:] in found:
            continue
        try:
            if stat.S_ISREG(os.stat(os.path.expanduser(spec)).st_mode):
                found.append(guest[2:])
        except OSError:
            continue
    return found


def _owners(config: Config, staged: list[str]) -> list[tuple[str, str]]:
    """Each staged file with whose login it is (an agent's name, gh or netrc)."""
    owners: dict[str, str] = {}
    for spec in loginfiles.GH_FILES:
        owners[loginfiles.guest_path_for(spec)[2:]] = "gh"
    owners[loginfiles.NETRC[2:]] = "netrc"
    for agent in config.agents.values():
        for spec in agent.credentials:
            owners.setdefault(loginfiles.guest_path_for(spec)[2:], agent.name)
    return [(path, owners.get(path, "unknown")) for path in staged]


# vm.lima settings that change what the network sentences below describe (beyond the two they follow).
_NETWORK_SETTINGS = ("networks", "portForwards", "hostResolver", "dns")


def _network(config: Config, vm_name: str) -> dict[str, Any]:
    lima = config.lima
    settings = config.network
    ssh: dict[str, Any] = lima["ssh"] if isinstance(lima.get("ssh"), dict) else {}
    if lima.get("propagateProxyEnv") and not settings.proxied:
        proxy = "the host's proxy variables are copied in (vm.lima.propagateProxyEnv)"
    else:
        proxy = "sets no proxy (the host's proxy variables are not copied in)"
    if ssh.get("forwardAgent"):
        agent = "forwarded (vm.lima.ssh.forwardAgent): the host's SSH keys can be used through it"
    else:
        agent = "not forwarded: the host's SSH keys are not usable in the VM"
    enforcement, why = hold.enforcement(vm_name, settings, config.vm_type, thorough=False)
    if settings.mode == "open":
        internet = f"open: the VM reaches the internet directly; agentbox filters nothing and {proxy}"
    else:
        reach = ("only the agent's API" if settings.mode == "offline" else
                 "only the agent's API and the hosts the user allowed (presets, network.allow)")
        internet = (f"{settings.mode}: HTTP and HTTPS leave only through agentbox's proxy (HTTPS_PROXY, HTTP_PROXY; "
                    "their URL carries this VM's proxy credentials, and a request without them gets HTTP 407), "
                    f"which lets through {reach}; a refused request gets HTTP 403 with a JSON body naming the host "
                    "and the command the user can run to allow it (`agentbox net allow HOST`, on the host). "
                    "Programs that ignore the proxy variables cannot reach the network: ask the user instead of "
                    "working around it")
    if settings.allow_host is True:
        host = ("host.lima.internal (192.168.5.2) is the host's localhost (127.0.0.1): every service listening on "
                "the host's localhost is reachable from the VM (network.allowHost: true)")
    elif settings.allow_host:
        ports = ", ".join(str(port) for port in settings.allow_host)
        host = (f"host.lima.internal (192.168.5.2) is the host's localhost: only its ports {ports} are reachable "
                "(network.allowHost); the others are closed")
    else:
        host = ("closed: host.lima.internal (192.168.5.2), the host's localhost, is not reachable from the VM "
                "(the user opens ports with network.allowHost)")
    return {
        "mode": settings.mode,
        "enforcement": enforcement,
        "enforcementWhy": why,
        "internet": internet,
        "hostLocalhost": host,
        "guestPorts": "a port you listen on in the VM (on 127.0.0.1 or 0.0.0.0) is forwarded by Lima to the same "
                      "port on the host's localhost, so the user can open http://localhost:PORT on the host",
        "sshAgent": agent,
        "changedByConfig": [f"vm.lima.{key}" for key in _NETWORK_SETTINGS if key in lima],
    }


def _remote_write(config: Config, vm_name: str) -> dict[str, Any]:
    """What the VM may write to remotes, by sync.remoteWrite and git.allowPush, and what keeps it to that."""
    if config.remote_write:
        ignored = "; git.allowPush: session has no effect beside it" if config.push_scope else ""
        return {
            "allowed": True,
            "setting": f"sync.remoteWrite is true{ignored}",
            "pushes": {"scope": "all", "branches": None},
            "blocked": [],
            "allowedCommands": ["every git and gh command, with the logins the VM has"],
            "instead": None,
            "enforcedBy": "nothing: the user turned the readonly-remote guards off",
        }
    brokered = config.credentials.enabled and config.credentials.broker
    gh_allowed = GH_ALLOWED + (" (the gh guard lets these through; those that write, such as gh pr create, are then "
                               "refused on the host)" if brokered else "")
    return _session_pushes(vm_name, brokered, gh_allowed) if config.scoped_pushes else _no_pushes(brokered, gh_allowed)


_GUARDED = [
    "one-off git settings and environment variables that make git run a program (-c core.sshCommand=..., "
    "-c alias.*, GIT_SSH_COMMAND, GIT_EXEC_PATH and the like)",
    "every gh command but those in allowedCommands (gh api only with GET)",
]
_GUARDS = "git and gh wrappers in ~/.local/bin and a global pre-push hook; they stop mistakes"


def _session_pushes(vm_name: str, brokered: bool, gh_allowed: str) -> dict[str, Any]:
    """git.allowPush: session: pushes only to the VM's own branches."""
    branches = pushes.namespace(vm_name).removeprefix("refs/heads/")
    host = ("On the host, the credential broker reads every push's ref updates and refuses the whole push when "
            f"one is outside {branches}, a delete, or an update of a branch this VM did not create; it refuses "
            "GitHub API writes too, and records what was pushed (the user sees it in `agentbox status`)"
            if brokered else
            "Nothing on the host checks pushes: the credential broker is off (credentials.broker), so the VM "
            "holds the user's GitHub login; the rules above are kept by the guards in the VM only")
    return {
        "allowed": False,
        "setting": "git.allowPush is session: pushes only to this VM's own branches",
        "pushes": {"scope": "session", "branches": branches},
        "blocked": [
            f"git push of any ref outside {branches} (other branches, tags), of a delete, or of an update to a "
            f"branch under {branches} this VM did not create: the whole push is refused",
            "GitHub API writes (REST calls other than GET and HEAD, GraphQL mutations): `gh pr create` too",
            "send-pack, receive-pack, http-push and the remote-* helpers, however they are reached, and git "
            "submodule foreach",
            *_GUARDED,
        ],
        "allowedCommands": [
            f"git push to a new branch under {branches} (`git push origin HEAD:{branches}NAME`), and later pushes "
            "that update a branch this VM created there",
            "every other git command: fetch, pull, clone, commit, branch, rebase, log, diff, ...",
            gh_allowed,
        ],
        "instead": (f"Push your work to a branch under {branches} and tell the user its name: they review it and "
                    "open the pull request or merge it themselves."),
        "enforcedBy": f"{_GUARDS} early. {host}",
    }


def _no_pushes(brokered: bool, gh_allowed: str) -> dict[str, Any]:
    """sync.remoteWrite false, the default: no push at all."""
    instead = (
        "Commit in the workspace and tell the user what to push: it is their folder, so they push from the host "
        "(where their own keys are). " + (
            "The VM's GitHub access is read-only on the host (the credential broker): `gh pr create` and other "
            "GitHub writes are refused, so the user opens the pull request too." if brokered else
            "`gh pr create` works for a branch they have pushed.")
    )
    return {
        "allowed": False,
        "setting": "sync.remoteWrite is false (the default)",
        "pushes": {"scope": "none", "branches": None},
        "blocked": [
            "git push, send-pack, receive-pack, http-push and the remote-* helpers, however they are reached "
            "(-C, -c, --git-dir, aliases), and git submodule foreach",
            *_GUARDED,
        ],
        "allowedCommands": [
            "every other git command: fetch, pull, clone, commit, branch, rebase, log, diff, ...",
            gh_allowed,
        ],
        "instead": instead,
        "enforcedBy": f"{_GUARDS}. What the VM can reach at all (mounts, logins, config) is decided and enforced on "
                      "the host",
    }


def _tools(config: Config) -> list[dict[str, Any]]:
    tools = [{"name": name, "from": "provisioning", "path": None} for name in PROVISIONED_TOOLS]
    tools += [{"name": name, "from": "image", "path": None} for name in IMAGE_TOOLS]
    seen = {tool["name"] for tool in tools}
    for agent in config.agents.values():
        if agent.binary not in seen:
            seen.add(agent.binary)
            tools.append({"name": agent.binary, "from": f"agent {agent.name}", "path": None})
    return tools


def _ask_for_more(config: Config) -> dict[str, Any]:
    described = dict(keys.walk())
    changes = []
    for want, path in ASK_FOR:
        key = described[path]
        changes.append({
            "want": want,
            "key": keys.dotted(path),
            "projectFileNeedsTrust": keys.trust_words(key),
            "appliesAt": ("a new VM: `agentbox start --recreate`" if key.creation else
                          "the VM's next start (`agentbox restart`)" if key.restart else "the next launch"),
        })
    return {
        "how": "Ask the user: only they can change these, on the host. They edit their global config (trusted as "
               "it is) or the project's agentbox.yml, which you may edit too; a change there that widens the VM "
               "is used only after the user runs `agentbox trust` on the host.",
        "configFiles": {
            "global": str(paths.global_config_file()),
            "local": str(config.local_file) if config.local_file else None,
        },
        "changes": changes,
    }


def memory_block(document: dict[str, Any]) -> str:
    """The short text kept in the agents' memory files, between BEGIN_MARKER and END_MARKER lines."""
    workspace = document["workspace"]
    remote = document["remoteWrite"]
    live = ("live: it is the user's own folder, so every edit is on the host at once"
            if workspace["mode"] == "live" else "isolated: your changes reach the user as a proposal they review")
    scope = remote.get("pushes") or {}
    branches = scope.get("branches")
    if remote["allowed"]:
        push_line = "- Remote writes are allowed (sync.remoteWrite is on): git push and gh use the logins the VM has."
    elif scope.get("scope") == "session":
        push_line = (f"- Pushes go only to branches under `{branches}`: create one "
                     f"(`git push origin HEAD:{branches}NAME`), then update the ones you created. No deletes, no "
                     "other branches or tags, no GitHub API writes (`gh pr create` is refused): tell the user which "
                     "branch to review.")
    else:
        push_line = ("- Remote writes are blocked: `git push` and gh commands that write are refused. Do not try to "
                     "get around it: commit in the workspace and tell the user what to push from the host.")
    lines = [
        BEGIN_MARKER,
        "## Sandbox (agentbox)",
        "",
        f"You run inside `{document['vm']['name']}`, a Lima VM on the user's machine, not on the machine itself.",
        f"- Workspace: `{workspace['path']}`, {live}.",
        push_line,
        "- You have sudo in the VM and may install what you need; only the workspace and the mounts listed in the "
        "context file reach the host.",
        f"- Mounts, network, logins, tools and how to ask for more: `{document['contextFile']}` "
        f"(${ENV_NAME}).",
        "- These limits are set and enforced on the host, outside the VM; the user changes them in agentbox's "
        "config.",
        END_MARKER,
    ]
    return "\n".join(lines) + "\n"


def stage(folder: Path, document: dict[str, Any]) -> None:
    """The document, its memory block, the tools to look up and both digests in the staging folder's context/.

    The digests file is written last and compared first: when it matches, nothing is written (the warm path).
    It also lets launch.sh skip all of it, without starting a process, when nothing changed since the last
    launch. The staged document is compact JSON: launch.sh's jq prints it indented.
    """
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    block = memory_block(document).encode()
    digests = f"{hashlib.sha256(text).hexdigest()}\n{hashlib.sha256(block).hexdigest()}\n".encode()
    try:
        if (folder / staginglayout.CONTEXT_DIGESTS).read_bytes() == digests:
            return
    except OSError:
        pass
    private_dir(folder / staginglayout.CONTEXT)
    write_if_changed(folder / staginglayout.CONTEXT_FILE, text)
    write_if_changed(folder / staginglayout.MEMORY_BLOCK, block)
    tools = "".join(f"{tool['name']}\n" for tool in document["tools"]["list"])
    write_if_changed(folder / staginglayout.CONTEXT_TOOLS, tools.encode())
    write_if_changed(folder / staginglayout.CONTEXT_DIGESTS, digests)


def dump(document: dict[str, Any]) -> str:
    """The document as `agentbox describe --json` prints it."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
