#!/usr/bin/env python3
"""A test double of OpenSSH's `ssh`, for what agentbox does with it: `ssh -F DIR/ssh.config -N -L ...
lima-NAME`, a local port forward into a guest of the limactl double, through the ssh.config Lima writes.

What it follows (OpenSSH: ssh.c, readconf.c, channels.c, log.c):
- Options: `-F FILE` (only that file is read), `-o KEY=VALUE` (or `-oKEY=VALUE`, `-o "KEY VALUE"`;
  the first value obtained wins, command line first), `-N` (no command), `-T`, `-q`, `-L
  [BIND:]PORT:HOST:HOSTPORT` (IPv6 in brackets). Anything else fails loudly (exit 255) instead of
  passing against a guess.
- The destination is looked up as a `Host` pattern of the file; its `Hostname`/`Port` are where ssh
  connects. Nothing answering there: `ssh: connect to host H port P: Connection refused`, exit 255. The
  double answers on the ssh port of a Running instance of `$LIMA_HOME` (its state's sshLocalPort).
- A local forward binds BIND:PORT (no BIND: localhost). When that fails: `bind [BIND]:PORT: Address
  already in use`, `channel_setup_fwd_listener_tcpip: cannot listen to port: PORT`, then `Could not
  request local forwarding.`; with `ExitOnForwardFailure yes` that last line is fatal (exit 255),
  else ssh goes on without the forward. Messages go to stderr ending in CR LF; `-q` or `LogLevel
  QUIET` silences them, `LogLevel ERROR` hides the info-level ones (`channel N: open failed: ...`).
- Each connection to the forwarded port opens a channel to HOST:HOSTPORT as seen from the guest.
  The double's guest shares the host's network namespace, so that is HOST:HOSTPORT here.
- When the VM goes away the connection drops: `Connection to H closed by remote host.`, exit 255.
  SIGTERM ends it quietly.

Every call is appended to `$LIMA_HOME/_fake/ssh-calls.jsonl` as `{"argv", "pid"}`.

Only a call through a Lima guest's ssh.config (`-F` naming a file under `$LIMA_HOME`) is the double's. Any
other call is agentbox reaching a real host (tests/remotehost.py: a real sshd): it runs the real ssh, the next
`ssh` on PATH that is not this double, told `-F $HOME/.ssh/config` when it was given no `-F` (ssh reads the
home of the passwd entry, not $HOME; the tests' HOME is their own) or `-F /dev/null` when that file is missing.
Those calls are appended to `$LIMA_HOME/_fake/ssh-passthrough.jsonl` as `{"argv", "pid"}`.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shlex
import signal
import socket
import sys
import threading

QUIET = {"QUIET": 0, "FATAL": 1, "ERROR": 2, "INFO": 3, "VERBOSE": 4, "DEBUG": 5, "DEBUG1": 5, "DEBUG2": 6,
         "DEBUG3": 7}


class Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Ssh:
    def __init__(self) -> None:
        self.options: dict[str, str] = {}
        self.level = QUIET["INFO"]
        self.forwards: list[tuple[str, int, str, int]] = []
        self.no_command = False

    def log(self, level: str, text: str) -> None:
        if QUIET[level] <= self.level:
            sys.stderr.write(text + "\r\n")
            sys.stderr.flush()

    def fatal(self, text: str) -> Exit:
        self.log("FATAL", text)
        return Exit(255)

    def option(self, key: str, value: str) -> None:
        self.options.setdefault(key.lower(), value)


def usage_error(text: str) -> Exit:
    sys.stderr.write(f"fake ssh: {text} (not implemented by the test double)\r\n")
    return Exit(255)


def parse_forward(spec: str) -> tuple[str, int, str, int]:
    parts: list[str] = []
    rest = spec
    while rest:
        if rest.startswith("["):
            end = rest.index("]")
            parts.append(rest[1:end])
            rest = rest[end + 1:].removeprefix(":")
        else:
            head, _, rest = rest.partition(":")
            parts.append(head)
    if len(parts) == 3:
        parts.insert(0, "localhost")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit():
        sys.stderr.write(f"Bad local forwarding specification '{spec}'\r\n")
        raise Exit(255)
    return parts[0], int(parts[1]), parts[2], int(parts[3])


def parse_args(ssh: Ssh, argv: list[str]) -> tuple[str | None, str, list[str]]:
    config_file = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        flag, value = arg[:2], arg[2:]
        if flag in ("-F", "-o", "-L"):
            if not value:
                i += 1
                if i >= len(argv):
                    raise usage_error(f"option {flag} needs an argument")
                value = argv[i]
            if flag == "-F":
                config_file = value
            elif flag == "-o":
                key, sep, val = value.partition("=")
                if not sep:
                    key, _, val = value.partition(" ")
                ssh.option(key.strip(), val.strip())
            else:
                ssh.forwards.append(parse_forward(value))
        elif arg == "-N":
            ssh.no_command = True
        elif arg in ("-T", "-q"):
            if arg == "-q":
                ssh.level = QUIET["QUIET"]
        else:
            raise usage_error(f"option {arg}")
        i += 1
    if i >= len(argv):
        raise usage_error("no destination")
    return config_file, argv[i], argv[i + 1:]


def read_config(ssh: Ssh, path: str, destination: str) -> None:
    matched = False
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ssh.fatal(f"Can't open user config file {path}: {e.strerror}")
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        key = words[0].lower()
        if key == "host":
            matched = destination in words[1:] or "*" in words[1:]
            continue
        if matched:
            ssh.option(key, " ".join(words[1:]))


def instance_on_port(lima_home: str, port: int) -> str | None:
    try:
        names = sorted(os.listdir(lima_home))
    except OSError:
        return None
    for name in names:
        if name.startswith((".", "_")):
            continue
        try:
            with open(os.path.join(lima_home, name, "fake-state.json"), encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if state.get("status") == "Running" and int(state.get("sshLocalPort") or 0) == port and guest_alive(state):
            return name
    return None


def guest_alive(state: dict) -> bool:
    """False when this boot's guest was started and is gone (a crash: Lima's host agent, and its sshd's port
    forward, go with it); machine.crashed, without importing the double's modules."""
    m = state.get("machine") or {}
    if not m or m.get("iid") != state.get("iid"):
        return True
    try:
        return os.readlink(f"/proc/{int(m['init'])}/ns/pid") == m.get("pidns")
    except (OSError, KeyError, TypeError, ValueError):
        return False


