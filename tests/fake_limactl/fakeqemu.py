"""The double's QEMU, as Lima runs it for a VM (`qemu-system-ARCH`, or `$QEMU_SYSTEM_<ARCH>`, which agentbox sets for a
held start). `--version` answers as QEMU does (Lima asks before it starts one); a start keeps running as the VM's
QEMU process until it is killed (`stop`, `delete`), or its `-pidfile` no longer names it or its folder is gone (a
test's LIMA_HOME removed). Nothing of a real VM runs: what agentbox checks is its command line (/proc/PID/cmdline).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time

PIDFILE = "qemu.pid"  # in the instance's folder, as Lima passes it (-pidfile)
VERSION = "QEMU emulator version 8.2.2 (fake limactl's)"


def run(instance_dir: str, arch: str, ssh_port: int) -> str | None:
    """Start the VM's QEMU as Lima's QEMU driver does when `$QEMU_SYSTEM_<ARCH>` is set (pkg/driver/qemu: the variable,
    which may carry arguments, else qemu-system-ARCH; `--version` asked first), with the first NIC as Lima makes it
    (`-netdev user,id=net0,...,hostfwd=...:22`). Without the variable the double starts no QEMU process (nothing of
    agentbox's looks at one). Returns what went wrong, once QEMU wrote its pid or ended (None: it runs)."""
    value = os.environ.get("QEMU_SYSTEM_" + arch.upper())
    if not value:
        return None
    exe = shlex.split(value)
    asked = subprocess.run([*exe, "--version"], capture_output=True, text=True)
    if asked.returncode != 0:
        return f"failed to run {exe[0]} --version: {asked.stderr.strip() or asked.returncode}"
    pidfile = os.path.join(instance_dir, PIDFILE)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile)
    argv = [*exe, "-m", "4096", "-netdev",
            f"user,id=net0,net=192.168.5.0/24,dhcpstart=192.168.5.15,hostfwd=tcp:127.0.0.1:{ssh_port}-:22",
            "-device", "virtio-net-pci,netdev=net0", "-name", "lima-fake", "-pidfile", pidfile]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"QEMU exited with status {process.returncode}: {(process.stderr.read() or '').strip()}"
        if os.path.exists(pidfile):
            process.stderr.close()
            return None
        time.sleep(0.01)
    return "QEMU did not start in 20 s"


def end(instance_dir: str) -> None:
    """The VM's QEMU killed (stop, a new boot)."""
    pidfile = os.path.join(instance_dir, PIDFILE)
    try:
        with open(pidfile, encoding="utf-8") as file:
            pid = int(file.read().strip())
        os.unlink(pidfile)
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def main(argv: list[str]) -> int:
    if "--version" in argv:
        print(VERSION)
        print("Copyright (c) 2003-2023 Fabrice Bellard and the QEMU Project developers")
        return 0
    pidfile = argv[argv.index("-pidfile") + 1] if "-pidfile" in argv[:-1] else ""
    if pidfile:
        with open(pidfile, "w", encoding="utf-8") as file:
            file.write(f"{os.getpid()}\n")
    while True:
        time.sleep(0.5)
        try:
            with open(pidfile, encoding="utf-8") as file:
                if file.read().strip() != str(os.getpid()):
                    return 0
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
