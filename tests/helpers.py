"""What tests share besides fixtures: writing project files, running the CLI, reading the limactl
double's record, and the capabilities a test needs from this machine. (tests/conftest.py keeps the
fixtures and pytest hooks; import these from here.)"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

REAL_HOME = os.path.expanduser("~")

# The VM of the `project` fixture's folder (work/myproject).
NAME = "agentbox-myproject"

# What agentbox renders on every read-only mount (templates/lima.yaml.j2): Lima's default caches keep showing
# the guest what it first read of a folder the host changes (real Lima 2.2, 9p's fscache: tests/test_real_lima.py).
READ_ONLY_CACHE = {"9p": {"cache": "mmap"}, "sshfs": {"cache": False}}

# A stand-in agent installed in the VM's /usr/local/bin: it records what reached it in the workspace.
# The start of a Python program in the guest that goes through agentbox's proxy: `proxy`, $HTTPS_PROXY split, and
# `proxy_auth`, the header a CONNECT carries (the VM's proxy credentials from that URL, as curl, git and npm send
# them; http.client's set_tunnel takes it as `headers=`).
GUEST_PROXY = r"""
import base64 as _base64, os as _os, urllib.parse as _parse
proxy = _parse.urlsplit(_os.environ["HTTPS_PROXY"])
proxy_auth = {"Proxy-Authorization": "Basic " + _base64.b64encode(
    (_parse.unquote(proxy.username or "") + ":" + _parse.unquote(proxy.password or "")).encode()).decode()}
"""
STUB = r"""#!/usr/bin/python3
import json, os, sys
data = {"args": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
        "stdin": "" if sys.stdin.isatty() else sys.stdin.read()}
with open(os.environ["AGENTBOX_TEST_OUT"], "w") as f:
    json.dump(data, f)
sys.exit(int(os.environ.get("STUB_EXIT", "0")))
"""


@functools.cache
def scratch_root() -> str:
    """Where tests keep LIMA_HOMEs: /dev/shm when it is a roomy memory file system (a VM's guest folders cost a
    thousand file creations; on a disk that is most of a VM start in the double), else /tmp. Short either way:
    Lima's socket paths count LIMA_HOME's length."""
    chosen = os.environ.get("AGENTBOX_TEST_SCRATCH")
    if chosen:
        return chosen
    try:
        fs = os.statvfs("/dev/shm")
        roomy = fs.f_bavail * fs.f_frsize >= 4 << 30 and os.access("/dev/shm", os.W_OK | os.X_OK)
    except OSError:
        roomy = False
    return "/dev/shm" if roomy else "/tmp"


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def write_trusted(project: Path, text: str) -> Path:
    """Write the project's agentbox.yml and trust it, as a user who read it would."""
    path = write(project / "agentbox.yml", text)
    result = run_cli("trust", cwd=project)
    assert result.exit_code == 0, result.stderr
    return path


def run_cli(*args: str, cwd: Path | None = None, input: str | None = None, **kwargs: Any) -> Result:
    """Run the real CLI in-process; errors surface as exit codes and stderr, as for users."""
    from agentbox.cli.main import cli

    runner = CliRunner()
    argv = (["-C", str(cwd)] if cwd else []) + list(args)
    return runner.invoke(cli, argv, input=input, catch_exceptions=False, **kwargs)


