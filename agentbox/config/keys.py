"""Every config key, described once.

Each key says its type, its built-in default, its help, whether it takes effect only when the VM is
created, and whether a project's agentbox.yml needs `agentbox trust` to set it (and why). From this
one table derive: validation (schema.py), the built-in defaults (config.py), the creation fingerprint
that says "`agentbox start --recreate` applies it" (drift.py), the settings Lima changes on the stopped
VM at its next start instead (agentbox.vm.inplace), what needs trust (trust.py), and the
key table in docs/configuration.md (`python3 docs/gen_configuration.py` writes it; tests keep it and
agentbox.yml.example in step).

Adding a key: describe it here, give Config a field and resolve it in config.py, use it. No other
list needs to learn about it. Pure data, no YAML import: the warm launch path reads it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from agentbox.config import image
from agentbox.config.naming import host_name_problem
from agentbox.net import uploads
from agentbox.net.policy import check_inspect, check_mode, check_preset

BOTH = frozenset({"global", "local"})
LOCAL = frozenset({"local"})


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # a key without a built-in value (decided elsewhere, or simply not set)

# When a project's agentbox.yml needs trust for a key:
SET = "set"  # whenever it sets the key
TRUE = "true"  # when it sets the key to true
RULE = "rule"  # a rule in trust.py decides from the resolved value (a path outside the workspace, ...)


class Key(NamedTuple):
    # str, word (a str where a bare off/on stays a word), path, int, bool, size, bytes, strlist, args, env,
    # cap (a bytes size or false: network.uploadLimit), mapping, agents, mounts, freeform, credentials, hosts (a
    # strlist of netproxy patterns), hostports (true,
    # false or a list of ports), taskhosts (tasks.hosts: names or {name, maxConcurrent}), pushmode (git.allowPush:
    # false or `session`), image (vm.image: a location, or a mapping of IMAGE_KEYS)
    kind: str
    help: str
    default: Any = UNSET
    default_text: str = ""  # the default in words, where a value would not say it
    files: frozenset[str] = BOTH
    children: Mapping[str, Key] = MappingProxyType({})
    minimum: int | None = None
    check: Callable[[Any], str | None] | None = None
    creation: bool = False  # fixed when the VM is created: a change needs `agentbox start --recreate`
    restart: bool = False  # Lima changes it on the stopped VM (`limactl edit`): a change applies at its next start
    trust: str | None = None  # SET, TRUE, RULE, or None: harmless in a project's file
    why: str = ""  # what the key could do, for the trust prompt and docs/configuration.md
    documented: bool = True  # a row in docs/configuration.md's key table


VM_TYPES = ("qemu", "vz", "krunkit", "wsl2")
ARCHES = ("x86_64", "aarch64", "armv7l", "ppc64le", "riscv64", "s390x")
MOUNT_TYPES = ("virtiofs", "9p", "wsl2")


BASE_MODES = ("auto", "off")


def _check_base_mode(value: str) -> str | None:
    return None if value in BASE_MODES else f"expected auto or off, found {value!r}"


def _check_network_mode(value: str) -> str | None:
    return check_mode(value)


def _check_network_preset(value: str) -> str | None:
    return check_preset(value)


def _check_vm_type(value: str) -> str | None:
    return None if value in VM_TYPES else f"expected one of {', '.join(VM_TYPES)}, found {value!r}"


def _check_arch(value: str) -> str | None:
    return None if value in ARCHES else f"expected one of {', '.join(ARCHES)}, found {value!r}"


SESSION_MODES = ("live", "isolated")
PUSH_SESSION = "session"  # git.allowPush: pushes only to the VM's own branches (agentbox.net.pushes.namespace)


def _check_session_mode(value: str) -> str | None:
    return None if value in SESSION_MODES else f"expected live or isolated, found {value!r}"


def _check_mount_type(value: str) -> str | None:
    if value == "reverse-sshfs":
        return (
            "reverse-sshfs is refused: its read-only mode is the weakest of Lima's mount types; "
            "use virtiofs (vz) or 9p (qemu)"
        )
    return None if value in MOUNT_TYPES else f"expected one of {', '.join(MOUNT_TYPES)}, found {value!r}"


def _check_instruction_path(value: str) -> str | None:
    """agents.<name>.instructionFiles: a path inside the workspace, relative, never leaving it."""
    parts = value.strip("/").split("/")
    if value.startswith(("/", "~")):
        return f"expected a path relative to the workspace, found the absolute path {value!r}"
    if not value.strip("/") or any(part in ("", ".", "..") for part in parts):
        return f"expected a path inside the workspace (no empty, `.` or `..` parts), found {value!r}"
    return None


AGENT_KEYS: dict[str, Key] = {
    "binary": Key("str", "Executable of the agent inside the VM.", default_text="built-ins", trust=SET,
                  why="decides what runs on every launch"),
    "defaultArgs": Key(
        "args", "Arguments always passed to the agent (a list, or one string split like a shell would).",
        default_text="built-ins", trust=SET, why="decide the agent's settings on every launch",
    ),
    "model": Key("str", "Model passed as --model unless the command line already names one.", default_text="none"),
    "vmName": Key("vmname", "VM used for this agent in this project.", files=LOCAL, default_text="the project's VM",
                  trust=SET, why="could move the session into another project's VM"),
    "taskArgs": Key(
        "args", "The agent's non-interactive form for `agentbox run`: arguments before the prompt (a leading "
        "word is a sub-command the defaultArgs follow).", default_text="built-ins (`claude -p`, `codex exec`, ...)",
        trust=SET, why="decide what runs for every background task",
    ),
    "install": Key("str", "Shell command that installs the agent's CLI in the VM (agents you define).",
                   default_text="built-ins", trust=SET, why="runs in the VM when the agent is missing"),
    "credentials": Key("agent_credentials", "Host files with this agent's login (a list), or false for none.",
                       default_text="built-ins", trust=RULE, why="when a list: it brings host files into the VM"),
    "endpoints": Key("hosts", "Hosts of the agent's API and login, reachable in `network.mode` allowlist and offline "
                     "(`host`, `*.suffix`, `host:port`).", default_text="built-ins (docs/network.md)",
                     trust=RULE, why="when it adds hosts the VM may reach in allowlist or offline mode"),
    "instructionFiles": Key(
        "strlist", "Files and folders in the workspace this agent (one a config defines) obeys, relative to the "
        "workspace, a trailing / for a folder, **/NAME for a file of that name in any folder: a session's changes to "
        "them are held (docs/instructions.md).",
        default_text="none (built-ins have their own)", check=_check_instruction_path),
    "sync": Key(
        "mapping",
        "What of this agent's own setup is brought into the VM.",
        documented=False,
        children={
            "include": Key("strlist", "More paths or globs in the agent's folder to bring into the VM "
                           "(besides the built-in set, see docs/agent-setup.md).", default_text="none",
                           trust=RULE, why="when it adds paths the global config does not: it brings more host "
                           "files into the VM"),
            "exclude": Key("strlist", "Paths or globs in the agent's folder never brought into the VM "
                           "(a folder: everything in it). Local and global lists add up.", default_text="none"),
            "mcpSecrets": Key("bool", "Bring the values of MCP servers' env and headers (otherwise only their names).",
                              default=False, trust=RULE,
                              why="when true and the global config does not set it: it brings the MCP servers' "
                              "secrets into the VM"),
        },
    ),
}

def _check_host_name(value: str) -> str | None:
    return host_name_problem(value, allow_local=True)


TASK_HOST_KEYS: dict[str, Key] = {
    "name": Key("str", "`local`, or a host added with `agentbox hosts add`.", check=_check_host_name),
    "maxConcurrent": Key("int", "How many tasks run on that host at once (default: tasks.maxConcurrent).",
                         minimum=1),
}

MOUNT_KEYS: dict[str, Key] = {
    "location": Key("path", "Host folder; a relative path is relative to the file's folder (docs/security.md, \"Mount "
                    "targets\").", creation=True),
    "mountPoint": Key("path", "Path inside the VM.", default_text="same as location", creation=True),
    "writable": Key("bool", "Whether the VM may write to it. A read-only mount shows the host's changes at once "
                    "(agentbox turns off Lima's caching for it).", default=False, creation=True),
}

_LOCATION_HELP = "An https:// (or http://) URL, or a host path (`~` and paths relative to the file's folder)"
_DIGEST_HELP = "Its digest, `sha256:<64 hex digits>` (Lima's form; `sha512:` works too): Lima checks the download."

IMAGE_KEYS: dict[str, Key] = {
    "location": Key("str", f"{_LOCATION_HELP} of the disk image (qcow2, raw, ...).", default_text="required",
                    check=image.location_problem,
                    creation=True),
    "digest": Key("str", _DIGEST_HELP, default_text="none", check=image.digest_problem, creation=True),
    "kernel": Key("mapping", "A kernel to boot the image with (an image without a bootloader).",
                  default_text="the image's own", creation=True, children={
                      "location": Key("str", f"{_LOCATION_HELP} of the kernel.", default_text="required",
                                      check=image.location_problem, creation=True),
                      "cmdline": Key("str", 'The kernel command line (for example "root=/dev/vda console=ttyS0").',
                                     default_text="none", creation=True),
                      "digest": Key("str", _DIGEST_HELP, default_text="none", check=image.digest_problem,
                                    creation=True),
                  }),
    "initrd": Key("mapping", "The initrd for `kernel`.", default_text="none", creation=True, children={
        "location": Key("str", f"{_LOCATION_HELP} of the initrd.", default_text="required",
                          check=image.location_problem, creation=True),
        "digest": Key("str", _DIGEST_HELP, default_text="none", check=image.digest_problem, creation=True),
    }),
}

CREDENTIAL_KEYS: dict[str, Key] = {
    "netrc": Key("bool", "Also bring ~/.netrc into the VM.", default=False, trust=TRUE,
                 why="brings ~/.netrc, which can hold many passwords, into the VM"),
    "gh": Key("bool", "Bring the GitHub CLI login.", default=True),
    "git": Key("bool", "Bring the safe part of ~/.gitconfig: name, email, ...", default=True),
    "broker": Key(
        "bool", "Keep the real logins of Claude Code, Codex, Gemini CLI and the GitHub CLI on the host: the VM gets "
        "placeholders, and agentbox's proxy puts the real value only where their own services take it "
        "(docs/credentials.md, \"The credential broker\"); false copies them into the VM as before.",
        default=True, trust=RULE, why="when false: the real logins go into the VM",
    ),
    "writeBack": Key(
        "bool", "Copy a login the agent refreshed or made in the VM back to the host file after the session "
        "(Claude Code, Codex, Gemini CLI); a project file can only turn it off.", default=True,
    ),
}

# The Docker-era spelling of an agent's credentials, still accepted.
DOCKER_ERA_AGENT_CREDENTIALS: dict[str, Key] = {
    "enabled": Key("bool", "Whether to bring this agent's login."),
    "files": Key("strlist", "Host files with the login."),
}

_SCRIPT_WHY = "always: it runs in the VM with your logins present (its content is pinned: an edit asks again)"

SCHEMA: dict[str, Key] = {
    "workspace": Key(
        "path", "Project folder mounted into the VM, writable, at the same path (relative to the file's folder).",
        files=LOCAL, default_text="the folder of agentbox.yml, else the git work tree's top, else the current folder",
        trust=RULE, why="when it names another folder: that folder is mounted writable",
    ),
    "vm": Key(
        "mapping",
        "The VM's resources and Lima settings.",
        documented=False,
        children={
            "name": Key("vmname", "Lima instance name for this project.",
                        default_text="`agentbox-<workspace folder name>`", trust=SET,
                        why="could move the session into another project's VM"),
            "cpus": Key("int", "Virtual CPUs.", default=4, minimum=1, restart=True),
            "memory": Key("size", 'Memory, in Lima\'s units ("8GiB").', default="8GiB", restart=True),
            "disk": Key("size", 'Disk size ("20GiB"); Lima cannot shrink a disk: a smaller value keeps the larger '
                        "disk.", default="20GiB", restart=True),
            "vmType": Key("str", "Lima VM driver (qemu, vz, krunkit, wsl2).", default_text="Lima's choice",
                          check=_check_vm_type, creation=True),
            "arch": Key("str", "Guest architecture (x86_64, aarch64, ...).", default_text="the host's",
                        check=_check_arch, creation=True),
            "mountType": Key("str", "virtiofs or 9p (reverse-sshfs is refused).", default_text="Lima's choice",
                             check=_check_mount_type, creation=True),
            "template": Key("path", "Your own Jinja2 template for lima.yaml, rendered with agentbox's context.",
                            default_text="agentbox's", creation=True, trust=SET,
                            why="replaces agentbox's Lima template"),
            "image": Key("image", "The disk image a new VM boots (a company mirror, an air-gapped machine): its "
                         "location (an https:// URL or a host path), or a mapping with `location` and optionally "
                         "`digest`, `kernel` and `initrd` (docs/vm.md, \"Another image\").",
                         default_text="Ubuntu 24.04 (Lima's `template:_images/ubuntu-24.04`)",
                         children=IMAGE_KEYS, creation=True, trust=RULE,
                         why="decides the system the VM runs (a host path: that host file is read)"),
            "lima": Key("freeform", "Lima settings deep-merged into the rendered lima.yaml.", default_text="none",
                        creation=True, trust=SET, why="changes Lima settings directly"),
            "protectGitHooks": Key("bool", "Mount the workspace's .git/hooks read-only in the VM.", default=False,
                                   creation=True),
            "base": Key("word", "`auto`: a new VM is a clone of agentbox's provisioned base VM (built once, "
                        "docs/vm.md, \"The base VM\"); `off`: every new VM is created and provisioned from scratch.",
                        default="auto", check=_check_base_mode),
            "baseMaxAgeDays": Key("int", "A base older than this is rebuilt the next time a VM is cloned from it "
                                  "(so the agent CLIs in new VMs stay current).", default=7, minimum=1),
        },
    ),
    "mounts": Key("mounts", "Extra host folders: `location`, `mountPoint` (default: the same), `writable`.",
                  default=[], creation=True, trust=RULE,
                  why="when a folder lies outside the workspace or is writable: it widens what the VM reaches"),
    "sync": Key(
        "mapping",
        "How the VM may talk to git remotes, and what of your agents' own setup it gets.",
        documented=False,
        children={
            "remoteWrite": Key("bool", "Allow git push and other remote writes from the VM.", default=False,
                               trust=TRUE, why="turns the readonly-remote guards off"),
            "agentConfig": Key("bool", "Bring the launched agent's own setup (skills, settings, MCP servers, "
                               "...) into the VM, filtered (docs/agent-setup.md).", default=True,
                               trust=RULE, why="when true and the global config turns it off: it brings host "
                               "files into the VM"),
        },
    ),
    "git": Key(
        "mapping",
        "What git in the VM may do with your remotes.",
        documented=False,
        children={
            # A project's file that sets `session` needs trust (trust.py's rule); `true` is refused (schema.py):
            # unrestricted pushes are sync.remoteWrite's.
            "allowPush": Key("pushmode", "`session`: the agent may push only to branches under `agentbox/<vm>/` "
                             "(create them, then update those it created; no deletes, no other refs), through "
                             "the credential broker, which refuses any other push on the host "
                             "(docs/security.md, \"Scoped pushes\"); `false`: no pushes. `sync.remoteWrite: true` "
                             "allows every push and wins over it.", default=False, trust=RULE,
                             why="when `session`: the agent pushes branches under agentbox/<vm>/ with your GitHub "
                             "login"),
        },
    ),
    "session": Key(
        "mapping",
        "How a session reaches the workspace.",
        documented=False,
        children={
            # A project's file may ask for isolated without trust (it only narrows what the agent reaches);
            # `live` while the global file says `isolated` loosens it, so that needs trust (trust.py's rule).
            "mode": Key("str", "`live`: the agent edits the workspace; `isolated`: it edits a copy in the VM and "
                        "proposes a patch (`agentbox review`, `apply`).", default="live",
                        check=_check_session_mode, creation=True, trust=RULE,
                        why="when `live` while the global config says `isolated`: it gives the agent the "
                        "workspace, writable"),
            "keepAlive": Key("bool", "Run an interactive launch on a terminal inside a tmux session in the VM and "
                             "attach to it, so closing the terminal does not end the agent (`agentbox attach`).",
                             default=False),
        },
    ),
    "network": Key(
        "mapping",
        "What the VM's network may reach (docs/network.md).",
        documented=False,
        children={
            # A project's file may tighten the policy without trust; loosening it needs trust (netpolicy.loosened).
            "mode": Key("word", "`open`: the internet is open; `allowlist`: traffic leaves only through agentbox's "
                        "proxy, to the agent's API, `presets` and `allow`; `offline`: to the agent's API only.",
                        default="open", check=_check_network_mode, trust=RULE,
                        why="when looser than the global config's: the VM reaches more"),
            "allowHost": Key("hostports", "Ports of the host's localhost the VM may reach (a list), or true for all; "
                             "closed in every mode otherwise.", default=False, trust=RULE,
                             why="when it opens ports the global config does not: the VM reaches services on "
                             "your localhost"),
            "allowLan": Key("bool", "In allowlist and offline mode, let the VM reach private addresses (RFC 1918, "
                            "link-local, cloud metadata).", default=False, trust=RULE,
                            why="when true and the global config does not say so: the VM reaches your local "
                            "network"),
            "presets": Key("strlist", "Host sets for allowlist mode: npm, pypi, github, apt, docker. Local and "
                           "global lists add up.", default=[], check=_check_network_preset, trust=RULE,
                           why="when it adds hosts the global config does not allow"),
            "allow": Key("hosts", "More hosts for allowlist mode (`host`, `*.suffix`, `host:port`, an IP). Local and "
                         "global lists add up.", default=[], trust=RULE,
                         why="when it adds hosts the global config does not allow"),
            "agentApi": Key("bool", "Let the launched agent reach its API (and login) in allowlist and offline "
                            "mode.", default=True, trust=RULE,
                            why="when true and the global config turns it off"),
            "inspect": Key("word", "`credentials`: the credential broker terminates TLS only for the credential "
                           "hosts; `all`: in allowlist and offline mode for every allowed host too (with the VM's own "
                           "CA; needs credentials.broker), so upload caps and leak checks see what each request "
                           "sends (docs/network.md).", default="credentials", check=check_inspect, trust=RULE,
                           why="when `credentials` while the global config says `all`: uploads go unread"),
            "uploadLimit": Key("cap", "Bytes the VM may send to one host in a session through agentbox's proxy "
                               "(`50MiB`; a bare number is bytes), or false for no cap; past it the host's uploads "
                               "are refused and the session's end says so (docs/network.md).",
                               default=uploads.DEFAULT_TEXT, trust=RULE,
                               why="when larger than the global config's (or false): more may be uploaded"),
            "private": Key("strlist", "Workspace files whose content must not leave the VM: globs relative to the "
                           "workspace (`*` within a folder, `**` any depth). An upload through the proxy or broker "
                           "carrying a chunk of one is refused (docs/network.md).",
                           default=[".env*", "*.pem", "*.key", "id_*", "secrets/**"], trust=RULE,
                           why="when it leaves out a glob the global config (or the default) has: that content may "
                               "be uploaded"),
        },
    ),
    "instructions": Key(
        "mapping",
        "The files that steer an agent (CLAUDE.md, .claude/, AGENTS.md, ...; docs/instructions.md).",
        documented=False,
        children={
            # A project's file may turn it on; off while the global config (or the default) has it on needs trust
            # (trust.py's rule): the agent can write that file and stop the next session's changes being held.
            "quarantine": Key("bool", "Hold what a session or task changes in the instruction files until you "
                              "approve it (`agentbox instructions`); agents see the approved version meanwhile.",
                              default=True, trust=RULE,
                              why="when false while the global config holds them: an agent's changes to the "
                              "instruction files reach the next agent unreviewed"),
        },
    ),
    "notify": Key("bool", "Tell you when a detached session waits for input or its agent ends, or a "
                  "background task ends: a desktop notification on the host, the terminal's bell and title "
                  "when attached.", default=True),
    "startupWaitSec": Key("int", "Seconds a launch waits for an unfinished boot.", default=30, minimum=1),
    "defaults": Key(
        "mapping",
        "Defaults (the previous agentbox's spelling in the global config).",
        documented=False,
        children={"startupWaitSec": Key("int", "Same as startupWaitSec.", minimum=1)},
    ),
    "env": Key("env", "Environment for the agent and for `agentbox shell` (values arrive byte for byte).",
               default={}, trust=SET,
               why="ANTHROPIC_BASE_URL, HTTPS_PROXY, NODE_OPTIONS and friends send the agent's requests, "
               "with your login, wherever the file says"),
    "bootstrap": Key(
        "mapping",
        "Scripts run inside the VM.",
        documented=False,
        children={
            "onCreateScript": Key("strlist", "Script(s) run once per VM, after its first start.", default=[],
                                  trust=RULE, why=_SCRIPT_WHY),
            "onStartScript": Key("strlist", "Script(s) run once per VM boot.", default=[], trust=RULE,
                                 why=_SCRIPT_WHY),
        },
    ),
    "caCert": Key("path", "PEM file with extra CA certificates for the VM.", default_text="none", creation=True,
                  trust=SET, why="adds certificate authorities the VM trusts"),
    "agents": Key("agents", "Settings of built-in agents, and agents you define (`agents.<name>.*`).",
                  documented=False),
    "credentials": Key("credentials", "`false` brings no host logins into the VM; or switches `{netrc, gh, git}`.",
                       default_text="true"),
    "tasks": Key(
        "mapping",
        "Background tasks (`agentbox run`).",
        documented=False,
        children={
            "maxConcurrent": Key("int", "How many background tasks run at once in a VM; the others wait, Queued.",
                                 default=2, minimum=1),
            "hosts": Key("taskhosts", "Where `agentbox run --on any` may send isolated tasks, in order: `local` "
                         "and names from `agentbox hosts add`, each a name or `{name: NAME, maxConcurrent: N}`.",
                         default=["local"], trust=SET,
                         why="sends a copy of the workspace to another machine for `run --on any`"),
        },
    ),
    "checkpoints": Key(
        "mapping",
        "Checkpoints of a git workspace at every launch (see docs/review-and-undo.md).",
        documented=False,
        children={
            # A project's file may only tighten these (the agent can write it): what weakens review or undo
            # against the global config (or the default) needs trust (trust.py's rule).
            "enabled": Key("bool", "Take a checkpoint when a session starts and ends (git workspaces only).",
                           default=True, trust=RULE,
                           why="when false while the global config takes checkpoints: nothing to review or undo"),
            "maxFileSize": Key("bytes", "Files larger than this are left out of checkpoints (and named).",
                               default="5MiB", trust=RULE,
                               why="when lower than the global config's (or the default): more files are left out "
                               "of undo"),
            "keep": Key("int", "How many checkpoints of a workspace are kept; older ones are pruned.", default=50,
                        minimum=1, trust=RULE,
                        why="when lower than the global config's (or the default): older checkpoints are "
                        "pruned at the next launch"),
        },
    ),
}

# Keys of the previous agentbox's Docker Sandboxes era. Its Lima version ignored them; so does agentbox.
RETIRED: dict[tuple[str, ...], str] = {
    **{("network", old): "Docker Sandboxes' proxy setting; agentbox's is network.mode with network.allow "
       "(docs/network.md)" for old in ("policy", "allowHosts", "blockHosts", "allowCidrs", "blockCidrs",
                                            "bypassHosts", "bypassCidrs")},
    ("sync", "files"): "files are no longer copied into the sandbox; use mounts, or credentials for logins",
    ("agents", "*", "execMode"): "agents always run through the VM's shell now",
    ("agents", "*", "sandboxName"): "Docker Sandboxes are gone; use agents.<agent>.vmName to pick a VM",
}


def retired_reason(keypath: tuple[str, ...]) -> str | None:
    for pattern, reason in RETIRED.items():
        if len(pattern) == len(keypath) and all(p in ("*", k) for p, k in zip(pattern, keypath, strict=True)):
            return reason
    return None


def walk(keys: Mapping[str, Key] = SCHEMA, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Key]]:
    """Every key with its path; agents' keys under ("agents", "<name>"), credentials' under ("credentials",)."""
    for name, key in keys.items():
        path = (*prefix, name)
        yield path, key
        yield from walk(key.children, path)
        if key.kind == "agents":
            yield from walk(AGENT_KEYS, (*path, "<name>"))
        if key.kind == "credentials":
            yield from walk(CREDENTIAL_KEYS, path)
        if key.kind == "mounts":
            yield from walk(MOUNT_KEYS, (*path, "[]"))


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(path).replace(".[]", "[]")


def defaults() -> dict[str, Any]:
    """The built-in values, nested as in a config file (a fresh copy: callers may change it)."""
    result: dict[str, Any] = {}
    for path, key in walk():
        if key.default is UNSET or "<name>" in path or "[]" in path or path[0] == "credentials":
            continue
        target = result
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = copy.deepcopy(key.default)
    return result


def creation_keys() -> list[str]:
    """Dotted paths of the keys that take effect only when the VM is created."""
    return [dotted(path) for path, key in walk() if key.creation]


def trust_rules() -> list[tuple[tuple[str, ...], Key]]:
    """The keys a project's agentbox.yml needs trust for, with the rule deciding when."""
    return [(path, key) for path, key in walk() if key.trust is not None]


