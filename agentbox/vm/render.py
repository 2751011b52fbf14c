"""Render the instance's lima.yaml from the merged config. Logic lives here; the template is layout."""

import os
import platform
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import paths, resources
from agentbox.config import pins
from agentbox.config.image import Image
from agentbox.config.load import Config, deep_merge
from agentbox.errors import ConfigError
from agentbox.git import dirs
from agentbox.progress import warn
from agentbox.vm import provisioning, workmode

if TYPE_CHECKING:
    from agentbox.vm.provisioning import Plan

MINIMUM_LIMA_VERSION = "2.0.0"
IMAGE_BASE = "template:_images/ubuntu-24.04"


class RenderedMount(NamedTuple):
    location: str
    mount_point: str
    writable: bool


def to_yaml_scalar(value: Any, indent: int = 0) -> str:
    """A YAML value meaning exactly `value` (strings of any characters included).

    Multi-line strings become literal blocks where YAML allows it; their lines are indented by
    `indent` more than PyYAML's own two spaces, to sit under a key at that column.
    """
    # deferred: start-up (yaml, ~22 ms: only rendering a template writes YAML; the warm launch renders none)
    import yaml

    multiline = isinstance(value, str) and "\n" in value.rstrip("\n")
    text = yaml.safe_dump(
        value,
        default_flow_style=True,
        default_style="|" if multiline else None,
        allow_unicode=True,
        width=float("inf"),
    )
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    lines = text.rstrip("\n").split("\n") if not multiline else text.split("\n")
    if multiline:
        if lines and lines[-1] == "":
            lines.pop()
        return "\n".join([lines[0], *((" " * indent + line) if line else line for line in lines[1:])])
    return "\n".join(lines)


def mounts_for(config: Config, vm_name: str) -> list[RenderedMount]:
    workspace = config.require_workspace()
    isolated = config.session_mode == workmode.ISOLATED
    git = dirs.locate(workspace)
    if isolated:
        # The VM sees the workspace read-only, elsewhere; launch.sh puts the agent's copy at its path.
        if git.git_dir is None:
            raise workmode.not_a_git_work_tree(workspace)
        mounts = [RenderedMount(str(workspace), workmode.GUEST_SOURCE, False)]
    else:
        mounts = [RenderedMount(str(workspace), str(workspace), True)]
    if git.problem:
        warn(f"not mounting the git common dir: {git.problem}; git in the VM will not work in this worktree")
    git_mounts = _common_dir_mounts(git, workspace, isolated)
    if git_mounts and _inside(Path(os.path.realpath(workspace)), Path(git_mounts[0].location)):
        mounts = git_mounts + mounts  # a workspace inside the read-only common dir stays writable: mounted after it
    else:
        mounts += git_mounts
    hooks = _hooks_dir(git.common_dir)
    if config.protect_git_hooks and hooks is not None and not isolated:
        # Mounted after the writable workspace, so this read-only view wins inside it.
        mounts.append(RenderedMount(str(hooks), str(hooks), False))
    mounts.append(RenderedMount(str(paths.staging_dir(vm_name)), str(paths.staging_dir(vm_name)), False))
    # The one folder of agentbox's the VM may write: what a session hands back (logins: agentbox.credentials.writeback;
    # an isolated session's changes: agentbox.review.isolation).
    mounts.append(RenderedMount(str(paths.vm_outbox(vm_name)), str(paths.vm_outbox(vm_name)), True))
    for mount in config.mounts:
        problem = workmode.mount_point_problem(mount.mount_point, workspace) if isolated else None
        if problem:
            raise ConfigError(
                f"mounts: {mount.location}: {problem}; isolated mode cannot have it",
                hint="Give it a mountPoint outside the workspace (for example /mnt/data), or use session.mode: live.",
            )
        # Lima gets the path resolved when the config was read: a symlink swapped in later cannot redirect it.
        mounts.append(RenderedMount(str(mount.real), mount.mount_point, mount.writable))
    return mounts


