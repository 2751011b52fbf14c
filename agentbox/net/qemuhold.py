"""QEMU as Lima starts it for a held VM: the user-mode network restricted to agentbox's forwards.

Run by the launcher agentbox writes for a held start (agentbox.net.hold), which Lima finds through
`QEMU_SYSTEM_<ARCH>`: `python3 -I qemuhold.py SPEC [QEMU ARGS...]`. Standard library only, and it never imports
agentbox (`-I`: no user site, no environment, no current folder). SPEC (JSON, agentbox's own file) says:
`qemu` (the real QEMU's argv), `append` (the options added to the first NIC's `-netdev user,...`) and `record`
(where the hold is recorded).

A call without `-netdev` (Lima asks QEMU for its version, accelerators, machines) runs QEMU as it is. With one, the
first NIC's value (`user,id=net0,...`) gets the spec's options (`restrict=on`, `ipv6=off` and the `guestfwd`s),
the record gets this process's pid (QEMU's, after exec) and the new value, and QEMU replaces this process. Anything
else (no such NIC, a second one, the options already there) is refused: a held start never runs unheld.
"""

from __future__ import annotations

import json
import os
import sys

NIC = "user,id=net0,"
OWN_OPTIONS = ("restrict=", "guestfwd=", "ipv6=")


def held_argv(argv: list[str], append: str) -> tuple[list[str], str] | str:
    """(the argv with the first NIC held, its new -netdev value), or why it cannot be held."""
    places = [index + 1 for index, arg in enumerate(argv[:-1]) if arg == "-netdev"]
    nics = [index for index in places if argv[index].startswith(NIC)]
    if len(nics) != 1:
        return f"expected one `-netdev {NIC}...` in QEMU's arguments, found {len(nics)}"
    others = [argv[index] for index in places if index not in nics]
    if any(value.startswith("user,") for value in others):
        return "a second user-mode network would not be held"
    value = argv[nics[0]]
    options = value.split(",")
    if any(option.startswith(OWN_OPTIONS) for option in options):
        return f"the user-mode network already sets {', '.join(o for o in options if o.startswith(OWN_OPTIONS))}"
    held = value + "," + append
    return argv[:nics[0]] + [held] + argv[nics[0] + 1:], held


def main(args: list[str]) -> int:
    with open(args[0], encoding="utf-8") as file:
        spec = json.load(file)
    qemu, rest = list(spec["qemu"]), args[1:]
    if "-netdev" not in rest:
        os.execvp(qemu[0], qemu + rest)
    found = held_argv(rest, spec["append"])
    if isinstance(found, str):
        print(f"agentbox: not starting QEMU unheld: {found}", file=sys.stderr)
        return 1
    argv, value = found
    record = spec["record"]
    temporary = f"{record}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump({"pid": os.getpid(), "netdev": value, "spec": spec["digest"]}, file)
        file.write("\n")
    os.replace(temporary, record)
    os.execvp(qemu[0], qemu + argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
