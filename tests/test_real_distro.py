"""The real-distribution tier: agentbox's provisioning and launch step on a real Debian userspace.

No VM and no double: a Debian userspace built with debootstrap from Debian's mirror (cached under
~/.cache/agentbox-tests, or $AGENTBOX_TEST_CACHE, keyed by suite, architecture and package list),
entered with unshare + chroot as root. In it, like Lima at boot: agentbox's own rendered lima.yaml
is applied (its `data` files, then its `system` scripts as root, then its `user` script as the
unprivileged guest user through sudo -iu, then its readiness probe), with real apt, then launch.sh
runs as that user from a staging folder built by agentbox's own host code, installing the agents
with real npm and starting them with their approvals-off flags, and the real gh sits behind the
guards.

What differs from a VM, and why:
- Debian 12, not Ubuntu: Debian's mirror is the one this project can reach. The image has Debian's
  docker.io, so 20-docker.sh (which asks apt for Ubuntu's package names) finds docker installed;
  no daemon starts, as no init runs in a chroot, but its group is there for the user step.
- The chroot shares the host's network namespace (a VM has its own), so launch.sh's `sudo nft -f`
  would change the test machine's firewall: root's nft is a stand-in (NFT_STAND_IN, at /usr/local/sbin
  where sudo's secure_path looks first) that lets the real nft, installed by 10-base-packages.sh, load
  the file in a throwaway network namespace (over the ruleset kept so far, so a broken file fails as
  in a VM) and keeps nft's listing in /var/lib/agentbox-test/nft.ruleset, which the tests read.
- Node.js comes from a nodejs.org-shaped folder built from the npm registry's `node-linux-<arch>`
  and `npm` packages (nodejs.org is not reachable here); a `curl` first on PATH for the system
  scripts maps https://nodejs.org/dist/ to it, so 30-nodejs.sh still downloads, checks SHASUMS256
  and unpacks. gh is Debian's package, in the image, so 40-github-cli.sh finds it installed.

Slow (minutes when nothing is cached) and needs the network; part of the whole suite. Run only it
with `python3 -m pytest -m realdistro` (as root, with debootstrap and npm on the host). Outside CI a
missing requirement skips it with the reason; in CI (CI set) it fails instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentbox import paths
from tests.helpers import REAL_HOME

# One xdist worker runs the whole tier (`pytest -n auto --dist loadgroup`): its fixture is per module. The
# first test may build the cache (debootstrap and the npm packages: up to ~10 min on a cold 2-core machine),
# so these tests get longer than the suite's 300 s.
pytestmark = [pytest.mark.realdistro, pytest.mark.xdist_group("realdistro"), pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
# The image: what a cloud image brings before agentbox provisions it (gh: see the module docstring);
# openssh-server as in every cloud image (Lima reaches the VM over ssh), so the seal has host keys to remove;
# python3 as in every cloud image (cloud-init is Python), so the broker CA's trust is checked from Python too.
IMAGE_PACKAGES = ("sudo", "ca-certificates", "curl", "git", "gnupg", "xz-utils", "build-essential", "gh", "procps",
                  "docker.io", "openssh-server", "python3")
HOSTNAME = "lima-agentbox"
USER, UID = "lima", 1000
GUEST_HOME = f"/home/{USER}.guest"
NODE_VERSION = re.search(r'^NODE_VERSION="(v[0-9.]+)"$', (REPO / "provision" / "30-nodejs.sh").read_text(), re.M)[1]
ARCH = {"x86_64": ("amd64", "x64"), "aarch64": ("arm64", "arm64")}.get(platform.machine())
NFT_STATE = "/var/lib/agentbox-test/nft.ruleset"
# root's nft in the chroot (see the module docstring): the real one, but only ever in a throwaway namespace.
NFT_STAND_IN = r"""#!/bin/sh
# the real-distribution tier's nft (tests/test_real_distro.py): never touches this network namespace
state=/var/lib/agentbox-test/nft.ruleset
real=/usr/sbin/nft
if [ "$(id -u)" != 0 ]; then
  [ "${1-}" != list ] || echo "Operation not permitted (you must be root)" >&2
  echo "netlink: Error: cache initialization failed: Operation not permitted" >&2
  exit 1
fi
check=
if [ "${1-}" = -c ] || [ "${1-}" = --check ]; then check=1; shift; fi
case "${1-} $#" in
  "-f 2"|"--file 2")
    listing=$(unshare --net sh -c '[ ! -s "$1" ] || "$0" -f "$1" || exit; "$0" -f "$2" && "$0" list ruleset' \
      "$real" "$state" "$2") || exit
    [ -n "$check" ] || printf '%s\n' "$listing" > "$state" ;;
  "list "*)
    [ -z "$check" ] || exit 1
    exec unshare --net sh -c '[ ! -s "$1" ] || "$0" -f "$1" || exit; shift; exec "$0" "$@"' "$real" "$state" "$@" ;;
  *) echo "the test tier's nft takes -f FILE, -c -f FILE or list ...; got: $*" >&2; exit 1 ;;