def run_agentbox(*args: str, cwd: Path, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
    """The real CLI in a child process: a hang fails the test at the timeout instead of stalling the suite."""
    return subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def echo_server(prefix: bytes = b"echo:") -> tuple[socket.socket, int]:
    """A TCP server on 127.0.0.1 that answers each connection with prefix + the first bytes it got: a program
    listening in the VM (the double's guest shares the host's network). Returns it and its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(prefix + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def notify_send_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host `notify-send` first on PATH that appends its arguments, one call a line, to the returned file."""
    log = tmp_path / "notified"
    write(tmp_path / "host-bin" / "notify-send", "#!/bin/sh\nprintf '%s\\n' \"$*\" >> \"$NOTIFY_LOG\"\n", mode=0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'host-bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("NOTIFY_LOG", str(log))
    return log


def without_once_notes(stderr: str) -> str:
    """stderr without the notes agentbox says once per workspace (such as "checkpoints are off: ... is not a
    git repository (said once)"), for tests of something else that compare the whole of it."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.rstrip().endswith("(said once)"))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, until: Callable[[Any], bool] = bool,
             interval: float = 0.1) -> Any:
    """Poll predicate() until its value passes `until` (is true, by default), and return that value; at the
    deadline fail the test naming `what` and the last value predicate() returned."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if until(last):
            return last
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {timeout:g} s for {what}; last seen: {last!r}")
        time.sleep(interval)


def returns_within(seconds: float, call: Callable[[], Any], unblock: Callable[[], None] | None = None) -> Any:
    """call()'s result; fail (not hang) when it has not returned within seconds. unblock() then frees
    the stuck call so its thread can end."""
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if unblock is not None:
            unblock()
        pytest.fail(f"still blocked after {seconds} s")
    assert outcome, "the call raised (see the thread's traceback above)"
    return outcome[0]


def launch_workdir(shell: list[str]) -> str:
    """The folder a launch's `limactl shell` enters: agentbox.session.warm's stub takes it after its proof."""
    return shell[shell.index("agentbox-launch") + 6]


class FakeLima:
    """The limactl double of one test (the `limactl` fixture): its calls and its instances' state."""

    def __init__(self, lima_home: Path) -> None:
        self.home = lima_home

    def calls(self) -> list[list[str]]:
        from tests import fake_limactl

        return [call["argv"] for call in fake_limactl.read_calls(self.home)]

    def subcommands(self) -> list[str]:
        """The limactl sub-command of each call, global flags skipped."""
        result = []
        for argv in self.calls():
            words = [a for a in argv if not a.startswith("-")]
            result.append(words[0] if words else "")
        return result

    def clear(self) -> None:
        from tests import fake_limactl

        fake_limactl.clear_calls(self.home)

    def status(self, name: str) -> str | None:
        from tests import fake_limactl

        try:
            return fake_limactl.read_state(self.home, name)["status"]
        except FileNotFoundError:
            return None

    def set_status(self, name: str, status: str) -> None:
        from tests import fake_limactl

        fake_limactl.set_status(self.home, name, status)

    def crash(self, name: str) -> None:
        """The VM crashes under everything (as `kill -9` of its QEMU): Lima reports it Stopped from then on."""
        from tests import fake_limactl

        fake_limactl.crash(self.home, name)

    def lima_yaml(self, name: str) -> str:
        return (self.home / name / "lima.yaml").read_text()

    def guest_home(self, name: str) -> Path:
        from tests import fake_limactl

        return fake_limactl.guest_home(self.home, name)

    def set_guest_listeners(self, name: str, *listeners: str) -> None:
        """What the guest listens on now ("127.0.0.1:3000", "0.0.0.0:8080"): Lima's host agent forwards it."""
        from tests import fake_limactl

        fake_limactl.set_guest_listeners(self.home, name, list(listeners))

    def nft_ruleset(self, name: str) -> str:
        """The ruleset the guest's `sudo nft -f` left (nft's listing; "" when none): what the VM would enforce."""
        from tests import fake_limactl

        state = fake_limactl.guest_dir(self.home, name, "run") / "fake-limactl" / "nft.ruleset"
        return state.read_text() if state.exists() else ""

    def ssh_calls(self) -> list[list[str]]:
        from tests import fake_limactl

        return [call["argv"] for call in fake_limactl.read_ssh_calls(self.home)]


# -- isolated mode: a repository with work in progress, a stand-in agent, the guest's copy ----------

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main",
       "-c", "core.hooksPath=/dev/null"]

# What the stand-in agent does to the workspace it is given; then it checks that the host's files, which the
# VM sees read-only at /mnt/agentbox/workspace, did not change, and writes a summary where agentbox said.
ISOLATED_AGENT = r"""#!/bin/bash
set -u
{
  echo "cwd=$PWD"
  echo "status=$(git status --short | tr '\n' ';')"
  printf 'changed\n' >> tracked.txt
  printf 'new file\n' > 'created file.txt'
  rm deleted.txt
  mkdir -p src && printf 'print(1)\n' > src/added.py
  printf 'bin\000ary' > data.bin
  ln -s tracked.txt link.txt
  chmod +x script.sh
  mkdir -p build && printf 'ignored\n' > build/new.o
  rm untracked.txt
  printf 'edited\n' > modified.txt
  if touch /mnt/agentbox/workspace/escape 2>/dev/null; then echo "host-write=yes"; else echo "host-write=no"; fi
  echo "host-tracked=$(cat /mnt/agentbox/workspace/tracked.txt | tr '\n' ';')"
  echo "args=$*"
} > /tmp/agent-report
printf '# Tidy the files\n\nChanged, created and deleted some.\n' > "$AGENTBOX_SUMMARY"
exit "${AGENT_EXIT:-0}"
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repository(project: Path, config: str = "session:\n  mode: isolated\n") -> None:
    """A repository with committed files, then uncommitted edits, an untracked file and an ignored one."""
    write(project / "agentbox.yml", config)
    write(project / ".gitignore", "build/\n")
    write(project / "tracked.txt", "one\n")
    write(project / "deleted.txt", "to delete\n")
    write(project / "modified.txt", "committed\n")
    write(project / "script.sh", "echo hi\n")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "init")
    write(project / "modified.txt", "uncommitted\n")
    write(project / "untracked.txt", "untracked\n")
    write(project / "build" / "out.o", "ignored\n")


def snapshot_tree(root: Path, skip: tuple[str, ...] = (".git",)) -> dict[str, tuple[str, bytes]]:
    """Every file and link under root (names relative), with its kind and exec bit and its content."""
    found: dict[str, tuple[str, bytes]] = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if os.path.normpath(os.path.join(rel, d)) not in skip)
        for name in dirs + files:
            path = os.path.join(folder, name)
            key = os.path.normpath(os.path.join(rel, name))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[key] = ("link", os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                found[key] = ("exec" if st.st_mode & 0o100 else "file", Path(path).read_bytes())
            elif stat.S_ISDIR(st.st_mode):
                found[key] = ("dir", b"")
    return found


def copy_in_guest(limactl: FakeLima, project: Path) -> Path:
    """Where the double keeps the guest's copy of the workspace (it lives in the guest's own /tmp)."""
    assert project.is_relative_to("/tmp")
    return limactl.home / NAME / "guestfs" / "tmp" / project.relative_to("/tmp")


def install_agent(limactl: FakeLima, script: str = ISOLATED_AGENT, binary: str = "claude") -> None:
    bin_dir = limactl.home / NAME / "guestfs" / "usr-local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    write(bin_dir / binary, script, mode=0o755)


def agentbox(project: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """run_agentbox in the project, with room for a VM's first start."""
    return run_agentbox(*args, cwd=project, timeout=timeout)