def listen(ssh: Ssh, bind: str, port: int) -> list[socket.socket]:
    hosts = ["127.0.0.1", "::1"] if bind in ("localhost", "") else [bind]
    sockets = []
    for host in hosts:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(16)
        except OSError as e:
            sock.close()
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):  # no IPv6 loopback here: skipped quietly
                continue
            ssh.log("ERROR", f"bind [{host}]:{port}: {os.strerror(e.errno or 0)}")
            continue
        sockets.append(sock)
    if not sockets:
        ssh.log("ERROR", f"channel_setup_fwd_listener_tcpip: cannot listen to port: {port}")
    return sockets


def relay(ssh: Ssh, client: socket.socket, host: str, port: int, channel: int) -> None:
    try:
        upstream = socket.create_connection((host, port), timeout=10)
    except OSError as e:
        ssh.log("INFO", f"channel {channel}: open failed: connect failed: {os.strerror(e.errno or 0)}")
        client.close()
        return
    upstream.settimeout(None)
    pair = {client: upstream, upstream: client}
    try:
        while pair:
            ready, _, _ = select.select(list(pair), [], [], 1.0)
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    other = pair.pop(sock)
                    pair.pop(other, None)
                    with_shutdown(other)
                    break
                pair[sock].sendall(data)
    except OSError:
        pass
    finally:
        client.close()
        upstream.close()