esac
"""
# A host behind a TLS-inspecting proxy trusts its CA through NODE_EXTRA_CA_CERTS: agentbox brings
# those certificates into the VM (caCerts), as it would for a user on such a host. Read before the
# tests' own isolation removes it from the environment.
HOST_NODE_EXTRA_CA_CERTS = os.environ.get("NODE_EXTRA_CA_CERTS", "")


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the real-distribution tier cannot run: {reason}")
    pytest.skip(reason)


def run(cmd: list[str], timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


# -- the cache: a Debian userspace and a nodejs.org-shaped folder ------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTBOX_TEST_CACHE") or Path(REAL_HOME) / ".cache" / "agentbox-tests")


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    import fcntl

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def rootfs_tarball() -> Path:
    """debootstrap --variant=minbase SUITE with the image packages, cached as one tarball."""
    key = hashlib.sha256(" ".join((SUITE, *IMAGE_PACKAGES)).encode()).hexdigest()[:12]
    stem = cache_dir() / f"rootfs-{SUITE}-{ARCH[0]}-{key}"
    for found in (stem.with_suffix(".tar.zst"), stem.with_suffix(".tar.gz")):
        if found.exists():
            return found
    tarball = stem.with_suffix(".tar.zst" if shutil.which("zstd") else ".tar.gz")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        root = Path(tmp) / "root"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}", SUITE, str(root)])  # debootstrap's default mirror
        run(["chroot", str(root), "apt-get", "clean"])
        partial = Path(tmp) / tarball.name
        run(["tar", "-C", str(root), "--numeric-owner", "-a", "-cf", str(partial), "."])
        os.replace(partial, tarball)
    return tarball


def node_dist() -> Path:
    """https://nodejs.org/dist/VERSION/ as 30-nodejs.sh expects it, made from npm registry packages:
    node-linux-ARCH (bin/node, include, share, README/LICENSE/CHANGELOG) and npm (lib/node_modules/npm)."""
    folder = cache_dir() / "node-dist" / NODE_VERSION
    top = f"node-{NODE_VERSION}-linux-{ARCH[1]}"
    if (folder / "SHASUMS256.txt").exists():
        return folder.parent
    if shutil.which("npm") is None:
        unavailable("npm is not installed on the host (it fetches Node.js from the npm registry)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        work = Path(tmp)
        for spec in (f"node-linux-{ARCH[1]}@{NODE_VERSION[1:]}", "npm@10"):
            run(["npm", "pack", "--silent", "--pack-destination", str(work), spec], cwd=work)
        tree = work / top
        (tree / "lib" / "node_modules").mkdir(parents=True)
        for packed in work.glob("*.tgz"):
            with tarfile.open(packed) as tar:
                tar.extractall(work / packed.stem, filter="tar")
            unpacked = work / packed.stem / "package"
            if packed.name.startswith("npm-"):
                unpacked.rename(tree / "lib" / "node_modules" / "npm")
            else:
                for entry in unpacked.iterdir():
                    if entry.name != "package.json":
                        entry.rename(tree / entry.name)
        (tree / "bin" / "npm").symlink_to("../lib/node_modules/npm/bin/npm-cli.js")
        (tree / "bin" / "npx").symlink_to("../lib/node_modules/npm/bin/npx-cli.js")
        (tree / "bin" / "node").chmod(0o755)
        name = f"{top}.tar.xz"
        run(["tar", "-C", str(work), "--owner=0", "--group=0", "-cf", str(work / name), "-I", "xz -T0 -1", top])
        digest = hashlib.sha256((work / name).read_bytes()).hexdigest()
        os.replace(work / name, folder / name)
        (folder / "SHASUMS256.txt").write_text(f"{digest}  {name}\n")
    return folder.parent


def network_problem() -> str | None:
    """Whether Debian's packages and the npm registry answer, asked through their own clients' defaults."""
    checks = (["apt-get", "download", "-q", "hostname"], ["npm", "view", "npm", "version"])
    for check in checks:
        if shutil.which(check[0]) is None:
            continue
        try:
            with tempfile.TemporaryDirectory() as scratch:
                subprocess.run(check, check=True, capture_output=True, timeout=60, cwd=scratch)
        except (subprocess.SubprocessError, OSError) as exc:
            return f"`{' '.join(check)}` failed ({exc}): the network or the package index is not reachable"
    return None


# -- the machine -------------------------------------------------------------------------------


@dataclass
class Machine:
    """An unpacked userspace and the host folders bound into it (at the same paths, like Lima's mounts)."""

    root: Path
    binds: list[tuple[Path, Path, bool]] = field(default_factory=list)  # host, guest, writable

    def command(self, argv: list[str], user: bool = False) -> list[str]:
        """argv in the userspace: own mount and pid namespaces, the binds, chroot; as the user through a
        clean environment (as sshd leaves it) when user is set."""
        mounts = ["mount --rbind /dev \"$R/dev\"", "mount -t proc proc \"$R/proc\"", "mount -t sysfs sys \"$R/sys\""]
        for host, guest, writable in self.binds:
            target = f'"$R"{shlex.quote(str(guest))}'
            mounts.append(f"mkdir -p {target} && mount --bind {shlex.quote(str(host))} {target}")
            if not writable:
                mounts.append(f"mount -o remount,bind,ro {target}")
        inner = argv
        if user:
            inner = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups", "--reset-env", *argv]
        script = " && ".join([f"hostname {HOSTNAME}", *mounts]) + ' && exec chroot "$R" "$@"'
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--uts", "--", "sh", "-c", script, "sh",
                *inner]

    def run(self, argv: list[str], user: bool = False, check: bool = True, timeout: float = 1200,
            input: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(argv, user), capture_output=True, text=True, timeout=timeout,
                                input=input, env={"R": str(self.root), "PATH": os.environ["PATH"]})
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def path(self, guest: str) -> Path:
        return self.root / guest.lstrip("/")


