"""The double's recorded provisioning results (tests/fake_limactl/bootcache.py): a boot replayed from a
record leaves the guest as running its scripts did, and anything that could make the scripts do
something else runs them for real."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import fake_limactl
from tests.helpers import FakeLima, scratch_root
from tests.test_fake_limactl import Lima, boot_log, minimal_yaml, script

pytestmark = pytest.mark.needs("bwrap")

# A system script that adds, changes and removes files of the guest's own folders and fails on purpose;
# a user script that keeps the boot id and a stamp no second run could repeat.
SCRIPTS = minimal_yaml("provision:\n- mode: system\n  script: " + script(
    "mkdir -p /usr/local/share/made && echo made > /usr/local/share/made/file && chmod 754 /usr/local/share/made/file\n"
    "ln -s /usr/local/share/made/file /usr/local/bin/made-link\n"
    "echo '# appended' >> /etc/bash.bashrc\n"
    "rm /etc/issue.net\n"
    "echo system-script-output\n"
    "exit 3") + "- mode: user\n  script: " + script(
    "mkdir -p ~/.state && cat /proc/sys/kernel/random/boot_id > ~/.state/boot-id\n"
    "date +%s%N > ~/.state/stamp\n"
    "echo user-script-output"))


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return tmp_path / "records"


def guest(records: Path, tmp_path: Path, label: str) -> Iterator[Lima]:
    lima_home = Path(tempfile.mkdtemp(prefix="fb", dir=scratch_root()))
    home = tmp_path / f"home-{label}"
    home.mkdir()
    bin_dir = tmp_path / f"bin-{label}"
    fake_limactl.install(bin_dir, lima_home)
    env = fake_limactl.make_env(lima_home, home=home, bin_dir=bin_dir, **{fake_limactl.BOOT_CACHE_VAR: str(records)})
    yield Lima(tmp_path, home, lima_home, bin_dir, env)
    shutil.rmtree(lima_home, ignore_errors=True)


@pytest.fixture
def first(records: Path, tmp_path: Path) -> Iterator[Lima]:
    yield from guest(records, tmp_path, "first")


@pytest.fixture
def second(records: Path, tmp_path: Path) -> Iterator[Lima]:
    yield from guest(records, tmp_path, "second")


def booted(lima: Lima, env: dict[str, str] | None = None,
           before_start: Callable[[Path], object] | None = None) -> Path:
    lima.create(yaml_text=SCRIPTS)
    if before_start is not None:
        before_start(fake_limactl.guest_dir(lima.lima_home, "vm", ""))
    lima.ok("--tty=false", "start", "vm", env=env)
    return fake_limactl.guest_dir(lima.lima_home, "vm", "")


def home_of(lima: Lima) -> Path:
    return fake_limactl.guest_home(lima.lima_home, "vm")


def tree(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """The guest's own folders as (mode, uid, gid, content or link target), /run and the boot log left out."""
    out = {}
    for folder in ("etc", "usr-local", "var", "root", "home"):
        for path in [root / folder, *sorted((root / folder).rglob("*"))]:
            rel = str(path.relative_to(root))
            if rel == "var/log/cloud-init-output.log" or rel.endswith(("/.state/stamp", "/boot-id")):
                continue
            st = path.lstat()
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes() if path.is_file() else b""
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, content)
    return out


def state(lima: Lima) -> list[tuple[str, int]]:
    return [(entry["mode"], entry["exit"]) for entry in fake_limactl.read_state(lima.lima_home, "vm")["provisionLog"]]


def test_a_replayed_boot_leaves_the_guest_as_the_scripts_did(first: Lima, second: Lima, records: Path) -> None:
    first_root = booted(first)
    assert not (first_root / "etc/issue.net").exists()
    assert len(list(records.iterdir())) == 1, "the first boot is recorded"
    second_root = booted(second)
    # The stamp is the first boot's: the scripts did not run again ...
    assert (home_of(second) / ".state/stamp").read_text() == (home_of(first) / ".state/stamp").read_text()
    # ... yet the guest is the same, file for file (modes, owners, contents, links, the removed file) ...
    assert tree(second_root) == tree(first_root)
    assert (second_root / "usr-local/share/made/file").read_text() == "made\n"
    assert os.readlink(second_root / "usr-local/bin/made-link") == "/usr/local/share/made/file"
    # ... with this boot's own id where the script wrote the boot id ...
    boot_id = (second.lima_home / "vm" / "boot-id").read_text().strip()
    assert (home_of(second) / ".state/boot-id").read_text().strip() == boot_id
    assert boot_id != (first.lima_home / "vm" / "boot-id").read_text().strip()
    # ... the same results (the failing script too) and the same lines in the boot log.
    assert state(second) == state(first) == [("system", 3), ("user", 0)]
    for line in ("system-script-output\n", "user-script-output\n", "WARNING: Failed to execute"):
        assert line in boot_log(second)
    assert second.ok("shell", "vm", "cat", "/usr/local/share/made/file").stdout == "made\n"


def test_a_guest_changed_before_its_boot_runs_the_scripts_for_real(first: Lima, second: Lima) -> None:
    booted(first)
    booted(second, before_start=lambda root: (root / "usr-local/bin/extra").write_text("x"))
    assert (home_of(second) / ".state/stamp").read_text() != (home_of(first) / ".state/stamp").read_text()
    assert state(second) == [("system", 3), ("user", 0)]


def test_a_knob_that_changes_the_boot_runs_the_scripts_for_real(first: Lima, second: Lima) -> None:
    booted(first)
    booted(second, env={"FAKE_LIMACTL_PROVISION_DELAY": "0.1"})
    assert (home_of(second) / ".state/stamp").read_text() != (home_of(first) / ".state/stamp").read_text()


def test_without_records_every_boot_runs_its_scripts(first: Lima, second: Lima) -> None:
    for lima in (first, second):
        del lima.env[fake_limactl.BOOT_CACHE_VAR]
    booted(first)
    booted(second)
    assert (home_of(second) / ".state/stamp").read_text() != (home_of(first) / ".state/stamp").read_text()


def test_the_tests_record_boots_unless_marked_real_boot(limactl: FakeLima, boot_records: Path) -> None:
    assert os.environ[fake_limactl.BOOT_CACHE_VAR] == str(boot_records)


@pytest.mark.real_boot
def test_a_test_marked_real_boot_runs_every_boot_for_real(limactl: FakeLima) -> None:
    assert fake_limactl.BOOT_CACHE_VAR not in os.environ