def readme_table() -> str:
    """The key table of docs/configuration.md, one row per documented key."""
    rows = [
        "| key | meaning | default | needs `agentbox trust` in a project file | applies to |",
        "|---|---|---|---|---|",
    ]
    for path, key in walk():
        if not key.documented:
            continue
        name = f"`{dotted(path)}`" + (" (project file only)" if key.files == LOCAL else "")
        rows.append(
            f"| {name} | {key.help} | {_default_words(key)} | {trust_words(key)} | "
            f"{applies_at(key)} |"
        )
    return "\n".join(rows) + "\n"


def applies_at(key: Key) -> str:
    """When a change of the key takes effect, in words."""
    if key.creation:
        return "a new VM (`start --recreate`)"
    if key.restart:
        return "the VM's next start (`limactl edit`)"
    return "the next launch"


def _default_words(key: Key) -> str:
    if key.default_text:
        return key.default_text
    if key.default is UNSET:
        return "none"
    if isinstance(key.default, bool):
        return str(key.default).lower()
    if key.default in ([], {}):
        return "none"
    return f"`{key.default}`" if isinstance(key.default, str) else str(key.default)


def trust_words(key: Key) -> str:
    """Whether a project's agentbox.yml needs `agentbox trust` to set the key, in words."""
    if key.trust is None:
        return "no"
    if key.trust == RULE:
        return key.why
    when = {SET: "yes", TRUE: "when true"}[key.trust]
    return f"{when}: {key.why}" if key.why else when


if __name__ == "__main__":
    print(readme_table(), end="")