@dataclass
class Provisioned:
    machine: Machine
    project: Path
    staging: Path
    scripts: list[tuple[str, int, str]]  # (name, exit code, output)
    env: dict[str, str]  # HOME and friends for agentbox's host code


def _go_template(text: str, params: dict[str, str]) -> str:
    """The template variables Lima fills in provisioning scripts and data files."""
    values = {".User": USER, ".Home": GUEST_HOME, ".UID": str(UID), **{f".Param.{k}": v for k, v in params.items()}}
    return re.sub(r"{{\s*(\.[A-Za-z.]+)\s*}}", lambda m: values[m[1]], text)


def _apply_lima_yaml(machine: Machine, lima_yaml: dict, log: list[tuple[str, int, str]]) -> None:
    """What Lima's boot script does with `provision`: data files, then system scripts as root, then
    user scripts as the user (sudo -iu), every failure noted; and the readiness probes."""
    params = {k: str(v) for k, v in (lima_yaml.get("param") or {}).items()}
    certs = (lima_yaml.get("caCerts") or {}).get("certs") or []
    for number, cert in enumerate(certs, 1):  # cloud-init's ca_certs
        machine.path(f"/usr/local/share/ca-certificates/cloud-init-ca-cert-{number}.crt").write_text(cert)
    if certs:
        machine.run(["update-ca-certificates"])
    steps = lima_yaml["provision"]
    for step in (s for s in steps if s["mode"] == "data"):
        target = machine.path(_go_template(step["path"], params))
        if target.exists() and step.get("overwrite") is False:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_go_template(step["content"], params))
        target.chmod(int(str(step.get("permissions", "644")), 8))
        owner = _go_template(str(step.get("owner", "root")), params)
        machine.run(["chown", owner if ":" in owner else f"{owner}:{owner}", _go_template(step["path"], params)])
    # Data files under the user's home: Lima creates their folders as the owner.
    machine.run(["chown", "-R", f"{USER}:{USER}", GUEST_HOME])
    for number, step in enumerate((s for s in steps if s["mode"] == "system"), 1):
        path = f"/var/lib/agentbox-test/system-{number:02d}"
        machine.path(path).parent.mkdir(parents=True, exist_ok=True)
        machine.path(path).write_text(_go_template(step["script"], params))
        machine.path(path).chmod(0o755)
        name = re.search(r"agentbox-managed: ([^\n(]*)", step["script"])[1].strip()
        result = machine.run(["env", "PATH=/var/lib/agentbox-test/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                     "/usr/bin:/sbin:/bin", "HOME=/root", path], check=False)
        log.append((name, result.returncode, result.stdout + result.stderr))
    for step in (s for s in steps if s["mode"] == "user"):
        script = f"{GUEST_HOME}/.lima-user-script"
        machine.path(script).write_text(_go_template(step["script"], params))
        machine.path(script).chmod(0o755)
        machine.run(["chown", f"{USER}:{USER}", script])
        result = machine.run(["sudo", "-iu", USER, script], check=False)
        machine.path(script).unlink()
        log.append(("user setup", result.returncode, result.stdout + result.stderr))
    machine.path("/run/lima-boot-done").write_text("iid-realdistro\n")  # the boot script's last step
    for probe in lima_yaml.get("probes") or []:
        result = machine.run(["bash"], user=True, check=False, input=probe["script"])
        log.append(("readiness probe", result.returncode, result.stdout + result.stderr))


def require_tier(*tools: str) -> None:
    """Skip (in CI: fail) unless this machine can run the tier: root, its tools, a Node.js build for it."""
    if os.geteuid() != 0:
        unavailable("it runs a chroot, so it needs root")
    for tool in ("debootstrap", "unshare", "chroot", "curl", "tar", "xz", *tools):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (.ci/run installs debootstrap)")
    if ARCH is None:
        unavailable(f"no Node.js build for {platform.machine()}")


def unpack_userspace(base: Path, tarball: Path, dist: Path) -> Machine:
    """The tier's userspace before provisioning, in base/root: the image, cloud-init's part (the user, its home and
    passwordless sudo), the nft stand-in and the tier's nodejs.org (see the module docstring)."""
    root = base / "root"
    root.mkdir()
    run(["tar", "-C", str(root), "--numeric-owner", "-a", "-xf", str(tarball)])
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    with open(root / "etc" / "hosts", "a", encoding="utf-8") as hosts:
        hosts.write(f"127.0.1.1 {HOSTNAME}\n")
    machine = Machine(root)
    machine.run(["useradd", "--create-home", "--home-dir", GUEST_HOME, "--uid", str(UID), "--user-group",
                 "--shell", "/bin/bash", USER])
    (root / "etc" / "sudoers.d" / "90-lima").write_text(f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
    stand_in = root / "usr" / "local" / "sbin" / "nft"
    stand_in.write_text(NFT_STAND_IN)
    stand_in.chmod(0o755)
    shim = root / "var" / "lib" / "agentbox-test" / "bin" / "curl"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/bin/sh\n# the test tier\'s nodejs.org\nfor a; do shift; set -- "$@" '
                    '"$(printf %s "$a" | sed "s#^https://nodejs.org/dist/#file:///var/lib/agentbox-test/node-dist/#")"; '
                    'done\nexec /usr/bin/curl "$@"\n')
    shim.chmod(0o755)
    machine.binds.append((dist, Path("/var/lib/agentbox-test/node-dist"), False))
    return machine


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provisioned]:
    require_tier()
    problem = network_problem()
    if problem:
        unavailable(problem)
    started = time.monotonic()
    with cache_lock():  # parallel workers (pytest -n) and parallel runs build the cache once
        tarball, dist = rootfs_tarball(), node_dist()
    print(f"\nreal-distro cache ready after {time.monotonic() - started:.0f}s ({cache_dir()})")

    base = tmp_path_factory.mktemp("realdistro")
    machine = unpack_userspace(base, tarball, dist)
    npm_cache = cache_dir() / "npm-cache"
    npm_cache.mkdir(parents=True, exist_ok=True)
    os.chown(npm_cache, UID, UID)
    for entry in npm_cache.rglob("*"):
        os.lchown(entry, UID, UID)
    machine.binds.append((npm_cache, Path(GUEST_HOME) / ".npm", True))

    # agentbox's host side, in a home of its own: config, rendered lima.yaml, staging.
    host_home = base / "host-home"
    project = base / "work" / "project"
    project.mkdir(parents=True)
    host_home.mkdir()
    env = {"HOME": str(host_home), "AGENTBOX_STATE_DIR": str(base / "state"), "LIMA_HOME": str(base / "lima")}
    if HOST_NODE_EXTRA_CA_CERTS:
        env["NODE_EXTRA_CA_CERTS"] = HOST_NODE_EXTRA_CA_CERTS
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        for key in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "NODE_EXTRA_CA_CERTS"):
            patch.delenv(key, raising=False)
        if HOST_NODE_EXTRA_CA_CERTS:
            patch.setenv("NODE_EXTRA_CA_CERTS", HOST_NODE_EXTRA_CA_CERTS)
        import yaml

        from agentbox.config import load as config_module
        from agentbox.vm import render

        config = config_module.load(project)
        lima_yaml = yaml.safe_load(render.render(config, config.vm_name))
        staged = paths.staging_dir(config.vm_name)
    staged.mkdir(parents=True, mode=0o700)
    own_by_guest_user(project, staged)
    machine.binds.append((project, project, True))
    machine.binds.append((staged, staged, False))

    log: list[tuple[str, int, str]] = []
    started = time.monotonic()
    _apply_lima_yaml(machine, lima_yaml, log)
    print(f"provisioning took {time.monotonic() - started:.0f}s")
    yield Provisioned(machine, project, staged, log, env)


