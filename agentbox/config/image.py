"""`vm.image`: the disk image a new VM boots, as the fields of one of Lima's `images` entries.

A location is an http(s) URL or a host path (resolved like `vm.template`: `~` and paths relative to
the file's folder). One image, for the VM's arch: agentbox renders it as the only `images` entry, so
a list of per-arch images would only ever use one of its entries. Pure data and checks; no I/O
but `os.stat` of a host path for the base's key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from agentbox import lazyre

URL_SCHEMES = ("http", "https")
# What Lima accepts (go-digest's Validate: an algorithm it links in, then lowercase hex of its length).
DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
_HEX = lazyre.compile(r"^[a-f0-9]+$")
LOCATION_HELP = "an https:// (or http://) URL, or a host path to the file (`~` and relative paths allowed)"


class ImageFile(NamedTuple):
    location: str  # a URL, or an absolute host path
    digest: str | None = None


class Kernel(NamedTuple):
    location: str
    digest: str | None = None
    cmdline: str | None = None


class Image(NamedTuple):
    location: str
    digest: str | None = None
    kernel: Kernel | None = None
    initrd: ImageFile | None = None

    def files(self) -> list[tuple[str, str]]:
        """(key, location) of the image and of its kernel and initrd."""
        found = [("vm.image", self.location)]
        if self.kernel is not None:
            found.append(("vm.image.kernel", self.kernel.location))
        if self.initrd is not None:
            found.append(("vm.image.initrd", self.initrd.location))
        return found

    def host_paths(self) -> list[tuple[str, str]]:
        """(key, path) of every file of the image that is on this machine."""
        return [(key, location) for key, location in self.files() if not is_url(location)]

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"location": self.location}
        if self.digest:
            shown["digest"] = self.digest
        if self.kernel is not None:
            shown["kernel"] = {name: value for name, value in self.kernel._asdict().items() if value}
        if self.initrd is not None:
            shown["initrd"] = {name: value for name, value in self.initrd._asdict().items() if value}
        return shown

    def lima_entry(self, arch: str) -> dict[str, Any]:
        """The `images` entry of lima.yaml: every part for this arch (Lima refuses a kernel of another)."""
        entry: dict[str, Any] = {"location": self.location, "arch": arch}
        if self.digest:
            entry["digest"] = self.digest
        if self.kernel is not None:
            entry["kernel"] = {"location": self.kernel.location, "arch": arch}
            if self.kernel.cmdline:
                entry["kernel"]["cmdline"] = self.kernel.cmdline
            if self.kernel.digest:
                entry["kernel"]["digest"] = self.kernel.digest
        if self.initrd is not None:
            entry["initrd"] = {"location": self.initrd.location, "arch": arch}
            if self.initrd.digest:
                entry["initrd"]["digest"] = self.initrd.digest
        return entry

    def identity(self) -> dict[str, Any]:
        """What the base's key covers of the image: its fields, and each host file's size and change time, so
        that an image rebuilt at the same path makes a new base (hashing gigabytes at every launch would not do)."""
        files: dict[str, list[int] | None] = {}
        for key, path in self.host_paths():
            try:
                st = os.stat(path)
                files[key] = [st.st_size, st.st_mtime_ns]
            except OSError:
                files[key] = None
        return {**self.to_json(), "files": files}


def is_url(location: str) -> bool:
    return "://" in location


def location_problem(value: str) -> str | None:
    """Why a location is neither an http(s) URL nor a host path (None: it is one)."""
    if not value.strip():
        return f"must not be empty: write {LOCATION_HELP}"
    if not is_url(value):
        if value.startswith("~") and not (value == "~" or value.startswith("~/")):
            return f"{value!r}: only your own home can be written with ~ (`~/...`); write {LOCATION_HELP}"
        return None
    parts = urlsplit(value)
    if parts.scheme.lower() not in URL_SCHEMES:
        return f"{value!r} is not an http(s) URL; write {LOCATION_HELP}"
    if not parts.hostname:
        return f"{value!r} names no host; write {LOCATION_HELP}"
    return None


def digest_problem(value: str) -> str | None:
    algorithm, _, encoded = value.partition(":")
    length = DIGEST_LENGTHS.get(algorithm)
    if length is not None and len(encoded) == length and _HEX.match(encoded):
        return None
    return (f"{value!r} is not a digest as Lima reads it: write `sha256:` and the 64 lowercase hex digits of the "
            "file's sha256sum (or `sha512:` and 128)")


def resolve(raw: Any, base: Path) -> Image | None:
    """The validated value of a file's vm.image, host paths made absolute against base (the file's folder)."""
    if not isinstance(raw, dict) or "location" not in raw:
        return None
    kernel = raw.get("kernel")
    initrd = raw.get("initrd")
    return Image(
        location=_absolute(raw["location"], base),
        digest=raw.get("digest"),
        kernel=Kernel(_absolute(kernel["location"], base), kernel.get("digest"), kernel.get("cmdline"))
        if isinstance(kernel, dict) else None,
        initrd=ImageFile(_absolute(initrd["location"], base), initrd.get("digest"))
        if isinstance(initrd, dict) else None,
    )


def _absolute(location: str, base: Path) -> str:
    if is_url(location):
        return location
    path = Path(os.path.expanduser(location))
    return os.path.normpath(path if path.is_absolute() else base / path)
