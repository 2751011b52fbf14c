#!/usr/bin/env python3
"""Time the in-VM launch step (provision/launch.sh) from the shell's start to the program: nothing changed (the
setup recorded: no process before the program) against a full setup; print a table.

    sudo python3 benchmarks/launchstep.py [--runs 15] [--before CHECKOUT]

On the real-distribution tier's cached Debian userspace (tests/test_real_distro.py; root, unshare, chroot, the
cached rootfs tarball in ~/.cache/agentbox-tests), as its unprivileged user with passwordless sudo, jq copied in from
this machine when it is the same Debian, and a stand-in nft that accepts every ruleset (the tier's own nft would
need provisioning). Without that userspace it says so and times on this machine's own userspace instead (no sudo:
launch.sh's steps that need it fail and say so).

Each run: `/bin/bash launch.sh OPTIONS -- /usr/bin/true`, timed from just before the fork to the program's exit by
a bash loop inside the userspace (EPOCHREALTIME), the rows alternating; median and spread of --runs runs. The staging
folder is made by agentbox's own host code (staging.refresh, stage_context, launch_command) for an
`agentbox shell` launch. "before" runs CHECKOUT's provision/launch.sh and parts (e.g. a worktree of the commit
before this change) on the same staging folder, without --setup-digest.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

UID = 1000
USER = "lima"
GUEST_HOME = f"/home/{USER}.guest"


def cached_userspace() -> tuple[Path | None, str]:
    """The real-distribution tier's cached rootfs tarball (never built here), or None and why not."""
    if os.geteuid() != 0:
        return None, "not root (the tier runs a chroot)"
    for tool in ("unshare", "chroot", "tar", "setpriv"):
        if shutil.which(tool) is None:
            return None, f"{tool} is not installed"
    from tests import test_real_distro as tier

    found = sorted(tier.cache_dir().glob("rootfs-*.tar.*"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None, f"no cached rootfs in {tier.cache_dir()} (run `pytest -m realdistro` once)"
    return found[-1], ""


def jq_files() -> list[Path]:
    """jq and the libraries it loads, from this machine (same Debian release and architecture as the image)."""
    jq = shutil.which("jq")
    if jq is None:
        return []
    out = subprocess.run(["ldd", jq], capture_output=True, text=True).stdout
    libs = [Path(line.split("=>")[1].split()[0]) for line in out.splitlines()
            if "=>" in line and ("libjq" in line or "libonig" in line)]
    return [Path(jq), *libs]


def stage(base: Path) -> tuple[Path, Path, list[str]]:
    """A project and its staging folder made by agentbox's host code; launch.sh's argv for `agentbox shell`."""
    project = base / "work" / "project"
    project.mkdir(parents=True)
    host_home = base / "host-home"
    host_home.mkdir()
    env = {"HOME": str(host_home), "AGENTBOX_STATE_DIR": str(base / "state"), "LIMA_HOME": str(base / "lima")}
    os.environ.update(env)
    for key in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "AGENTBOX_CONFIG"):
        os.environ.pop(key, None)
    from agentbox.config import load as config_module
    from agentbox.session import prepare, staging
    from agentbox.vm.lifecycle import VmControl
    from agentbox.vm.lima import Instance, Lima

    config = config_module.load(project)
    instance = Instance.from_json({"name": config.vm_name, "status": "Running", "cpus": 4, "memory": 8 << 30,
                                   "disk": 100 << 30, "config": {"user": {"home": GUEST_HOME}}})
    launch = prepare.prepare(VmControl(config, Lima()), prepare.Ask(None, steps=prepare.TASK))
    refreshed = staging.refresh(launch, instance)
    staging.stage_context(launch, refreshed, instance, None)
    command = staging.launch_command(launch, refreshed.folder, staging.LaunchOptions())
    return project, refreshed.folder, command


def before_copy(staging_dir: Path, checkout: Path, command: list[str]) -> tuple[Path, list[str]]:
    """The same staging folder with CHECKOUT's launch.sh and parts; the argv without the options it lacks."""
    copy = staging_dir.parent / "staging-before"
    shutil.copytree(staging_dir, copy, symlinks=True)
    shutil.copyfile(checkout / "provision" / "launch.sh", copy / "launch.sh")
    shutil.rmtree(copy / "launch")
    (copy / "launch").mkdir(mode=0o700)
    for part in (checkout / "provision" / "launch").glob("*.sh"):
        shutil.copyfile(part, copy / "launch" / part.name)
    argv = [str(copy / "launch.sh")]
    rest = command[2:]
    known = (checkout / "provision" / "launch.sh").read_text()
    i = 0
    while i < len(rest):
        option = rest[i]
        takes_value = i + 1 < len(rest) and not rest[i + 1].startswith("--")
        if f"    {option})" in known:
            argv += rest[i:i + 2] if takes_value else [option]
        i += 2 if takes_value else 1
    return copy, ["/bin/bash", *argv]


def driver(rows: dict[str, tuple[str, str]], runs: int) -> str:
    """A bash loop that times each row's command (prep untimed), alternating, and prints `ROW MICROSECONDS`."""
    lines = ["set -u", f"for i in $(seq {runs}); do"]
    for name, (prep, command) in rows.items():
        lines += [f"  {prep}", "  t0=${EPOCHREALTIME/./}", f"  {command} >/dev/null 2>>\"$HOME/launchstep.err\"",
                  "  t1=${EPOCHREALTIME/./}", f"  printf '%s %d\\n' {shlex.quote(name)} $((t1 - t0))"]
    lines.append("done")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", type=Path, help="a checkout whose launch.sh and parts are timed as 'before'")
    args = parser.parse_args()
    tarball, why = cached_userspace()
    base = Path(tempfile.mkdtemp(prefix="launchstep"))
    try:
        project, staging_dir, command = stage(base)
        before = before_copy(staging_dir, args.before, command) if args.before else None
        program = ["--", "/usr/bin/true"]
        launch = shlex.join([*command, *program])
        rows = {
            "bash alone (start, exec true)": (":", "/bin/bash -c 'exec /usr/bin/true'"),
            "bash + sourcing launch.sh's parts": (":", shlex.join([
                "/bin/bash", "-c", 'state="$HOME/.agentbox" staging="$1"; for part in "$1"/launch/*.sh; do '
                'source "$part"; done; exec /usr/bin/true', "bash", str(staging_dir)])),
            "launch.sh, nothing changed": (":", launch),
            "launch.sh, changed (full setup)": ("rm -f ~/.agentbox/setup.applied", launch),
        }
        if before is not None:
            rows["launch.sh before (full setup)"] = (":", shlex.join([*before[1], *program]))
        warmup = f"{launch} >/dev/null 2>&1; {launch} >/dev/null 2>&1"
        if before is not None:
            warmup += f"; {shlex.join([*before[1], *program])} >/dev/null 2>&1"
        script = f"cd {shlex.quote(str(project))} || exit 1\n{warmup}\n" + driver(rows, args.runs)
        # the setup was recorded (so the unchanged row took the short path)
        script += f"{launch} >/dev/null 2>&1; [ ! -s ~/.agentbox/setup.applied ] || echo recorded\n"
        if tarball is not None:
            from tests import test_real_distro as tier

            machine = tier.unpack_userspace(base, tarball, base)  # the tier's user, sudo, nft stand-in
            (machine.root / "usr" / "local" / "sbin" / "nft").write_text("#!/bin/sh\nexit 0\n")
            for file in jq_files():
                shutil.copy2(file, machine.root / str(file).lstrip("/"))
            tier.own_by_guest_user(project, staging_dir, *( [before[0]] if before else []))
            for path in (staging_dir, *([before[0]] if before else [])):
                machine.binds.append((path, path, False))
            machine.binds.append((project, project, True))
            (machine.root / "run" / "lima-boot-done").write_text("iid-launchstep\n")
            result = machine.run(["/bin/bash", "-l", "-c", script], user=True, check=False, timeout=1800)
            jq = "jq copied in" if jq_files() else "no jq"
            where = f"the real-distribution userspace ({tarball.name}, as {USER}, passwordless sudo, {jq})"
        else:
            result = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, timeout=1800)
            where = f"this machine's own userspace: the real-distribution one is not available ({why})"
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for line in result.stdout.splitlines():
            name, _, micros = line.rpartition(" ")
            if name in samples:
                samples[name].append(int(micros) / 1000)
        if any(not values for values in samples.values()):
            print(result.stdout, result.stderr, file=sys.stderr)
            return 1
        if "recorded" not in result.stdout.splitlines():
            print("the setup was never recorded, so every row ran it; launch.sh said:", file=sys.stderr)
            print(result.stderr, file=sys.stderr)
            return 1
        print(f"launch.sh from the shell's start to the program's exit, {args.runs} runs each, alternating; on {where}")
        print(f"{'row':<34} {'median':>9} {'min':>9} {'max':>9}")
        for name, values in samples.items():
            print(f"{name:<34} {statistics.median(values):>7.1f}ms {min(values):>7.1f}ms {max(values):>7.1f}ms")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