def own_by_guest_user(*paths: Path) -> None:
    """Over Lima's mounts the host user's files are the guest user's (same uid); here the host user
    is root, so hand the mounted folders to the guest user's uid."""
    for top in paths:
        for path in [top, *top.rglob("*")]:
            os.lchown(path, UID, UID)


def launch(p: Provisioned, agent: str | None, argv: list[str], interactive_input: str | None = None,
           timeout: float = 1200, brokered: bool = False) -> subprocess.CompletedProcess:
    """One launch as agentbox makes it: staging refreshed by agentbox's host code, then what
    `limactl shell --workdir WORKSPACE` runs (a login shell running launch.sh) as the user. `brokered`: the VM's
    broker CA (agentbox.net.certauthority, made beforehand) is staged; otherwise none is, and launch.sh removes one."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in p.env.items():
            patch.setenv(key, value)
        from agentbox.config import load as config_module
        from agentbox.net import certauthority
        from agentbox.session import brokersetup, prepare, staging
        from agentbox.vm.lifecycle import VmControl
        from agentbox.vm.lima import Instance, Lima

        # The CA made beforehand, as it is (the broker's own prepare would make one for the host's logins' hosts).
        patch.setattr(brokersetup, "prepare", lambda config, vm_name, agent=None: brokersetup.Brokered(
            None, certauthority.load(vm_name)) if brokered else None)  # type: ignore[arg-type]

        config = config_module.load(p.project)
        agent_config = config.agent(agent) if agent else None
        # The VM's row of `limactl list` as a launch has it (the user's home is what the sync rewrites to).
        instance = Instance.from_json({"name": config.vm_name, "status": "Running", "cpus": 4, "memory": 8 << 30,
                                       "disk": 100 << 30, "config": {"user": {"home": GUEST_HOME}}})
        launch = prepare.prepare(VmControl(config, Lima()), prepare.Ask(agent_config, steps=prepare.TASK))
        refreshed = staging.refresh(launch, instance)
        staging.stage_context(launch, refreshed, instance, None)
        command = staging.launch_command(launch, p.staging, staging.LaunchOptions())
    own_by_guest_user(p.staging)
    if agent_config is not None:
        command += ["--", agent_config.binary, *agent_config.default_args, *argv]
    elif argv:
        command += ["--", *argv]
    script = f"cd {shlex.quote(str(p.project))} || exit 1 ; exec /bin/bash -l -c {shlex.quote(shlex.join(command))}"
    return p.machine.run(["/bin/bash", "-c", script], user=True, check=False, input=interactive_input or "",
                         timeout=timeout)


# -- the tests ---------------------------------------------------------------------------------


def test_provisioning_finishes_on_a_real_distribution(provisioned: Provisioned) -> None:
    """Every script of agentbox's rendered lima.yaml, for real; then the readiness probe passes."""
    report = "\n".join(f"== {name}: exit {code}\n{output}" for name, code, output in provisioned.scripts)
    codes = {name: code for name, code, _ in provisioned.scripts}
    assert codes == {"base packages": 0, "Docker engine from Ubuntu's archive": 0,
                     "Node.js LTS from nodejs.org, checked against its SHASUMS256": 0,
                     "GitHub CLI from its signed apt repository": 0, "user setup": 0, "readiness probe": 0}, report
    machine = provisioned.machine
    assert machine.run(["dpkg-query", "-W", "-f=${Status}\n", "jq", "unzip"]).stdout == \
        "install ok installed\ninstall ok installed\n"
    assert machine.run(["node", "--version"], user=True).stdout.strip() == NODE_VERSION
    assert sorted(p.name for p in machine.path("/usr/local").iterdir() if p.is_file()) == []  # no README, LICENSE
    assert machine.run(["npm", "config", "get", "prefix"], user=True).stdout.strip() == f"{GUEST_HOME}/.local"
    assert "docker" in machine.run(["id", "-nG", USER]).stdout.split()  # through sudo usermod, in the user step


