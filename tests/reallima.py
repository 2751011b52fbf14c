"""What the real-Lima tier (tests/test_real_lima.py) stands on: Lima built from its Go module, QEMU, a Debian guest.

- Lima: `limactl` and `lima-guestagent` at LIMA_VERSION, built with the Go toolchain from Lima's own module
  (downloaded through the Go module proxy the toolchain is configured with), laid out as Lima's release archives
  are: <prefix>/bin/limactl, <prefix>/share/lima/lima-guestagent.Linux-<arch>. Cached by version.
  `go install …/cmd/limactl@v2.2.0` is what the issue names; it asks the proxy for the module's version list (for
  deprecations), which some proxies refuse, so the module is fetched with `go mod download` and both commands are
  built from it with `go build`: the same source and flags.
- QEMU and qemu-img: Debian's packages (qemu-system-x86, qemu-utils).
- The guest: Debian 12 made with debootstrap (the client's default mirror), with a kernel, cloud-init, openssh-server
  and what Lima's boot scripts use, plus what agentbox's provisioning would otherwise install with apt (so a boot
  under software emulation does not spend minutes in apt). An ext4 file system made from the folder with
  `mkfs.ext4 -d` (no loop mount, no root-owned mount), turned into qcow2; its kernel and initrd beside it, booted
  through the `kernel`/`initrd` fields of the image (agentbox's `vm.image`). Cached by its package list.

Every missing piece stops the tier with one line naming it and how to install it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

LIMA_MODULE = "github.com/lima-vm/lima/v2"
LIMA_VERSION = "2.2.0"
SUITE = "bookworm"
KERNEL_CMDLINE = "root=/dev/vda rw console=ttyS0 net.ifnames=0"
ROOT_SIZE = "3G"
# What boots and what Lima's boot scripts use (cloud-init's NoCloud, sshd, the reverse-sshfs mounts, the DNS
# redirect's iptables, the guest agent's systemd unit, the user manager the user step waits for) ...
BOOT_PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "dbus", "cloud-init", "cloud-guest-utils",
                 "python3-cffi-backend", "openssh-server", "sudo", "iproute2", "isc-dhcp-client", "ifupdown",
                 "kmod", "procps", "netbase", "ca-certificates", "curl", "fuse3", "sshfs", "iptables", "rsync",
                 "libpam-systemd", "dbus-user-session", "locales")
# ... and what agentbox's provisioning installs with apt (10-base-packages.sh, 20-docker.sh as Debian names it,
# 40-github-cli.sh: Debian's gh), so those scripts find them; Node.js still comes through 30-nodejs.sh's download.
PROVISIONED_PACKAGES = ("git", "jq", "build-essential", "unzip", "gnupg", "tmux", "nftables", "xz-utils",
                        "docker.io", "gh", "python3")
IMAGE_PACKAGES = BOOT_PACKAGES + PROVISIONED_PACKAGES
# nodejs.org is not reachable from the project's machines: the tier serves a nodejs.org-shaped folder (the
# real-distribution tier's, tests/test_real_distro.py node_dist) on the host's loopback at NODE_PORT, which a
# QEMU guest of Lima's user-mode network reaches at 192.168.5.2; a `curl` first on the image's PATH maps
# https://nodejs.org/dist/ to it, so 30-nodejs.sh still downloads, checks SHASUMS256 and unpacks.
NODE_PORT = 38_457
NODE_CURL = rf"""#!/bin/bash
# agentbox's real-Lima test tier (tests/reallima.py): nodejs.org/dist/ is served by the tier on the host
args=()
for arg in "$@"; do args+=("${{arg/#https:\/\/nodejs.org\/dist\//http://192.168.5.2:{NODE_PORT}/}}"); done
exec /usr/bin/curl "${{args[@]}}"
"""
GUEST_ARCH = {"x86_64": "amd64"}.get(platform.machine())


class Missing(Exception):
    """A requirement of the tier is missing: one line, what and how to install it."""


def run(cmd: list[str], timeout: float = 1800, **kwargs: object) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def build(cmd: list[str], what: str, timeout: float = 1800, **kwargs: object) -> None:
    """One step of building the tier's tools: a failure stops the tier with one line (Missing) saying what failed,
    the command and its last words."""
    try:
        run(cmd, timeout, **kwargs)
    except (AssertionError, OSError, subprocess.TimeoutExpired) as exc:
        last = [line.strip() for line in str(exc).splitlines() if line.strip()][-1:]
        raise Missing(f"{what} failed: `{' '.join(cmd[:3])} …`: {last[0] if last else exc}") from exc


def go_toolchain() -> str:
    found = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if found is None:
        raise Missing("the Go toolchain is missing (it builds limactl from Lima's module): install Go 1.24 or newer "
                      "and put `go` on PATH")
    return found


def qemu_problem() -> str | None:
    missing = [name for name, package in (("qemu-system-x86_64", "qemu-system-x86"), ("qemu-img", "qemu-utils"))
               if shutil.which(name) is None]
    if missing:
        return (f"{' and '.join(missing)} missing: install Debian's qemu-system-x86 and qemu-utils "
                "(apt-get install qemu-system-x86 qemu-utils)")
    return None


def lima_tools(cache: Path) -> Path:
    """<prefix> with bin/limactl and share/lima/lima-guestagent.Linux-<arch>, built once per version."""
    prefix = cache / "lima" / f"v{LIMA_VERSION}-{platform.machine()}"
    limactl = prefix / "bin" / "limactl"
    agent = prefix / "share" / "lima" / f"lima-guestagent.Linux-{platform.machine()}"
    if limactl.exists() and agent.exists():
        return prefix
    go = go_toolchain()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "PATH": f"{Path(go).parent}:{os.environ['PATH']}"}
    downloaded = subprocess.run([go, "mod", "download", "-json", f"{LIMA_MODULE}@v{LIMA_VERSION}"],
                                capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=900)
    if downloaded.returncode != 0:
        raise Missing(f"Lima's Go module {LIMA_MODULE}@v{LIMA_VERSION} could not be downloaded (the Go module proxy "
                      f"must be reachable): {(downloaded.stdout + downloaded.stderr).strip().splitlines()[-1:]}")
    source = json.loads(downloaded.stdout)["Dir"]
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".lima-build-"))
    try:
        flags = ["-trimpath", "-ldflags", f"-s -w -X {LIMA_MODULE}/pkg/version.Version={LIMA_VERSION}"]
        (staging / "bin").mkdir()
        (staging / "share" / "lima").mkdir(parents=True)
        build([go, "build", *flags, "-o", str(staging / "bin" / "limactl"), "./cmd/limactl"], "building limactl",
              cwd=source, env=env)
        build([go, "build", *flags, "-o", str(staging / agent.relative_to(prefix)), "./cmd/lima-guestagent"],
              "building lima-guestagent", cwd=source, env={**env, "GOOS": "linux"})
        # Lima's own templates (`template:` names), as its release archive carries them.
        shutil.copytree(Path(source) / "templates", staging / "share" / "lima" / "templates")
        for path in staging.rglob("*"):
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        staging.chmod(0o755)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, prefix)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return prefix


@dataclass(frozen=True)
class GuestImage:
    disk: Path
    kernel: Path
    initrd: Path

    def setting(self) -> dict:
        """agentbox's `vm.image` for it."""
        return {"location": str(self.disk), "kernel": {"location": str(self.kernel), "cmdline": KERNEL_CMDLINE},
                "initrd": {"location": str(self.initrd)}}