def with_shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def given_config(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--" or (not arg.startswith("-") and (i == 0 or argv[i - 1] not in OPTIONS_WITH_VALUE)):
            break
        if arg == "-F" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("-F") and len(arg) > 2:
            return arg[2:]
    return None


# ssh's options that take a value (ssh.c's getopt string), so the destination is not mistaken for one.
OPTIONS_WITH_VALUE = {f"-{c}" for c in "BbcDEeFIiJLlmOoPpQRSWw"}


def is_guest_call(argv: list[str], lima_home: str) -> bool:
    config = given_config(argv)
    if config is None:
        return False
    root = os.path.realpath(lima_home) + os.sep
    return os.path.realpath(config).startswith(root)


def real_ssh() -> str:
    """The first `ssh` on PATH that is not a shim of this double."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", "ssh")
        if not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
            continue
        try:
            with open(candidate, "rb") as f:
                head = f.read(512)
        except OSError:
            continue
        if os.path.basename(__file__).encode() not in head:
            return candidate
    return "/usr/bin/ssh"


def pass_through(argv: list[str], lima_home: str) -> None:
    ssh = real_ssh()
    if given_config(argv) is None:
        config = os.path.join(os.environ.get("HOME") or os.path.expanduser("~"), ".ssh", "config")
        argv = ["-F", config if os.path.isfile(config) else "/dev/null", *argv]
    record(lima_home, argv, "ssh-passthrough.jsonl")
    os.execv(ssh, [ssh, *argv])


def main(argv: list[str]) -> int:
    lima_home = os.environ.get("LIMA_HOME") or os.path.join(os.path.expanduser("~"), ".lima")
    if not is_guest_call(argv, lima_home):
        pass_through(argv, lima_home)
    record(lima_home, argv)
    ssh = Ssh()
    try:
        config_file, destination, command = parse_args(ssh, argv)
        if config_file is None:
            raise usage_error("only `-F FILE` configurations")
        read_config(ssh, config_file, destination)
        if command or not ssh.no_command:
            raise usage_error("running a command (only -N port forwards)")
        level = ssh.options.get("loglevel", "INFO").upper()
        if ssh.level != QUIET["QUIET"]:
            ssh.level = QUIET.get(level, QUIET["INFO"])
        host = ssh.options.get("hostname", destination)
        port = int(ssh.options.get("port", "22"))
        name = instance_on_port(lima_home, port) if host in ("127.0.0.1", "localhost") else None
        if name is None:
            sys.stderr.write(f"ssh: connect to host {host} port {port}: Connection refused\r\n")
            return 255
        listeners: list[tuple[socket.socket, str, int]] = []
        for bind, local_port, target, target_port in ssh.forwards:
            opened = listen(ssh, bind, local_port)
            if not opened:
                if ssh.options.get("exitonforwardfailure", "no").lower() == "yes":
                    raise ssh.fatal("Could not request local forwarding.")
                ssh.log("ERROR", "Could not request local forwarding.")
            listeners += [(sock, target, target_port) for sock in opened]
        return serve(ssh, lima_home, name, port, host, listeners)
    except Exit as e:
        return e.code


def serve(ssh: Ssh, lima_home: str, name: str, port: int, host: str,
          listeners: list[tuple[socket.socket, str, int]]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    by_socket = {sock: (target, target_port) for sock, target, target_port in listeners}
    channel = 2
    while True:
        if instance_on_port(lima_home, port) != name:
            ssh.log("ERROR", f"Connection to {host} closed by remote host.")
            return 255
        ready, _, _ = select.select(list(by_socket), [], [], 0.2)
        for sock in ready:
            client, _ = sock.accept()
            target, target_port = by_socket[sock]
            threading.Thread(target=relay, args=(ssh, client, target, target_port, channel), daemon=True).start()
            channel += 1


def record(lima_home: str, argv: list[str], name: str = "ssh-calls.jsonl") -> None:
    try:
        folder = os.path.join(lima_home, "_fake")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "a", encoding="utf-8") as f:
            f.write(json.dumps({"argv": argv, "pid": os.getpid()}) + "\n")
    except OSError:
        pass


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)