@pytest.mark.parametrize("agent,package", [
    ("claude", "@anthropic-ai/claude-code"), ("codex", "@openai/codex"), ("gemini", "@google/gemini-cli"),
    ("opencode", "opencode-ai"), ("copilot", "@github/copilot")])
def test_each_agent_installs_and_accepts_its_approvals_off_flags(provisioned: Provisioned, agent: str,
                                                                package: str) -> None:
    result = launch(provisioned, agent, ["--version"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing {agent} in the VM: npm install -g {package}" in result.stderr
    assert re.search(r"\d+\.\d+\.\d+", result.stdout), result.stdout
    again = launch(provisioned, agent, ["--version"])
    assert again.returncode == 0 and "installing" not in again.stderr


def test_gemini_keeps_yolo_in_the_workspace_and_leaves_its_settings_alone(provisioned: Provisioned) -> None:
    machine = provisioned.machine
    settings = machine.path(f"{GUEST_HOME}/.gemini/settings.json")
    before = settings.read_text()
    # Headless, Gemini CLI says when it resets yolo in an untrusted folder (and then refuses to run);
    # in a trusted one it goes on to call the API, which fails here: only what it decided is read.
    try:
        result = launch(provisioned, "gemini", ["--debug", "-p", "hi"], interactive_input="", timeout=90)
        decided = result.stdout + result.stderr
    except subprocess.TimeoutExpired as waited:  # still trying to reach Google: the decision is made by then
        decided = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                          for x in (waited.stdout, waited.stderr))
    assert "YOLO mode is enabled" in decided, decided[-3000:]
    assert "Approval mode overridden" not in decided and "not running in a trusted directory" not in decided
    assert settings.read_text() == before  # Gemini CLI found nothing to migrate or reject
    assert "approvalMode" not in before
    trusted = json.loads(machine.path(f"{GUEST_HOME}/.gemini/trustedFolders.json").read_text())
    assert trusted == {str(provisioned.project): "TRUST_FOLDER"}


def test_local_bin_is_on_path_once(provisioned: Provisioned) -> None:
    local_bin = f"{GUEST_HOME}/.local/bin"
    command = launch(provisioned, None, ["printenv", "PATH"])
    assert command.stdout.strip().split(":").count(local_bin) == 1, command.stdout
    shell = launch(provisioned, None, [], interactive_input='echo "PATH=$PATH"\n')
    line = next(x for x in shell.stdout.splitlines() if x.startswith("PATH="))
    assert line[5:].split(":").count(local_bin) == 1, line


def test_guards_stop_remote_writes_with_the_real_git_and_gh(provisioned: Provisioned) -> None:
    project, machine = provisioned.project, provisioned.machine
    remote = project / "remote.git"
    git = ["git", "-c", "safe.directory=*"]  # the host's git, as root, in the guest user's folder
    if not remote.exists():
        run([*git, "init", "-q", "--bare", str(remote)])
        run([*git, "-c", "init.defaultBranch=main", "init", "-q", str(project)])
        run([*git, "-C", str(project), "remote", "add", "origin", str(remote)])
        run([*git, "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q",
             "--allow-empty", "-m", "first"])
        own_by_guest_user(project)
    push = launch(provisioned, None, ["git", "push", "origin", "HEAD:main"])
    assert push.returncode != 0 and "remoteWrite" in push.stderr, push.stderr
    real_push = launch(provisioned, None, ["/usr/bin/git", "push", "origin", "HEAD:main"])
    assert real_push.returncode != 0, real_push.stderr  # the global pre-push hook
    assert run([*git, "--git-dir", str(remote), "for-each-ref"]).stdout == ""
    assert machine.run(["test", "-x", "/usr/bin/gh"], check=False).returncode == 0
    for write in (["gh", "pr", "merge", "1"], ["gh", "repo", "delete", "o/r", "--yes"], ["gh", "api", "-X", "POST", "/x"]):
        refused = launch(provisioned, None, write)
        assert refused.returncode == 1 and "agentbox: refused" in refused.stderr, (write, refused.stderr)
    # Reading (and `pr create`, which the guard allows) reaches the real gh: Debian's, behind the wrapper.
    version = launch(provisioned, None, ["gh", "--version"])
    assert version.returncode == 0 and "gh version" in version.stdout and " Debian " in version.stdout
    create = launch(provisioned, None, ["gh", "pr", "create", "--title", "t", "--body", "b"])
    assert "agentbox: refused" not in create.stderr


def test_the_sandbox_description_is_root_s_and_the_memory_block_is_kept(provisioned: Provisioned) -> None:
    """Real sudo, jq and Debian's mawk: /run/agentbox/context.json belongs to root and lists the tools found;
    the block goes into an existing CLAUDE.md once, the user's text kept."""
    machine = provisioned.machine
    claude_md = machine.path(f"{GUEST_HOME}/.claude/CLAUDE.md")
    claude_md.parent.mkdir(parents=True, exist_ok=True)
    claude_md.write_text("# mine\n")
    machine.run(["chown", "-R", f"{USER}:{USER}", f"{GUEST_HOME}/.claude"])
    result = launch(provisioned, None, ["sh", "-c", 'stat -c "%U %a" "$AGENTBOX_CONTEXT_FILE"'])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "root 644\n"
    document = json.loads(machine.path("/run/agentbox/context.json").read_text())
    tools = {tool["name"]: tool["path"] for tool in document["tools"]["list"]}
    assert document["tools"]["checkedInVm"] is True
    assert tools["node"] == "/usr/local/bin/node" and tools["gh"] == f"{GUEST_HOME}/.local/bin/gh"  # the guard
    first = claude_md.read_text()
    assert first.startswith("# mine\n<!-- BEGIN AGENTBOX") and first.count("END AGENTBOX") == 1
    assert launch(provisioned, None, ["true"]).returncode == 0
    assert claude_md.read_text() == first
    assert machine.path(f"{GUEST_HOME}/.kiro/steering/agentbox.md").read_text().startswith("<!-- BEGIN AGENTBOX")


def test_launch_applies_the_staged_network_ruleset_with_root_s_nft(provisioned: Provisioned) -> None:
    """launch.sh loads the staged ruleset with `sudo nft -f` on every launch: root's nft here is the stand-in,
    which ran the real nft (installed by the base packages) on it; the ruleset kept is exactly the staged
    file's, once, after a second launch too; this machine's own firewall never saw it."""
    machine = provisioned.machine
    assert machine.run(["test", "-x", "/usr/sbin/nft"], check=False).returncode == 0  # from 10-base-packages.sh
    # As after a reboot (earlier tests' launches applied it already): no rules, so launch.sh applies them. A reboot
    # changes the boot id too, which the setup's record names (this machine keeps the host's): its record goes.
    machine.path(NFT_STATE).unlink(missing_ok=True)
    machine.path("/run/agentbox/network.nft").unlink(missing_ok=True)
    machine.path(f"{GUEST_HOME}/.agentbox/setup.applied").unlink(missing_ok=True)
    for _ in range(2):
        result = launch(provisioned, None, ["true"])
        assert result.returncode == 0, result.stderr
    staged = provisioned.staging / "network.nft"
    assert staged.is_file(), "the staging folder has no network.nft"
    expected = run(["unshare", "--net", "sh", "-c", 'nft -f "$1" && nft list ruleset', "sh", str(staged)]).stdout
    assert machine.path(NFT_STATE).read_text() == expected
    assert expected.count("table inet agentbox {") == 1 and "ip daddr 192.168.5.2" in expected
    host = shutil.which("nft", path="/usr/sbin:/sbin:" + os.environ["PATH"])
    if host:
        assert "inet agentbox" not in run([host, "list", "ruleset"]).stdout


BROKER_HOST = "api.broker-test.invalid"  # a credential host of the test's CA; no real name is shadowed
OUTSIDE_HOST = "elsewhere.broker-test.example"  # outside the CA's name constraints
# In the guest, as the agent would: each tool with nothing but the system's trust (the variables launch.sh exports
# are taken out, so the store itself is what is checked; Node is the exception, it reads only NODE_EXTRA_CA_CERTS).
TRUST_PROBE = r"""
url="https://$1:$2"
printf 'vars %s %s %s\n' "$NODE_EXTRA_CA_CERTS" "$SSL_CERT_FILE" "$REQUESTS_CA_BUNDLE"
plain() { env -u NODE_EXTRA_CA_CERTS -u SSL_CERT_FILE -u REQUESTS_CA_BUNDLE "$@"; }
plain curl -sS -o /dev/null "$url/ok.txt" 2>&1 && echo "curl ok" || echo "curl refused"
plain python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/ok.txt", timeout=20)' "$url" \
  2>&1 | tail -n 1 | sed 's/^/python: /'; [ "${PIPESTATUS[0]}" = 0 ] && echo "python ok" || echo "python refused"
node -e 'require("https").get(process.argv[1] + "/ok.txt", r => { console.log("node ok"); r.resume(); })
  .on("error", e => { console.log("node refused: " + e.code); })' "$url"
plain git ls-remote "$url/repo.git" 2>&1 | sed 's/^/git: /'; [ "${PIPESTATUS[0]}" = 0 ] && echo "git ok" || echo "git refused"
"""


def _tls_server(root: Path, cert: Path, key: Path) -> tuple[object, int]:
    """A static HTTPS server on 127.0.0.1 serving `root` (a bare repository there answers git's dumb protocol)."""
    import functools
    import http.server
    import ssl
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_the_broker_ca_is_installed_and_trusted_by_the_guest_s_tools_within_its_names(provisioned: Provisioned,
                                                                                      tmp_path: Path) -> None:
    """The real update-ca-certificates installs a CA made by agentbox.net.certauthority; curl, Python's default context and
    git then trust a server presenting its leaf with no CA option of their own, and Node through the variable
    launch.sh exports; a leaf the same key signed for a name outside the CA's constraints is refused by every one.
    A second launch installs nothing; one without the CA removes it, with the real tool again."""
    from agentbox.config import load as config_module
    from agentbox.net import certauthority

    machine = provisioned.machine
    with pytest.MonkeyPatch.context() as patch:
        for key, value in provisioned.env.items():
            patch.setenv(key, value)
        vm = config_module.load(provisioned.project).vm_name
        authority = certauthority.ensure(vm, [BROKER_HOST])
    # The outside leaf: signed by the CA's own key, for a name its constraints do not permit.
    outside_key, outside_cert, ext = tmp_path / "outside.key", tmp_path / "outside.pem", tmp_path / "ext.cnf"
    ext.write_text(f"subjectAltName = DNS:{OUTSIDE_HOST}\nextendedKeyUsage = serverAuth\n")
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(outside_key)])
    request = run(["openssl", "req", "-new", "-key", str(outside_key), "-subj", f"/CN={OUTSIDE_HOST}"]).stdout
    run(["openssl", "x509", "-req", "-CA", str(authority.cert), "-CAkey", str(authority.key), "-set_serial", "7",
         "-days", "30", "-extfile", str(ext), "-out", str(outside_cert)], input=request)
    site = tmp_path / "site"
    site.mkdir()
    (site / "ok.txt").write_text("ok\n")
    run(["git", "init", "-q", "--bare", str(site / "repo.git")])
    work = tmp_path / "work"
    run(["git", "-c", "init.defaultBranch=main", "init", "-q", str(work)])
    run(["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty",
         "-m", "first"])
    run(["git", "-C", str(work), "push", "-q", str(site / "repo.git"), "HEAD:main"])
    run(["git", "--git-dir", str(site / "repo.git"), "update-server-info"])
    leaf = authority.leaf(BROKER_HOST)
    inside, inside_port = _tls_server(site, leaf.cert, leaf.key)
    outside, outside_port = _tls_server(site, outside_cert, outside_key)
    hosts = machine.path("/etc/hosts")
    before = hosts.read_text()
    hosts.write_text(before + f"127.0.0.1 {BROKER_HOST} {OUTSIDE_HOST}\n")
    installed, bundle = machine.path("/usr/local/share/ca-certificates/agentbox-broker.crt"), \
        machine.path("/etc/ssl/certs/ca-certificates.crt")
    try:
        started = time.monotonic()
        install = launch(provisioned, None, ["true"], brokered=True)
        install_took = time.monotonic() - started
        assert install.returncode == 0, install.stderr
        assert installed.read_text() == authority.cert_pem() and authority.cert_pem() in bundle.read_text()
        trusted = launch(provisioned, None, ["bash", "-c", TRUST_PROBE, "probe", BROKER_HOST, str(inside_port)],
                         brokered=True)
        assert trusted.returncode == 0, trusted.stderr
        bundle_path = "/etc/ssl/certs/ca-certificates.crt"
        assert f"vars {bundle_path} {bundle_path} {bundle_path}\n" in trusted.stdout
        for tool in ("curl", "python", "node", "git"):
            assert f"{tool} ok\n" in trusted.stdout, trusted.stdout
        assert "refs/heads/main" in trusted.stdout
        refused = launch(provisioned, None, ["bash", "-c", TRUST_PROBE, "probe", OUTSIDE_HOST, str(outside_port)],
                         brokered=True)
        for tool in ("curl", "python", "node", "git"):
            assert f"{tool} refused" in refused.stdout, refused.stdout
        # refused for the name, not for want of a connection (OpenSSL's words; git's GnuTLS says less)
        assert refused.stdout.count("permitted subtree violation") == 2, refused.stdout
        assert "server certificate verification failed" in refused.stdout
        started = time.monotonic()
        warm = launch(provisioned, None, ["true"], brokered=True)
        warm_took = time.monotonic() - started
        assert warm.returncode == 0, warm.stderr
        started = time.monotonic()
        removed = launch(provisioned, None, ["true"])
        remove_took = time.monotonic() - started
        assert removed.returncode == 0, removed.stderr
        assert not installed.exists() and authority.cert_pem() not in bundle.read_text()
        assert "BEGIN CERTIFICATE" in bundle.read_text()  # Debian's own roots are still there
        started = time.monotonic()
        assert launch(provisioned, None, ["true"]).returncode == 0
        plain_took = time.monotonic() - started
        print(f"\nbroker CA: install launch {install_took:.2f}s, warm {warm_took:.2f}s, removal {remove_took:.2f}s,"
              f" without a CA {plain_took:.2f}s")
    finally:
        hosts.write_text(before)
        inside.shutdown()  # type: ignore[attr-defined]
        outside.shutdown()  # type: ignore[attr-defined]


