"""The base VM: agentbox's template provisioned once, verified, sealed and stopped, so that a new
project's VM is one `limactl clone` and one boot instead of a provisioning from scratch.

A base holds nothing of a project's: no workspace, staging or outbox mount, empty workspace params,
no `vm.lima`, never `vm.template`; its VM type, arch and mount type come from the global config only.
It has the CA certificates a VM made from this config gets (caCert, the host's NODE_EXTRA_CA_CERTS), and
its agents are installed with the network environment a launch gives (`install_env`), so that a base
builds behind a TLS-intercepting proxy. `key()` is a short hash over everything that goes into it
(`inputs()`): the base render of the template, the bytes of every provisioning script and wrapper, the
install commands of the agents it holds, the CA certificates (when there are any), the image, vmType,
arch, mountType and FORMAT (bumped by hand when the way a base is made changes). The proxy variables are
not part of it: they change how the base is fetched, not what it holds, and may carry a password.
The base is the Lima instance `agentbox-base-KEY`; its record is STATE/bases/KEY.json.

Building: create under a temporary name, start (the provisioning runs), install the agents, verify
(provision/base-check.sh), seal (provision/base-seal.sh), stop, then rename it to the base's name, so
nothing half-made ever has that name. A failing step deletes the temporary instance and says which
step failed. What each step printed, and a failed build's provisioning log, is kept in STATE/bases/build.log
(agentbox.vm.buildlog; `agentbox base log`). One file lock covers building and cloning: two first launches
build one base.

A project VM records the key it was cloned from (its state's "base"); `staleness()` says what changed
since. A base older than vm.baseMaxAgeDays is rebuilt the next time a VM is cloned from it. This
module asks lima.py to change base VMs only; agentbox.vm.lifecycle owns the project VMs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml

from agentbox import lazyre, paths, resources, sizes
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.config import image, keys
from agentbox.errors import AgentboxError, LimaError, StateError
from agentbox.fsutil import atomic_write, locked_or_waiting, private_dir
from agentbox.progress import Progress, note, warn
from agentbox.safetext import visible
from agentbox.staginglayout import GUEST_CA_BUNDLE
from agentbox.vm import buildlog, provisioning, render
from agentbox.vm.lima import MIN_START_TIMEOUT, RUNNING

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.vm.lima import Lima

FORMAT = 1
PREFIX = "agentbox-base-"
BUILD_PREFIX = "agentbox-basebuild-"  # the temporary name while a base is built
KEY_LENGTH = 12
RENDER_NAME = "agentbox-base"  # the name in the base render's comment line: the key must not depend on itself
DAY = 86400
# Top-level lima.yaml keys a clone cannot take from the project's render: they decide what is on the
# disk (image, provisioning) or the machine itself. A project that differs in one is created from scratch.
FIXED_KEYS = ("base", "images", "vmType", "arch", "os", "provision", "probes", "user", "firmware", "vmOpts")
# Of those, what the base takes from the global config's vm.lima, as every project VM gets it: how the machine
# boots (a host whose QEMU has no UEFI firmware needs `firmware.legacyBIOS` for every VM, its base included).
GLOBAL_LIMA_KEYS = ("images", "vmType", "arch", "os", "firmware", "vmOpts")
RESOURCE_KEYS = ("cpus", "memory", "disk")
# What each part of the key is, for the line that says what changed.
PART_NAMES = {
    "template": "agentbox's VM template",
    "provisioning": "provisioning scripts",
    "agents": "agent install commands",
    "caCerts": "the CA certificates (caCert, NODE_EXTRA_CA_CERTS)",
    "image": "the image",
    "lima": "the global vm.lima's machine settings (" + ", ".join(GLOBAL_LIMA_KEYS) + ")",
    "vmType": "vm.vmType",
    "arch": "vm.arch",
    "mountType": "vm.mountType",
    "format": "the base format",
}
# What an install needs from the config's env to reach the network as a launch's install does (agentbox.session.guestenv
# gives the whole env to a session; a base is shared by projects, so its installs get only these, and npm's own).
NETWORK_VARIABLES = frozenset({
    *(name for base in ("http_proxy", "https_proxy", "no_proxy", "all_proxy") for name in (base, base.upper())),
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})
# Runs $1 in a login shell after exporting the NAME=value records (each ended by a NUL) read from stdin: a proxy's
# password never appears on a command line or in a file.
WITH_ENV = 'while IFS= read -r -d "" assignment; do export "${assignment?}"; done; exec bash -lc "$1" </dev/null'
PROVISIONING_LOG_TAIL = 256 << 10  # what a failed build keeps of the guest's provisioning log
_IDENTIFIER = lazyre.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REJECTED = lazyre.compile(r'the YAML was rejected and saved as "?lima\.REJECTED\.yaml"?: ?')


# -- what goes into a base --------------------------------------------------------------------------


def settings(config: Config) -> render.BaseSettings:
    """The base's VM settings: vmType, arch, mountType, image and vm.lima's machine keys (GLOBAL_LIMA_KEYS) from the
    global config, resources built-in."""
    vm = config.global_data.get("vm") or {}
    vm = vm if isinstance(vm, dict) else {}
    built_in = keys.SCHEMA["vm"].children
    folder = config.global_file.parent if config.global_file is not None else paths.home()
    lima = vm.get("lima")
    lima = lima if isinstance(lima, dict) else {}
    return render.BaseSettings(
        vm_type=vm.get("vmType"),
        arch=vm.get("arch"),
        mount_type=vm.get("mountType"),
        cpus=built_in["cpus"].default,
        memory=built_in["memory"].default,
        disk=built_in["disk"].default,
        image=image.resolve(vm.get("image"), folder),
        lima={key: value for key, value in lima.items() if key in GLOBAL_LIMA_KEYS} or None,
    )


def agent_installs(config: Config) -> dict[str, str]:
    """The built-in agents a base holds, with their install commands: the ones the global config names
    (with its install command when it gives one), or all built-ins. A project's file never decides it."""
    configured = config.global_data.get("agents") or {}
    configured = configured if isinstance(configured, dict) else {}
    chosen = [name for name in BUILTIN_AGENTS if name in configured] or list(BUILTIN_AGENTS)
    installs = {}
    for name in chosen:
        own = configured.get(name)
        install = own.get("install") if isinstance(own, dict) and own.get("install") else BUILTIN_AGENTS[name].install
        if install:
            installs[name] = install
    return installs