def _common_dir_mounts(git: dirs.GitDirs, workspace: Path, isolated: bool) -> list[RenderedMount]:
    """A validated `git worktree add` layout: the main repository's .git, which git in the VM needs.

    Read-only as a whole (its config, hooks, info and the other worktrees' folders configure and
    point the user's other checkouts), then each folder git writes for this checkout mounted writable
    on top, in that order (Lima mounts them in list order). Each is a separate share, so guest root
    unmounting one never uncovers a writable view of the rest. Isolated mode reads it only: the copy
    is cloned from it.
    """
    common = git.common_dir_outside(workspace)
    if common is None:
        return []
    mounts = [RenderedMount(str(common), str(common), False)]
    if isolated:
        return mounts
    parts = dirs.vm_writable_parts(git)
    for problem in parts.skipped:
        warn(f"not mounting it writable: {problem}; git in the VM cannot write there")
    mounts += [RenderedMount(str(folder), str(folder), True) for folder in parts.folders]
    return mounts


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _hooks_dir(common: Path | None) -> Path | None:
    """The hooks folder of a validated git folder, when it is a real folder (a link could point anywhere)."""
    if common is None:
        return None
    try:
        return common / "hooks" if stat.S_ISDIR(os.lstat(common / "hooks").st_mode) else None
    except OSError:
        return None


class BaseSettings(NamedTuple):
    """What the base VM (agentbox.vm.golden) is rendered with: nothing of a project's."""

    vm_type: str | None
    arch: str | None
    mount_type: str | None
    cpus: int
    memory: str
    disk: str
    image: Image | None = None  # vm.image (None: IMAGE_BASE)
    lima: dict[str, Any] | None = None  # what the base takes of the global vm.lima (agentbox.vm.golden)


# Python's names for the host's machine where they differ from Lima's (macOS says arm64).
_LIMA_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}


def vm_arch(arch: str | None) -> str:
    """The VM's arch as Lima names it: vm.arch, else the host's (Lima's default)."""
    machine = platform.machine().lower()
    return arch or _LIMA_ARCH.get(machine, machine)


def images(settings: BaseSettings) -> list[dict[str, Any]]:
    """lima.yaml's `images`: vm.image for the VM's arch, or none (then the template's `base:` gives Ubuntu's).

    A host file that is not there is refused now: Lima accepts the lima.yaml and fails only when the VM starts."""
    if settings.image is None:
        return []
    for key, path in settings.image.host_paths():
        if not os.path.isfile(path):
            what = "not a file" if os.path.lexists(path) else "missing"
            raise ConfigError(
                f"{key}: {path} is not a file on this machine ({what})",
                hint="Point it at the image file (`agentbox config` shows which config file sets it), or remove "
                "vm.image to use agentbox's Ubuntu image. Nothing was created.",
            )
    return [settings.image.lima_entry(vm_arch(settings.arch))]


def settings_of(config: Config) -> BaseSettings:
    return BaseSettings(config.vm_type, config.arch, config.mount_type, config.cpus, config.memory, config.disk,
                        config.image)


def context(config: Config, vm_name: str) -> dict[str, Any]:
    prov = provisioning.plan(config)
    return _values(vm_name, settings_of(config), prov, mounts_for(config, vm_name), str(config.require_workspace()),
                   str(paths.staging_dir(vm_name)))


def base_context(settings: BaseSettings, vm_name: str, ca_certs: tuple[str, ...] = ()) -> dict[str, Any]:
    """The template's values for the base VM: no mounts, empty workspace params (Lima requires every param
    to be used, and a clone sets them: agentbox.vm.golden.clone_edits), the CA certificates a project VM gets."""
    plan = provisioning.plan(None)
    plan.ca_certs = list(ca_certs)
    return _values(vm_name, settings, plan, [], "", "")


def _values(vm_name: str, settings: BaseSettings, prov: "Plan", mounts: list[RenderedMount], workspace: str,
            staging_mount: str) -> dict[str, Any]:
    return {
        "name": vm_name,
        "minimum_lima_version": MINIMUM_LIMA_VERSION,
        "image_base": IMAGE_BASE,
        "images": images(settings),
        "vm_type": settings.vm_type,
        "arch": settings.arch,
        "cpus": settings.cpus,
        "memory": settings.memory,
        "disk": settings.disk,
        "mount_type": settings.mount_type,
        "mounts": mounts,
        "forward_agent": False,
        "propagate_proxy_env": False,
        "ca_certs": prov.ca_certs,
        "workspace": workspace,
        "staging_mount": staging_mount,
        "system_scripts": prov.system_scripts,
        "user_scripts": prov.user_scripts,
        "data_files": prov.data_files,
        "readiness_probe": prov.readiness_probe,
        "readiness_hint": prov.readiness_hint,
    }


def render_base(settings: BaseSettings, vm_name: str, ca_certs: tuple[str, ...] = ()) -> str:
    """The base VM's lima.yaml: agentbox's own template (never vm.template), with only the global vm.lima's
    machine settings merged in (settings.lima)."""
    text = _render_bounded(_environment().get_template("lima.yaml.j2"), base_context(settings, vm_name, ca_certs),
                           "agentbox's template")
    return _merge_lima(text, settings.lima) if settings.lima else text