def host_keys(machine: Machine) -> dict[str, bytes]:
    """The SSH host keys (private halves) in /etc/ssh, by name."""
    return {key.name: key.read_bytes() for key in machine.path("/etc/ssh").glob("ssh_host_*_key")}


def exec_start_pre(machine: Machine, unit: str) -> list[str]:
    """ExecStartPre of a systemd unit as systemd assembles it: the unit file's, then each drop-in's in name
    order, an empty assignment clearing the list."""
    files = [next(path for folder in ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
                  if (path := machine.path(f"{folder}/{unit}")).is_file())]
    for folder in ("/usr/lib/systemd/system", "/etc/systemd/system"):
        files += sorted(machine.path(f"{folder}/{unit}.d").glob("*.conf"))
    commands: list[str] = []
    for path in files:
        section = ""
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and line.partition("=")[0].strip() == "ExecStartPre":
                value = line.partition("=")[2].strip()
                commands = [*commands, value] if value else []
    return commands


def test_the_base_check_and_seal_on_a_real_distribution(provisioned: Provisioned) -> None:
    """The last test of the module (it seals the machine): agentbox's base VM check passes on a provisioned
    userspace and refuses a login file or a shell history; the seal leaves no host keys, machine-id, package
    lists or history; a clone's first boot makes new host keys before sshd starts; and the base packages'
    provisioning then runs again without the lists (a clone's boot)."""
    machine = provisioned.machine
    check = (REPO / "provision" / "base-check.sh").read_text()
    seal = (REPO / "provision" / "base-seal.sh").read_text()
    passed = machine.run(["bash", "-c", check, "base-check.sh", "agent:node", "file:~/.codex/auth.json"],
                         user=True, check=False)
    assert passed.returncode == 0, passed.stdout
    assert "tool git: git version" in passed.stdout and "agent node: v" in passed.stdout
    history = machine.path(f"{GUEST_HOME}/.bash_history")
    history.write_text("echo secret\n")
    machine.run(["chown", f"{USER}:{USER}", f"{GUEST_HOME}/.bash_history"])
    login = machine.path(f"{GUEST_HOME}/.codex/auth.json")
    login.parent.mkdir(parents=True, exist_ok=True)
    login.write_text("{}")
    failed = machine.run(["bash", "-c", check, "base-check.sh", "file:~/.codex/auth.json"], user=True, check=False)
    assert failed.returncode == 1
    assert f"FAIL: a login file is present: {GUEST_HOME}/.codex/auth.json" in failed.stdout
    assert f"FAIL: a shell history file is present: {GUEST_HOME}/.bash_history" in failed.stdout
    login.unlink()

    keys_before = host_keys(machine)  # made by openssh-server's installation, as in a cloud image
    assert {"ssh_host_ed25519_key", "ssh_host_rsa_key"} <= set(keys_before), keys_before
    sealed = machine.run(["bash", "-c", seal, "base-seal.sh", GUEST_HOME])
    assert sealed.stdout.strip().endswith("sealed")
    assert host_keys(machine) == {}
    assert not list(machine.path("/etc/ssh").glob("ssh_host_*"))
    assert machine.path("/etc/machine-id").read_text() == ""
    # A clone's first boot: systemd starts ssh.service, whose ExecStartPre (with the seal's drop-in) make new
    # host keys and check sshd's config; sshd starts only if every one passes.
    machine.path("/run/sshd").mkdir(exist_ok=True)  # the unit's RuntimeDirectory
    for command in exec_start_pre(machine, "ssh.service"):
        started = machine.run(["sh", "-c", command.lstrip("-@+!:")], check=False)
        assert started.returncode == 0 or command.startswith("-"), (command, started.stdout + started.stderr)
    keys_after = host_keys(machine)
    assert set(keys_after) == set(keys_before)
    assert not set(keys_after.values()) & set(keys_before.values()), "the clone kept the base's host keys"
    assert machine.run(["/usr/sbin/sshd", "-t"], check=False).returncode == 0
    assert not history.exists()
    assert not [p for p in machine.path("/var/lib/apt/lists").iterdir() if p.is_file() and p.name != "lock"]
    # A clone's boot: every system script runs again, without package lists, and installs nothing.
    scripts = sorted(machine.path("/var/lib/agentbox-test").glob("system-*"))
    assert scripts
    for script in scripts:
        again = machine.run(["env", "PATH=/var/lib/agentbox-test/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                    "/usr/bin:/sbin:/bin", "HOME=/root", f"/var/lib/agentbox-test/{script.name}"],
                            check=False)
        output = again.stdout + again.stderr
        assert again.returncode == 0, (script.name, output)
        assert "Reading package lists" not in output and "newly installed" not in output, (script.name, output)
