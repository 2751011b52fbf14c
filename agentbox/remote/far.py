"""The far end: agentbox's helper on a remote host, run there with `python3 far-DIGEST.py COMMAND ARGS...`.

A standalone script (standard library only, Python 3.8 or newer; it never imports agentbox), copied to
`~/.agentbox-remote/bin/` by agentbox.remote.farclient. Every command prints one JSON object on stdout (`collect`:
a tar; `attach` becomes the session's terminal); an error is `{"error": TEXT}` with exit status 3. It runs
`limactl` (the remote PATH) and owns the layout `~/.agentbox-remote/` (folders 0700):

    bin/far-DIGEST.py          this script
    tasks/KEY                  the VM name of task KEY (written here at submit: the VM cannot reach it)
    vms/VM/lima.yaml           the template the VM was created from
    vms/VM/staging/            mounted read-only in the VM: only the laptop's bytes
    vms/VM/outbox/tasks/KEY/   mounted writable in the VM: everything in it is the attacker's

What the VM wrote is read here as agentbox.vmread reads it on the laptop: folders opened one level at a time with
O_DIRECTORY|O_NOFOLLOW, files with O_NOFOLLOW|O_NONBLOCK and taken only when fstat says regular, at most a cap of
bytes; no link is ever followed, no FIFO blocks, and `collect` builds its tar from those bytes (never with the tar
program). Files written into the outbox go in beside their name and are renamed over it, so a link the VM planted
is replaced, never written through.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from typing import IO, Any, NoReturn

ERROR_EXIT = 3
ROOT_NAME = ".agentbox-remote"
VM_PREFIX = "agentbox-"
# Lima's instance name rule (pkg/identifiers/validate.go), at most 76 characters
VM_NAME = re.compile(r"agentbox-[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

STATE_CAP = 4096
STDERR_TAIL = 4096
READ_CAP = 4 * 1024 * 1024  # the most one `read` answers
JOB_CAP = 4 * 1024 * 1024
# collect: each file with the most it may hold and whether more is cut (outputs) or refused whole (a cut patch
# or summary is worthless)
COLLECTED = (("state", STATE_CAP, False), ("stdout", 16 * 1024 * 1024, True), ("stderr", 16 * 1024 * 1024, True),
             ("changes.patch", 64 * 1024 * 1024, False), ("summary.md", 256 * 1024, False))
COLLECT_REPORT = "collect.json"
MAX_REMOVE_DEPTH = 32

SHELL_MISSING = re.compile(r"instance `([^`]+)` does not exist")
SHELL_STOPPED = re.compile(r"instance `([^`]+)` is stopped")
# Lima cannot read the instance's lima.yaml: what a `limactl create` cut short leaves (an empty or partial file)
UNREADABLE = re.compile(r"errors inspecting instance|has configuration errors|has no configuration")


class Failure(Exception):
    """What the far end answers as {"error": message}."""


# -- the layout ------------------------------------------------------------------------------------


def root() -> str:
    return os.path.join(os.path.expanduser("~"), ROOT_NAME)


def private_dir(path: str) -> str:
    """path (under the layout's root) as a folder of this user's only (0700), made when missing; and so is every
    folder from the root down to it (os.makedirs gives the parents it makes the umask's mode: an older far end left
    `vms/` readable by all, and the staging below holds the VM's proxy credentials)."""
    top = root()
    chain = [path]
    while chain[-1].startswith(top + os.sep):
        chain.append(os.path.dirname(chain[-1]))
    for folder in reversed(chain):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise Failure(f"{folder} is not a folder; move it away")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)
    return path


def vm_dir(vm: str) -> str:
    return os.path.join(root(), "vms", vm)


def check_vm(vm: str) -> str:
    if not VM_NAME.fullmatch(vm) or len(vm) > 76:
        raise Failure(f"{vm!r} is not an agentbox VM name (agentbox-..., letters, digits and . _ -)")
    return vm


def check_key(key: str) -> str:
    if not KEY.fullmatch(key):
        raise Failure(f"{key!r} is not a task key (letters, digits and . _ -, at most 64)")
    return key


def task_vm(key: str) -> str | None:
    """The VM of task KEY, from the index written at submit; None for a task this host does not know."""
    try:
        with open(os.path.join(root(), "tasks", check_key(key)), "rb") as handle:
            vm = handle.read(200).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    return check_vm(vm)


def known_task(key: str) -> str:
    vm = task_vm(key)
    if vm is None:
        raise Failure(f"task {key} is not known on this host (never submitted here, or forgotten)")
    return vm


# -- what the VM wrote: no link followed, regular files only, capped --------------------------------


class Refused(Exception):
    """A file of the VM's that is not taken; the message says why."""


class Missing(Refused):
    """A file that is not there."""


def single(name: str) -> bool:
    """Whether name is one entry of its folder: no "/" (its folders would be followed were they links), not ".."."""
    return "/" not in name and name not in (".", "..")


def open_dir(parent: int, name: str, create: bool = False) -> int:
    """parent/name as a folder descriptor, never through a link. With create, a missing folder is made and whatever
    else stands there (a link, a file) is replaced."""
    if not single(name):
        raise OSError(errno.EINVAL, f"{name!r} is not a single folder name")
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if not create or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent)
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def open_path(start: str, parts: list[str], create: bool = False) -> int:
    """start (this script's own folder) then each part below it, one level at a time, without following a link."""
    fd = os.open(private_dir(start) if create else start, DIR_FLAGS)
    try:
        for part in parts:
            child = open_dir(fd, part, create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def task_box(key: str, create: bool = False) -> int:
    """The descriptor of task KEY's folder in its VM's outbox (reached without following a link)."""
    vm = known_task(key)
    try:
        return open_path(vm_dir(vm), ["outbox", "tasks", key], create)
    except FileNotFoundError:
        raise Failure(f"task {key} has no folder in the outbox of {vm}") from None
    except OSError as exc:
        raise Failure(f"task {key}'s folder in the outbox of {vm} cannot be opened ({exc.strerror})") from None


def open_regular(parent: int, name: str) -> tuple[int, os.stat_result]:
    """A read descriptor on parent/name when it is a regular file reached without a link, and its stat; looked at
    before opening (a FIFO or device is never opened) and again after (not swapped meanwhile)."""
    if not single(name):
        raise Refused("is not a single file name")
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise Missing("does not exist") from None
    except OSError as exc:
        raise Refused(f"cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(before.st_mode):
        raise Refused("is a symbolic link, which is never followed")
    if not stat.S_ISREG(before.st_mode):
        raise Refused("is not a regular file")
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise Refused("does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("is a symbolic link, which is never followed") from None
        raise Refused(f"cannot be opened ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise Refused("was replaced while it was opened")
    return fd, st


def read_fd(fd: int, limit: int) -> bytes:
    chunks = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1024 * 1024))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(parent: int, name: str, cap: int, offset: int = 0) -> tuple[bytes, int]:
    """Up to cap+1 bytes of parent/name from offset, and the file's size; Refused unless regular and unlinked."""
    fd, st = open_regular(parent, name)
    try:
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        return read_fd(fd, cap + 1), st.st_size
    finally:
        os.close(fd)


def stat_regular(parent: int, name: str) -> os.stat_result | None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def state_text(parent: int) -> str | None:
    """The runner's state file, raw (at most STATE_CAP bytes; None when absent, larger, a link or not regular)."""
    try:
        data = read_regular(parent, "state", STATE_CAP)[0]
    except Refused:
        return None
    return None if len(data) > STATE_CAP else data.decode("utf-8", "replace")


def replace_file(parent: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """parent/name holds data: written beside it under a fresh name, then renamed over whatever is there (a link
    the VM planted is replaced, never written through)."""
    while True:
        aside = f".{name}.far-{secrets.token_hex(6)}"
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=parent)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.rename(aside, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        try:
            os.unlink(aside, dir_fd=parent)
        except OSError:
            pass
        raise


def remove(parent: int, name: str, depth: int = 0) -> bool:
    """Remove parent/name and whatever is in it, never following a link out of it."""
    if not single(name):
        return False
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return True
        if depth > MAX_REMOVE_DEPTH:
            return False
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            for child in os.listdir(fd):
                remove(fd, child, depth + 1)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


# -- limactl ---------------------------------------------------------------------------------------


def limactl_path() -> str | None:
    return shutil.which("limactl")


def limactl(*args: str, timeout: float | None = 120) -> subprocess.CompletedProcess[bytes]:
    program = limactl_path()
    if program is None:
        raise Failure("limactl is not on this host's PATH (install Lima, https://lima-vm.io, for this user)")
    try:
        return subprocess.run([program, *args], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise Failure(f"`limactl {' '.join(args)}` did not finish within {timeout:.0f} s") from None


def last_line(data: bytes) -> str:
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def fatal_message(data: bytes) -> str:
    """The message of limactl's last logrus line (msg="..." unquoted), or the line itself."""
    line = last_line(data)
    found = re.search(r'msg="((?:[^"\\]|\\.)*)"', line)
    if found:
        try:
            return str(json.loads(f'"{found.group(1)}"'))
        except ValueError:
            return found.group(1)
    found = re.search(r"msg=(\S+)", line)
    return found.group(1) if found else line


def vm_statuses() -> dict[str, str]:
    """{name: status} of the agentbox VMs, from one `limactl list --json`."""
    done = limactl("list", "--json")
    if done.returncode != 0:
        raise Failure(f"`limactl list --json` failed: {fatal_message(done.stderr)}")
    found = {}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and str(item.get("name", "")).startswith(VM_PREFIX):
            found[str(item["name"])] = str(item.get("status", ""))
    return found


# -- commands --------------------------------------------------------------------------------------


def own_digest() -> str:
    with open(os.path.abspath(__file__), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:12]


def memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        done = subprocess.run(["sysctl", "-n", "hw.memsize"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=10, check=False)
        return int(done.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def virtualisation() -> str:
    system = platform.system()
    if system == "Linux":
        return "kvm" if os.access("/dev/kvm", os.R_OK | os.W_OK) else "none"
    if system == "Darwin":
        try:
            major = int(platform.mac_ver()[0].split(".")[0])
        except ValueError:
            return "none"
        return "vz" if major >= 13 else "none"
    return "none"


def running_tasks() -> int:
    """How many tasks known here have a state file that says running."""
    try:
        keys = os.listdir(os.path.join(root(), "tasks"))
    except OSError:
        return 0
    count = 0
    for key in keys:
        try:
            box = task_box(key)
        except Failure:
            continue
        try:
            text = state_text(box)
        finally:
            os.close(box)
        if text is not None and "state=running" in text.splitlines():
            count += 1
    return count


def cmd_facts() -> dict[str, Any]:
    program = limactl_path()
    version = None
    vms: list[dict[str, str]] = []
    if program is not None:
        done = limactl("--version", timeout=30)
        found = re.search(r"limactl version v?(\S+)", done.stdout.decode("utf-8", "replace"))
        version = found.group(1) if found else None
        vms = [{"name": name, "status": status} for name, status in sorted(vm_statuses().items())]
    home = os.path.expanduser("~")
    usage = os.statvfs(home)
    return {"far": own_digest(), "os": platform.system().lower(), "arch": platform.machine(), "limactl": program,
            "limaVersion": version, "virt": virtualisation(), "cpus": os.cpu_count(), "memory": memory_bytes(),
            "diskFree": usage.f_bavail * usage.f_frsize, "vms": vms, "running": running_tasks(), "root": root()}


def member_target(name: str) -> tuple[str, list[str]]:
    """Where a submit member goes: ("job", []), ("staging", parts) or ("task", parts); raises Failure for a name
    outside them (absolute, `..`, anything else)."""
    if name.startswith("/") or "\\" in name:
        raise Failure(f"the submitted tar has a member with an absolute or odd name: {name!r}")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        raise Failure(f"the submitted tar has a member going up with `..`: {name!r}")
    if parts == ["job.json"]:
        return "job", []
    if parts and parts[0] in ("staging", "task"):
        return parts[0], parts[1:]
    raise Failure(f"the submitted tar has a member outside job.json, staging/ and task/: {name!r}")


def read_job(data: bytes) -> dict[str, Any]:
    try:
        job = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise Failure(f"job.json is not JSON: {exc}") from None
    if not isinstance(job, dict):
        raise Failure("job.json is not a JSON object")
    check_vm(str(job.get("vm", "")))
    check_key(str(job.get("task", "")))
    launch = job.get("launch")
    if not isinstance(launch, list) or not launch or not all(isinstance(word, str) for word in launch):
        raise Failure("job.json's launch is not a non-empty list of strings")
    if job.get("limaYaml") is not None and not isinstance(job["limaYaml"], str):
        raise Failure("job.json's limaYaml is neither text nor null")
    keep = job.get("staging")
    if keep is not None and (not isinstance(keep, list) or not all(isinstance(name, str) for name in keep)):
        raise Failure("job.json's staging is not a list of file names")
    timeout = job.get("startTimeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise Failure("job.json's startTimeout is not a positive number of seconds")
    return job


def unpack(archive: tarfile.TarFile, members: list[tuple[tarfile.TarInfo, str, list[str]]], vm: str,
           key: str) -> None:
    """The members into the VM's staging folder and the task's folder in its outbox, each folder reached without
    following a link and each file renamed into place."""
    staging = open_path(vm_dir(vm), ["staging"], create=True)
    box = open_path(vm_dir(vm), ["outbox", "tasks", key], create=True)
    try:
        for info, where, parts in members:
            if not parts:
                continue
            base = staging if where == "staging" else box
            folders = parts if info.isdir() else parts[:-1]
            fd = os.dup(base)
            try:
                for part in folders:
                    child = open_dir(fd, part, create=True)
                    os.close(fd)
                    fd = child
                if info.isfile():
                    source = archive.extractfile(info)
                    data = source.read() if source is not None else b""
                    replace_file(fd, parts[-1], data, 0o700 if info.mode & 0o100 else 0o600)
            finally:
                os.close(fd)
    finally:
        os.close(staging)
        os.close(box)


def prune_staging(vm: str, keep: set[str]) -> None:
    """The VM's staging folder holds only the files the laptop's staging has now (it sends only what changed, and
    names the whole set): a launch step part it no longer has is not left to be read. The VM cannot write there."""
    staging = open_path(vm_dir(vm), ["staging"], create=True)
    try:
        _prune(staging, "", keep, 0)
    finally:
        os.close(staging)


def _prune(fd: int, prefix: str, keep: set[str], depth: int) -> None:
    for name in os.listdir(fd):
        relative = prefix + name
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth < MAX_REMOVE_DEPTH and any(item.startswith(relative + "/") for item in keep):
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    _prune(child, relative + "/", keep, depth + 1)
                finally:
                    os.close(child)
            else:
                remove(fd, name)
        elif relative not in keep:
            os.unlink(name, dir_fd=fd)


def cmd_submit(stream: IO[bytes]) -> tuple[dict[str, Any], int]:
    # stdin goes to an unnamed file first: the tar's members are then read in any order, whatever its size
    with tempfile.TemporaryFile(dir=private_dir(os.path.join(root(), "tmp"))) as spooled:
        shutil.copyfileobj(stream, spooled, 1024 * 1024)
        spooled.seek(0)
        try:
            archive = tarfile.open(fileobj=spooled, mode="r:")  # noqa: SIM115 (closed by the with below)
        except tarfile.TarError as exc:
            raise Failure(f"what came on stdin is not a tar: {exc}") from None
        with archive:
            job = take(archive)
    return launch(job), 0


def take(archive: tarfile.TarFile) -> dict[str, Any]:
    """The job of a submit tar, its files unpacked and the task entered in the index; every member is checked
    before anything is written."""
    members = []
    job_data = None
    for info in archive.getmembers():
        where, parts = member_target(info.name)
        if not (info.isfile() or info.isdir()):
            raise Failure(f"the submitted tar's member {info.name!r} is a link or a device: only files "
                          "and folders are taken")
        if where == "job":
            source = archive.extractfile(info) if info.isfile() else None
            if source is None or info.size > JOB_CAP:
                raise Failure("job.json is not a file of at most 4 MiB")
            job_data = source.read()
        else:
            members.append((info, where, parts))
    if job_data is None:
        raise Failure("the submitted tar has no job.json")
    job = read_job(job_data)
    vm, key = job["vm"], job["task"]
    private_dir(vm_dir(vm))
    unpack(archive, members, vm, key)
    if job.get("staging") is not None:
        prune_staging(vm, set(job["staging"]))
    tasks = os.open(private_dir(os.path.join(root(), "tasks")), DIR_FLAGS)
    try:
        replace_file(tasks, key, vm.encode() + b"\n")
    finally:
        os.close(tasks)
    return job


def launch(job: dict[str, Any]) -> dict[str, Any]:
    """Run the launch in the VM; a warm VM costs one limactl call (shell). A VM that shell says is missing is created
    from limaYaml, a stopped one started, each seen in `limactl list` before it is believed, then shell again."""
    vm = job["vm"]
    argv = ["shell", "--tty=false", vm, "--", *job["launch"]]
    created = started = False
    done = limactl(*argv, timeout=None)
    if done.returncode == 1:
        message = fatal_message(done.stderr)
        said = SHELL_MISSING.search(message) or SHELL_STOPPED.search(message)
        if said is None and UNREADABLE.search(done.stderr.decode("utf-8", "replace")):
            raise unusable(vm, message)
        if said is not None and said.group(1) == vm:
            with vm_lock(vm):  # two submits to a cold VM: one creates and starts it, the other finds it running
                status = vm_statuses().get(vm)
                if status is None:
                    if job.get("limaYaml") is None:
                        return {"need": "limaYaml"}
                    create(vm, job["limaYaml"])
                    created = True
                    status = "Stopped"
                if status != "Running":
                    start(vm, job.get("startTimeout"))
                    started = True
            done = limactl(*argv, timeout=None)
    return {"code": done.returncode, "stderr": done.stderr[-STDERR_TAIL:].decode("utf-8", "replace"),
            "created": created, "started": started}


@contextlib.contextmanager
def vm_lock(vm: str) -> Iterator[None]:
    fd = os.open(os.path.join(private_dir(vm_dir(vm)), "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def create(vm: str, lima_yaml: str) -> None:
    folder = private_dir(vm_dir(vm))
    path = os.path.join(folder, "lima.yaml")
    fd = os.open(folder, DIR_FLAGS)
    try:
        replace_file(fd, "lima.yaml", lima_yaml.encode("utf-8"))
    finally:
        os.close(fd)
    done = limactl("create", f"--name={vm}", "--tty=false", path, timeout=1800)
    if done.returncode != 0:
        message = f"`limactl create` of {vm} failed: {fatal_message(done.stderr)}"
        # Under vm_lock nothing else makes this VM, so what the failure left is ours: removed as on the laptop
        # (agentbox.vm.lifecycle), or every later task would meet a half-made instance Lima cannot start.
        if vm in vm_statuses():
            removed = limactl("delete", "--force", "--tty=false", vm, timeout=600)
            if removed.returncode != 0:
                raise Failure(f"{message}; the half-created VM could not be removed either "
                              f"({fatal_message(removed.stderr)}): remove it on this host with "
                              f"`limactl delete --force {vm}`, then run the task again")
            message += "; the half-created VM was removed, nothing else changed"
        raise Failure(message)


def start(vm: str, timeout: float | None) -> None:
    args = ["start", "--tty=false"]
    if timeout:
        args.append(f"--timeout={int(timeout)}s")
    done = limactl(*args, vm, timeout=(timeout + 120) if timeout else 1800)
    if done.returncode != 0:
        message = fatal_message(done.stderr)
        if UNREADABLE.search(done.stderr.decode("utf-8", "replace")):
            raise unusable(vm, message)
        raise Failure(f"`limactl start` of {vm} failed: {message}")


def unusable(vm: str, message: str) -> Failure:
    """An instance Lima cannot read is left alone (it may hold a disk worth keeping); the answer says how to go on."""
    return Failure(f"{vm} on this host cannot be used ({message}); it looks half-made, by a `limactl create` that "
                   f"was cut short. Remove it there with `limactl delete --force {vm}`, then run the task again: "
                   "agentbox makes it anew")


def cmd_status(keys: list[str]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    vms = {}
    for key in keys:
        vm = task_vm(key)
        entry: dict[str, Any] = {"vm": vm, "state": None, "heartbeat": None, "stdout": None, "stderr": None,
                                 "vmStatus": None}
        if vm is not None:
            vms[key] = vm
            try:
                box = task_box(key)
            except Failure:
                box = -1
            if box >= 0:
                try:
                    entry["state"] = state_text(box)
                    beat = stat_regular(box, "heartbeat")
                    entry["heartbeat"] = beat.st_mtime if beat else None
                    for name in ("stdout", "stderr"):
                        found = stat_regular(box, name)
                        entry[name] = found.st_size if found else None
                finally:
                    os.close(box)
        answers[key] = entry
    if vms:
        statuses = vm_statuses()
        for key, vm in vms.items():
            answers[key]["vmStatus"] = statuses.get(vm)
    return {"tasks": answers}


def number(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 15:
        raise Failure(f"{what} {text!r} is not a number")
    return int(text)


def cmd_read(key: str, name: str, offset_text: str, limit_text: str) -> dict[str, Any]:
    if not FILE_NAME.fullmatch(name):
        raise Failure(f"{name!r} is not a file name of the task's folder")
    offset = number(offset_text, "the offset")
    limit = min(number(limit_text, "the limit"), READ_CAP)
    box = task_box(key)
    try:
        data, size = read_regular(box, name, limit, offset)
    except Missing:
        return {"name": name, "offset": offset, "data": None, "size": None, "missing": True}
    except Refused as refused:
        return {"name": name, "offset": offset, "data": None, "size": None, "refused": str(refused)}
    finally:
        os.close(box)
    return {"name": name, "offset": offset, "data": base64.b64encode(data[:limit]).decode("ascii"), "size": size}


def cmd_cancel(key: str) -> dict[str, Any]:
    box = task_box(key)
    try:
        replace_file(box, "cancel", b"")
    finally:
        os.close(box)
    return {"cancelled": key}


def cmd_collect(key: str, out: IO[bytes]) -> None:
    """The task's results as a tar on out: each a regular file reached without a link, read capped; collect.json says
    for each its size and what was kept, or why it was not taken."""
    if task_vm(key) is None:  # never submitted here, or forgotten: nothing to collect
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            add_member(archive, COLLECT_REPORT, json.dumps({"files": {}, "unknown": True}).encode())
        return
    box = task_box(key)
    files: dict[str, Any] = {}
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            for name, cap, cut in COLLECTED:
                try:
                    data, size = read_regular(box, name, cap)
                except Missing:
                    files[name] = {"missing": True}
                    continue
                except Refused as refused:
                    files[name] = {"refused": str(refused)}
                    continue
                if len(data) > cap and not cut:
                    files[name] = {"size": size, "refused": f"is larger than {cap} bytes, the most collected"}
                    continue
                data = data[:cap]
                files[name] = {"size": size, "kept": len(data)}
                add_member(archive, name, data)
            add_member(archive, COLLECT_REPORT, json.dumps({"files": files}, sort_keys=True).encode())
    finally:
        os.close(box)


def add_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    archive.addfile(info, io.BytesIO(data))


def cmd_forget(key: str) -> dict[str, Any]:
    vm = task_vm(key)
    if vm is None:
        return {"forgotten": False}
    try:
        tasks = open_path(vm_dir(vm), ["outbox", "tasks"])
    except OSError:
        tasks = -1
    if tasks >= 0:
        try:
            remove(tasks, key)
        finally:
            os.close(tasks)
    os.unlink(os.path.join(root(), "tasks", key))
    return {"forgotten": True}


def cmd_vm_status(vm: str) -> dict[str, Any]:
    return {"vm": check_vm(vm), "status": vm_statuses().get(vm)}


def cmd_stop(vm: str) -> dict[str, Any]:
    status = vm_statuses().get(check_vm(vm))
    if status == "Running":
        done = limactl("stop", "--tty=false", vm, timeout=600)
        if done.returncode != 0:
            raise Failure(f"`limactl stop` of {vm} failed: {fatal_message(done.stderr)}")
        status = "Stopped"
    return {"vm": vm, "status": status}


def cmd_delete(vm: str) -> dict[str, Any]:
    done = limactl("delete", "--force", "--tty=false", check_vm(vm), timeout=600)
    if done.returncode != 0:
        raise Failure(f"`limactl delete` of {vm} failed: {fatal_message(done.stderr)}")
    try:
        folder = os.open(vm_dir(vm), DIR_FLAGS)
    except OSError:
        folder = -1
    if folder >= 0:  # the outbox stays: results not collected yet
        try:
            remove(folder, "staging")
            remove(folder, "lima.yaml")
        finally:
            os.close(folder)
    return {"vm": vm, "deleted": True}


# A session's tmux session (task-runner.sh: `tmux -L KEY`, session KEY), attached; then the exit status of tmux's
# attach while the session goes on (0: detached), or SESSION_ENDED once it is gone.
ATTACH_SCRIPT = ('tmux -L "$1" attach-session -t "=$1"; code=$?; '
                 'if tmux -L "$1" has-session -t "=$1" 2>/dev/null; then exit "$code"; fi; exit 100')
SESSION_ENDED = 100


def cmd_attach(key: str) -> NoReturn:
    """Become `limactl shell VM -- tmux attach` for task KEY's session, on this command's terminal."""
    vm = known_task(check_key(key))
    program = limactl_path()
    if program is None:
        raise Failure("limactl is not on this host's PATH (install Lima, https://lima-vm.io, for this user)")
    sys.stdout.flush()
    os.execv(program, [program, "shell", vm, "--", "sh", "-c", ATTACH_SCRIPT, "sh", key])


COMMANDS: dict[str, int] = {"facts": 0, "submit": 0, "status": -1, "read": 4, "cancel": 1, "collect": 1,
                            "forget": 1, "vm-status": 1, "stop": 1, "delete": 1, "attach": 1}


def dispatch(command: str, args: list[str]) -> tuple[dict[str, Any] | None, int]:
    wanted = COMMANDS.get(command)
    if wanted is None:
        raise Failure(f"unknown command {command!r}; this far end knows {', '.join(sorted(COMMANDS))}")
    if (wanted >= 0 and len(args) != wanted) or (wanted < 0 and not args):
        raise Failure(f"`{command}` takes {'one or more' if wanted < 0 else wanted} argument(s), not {len(args)}")
    if command == "facts":
        return cmd_facts(), 0
    if command == "submit":
        return cmd_submit(sys.stdin.buffer)
    if command == "status":
        return cmd_status(args), 0
    if command == "read":
        return cmd_read(*args), 0
    if command == "cancel":
        return cmd_cancel(args[0]), 0
    if command == "collect":
        check_key(args[0])
        cmd_collect(args[0], sys.stdout.buffer)
        return None, 0
    if command == "forget":
        return cmd_forget(check_key(args[0])), 0
    if command == "vm-status":
        return cmd_vm_status(args[0]), 0
    if command == "stop":
        return cmd_stop(args[0]), 0
    if command == "attach":
        cmd_attach(args[0])
    return cmd_delete(args[0]), 0


def main(argv: list[str]) -> int:
    # no umask here: limactl inherits it, and its guest's own folders would become unreadable to the guest
    try:
        if not argv:
            raise Failure("no command given")
        answer, code = dispatch(argv[0], argv[1:])
    except Failure as failure:
        answer, code = {"error": str(failure)}, ERROR_EXIT
    except OSError as exc:
        answer, code = {"error": f"{exc.filename or 'a file'}: {exc.strerror or exc}"}, ERROR_EXIT
    if answer is not None:
        sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