def guest_image(cache: Path) -> GuestImage:
    """The Debian guest (see the module docstring), cached by suite, architecture and package list."""
    if GUEST_ARCH is None:
        raise Missing(f"the tier's guest image is built for x86_64 hosts; this is {platform.machine()}")
    key = hashlib.sha256(" ".join((SUITE, KERNEL_CMDLINE, ROOT_SIZE, NODE_CURL, *IMAGE_PACKAGES)).encode()).hexdigest()[:12]
    folder = cache / "lima-images" / f"debian-{SUITE}-{GUEST_ARCH}-{key}"
    image = GuestImage(folder / "disk.qcow2", folder / "vmlinuz", folder / "initrd.img")
    if image.disk.exists():
        return image
    if shutil.which("debootstrap") is None:
        raise Missing("debootstrap is missing (it builds the guest image): apt-get install debootstrap")
    if os.geteuid() != 0:
        raise Missing("building the guest image needs root (debootstrap); run the tier once as root to cache it")
    problem = qemu_problem()
    if problem:
        raise Missing(problem)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".image-build-"))
    try:
        root = staging / "rootfs"
        build(["debootstrap", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}", SUITE, str(root)],
              "building the guest image (debootstrap; Debian's packages must be reachable)", timeout=3600)
        (root / "etc" / "hostname").write_text("lima-guest\n")
        (root / "etc" / "fstab").write_text("/dev/vda / ext4 defaults,discard 0 1\n")
        (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
        # cloud-init adds the VM's own name to /etc/hosts (sudo looks it up), as a cloud image's config does.
        (root / "etc" / "cloud" / "cloud.cfg.d" / "90-datasource.cfg").write_text(
            "datasource_list: [ NoCloud ]\nmanage_etc_hosts: localhost\n")
        build(["chroot", str(root), "apt-get", "clean"], "building the guest image")
        curl = root / "usr" / "local" / "bin" / "curl"
        curl.write_text(NODE_CURL)
        curl.chmod(0o755)
        for key_file in (root / "etc" / "ssh").glob("ssh_host_*"):
            key_file.unlink()  # each VM's cloud-init makes its own
        shutil.copyfile(next((root / "boot").glob("vmlinuz-*")), staging / "vmlinuz")
        shutil.copyfile(next((root / "boot").glob("initrd.img-*")), staging / "initrd.img")
        raw = staging / "disk.raw"
        build(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(root), str(raw), ROOT_SIZE],
              "making the guest's file system (mkfs.ext4 -d needs e2fsprogs 1.43 or newer)")
        build(["qemu-img", "convert", "-O", "qcow2", str(raw), str(staging / "disk.qcow2")], "converting the image")
        raw.unlink()
        shutil.rmtree(root)
        for path in (staging, *staging.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return image


def qemu_version() -> str:
    first = run(["qemu-system-x86_64", "--version"]).stdout.splitlines()[0]
    return first.removeprefix("QEMU emulator version ").strip()


REPORT_NAME = "reallima-report.md"
META_NAME = "reallima-meta.json"
TIER_MODULE = "tests/test_real_lima.py::"


def report(reports: dict[str, list], cache: Path) -> list[str] | None:
    """The tier's report from pytest's reports by outcome (the terminal reporter's `stats`): each step, its result
    and time (setup, call and teardown), with Lima's and QEMU's versions; None when the tier did not run."""
    steps: dict[str, dict] = {}
    for outcome, entries in reports.items():
        for entry in entries:
            nodeid = getattr(entry, "nodeid", "")
            if not nodeid.startswith(TIER_MODULE) or not hasattr(entry, "duration"):
                continue
            step = steps.setdefault(nodeid[len(TIER_MODULE):], {"result": "passed", "seconds": 0.0, "why": ""})
            step["seconds"] += entry.duration
            if outcome in ("failed", "error") or (outcome == "skipped" and step["result"] == "passed"):
                step["result"] = "failed" if outcome == "error" else outcome
                step["why"] = _first_line(entry)
    if not steps:
        return None
    try:
        meta = json.loads((cache / META_NAME).read_text())
    except (OSError, ValueError):
        meta = {}
    lines = [f"# The real-Lima tier: {meta.get('lima', 'limactl ?')}, QEMU {meta.get('qemu', '?')} (TCG), "
             f"guest {meta.get('image', '?')}", "", "| step | result | seconds |", "|---|---|---:|"]
    for name, step in steps.items():
        result = step["result"] + (f": {step['why']}" if step["why"] else "")
        lines.append(f"| {name} | {result} | {step['seconds']:.1f} |")
    lines.append(f"| total | | {sum(s['seconds'] for s in steps.values()):.1f} |")
    (cache / REPORT_NAME).write_text("\n".join(lines) + "\n")
    return lines


def _first_line(entry: object) -> str:
    longrepr = getattr(entry, "longrepr", None)
    if isinstance(longrepr, tuple):
        text = str(longrepr[2])
    else:
        text = getattr(entry, "longreprtext", "") or str(longrepr or "")
    found = [line.strip() for line in text.splitlines() if line.strip().startswith("E ")] or text.splitlines()
    return (found[0].removeprefix("E").strip() if found else "")[:160].replace("|", "/")