def render_remote(config: Config, vm_name: str, staging: RenderedMount, outbox: RenderedMount) -> str:
    """The lima.yaml of the project's VM on a remote host (isolated tasks only): agentbox's own template with the
    config's resources and provisioning, and no mount but the two shared folders there (staging read-only,
    the outbox writable), each seen in the VM at this machine's path of its counterpart, so that the launch step
    and its files name the same paths as here. vm.template and vm.lima are not used, nor a vm.image that names a
    host path: they name this machine's files and folders (an image's URL is used)."""
    prov = provisioning.plan(config)
    settings = settings_of(config)
    if settings.image is not None and settings.image.host_paths():
        settings = settings._replace(image=None)  # a host path names this machine's file
    values = _values(vm_name, settings, prov, [staging, outbox], str(config.require_workspace()),
                     staging.mount_point)
    return _render_bounded(_environment().get_template("lima.yaml.j2"), values, "agentbox's template")


def _environment() -> Any:
    # deferred: start-up (jinja2, ~44 ms: only rendering a template needs it; the warm launch renders none)
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        loader=jinja2.FileSystemLoader(str(resources.path("templates"))),
    )
    env.filters["yaml"] = to_yaml_scalar
    return env


MAX_RENDERED_BYTES = 4 * 1024 * 1024
TEMPLATE_NAME = "<template>"  # what Jinja2 calls a template made from a string, in tracebacks


def render(config: Config, vm_name: str) -> str:
    """The instance's lima.yaml. Templates run in Jinja2's immutable sandbox: a template is data, never
    a way to reach Python objects or run commands on the host."""
    # deferred: start-up (jinja2, ~44 ms: only rendering a template needs it; the warm launch renders none)
    import jinja2

    env = _environment()
    where = "agentbox's template"
    if config.template is not None:

        where = str(config.template)
        try:
            source = pins.read(config.template, "vm.template").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"vm.template: {config.template} is not UTF-8 text") from exc
        try:
            template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            where = f"{config.template}:{exc.lineno}"
            raise ConfigError(f"{where}: vm.template: Jinja2 syntax error: {exc.message}") from exc
    else:
        template = env.get_template("lima.yaml.j2")
    text = _render_bounded(template, context(config, vm_name), where)
    return _merge_lima(text, config.lima) if config.lima else text


def _merge_lima(text: str, lima: dict[str, Any]) -> str:
    # deferred: start-up (yaml, ~22 ms: only rendering a template writes YAML; the warm launch renders none)
    import yaml

    data = yaml.safe_load(text) or {}
    deep_merge(data, lima)
    return "# Rendered by agentbox, with vm.lima merged in.\n" + yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, width=float("inf")
    )


def _render_bounded(template: Any, values: dict[str, Any], where: str) -> str:
    """Render, turning anything the template does wrong into a config error with its line."""
    # deferred: start-up (jinja2, ~44 ms: only rendering a template needs it; the warm launch renders none)
    from jinja2.exceptions import SecurityError, TemplateError

    parts: list[str] = []
    size = 0
    try:
        for part in template.generate(**values):
            size += len(part)
            if size > MAX_RENDERED_BYTES:
                raise ConfigError(
                    f"{where}: vm.template renders more than {MAX_RENDERED_BYTES:,} characters; refusing it"
                )
            parts.append(part)
    except ConfigError:
        raise
    except SecurityError as exc:
        raise ConfigError(
            f"{where}{_template_line(exc)}: vm.template reaches for something the template sandbox refuses ({exc})",
            hint="A template may only use the values agentbox passes to it (see `agentbox template`).",
        ) from exc
    except TemplateError as exc:
        raise ConfigError(f"{where}{_template_line(exc)}: vm.template: {exc.message or exc}") from exc
    except Exception as exc:
        raise ConfigError(f"{where}{_template_line(exc)}: vm.template failed: {type(exc).__name__}: {exc}") from exc
    return "".join(parts)


def _template_line(exc: BaseException) -> str:
    """ ":LINE" of the template line that raised, from the frames Jinja2 maps back to the template."""
    # deferred: start-up (traceback, ~4 ms: only a template error's line needs it)
    import traceback

    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename in (TEMPLATE_NAME, "lima.yaml.j2") or frame.f_code.co_filename.endswith(".j2"):
            line = lineno
    return f":{line}" if line is not None else ""