def ca_certs(config: Config) -> tuple[str, ...]:
    """The CA certificates the base gets: the ones a VM made from this config gets (agentbox.vm.provisioning)."""
    return tuple(provisioning.ca_certificates(config, announce=False))


def install_env(config: Config) -> dict[str, str]:
    """The environment the base's agent installs run with: the config env's proxy and CA variables and npm's own
    settings (npm_config_*), and NODE_EXTRA_CA_CERTS at the guest's trust store when CA certificates are configured,
    as a launch sets it (agentbox.session.guestenv)."""
    env = {name: value for name, value in config.env.items()
           if name in NETWORK_VARIABLES or name.lower().startswith("npm_config_")}
    if config.ca_cert is not None or os.environ.get("NODE_EXTRA_CA_CERTS"):
        env.setdefault("NODE_EXTRA_CA_CERTS", GUEST_CA_BUNDLE)
    return env


def env_records(env: dict[str, str]) -> bytes:
    """NAME=value records, each ended by a NUL: what WITH_ENV reads on its stdin."""
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in env.items())


def inputs(config: Config) -> dict[str, Any]:
    """Everything the key covers, each part as a value or a digest (to say later what changed)."""
    base = settings(config)
    parts = {
        "format": FORMAT,
        # Without the image and vm.lima, parts of their own: a new image says "the image", not "the template".
        "template": _digest(render.render_base(base._replace(image=None, lima=None), RENDER_NAME).encode()),
        "provisioning": _files_digest("provision", "wrappers"),
        "agents": _digest(json.dumps(agent_installs(config), sort_keys=True).encode()),
        "image": render.IMAGE_BASE if base.image is None else base.image.identity(),
        "vmType": base.vm_type,
        "arch": base.arch,
        "mountType": base.mount_type,
    }
    if base.lima:  # only then, as caCerts: a base without them keeps its key
        parts["lima"] = _digest(json.dumps(base.lima, sort_keys=True).encode())
    certs = ca_certs(config)
    if certs:  # only then: a base without any keeps the key it had before bases had CA certificates
        parts["caCerts"] = _digest("".join(certs).encode())
    return parts


