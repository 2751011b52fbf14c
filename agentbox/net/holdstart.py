"""What `limactl start` is handed to start a VM held on the host (agentbox.net.hold says what a hold is): a launcher
for QEMU in the VM's network folder and the spec agentbox.net.qemuhold follows. Only a start reads it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from agentbox.fsutil import atomic_write, private_dir
from agentbox.net.hold import (
    GUEST_ADDRESS,
    GUEST_SOCKET,
    LAUNCHER,
    NOTED,
    PROXY_GUEST_PORT,
    RECORD,
    SPEC,
    folder,
    unheld_reason,
)
from agentbox.net.policy import NetworkSettings


def _arch(arch: str | None) -> str:
    machine = arch or platform.machine().lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)


def start_env(vm_name: str, settings: NetworkSettings, vm_type: str | None, arch: str | None) -> dict[str, str]:
    """The environment `limactl start` gets to start the VM held ({} when it is not held: the record goes)."""
    base = private_dir(folder(vm_name))
    with_record = base / RECORD
    with_record.unlink(missing_ok=True)  # whatever ran before: only this start's QEMU may record a hold
    (base / NOTED).unlink(missing_ok=True)  # a launch says again when this boot is not held
    if unheld_reason(settings, vm_type) is not None:
        return {}
    machine = _arch(arch)
    variable = "QEMU_SYSTEM_" + machine.upper()
    # Lima's own rule: the variable (which may carry arguments) else qemu-system-ARCH on PATH.
    qemu = shlex.split(os.environ.get(variable, "")) or [shutil.which(f"qemu-system-{machine}") or
                                                         f"qemu-system-{machine}"]
    python = sys.executable
    here = Path(__file__).resolve().parent
    ports = tuple(sorted(set(settings.allow_host or ()))) if not isinstance(settings.allow_host, bool) else ()
    forwards = [(PROXY_GUEST_PORT, f"proxy:{base / GUEST_SOCKET}")]
    forwards += [(port, f"port:{port}") for port in ports if port != PROXY_GUEST_PORT]
    connector = [python, "-I", "-S", str(here / "holdconnector.py")]
    options = ["restrict=on", "ipv6=off"]
    for port, target in forwards:
        command = shlex.join([*connector, target]).replace(",", ",,")  # QEMU's option syntax doubles a comma
        options.append(f"guestfwd=tcp:{GUEST_ADDRESS}:{port}-cmd:{command}")
    spec: dict[str, Any] = {"qemu": qemu, "append": ",".join(options), "record": str(with_record),
                            "ports": list(ports)}
    spec["digest"] = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    atomic_write(base / SPEC, json.dumps(spec, indent=1) + "\n", mode=0o600)
    launcher = base / LAUNCHER
    script = f"#!/bin/sh\nexec {shlex.join([python, '-I', str(here / 'qemuhold.py'), str(base / SPEC)])} \"$@\"\n"
    atomic_write(launcher, script, mode=0o700)
    if any(char.isspace() for char in str(launcher)):
        return {}  # Lima splits the variable at spaces: such a path cannot be handed over (said by current())
    return {variable: str(launcher)}