# -- capabilities of this machine -------------------------------------------------------------
#
# Some tests need a tool from the machine (bubblewrap runs the double's guest; shellcheck lints the
# shipped scripts). Without it such a test is skipped, and the run ends with a banner that names
# every test that did not run and what to install (tests/conftest.py's pytest_terminal_summary);
# with CI set, a missing capability fails the test instead, so CI never passes having run less
# than the whole suite.

def _on_path(name: str) -> Callable[[], bool]:
    return lambda: shutil.which(name) is not None


@functools.cache
def _remote_hosts() -> bool:
    from tests import remotehost

    return remotehost.available() is None


@functools.cache
def _can_be_root() -> bool:
    """Root already, or able to look like root in a user namespace of our own (`unshare -r`)."""
    if os.geteuid() == 0:
        return True
    try:
        return subprocess.run(["unshare", "--map-root-user", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@functools.cache
def _bash_4_4() -> bool:
    """bash 4.4 or newer first on PATH: the guards in wrappers/ refuse to run on an older one."""
    bash = shutil.which("bash")
    if bash is None:
        return False
    version = subprocess.run([bash, "-c", 'echo "${BASH_VERSINFO[0]} ${BASH_VERSINFO[1]}"'],
                             capture_output=True, text=True).stdout.split()
    try:
        return (int(version[0]), int(version[1])) >= (4, 4)
    except (IndexError, ValueError):
        return False


def sbin_tool(name: str) -> str | None:
    """A system tool (nft, ip) also where it lives outside a user's PATH (/usr/sbin, /sbin)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


@functools.cache
def _network_lab() -> bool:
    """nft, ip and nsenter here, and a network namespace of our own where nft may load a ruleset."""
    nft = sbin_tool("nft")
    if nft is None or sbin_tool("ip") is None or shutil.which("nsenter") is None or not _can_be_root():
        return False
    argv = ["unshare", "--net", nft, "list", "ruleset"]
    if os.geteuid() != 0:
        argv[1:1] = ["--map-root-user"]
    return subprocess.run(argv, capture_output=True).returncode == 0


CAPABILITIES: dict[str, tuple[Callable[[], bool], str]] = {
    # name: (is it here?, how to get it)
    "bwrap": (_on_path("bwrap"), "apt-get install bubblewrap"),
    "shellcheck": (_on_path("shellcheck"), "apt-get install shellcheck"),
    "git": (_on_path("git"), "apt-get install git"),
    "bash": (_bash_4_4, "bash 4.4 or newer first on PATH, as the guards in wrappers/ need (macOS: brew install bash)"),
    "openssl": (_on_path("openssl"), "apt-get install openssl"),
    "strace": (_on_path("strace"), "apt-get install strace (tests/test_setup_digest.py counts launch.sh's processes)"),
    "tmux": (_on_path("tmux"), "apt-get install tmux (the double's guest runs the host's, as a VM runs its own)"),
    "sshd": (_remote_hosts, "run as root with OpenSSH's sshd and ssh, and /usr/bin/python3 with PyYAML and "
                            "jsonschema (apt-get install openssh-server openssh-client python3-yaml "
                            "python3-jsonschema): tests/remotehost.py"),
    "root": (_can_be_root, "run as root, or allow unprivileged user namespaces for `unshare -r`"),
    "netns": (_network_lab, "apt-get install nftables iproute2 util-linux, and run as root or allow unprivileged "
                            "user namespaces (`unshare -rn nft list ruleset` must work)"),
}
# The start of every skip reason for a missing capability: the banner finds the skips by it.
MISSING = "missing capability: "


def needs(*names: str) -> None:
    """Skip (or, with CI set, fail) the running test unless this machine has every named capability."""
    for name in names:
        available, how = CAPABILITIES[name]
        if available():
            continue
        message = f"{MISSING}{name} ({how})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run every test (.ci/run installs it)", pytrace=False)
        pytest.skip(message)


def as_root(argv: list[str]) -> list[str]:
    """argv run with euid 0: as it is when we are root, else in a user namespace that maps us to root."""
    needs("root")
    return argv if os.geteuid() == 0 else ["unshare", "--map-root-user", *argv]


def needs_bwrap() -> None:
    needs("bwrap")


def tree_listing(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every entry under root, never following a link: relative path -> (kind, permission bits,
    content or link target; b"" for a folder). Two equal listings are byte-for-byte the same tree."""
    listing: dict[str, tuple[str, int, bytes]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                listing[rel] = ("link", 0, os.fsencode(os.readlink(path)))
            elif path.is_dir():
                listing[rel] = ("dir", st.st_mode & 0o7777, b"")
            else:
                listing[rel] = ("file", st.st_mode & 0o7777, path.read_bytes())
    return listing


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """Nothing can be created in or removed from folder meanwhile, even by root (chattr +i then)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("as root, a folder is made unwritable with chattr +i, which this file system refuses")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def staged_logins(home: Path) -> None:
    """Logins copied into the VM as they were before the credential broker: `credentials.broker: false` in the
    global config (where it needs no trust), kept with whatever else that file says."""
    import yaml

    path = home / ".config" / "agentbox" / "config.yml"
    data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    if data.get("credentials") is False:
        return
    credentials = data.get("credentials") if isinstance(data.get("credentials"), dict) else {}
    data["credentials"] = {**credentials, "broker": False}
    write(path, yaml.safe_dump(data, sort_keys=False))


# A stand-in agent for isolated tasks (tests/test_isolated_tasks.py, tests/test_remote_tasks.py): prints the files
# it sees in its folder (JSON, .git left out) and its folder, then does what the prompt's `do:` steps ask
# (`;`-separated): write:FILE:TEXT (replaced), rm:FILE, summary:TEXT (at $AGENTBOX_SUMMARY), sleep:S, out:TEXT,
# await:PATH (until that file exists).
COPY_AGENT = r"""#!/usr/bin/python3
import json, os, sys, time
seen = []
for folder, dirs, files in os.walk("."):
    dirs[:] = [d for d in dirs if d != ".git"]
    seen += [os.path.normpath(os.path.join(folder, name)) for name in files]
print(json.dumps({"cwd": os.getcwd(), "files": sorted(seen)}), flush=True)
prompt = sys.argv[-1]
if prompt.startswith("do:"):
    for step in prompt[3:].split(";"):
        what, _, arg = step.partition(":")
        if what == "write":
            name, _, text = arg.partition(":")
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            with open(name, "w") as f:
                f.write(text + "\n")
        elif what == "rm":
            os.remove(arg)
        elif what == "summary":
            with open(os.environ["AGENTBOX_SUMMARY"], "w") as f:
                f.write(arg + "\n")
        elif what == "sleep":
            time.sleep(float(arg))
        elif what == "out":
            print(arg, flush=True)
        elif what == "await":
            while not os.path.exists(arg):
                time.sleep(0.05)
"""


def on_terminal(cwd: Path, args: list[str], answer: bytes) -> tuple[int, str]:
    """Run agentbox with its stdin, stdout and stderr on a pseudo-terminal, `answer` typed at its first [y/N]
    question; (exit code, what it wrote, without the terminal's CRs)."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentbox", *args], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=slave)
    os.close(slave)
    output = b""
    answered = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not answered and b"[y/N]" in output:
                os.write(master, answer)
                answered = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, output.decode(errors="replace").replace("\r", "")


class Live:
    """agentbox running in the background, its stdout and stderr on one pipe or (terminal=True) on a pseudo-terminal,
    read as it writes them. It runs as users run it: without PYTHONUNBUFFERED, which a developer's or CI's environment
    may set and which would hide output that agentbox holds in a buffer."""

    def __init__(self, cwd: Path, args: list[str], terminal: bool = False) -> None:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
        argv = [sys.executable, "-m", "agentbox", *args]
        if terminal:
            import pty

            self.fd, child_end = pty.openpty()
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=child_end, stdout=child_end, stderr=child_end)
        else:
            self.fd, child_end = os.pipe()
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=child_end,
                                         stderr=child_end)
        os.close(child_end)
        os.set_blocking(self.fd, False)
        self.seen = b""

    def read(self) -> bytes:
        """Everything it wrote so far (a terminal's CRs dropped)."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:  # EIO: the child closed its terminal
                break
            if not chunk:
                break
            self.seen += chunk.replace(b"\r", b"")
        return self.seen

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self.read()
        return code

    def __enter__(self) -> Live:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.fd)


def process_report(pid: int) -> str:
    """What a process that did not end is doing: its signal masks and state, and its children's (for a test's
    failure message, when a Ctrl-C was not acted on)."""
    lines = []
    for each in [pid, *(int(child) for child in _children(pid))]:
        try:
            status = Path(f"/proc/{each}/status").read_text()
            command = Path(f"/proc/{each}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = [line for line in status.splitlines() if line.split(":")[0] in ("State", "SigBlk", "SigIgn", "SigCgt")]
        lines.append(f"{each} {command[:200]}: " + "; ".join(fields))
    return "\n".join(lines)


def _children(pid: int) -> list[str]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [grand for child in found for grand in (child, *_children(int(child)))]