def key_of(parts: dict[str, Any]) -> str:
    return _digest(json.dumps(parts, sort_keys=True).encode())[:KEY_LENGTH]


def key(config: Config) -> str:
    return key_of(inputs(config))


def instance_name(base_key: str) -> str:
    return PREFIX + base_key


def is_base_name(name: str) -> bool:
    """A base VM or one being built: never a project's VM."""
    return name.startswith((PREFIX, BUILD_PREFIX))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_digest(*folders: str) -> str:
    digest = hashlib.sha256()
    for folder in folders:
        root = resources.path(folder)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(_digest(path.read_bytes()).encode())
    return digest.hexdigest()


# -- records --------------------------------------------------------------------------------------


def record_path(base_key: str) -> Path:
    return paths.bases_dir() / f"{base_key}.json"


def read_record(base_key: str) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(base_key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def age_days(record: dict[str, Any], now: float | None = None) -> float:
    built = record.get("built")
    if not isinstance(built, (int, float)):
        return float("inf")
    return max(0.0, ((now if now is not None else time.time()) - built) / DAY)


@contextmanager
def lock() -> Iterator[bool]:
    """One base build (or clone from a base) at a time across agentbox processes; yields whether it waited."""
    with locked_or_waiting(private_dir(paths.bases_dir()) / "lock",
                           "waiting for another agentbox that is building or cloning the base VM...") as waited:
        yield waited


# -- the base a clone comes from ------------------------------------------------------------------


class Base(NamedTuple):
    key: str
    name: str
    record: dict[str, Any]
    built_now: bool = False  # ensure() built it (False: it was there, current and fresh)

    def reference(self) -> dict[str, Any]:
        """What a cloned VM keeps about its base (its state's "base")."""
        return {"key": self.key, "built": self.record.get("built"), "inputs": self.record.get("inputs", {}),
                "agents": self.record.get("agents", {})}


def ensure(lima: Lima, config: Config, verbose: bool = False, rebuild: bool = False, waited: bool = False) -> Base:
    """The current base, built when it is missing, has no record, is older than vm.baseMaxAgeDays, or
    `rebuild`. Call it holding `lock()`; `waited` (the lock was busy) means Lima's last list is stale."""
    parts = inputs(config)
    base_key = key_of(parts)
    name = instance_name(base_key)
    instance = None if waited else lima.listed.get(name)
    if instance is None:  # not in the caller's list, or the list is older than another agentbox's build
        instance = lima.instances().get(name)
    record = read_record(base_key)
    reason = None
    if rebuild:
        reason = f"rebuilding the base VM {name} (--rebuild)"
    elif instance is None:
        reason = (f"the base VM {name} is gone (deleted outside agentbox?); building it again" if record else
                  f"building the base VM {name}: provisioned once, then every new project VM is a clone of it")
    elif record is None:
        reason = f"the base VM {name} has no record of how it was built; building it again"
    elif age_days(record) > config.base_max_age_days:
        reason = (f"the base VM {name} is {age_days(record):.0f} days old (vm.baseMaxAgeDays: "
                  f"{config.base_max_age_days}); building it again so the agent CLIs are current")
    if reason is None:
        assert record is not None
        return Base(base_key, name, record)
    note(reason)
    record = build(lima, config, parts, replace=instance is not None, verbose=verbose)
    return Base(base_key, name, record, built_now=True)


class _Step:
    """The build's current step, for the error that names it, and the build's log."""

    def __init__(self, log: buildlog.BuildLog) -> None:
        self.name = ""
        self.log = log


def build(lima: Lima, config: Config, parts: dict[str, Any], replace: bool, verbose: bool = False) -> dict[str, Any]:
    """Build the base for these inputs under a temporary name, then give it the base's name."""
    base_key = key_of(parts)
    name = instance_name(base_key)
    temporary = BUILD_PREFIX + base_key
    base = settings(config)
    directory = private_dir(paths.bases_dir())
    template = directory / f"{base_key}.yaml"
    atomic_write(template, render.render_base(base, RENDER_NAME, ca_certs(config)), mode=0o600)
    if temporary in lima.instances():  # an earlier build that was cut short: start clean
        lima.delete(temporary, force=True)
    installs = agent_installs(config)
    step = _Step(buildlog.BuildLog(f"building the base VM {name} (as {temporary})"))
    try:
        with _step(step, f"Building base VM {name}: creating", verbose) as feed:
            lima.create(temporary, template, on_output=feed)
        with _step(step, f"Building base VM {name}: starting (provisioning)", verbose) as feed:
            lima.start(temporary, max(MIN_START_TIMEOUT, config.startup_wait_sec), on_output=feed)
        with _step(step, f"Building base VM {name}: installing agents", verbose):
            missing = _install_agents(lima, temporary, installs, install_env(config), step.log)
        with _step(step, f"Building base VM {name}: verifying", verbose):
            verification = _verify(lima, temporary, installs, step.log)
        found = _agent_versions(verification)
        for agent in installs:
            binary = BUILTIN_AGENTS[agent].binary
            if agent not in missing and binary not in found:
                missing[agent] = f"its install command ended without error, but {binary} is not on PATH"
                warn(f"the base VM will not hold {agent}: {missing[agent]}; "
                     "it is installed at its first launch instead")
        with _step(step, f"Building base VM {name}: sealing", verbose):
            _seal(lima, temporary, step.log)
        with _step(step, f"Building base VM {name}: stopping", verbose) as feed:
            lima.stop(temporary, on_output=feed)
        if replace:
            step.name = "removing the old base"
            lima.delete(name, force=True)
        step.name = "renaming"
        lima.rename(temporary, name)
    except (LimaError, StateError) as error:
        step.log.section(f"failed while {step.name}: {error.message}")
        try:
            _keep_provisioning_log(lima, temporary, step.log)
        except (LimaError, OSError) as unread:
            step.log.line(f"(the VM's provisioning log could not be kept: {getattr(unread, 'message', unread)})")
        step.log.close()
        _discard(lima, temporary)
        message = f"building the base VM {name} failed while {step.name}: {error.message}"
        hint = (f"Its log, the VM's provisioning log included, is kept: `agentbox base log` shows it "
                f"({buildlog.path()}). The unfinished base ({temporary}) was removed; nothing else changed. The "
                "next launch (or `agentbox base build`) starts over; `vm.base: off` creates VMs without a base.")
        if isinstance(error, LimaError):
            raise LimaError(message, hint, stderr_lines=error.stderr_lines, tail=error.tail,
                            log_path=error.log_path) from None
        raise StateError(message, hint=hint) from None
    except BaseException:
        step.log.close()
        _discard(lima, temporary)
        raise
    step.log.section("built")
    step.log.close()
    row = lima.instances().get(name)
    record = {
        "key": base_key,
        "name": name,
        "format": FORMAT,
        "inputs": parts,
        "settings": base._asdict(),
        "agentInstalls": installs,
        "built": time.time(),
        "limaVersion": (row.raw.get("limaVersion") if row is not None else None) or None,
        "agents": found,
        "agentsMissing": missing,
        "verification": verification,
    }
    atomic_write(record_path(base_key), json.dumps(record, indent=2), mode=0o600)
    return record


@contextmanager
def _step(step: _Step, title: str, verbose: bool) -> Iterator[Callable[[str], None]]:
    """The step's progress line; yields what feeds limactl's output to it and to the build's log."""
    step.name = title.rsplit(": ", 1)[-1]
    step.log.section(step.name)

    def feed(line: str) -> None:
        progress.feed(line)
        step.log.line(line)

    with Progress(title, verbose=verbose) as progress:
        yield feed


def _keep_provisioning_log(lima: Lima, temporary: str, log: buildlog.BuildLog) -> None:
    """Before the unfinished VM goes: the guest's provisioning log (while it runs) and Lima's host-agent log."""
    instance = lima.instances().get(temporary)
    if instance is None:
        return
    if instance.status == RUNNING:
        code, output = lima.shell_output(
            temporary, ["sudo", "-n", "tail", "-c", str(PROVISIONING_LOG_TAIL), "/var/log/cloud-init-output.log"])
        log.section(f"the VM's provisioning log (/var/log/cloud-init-output.log, its last {PROVISIONING_LOG_TAIL} "
                    "bytes)" + (f"; could not be read (exit {code})" if code else ""))
        log.write(output)
    if instance.dir:
        try:
            descriptor = os.open(os.path.join(instance.dir, "ha.stderr.log"), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(descriptor, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(max(0, size - PROVISIONING_LOG_TAIL))
            text = file.read(PROVISIONING_LOG_TAIL).decode("utf-8", errors="replace")
        log.section("Lima's host-agent log (ha.stderr.log, its end)")
        log.write(text)


def _discard(lima: Lima, temporary: str) -> None:
    try:
        lima.delete(temporary, force=True)
    except (LimaError, OSError) as error:
        warn(f"could not remove the unfinished base {temporary}: {getattr(error, 'message', error)}; "
             f"remove it with `limactl delete --force {temporary}`")


def _install_agents(lima: Lima, name: str, installs: dict[str, str], env: dict[str, str],
                    log: buildlog.BuildLog) -> dict[str, str]:
    """Run each agent's install command as the VM's user, as a launch does (`bash -euo pipefail`: a download piped
    into a shell fails when the download does), with `env` (install_env, on its stdin). One that fails leaves that
    agent to its first launch (as without a base), said once; returns them with the reason."""


    missing = {}
    records = env_records(env)
    for agent, command in installs.items():
        log.section(f"installing {agent}: {command}")
        script = f"bash -euo pipefail -c {shlex.quote(command)} 2>&1"
        code, output = lima.shell_output(name, ["bash", "-c", WITH_ENV, "agentbox-install", script],
                                         stdin_data=records)
        log.write(output)
        log.line(f"(exit {code})")
        if code != 0:
            last = visible(buildlog.failure_line(output))
            missing[agent] = f"exit {code}" + (f": {last[:200]}" if last else "")
            warn(f"the base VM will not hold {agent}: `{command}` failed ({missing[agent]}); "
                 "it is installed at its first launch instead")
    return missing


def _verify(lima: Lima, name: str, installs: dict[str, str], log: buildlog.BuildLog) -> str:
    arguments = [f"agent:{BUILTIN_AGENTS[agent].binary}" for agent in installs]
    arguments += [f"file:{path}" for spec in BUILTIN_AGENTS.values() for path in spec.credentials]
    arguments += ["file:~/.netrc", "file:~/.git-credentials", "file:~/.config/gh/hosts.yml"]
    script = resources.text("provision", "base-check.sh")
    code, output = lima.shell_output(name, ["bash", "-c", script, "base-check", *arguments])
    log.write(output[-20000:])
    output = "".join(visible(line) + "\n" for line in output[-20000:].splitlines())
    if code != 0:
        failures = [line[len("FAIL: "):] for line in output.splitlines() if line.startswith("FAIL: ")]
        raise StateError("; ".join(failures) or f"the check script exited {code}: {output.strip()[-300:]}")
    return output


def _seal(lima: Lima, name: str, log: buildlog.BuildLog) -> None:
    script = resources.text("provision", "base-seal.sh")
    code, output = lima.shell_output(
        name, ["bash", "-c", 'exec sudo -n /bin/bash -c "$1" base-seal "$HOME" 2>&1', "base-seal", script]
    )
    log.write(output[-20000:])
    if code != 0:

        raise StateError(f"the seal script exited {code}: {visible(output.strip()[-300:])}")


def _agent_versions(verification: str) -> dict[str, str]:
    """Binary -> the first line of its --version, for the agents the check found."""
    versions = {}
    for line in verification.splitlines():
        if line.startswith("agent ") and ": " in line:
            binary, _, version = line[len("agent "):].partition(": ")
            if version != "not installed":
                versions[binary] = version
    return versions


# -- a project VM as a clone of the base ----------------------------------------------------------


def _image_text(chosen: image.Image | None) -> str | None:
    if chosen is None:
        return None
    return chosen.location if chosen == image.Image(chosen.location) else json.dumps(chosen.to_json())


class ClonePlan(NamedTuple):
    edits: list[str]  # limactl edit flags that turn the base's lima.yaml into the project's render
    disk_note: str | None  # the project asks for a smaller disk than the base's (Lima cannot shrink)


def clone_plan(config: Config, rendered: str) -> ClonePlan | str:
    """The edit flags for a clone of the base that carries exactly this project's render, or why the
    project's VM cannot be a clone (then it is created from scratch)."""


    if config.template is not None:
        return "vm.template is set (a base is made from agentbox's own template)"
    base = settings(config)
    for setting, value, own in (("vmType", config.vm_type, base.vm_type), ("arch", config.arch, base.arch),
                                ("image", _image_text(config.image), _image_text(base.image))):
        if value != own:
            return (f"this project's vm.{setting} ({value or 'not set'}) differs from the global config's "
                    f"({own or 'not set'}), which the base VM is built with")
    wanted = yaml.safe_load(rendered) or {}
    have = yaml.safe_load(render.render_base(base, RENDER_NAME, ca_certs(config))) or {}
    for fixed in FIXED_KEYS:
        if wanted.get(fixed) != have.get(fixed):
            return f"this project's lima.yaml changes `{fixed}`, which is fixed in the base (vm.lima?)"
    edits: list[str] = []
    for setting in [*wanted, *(k for k in have if k not in wanted)]:
        if setting in RESOURCE_KEYS or wanted.get(setting) == have.get(setting):
            continue
        problem = _literal_problem(wanted.get(setting))
        if problem:
            return f"`{setting}` holds {problem}, which Lima's --set cannot be given exactly"
        path = f".{setting}" if _IDENTIFIER.match(str(setting)) else f".[{json.dumps(str(setting))}]"
        # null is how Lima reads a key that is not there (a key only the base has)
        edits += ["--set", f"{path} = {json.dumps(wanted.get(setting), ensure_ascii=False)}"]
    if wanted.get("cpus") != have.get("cpus"):
        edits += ["--cpus", str(wanted.get("cpus"))]
    if wanted.get("memory") != have.get("memory"):
        edits += ["--memory", _gib(sizes.to_bytes(str(wanted.get("memory"))))]
    disk_note = None
    want_disk, have_disk = sizes.to_bytes(str(wanted.get("disk"))), sizes.to_bytes(str(have.get("disk")))
    if want_disk is not None and have_disk is not None:
        if want_disk > have_disk:
            edits += ["--disk", _gib(want_disk)]
        elif want_disk < have_disk:
            disk_note = (f"vm.disk {wanted.get('disk')} is smaller than the base VM's {have.get('disk')}, and Lima "
                         f"cannot shrink a disk: {config.vm_name} gets {have.get('disk')}")
    return ClonePlan(edits, disk_note)


# Lima's --set is a yq expression: a JSON value is a yq literal, except that yq reads backslashes in
# strings its own way (`\\` twice, `\(` as interpolation, no `\u`). Values without a backslash or a
# control character JSON would write as \u00XX read the same in both.
_UNSAFE_IN_YQ = lazyre.compile(r"[\\\x00-\x07\x0b\x0e-\x1f]")


def _literal_problem(value: Any) -> str | None:
    if isinstance(value, str):
        found = _UNSAFE_IN_YQ.search(value)
        if found:
            return "a backslash" if found.group() == "\\" else f"a control character ({found.group()!r})"
        return None
    if isinstance(value, dict):
        return next((p for k, v in value.items() for p in (_literal_problem(str(k)), _literal_problem(v)) if p), None)
    if isinstance(value, list):
        return next((p for item in value if (p := _literal_problem(item))), None)
    return None


def _gib(size: int | None) -> str:
    if size is None:
        raise AgentboxError("cannot read a size for the clone's edit flags")
    return format(size / (1 << 30), ".10g")


class CloneUnsupported(Exception):
    """This Lima's clone takes no edit flags (or has no clone): create the VM from scratch."""


def clone(lima: Lima, base: Base, vm_name: str, edits: list[str], verbose: bool = False) -> None:
    """`limactl clone` of the base into `vm_name`, run in a private temporary folder: Lima writes an edit it
    rejects to ./lima.REJECTED.yaml, which must never land in the user's folder. A rejected one is kept
    in the VM's state folder and its message shown."""
    folder = tempfile.mkdtemp(prefix="agentbox-clone-")
    try:
        try:
            with Progress(f"Cloning VM {vm_name} from the base VM {base.name}", verbose=verbose) as progress:
                lima.clone(base.name, vm_name, edits, cwd=folder, on_output=progress.feed)
        except LimaError as error:
            text = " ".join(error.stderr_lines)
            if "unknown flag" in text or "unknown command" in text or "unknown shorthand flag" in text:
                raise CloneUnsupported(error.message) from None
            rejected = Path(folder) / "lima.REJECTED.yaml"
            if rejected.is_file() and not rejected.is_symlink():
                kept = private_dir(paths.vm_state_dir(vm_name)) / "lima.REJECTED.yaml"
                atomic_write(kept, rejected.read_bytes()[: 4 << 20], mode=0o600)
                reason = _REJECTED.sub("", error.stderr_lines[-1] if error.stderr_lines else error.message)
                error.message = f"Lima rejected {vm_name}'s settings applied to the base VM {base.name}: {reason}"
                error.hint = (f"The rejected lima.yaml is kept in {kept}. Fix what it names in your config, or set "
                              "`vm.base: off` to create the VM from scratch.")
            raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def staleness(config: Config, recorded: Any) -> str | None:
    """The one line that says the VM was cloned from a base that is no longer current (None: it is current)."""
    found = stale_note(config, recorded)
    return found[1] if found else None


# The parts of the key a running VM can catch up with without a new VM: `agentbox update-agents`.
AGENT_PARTS = {"agents"}


def stale_note(config: Config, recorded: Any) -> tuple[str, str] | None:
    """(which current base it is about, the line) when the VM was cloned from a base that is no longer current.

    What differs decides the advice: provisioning, the template, the image (anything but the agents) needs a
    new clone (`agentbox start --recreate`); agent CLIs alone are brought up to date in place
    (`agentbox update-agents`). A base rebuilt with the same key differs only in what its agents' installs
    fetched: the versions the VM's record keeps are compared with the new base's.
    """
    if config.vm_base != "auto" or not isinstance(recorded, dict) or not recorded.get("key"):
        return None
    parts = inputs(config)
    current = key_of(parts)
    vm_name = config.vm_name
    update = f"`agentbox update-agents` brings {vm_name}'s agent CLIs up to date (no new VM)"
    if recorded["key"] != current:
        before = recorded.get("inputs") or {}
        changed = [part for part, value in parts.items() if before.get(part) != value]
        what = ", ".join(PART_NAMES.get(part, part) for part in changed) if changed else "what goes into it"
        if changed and set(changed) <= AGENT_PARTS:
            return current, f"{vm_name} was cloned from an older base VM ({what} changed since); {update}"
        return current, (f"{vm_name} was cloned from an older base VM ({what} changed since); "
                         "`agentbox start --recreate` re-clones it from a new base")
    record = read_record(current)
    built = recorded.get("built")
    if not (record and isinstance(built, (int, float)) and isinstance(record.get("built"), (int, float))
            and record["built"] > built + 1):
        return None
    identity = f"{current}@{record['built']:.0f}"
    had, has = recorded.get("agents"), record.get("agents")
    if isinstance(had, dict) and isinstance(has, dict):
        differ = [f"{binary} {had.get(binary) or 'none'} -> {has.get(binary) or 'none'}"
                  for binary in sorted({*had, *has}) if had.get(binary) != has.get(binary)]
        if not differ:
            return None  # rebuilt with the same provisioning and the same agent versions: nothing to catch up

        return identity, visible(f"the base VM was rebuilt since {vm_name} was cloned from it, with other agent CLI "
                                 f"versions ({'; '.join(differ)[:300]}); {update}")
    return identity, f"the base VM was rebuilt since {vm_name} was cloned from it (newer agent CLIs); {update}"


# -- listing and removing bases -------------------------------------------------------------------


def users() -> dict[str, list[str]]:
    """Base key -> the VMs cloned from it (from agentbox's VM records)."""
    found: dict[str, list[str]] = {}
    root = paths.state_dir() / "vms"
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        try:
            state = json.loads((folder / "state.json").read_text())
        except (OSError, ValueError):
            continue
        recorded = state.get("base") if isinstance(state, dict) else None
        if isinstance(recorded, dict) and isinstance(recorded.get("key"), str):
            found.setdefault(recorded["key"], []).append(folder.name)
    return found


def listing(lima: Lima, config: Config) -> list[dict[str, Any]]:
    """Every base VM: key, status, build time, age, size on the host, the VMs cloned from it, fresh or stale."""
    instances = lima.instances()
    current = key(config)
    cloned = users()
    rows = []
    for name, instance in sorted(instances.items()):
        if not name.startswith(PREFIX):
            continue
        base_key = name[len(PREFIX):]
        record = read_record(base_key) or {}
        age = age_days(record) if record else None
        is_current = base_key == current
        fresh = is_current and age is not None and age <= config.base_max_age_days
        rows.append({
            "key": base_key,
            "name": name,
            "status": instance.status or "Unknown",
            "built": _iso(record.get("built")),
            "ageDays": round(age, 2) if age is not None and age != float("inf") else None,
            "size": _size_on_host(instance.dir),
            "disk": instance.disk or None,
            "usedBy": [vm for vm in cloned.get(base_key, []) if vm in instances],
            "current": is_current,
            "state": "fresh" if fresh else "stale",
            "limaVersion": record.get("limaVersion"),
            "agents": record.get("agents", {}),
        })
    return rows


def _iso(stamp: Any) -> str | None:
    if not isinstance(stamp, (int, float)):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


def _size_on_host(directory: str) -> int | None:
    """Bytes the instance folder takes on the host's disk (allocated blocks: a sparse disk counts as used)."""
    if not directory:
        return None
    total = 0
    for root, _dirs, files in os.walk(directory):
        for file in files:
            try:
                total += os.lstat(os.path.join(root, file)).st_blocks * 512
            except OSError:
                continue
    return total


def remove(lima: Lima, base_key: str) -> str:
    """Delete a base VM and its record; what was removed, in words."""
    base_key = base_key[len(PREFIX):] if base_key.startswith(PREFIX) else base_key
    name = instance_name(base_key)
    instance = lima.instances().get(name)
    record = record_path(base_key)
    if instance is None and not record.exists():
        raise AgentboxError(f"there is no base VM {name}", hint="`agentbox base ls` lists them.")
    with lock():
        if instance is not None:
            lima.delete(name, force=True)
        record.unlink(missing_ok=True)
        (paths.bases_dir() / f"{base_key}.yaml").unlink(missing_ok=True)
    cloned = [vm for vm in users().get(base_key, []) if vm in lima.listed]
    what = f"removed the base VM {name}" if instance is not None else f"removed the record of the base VM {name}"
    if cloned:
        what += f" (VMs cloned from it are independent copies and keep working: {', '.join(cloned)})"
    return what
