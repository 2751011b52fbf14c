"""One guest connection of a held VM, handed on: run by QEMU for each connection to a `guestfwd` address.

QEMU's user-mode network starts `cmd:` forwards once per connection, with the connection as this program's standard
input and output (a socket). Standard library only, run as `python3 -I holdconnector.py TARGET`:
- `proxy:PATH`: the connection is handed to the VM's proxy process over its Unix socket at PATH (SCM_RIGHTS), which
  serves it as any other client (asking the VM's proxy credentials first); this program ends at once;
- `port:N`: a port of the host's loopback the config allows (`network.allowHost`): the bytes are copied both ways
  until both sides end.
Nothing else is reached: what the guest sends never chooses the target. It uses _socket, not socket: importing
socket (its enums) costs some 12 ms, paid by every connection the guest makes.
"""

from __future__ import annotations

import _socket
import os
import select
import sys

CHUNK = 65536


def hand_to_proxy(path: str) -> int:
    directory, name = os.path.split(path)
    os.chdir(directory)  # the path may be longer than a socket address takes: connect relative to its folder
    proxy = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        proxy.connect(name)
        descriptor = (0).to_bytes(4, sys.byteorder)  # the guest's connection: this program's standard input
        proxy.sendmsg([b"g"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, descriptor)])
    finally:
        proxy.close()
    return 0


def copy_to_port(port: int) -> int:
    guest = _socket.socket(fileno=os.dup(0))
    host = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    host.settimeout(10)
    host.connect(("127.0.0.1", port))
    host.settimeout(None)
    other = {guest.fileno(): (guest, host), host.fileno(): (host, guest)}
    while other:
        ready, _, _ = select.select(list(other), [], [])
        for descriptor in ready:
            source, target = other[descriptor]
            data = source.recv(CHUNK)
            if data:
                target.sendall(data)
                continue
            del other[descriptor]
            try:
                target.shutdown(_socket.SHUT_WR)
            except OSError:
                other.clear()
    return 0


def main(target: str) -> int:
    kind, _, value = target.partition(":")
    try:
        if kind == "proxy":
            return hand_to_proxy(value)
        if kind == "port" and value.isdigit():
            return copy_to_port(int(value))
    except OSError:
        return 1  # the guest's connection is reset: nothing listens there
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) == 2 else ""))
