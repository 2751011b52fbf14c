"""Fixtures and hooks: every test runs against a home, config, state and LIMA_HOME of its own, never
the real ones; skips for a missing capability are summed up in a banner at the end of the run; a proxy or broker
process still running after the run fails it (tests/leftovers.py).
(Shared helpers that are not fixtures live in tests/helpers.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    MISSING,
    NAME,
    REAL_HOME,
    STUB,
    FakeLima,
    install_agent,
    make_repository,
    needs,
    needs_bwrap,
    run_cli,
    scratch_root,
)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    home = tmp_path / "home"
    home.mkdir()
    state = tmp_path / "state"
    # LIMA_HOME must stay short: Lima's socket paths limit instance names by its length. It is on a memory file
    # system where there is one (helpers.scratch_root): the guest's folders are most of a VM start's file writes.
    lima_home = Path(tempfile.mkdtemp(prefix="lh", dir=scratch_root()))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(state))
    monkeypatch.setenv("LIMA_HOME", str(lima_home))
    # the host's proxy variables: agentbox's proxy would go through them (agentbox.net.upstream); and
    # PYTHONUNBUFFERED, which users do not set and which would hide output agentbox holds in a buffer
    for name in ("PYTHONUNBUFFERED", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "AGENTBOX_TIMING", "NODE_EXTRA_CA_CERTS", "HTTPS_PROXY",
                 "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    # A new VM is created from scratch unless a test asks for the base VM (tests/test_base.py): building a
    # base costs the double a second provisioning per test, and most tests are about something else.
    monkeypatch.setenv("AGENTBOX_VM_BASE", "off")
    # A start leaves the first launch's setup to it (each start would pay for it); tests/test_setup_digest.py turns it on.
    monkeypatch.setenv("AGENTBOX_START_SETUP", "off")
    yield {"home": home, "state": state, "lima_home": lima_home}
    shutil.rmtree(lima_home, ignore_errors=True)


@pytest.fixture(autouse=True)
def signals_left_as_found() -> Iterator[None]:
    """A test that leaves SIGINT's or SIGQUIT's handler changed fails; the handler is put back, so that the
    children later tests start (agentbox, which must end on Ctrl-C) do not inherit an ignored signal."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGQUIT)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = {sig: now for sig in before if (now := signal.getsignal(sig)) is not before[sig]}
    now_blocked = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for sig in changed:
        signal.signal(sig, before[sig])
    assert not changed and now_blocked == blocked, f"the test left signal handlers changed: {changed}, " \
        f"blocked {sorted(now_blocked)} (was {sorted(blocked)})"


@pytest.fixture(autouse=True, scope="session")
def real_home_untouched() -> Iterator[None]:
    """Fail loudly if a test wrote agentbox files into the real home directory."""
    watched = [Path(REAL_HOME) / ".config" / "agentbox", Path(REAL_HOME) / ".lima"]
    before = {p: p.exists() for p in watched}
    yield
    for path, existed in before.items():
        assert path.exists() == existed, f"a test touched the real home: {path}"


@pytest.fixture
def home(isolated_env: dict[str, Path]) -> Path:
    return isolated_env["home"]


@pytest.fixture
def project(home: Path) -> Path:
    """An empty project folder (outside the home directory, as most tests want)."""
    path = home.parent / "work" / "myproject"
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="session")
def boot_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the double keeps recorded provisioning results for this run, shared by its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "boot-records"


@pytest.fixture
def limactl(isolated_env: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            request: pytest.FixtureRequest, boot_records: Path) -> FakeLima:
    """The limactl test double, first on PATH, with its state in this test's LIMA_HOME. A VM's boot scripts
    run for real the first time the run meets them and are replayed from a record after that
    (tests/fake_limactl/bootcache.py), unless the test is marked `real_boot`."""
    from tests import fake_limactl

    bin_dir = tmp_path / "bin"
    fake_limactl.install(bin_dir, isolated_env["lima_home"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in list(os.environ):
        if name.startswith("FAKE_LIMACTL_"):
            monkeypatch.delenv(name)
    if request.node.get_closest_marker("real_boot") is None:
        monkeypatch.setenv(fake_limactl.BOOT_CACHE_VAR, str(boot_records))
    return FakeLima(isolated_env["lima_home"])


@pytest.fixture
def vm(project: Path, limactl: FakeLima) -> FakeLima:
    """The project's VM, started, with stub agents (claude, codex, gemini, kiro-cli, opencode, copilot) that report
    what they got."""
    needs_bwrap()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    bin_dir = limactl.home / NAME / "guestfs" / "usr-local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in ("claude", "codex", "gemini", "kiro-cli", "opencode", "copilot"):
        path = bin_dir / binary
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    limactl.clear()
    return limactl


@pytest.fixture
def isolated_vm(project: Path, limactl: FakeLima) -> FakeLima:
    """The project as a git repository with uncommitted work, its VM created isolated, a stand-in claude."""
    needs_bwrap()
    make_repository(project)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    install_agent(limactl)
    limactl.clear()
    return limactl


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The credential broker in front of a fake upstream standing for the real hosts (tests/brokerharness.py)."""
    from tests import brokerharness

    with brokerharness.harness(tmp_path, monkeypatch) as harness:
        yield harness


@pytest.fixture(scope="session")
def remote_double() -> Iterator[Path]:
    """The limactl double's bin folder for remote users: a copy they can read, run by /usr/bin/python3."""
    from tests import remotehost

    needs("sshd")
    folder = Path(tempfile.mkdtemp(prefix="abdouble", dir=scratch_root()))
    folder.chmod(0o755)  # the remote users run it
    yield remotehost.install_double(folder / "d")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def remote_hosts(home: Path, limactl: FakeLima, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: `remote_hosts(N)` starts N remote hosts (tests/remotehost.py: a real sshd each, a local user
    standing for the machine, the limactl double on its PATH) and returns them, a list of RemoteHost; the
    test's ~/.ssh/config names them remote1, remote2, ... The limactl fixture's `ssh` passes agentbox's calls to
    the real ssh with that config. Everything is stopped and emptied at the end of the test."""
    from tests import remotehost

    needs("sshd")
    double = request.getfixturevalue("remote_double")
    with remotehost.hosts_factory(home, double, scratch_root()) as factory:
        yield factory


# -- capabilities: the `needs` mark and the banner of tests that did not run ---------------------

def pytest_configure(config: pytest.Config) -> None:
    from tests import leftovers

    # A suite started as a background job (`cmd &` in a script, nohup) inherits Ctrl-C and Ctrl-\ ignored, and so
    # would every agentbox it starts: the tests of what agentbox does on them need the terminal's defaults.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    if not config.pluginmanager.is_registered(leftovers):  # no proxy outlives the run (it fails the run)
        config.pluginmanager.register(leftovers, "agentbox-leftovers")
    config.addinivalue_line("markers", "needs(*capabilities): the test needs these tools on this machine")
    config.addinivalue_line("markers", "real_boot: the limactl double runs every boot's provisioning scripts for "
                                       "real (no recorded results: tests/fake_limactl/bootcache.py)")
    if os.environ.get("CI") and config.option.durations is None:
        config.option.durations = 25  # CI's log shows where the time goes (the budget is in CONTRIBUTING.md)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        needs(*mark.args)


def _missing_capabilities(reporter: Any) -> dict[str, list[str]]:
    """Capability -> node ids of the tests skipped for the lack of it."""
    missing: dict[str, list[str]] = {}
    for report in reporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if MISSING in reason:
            what = reason[reason.index(MISSING) + len(MISSING):]
            missing.setdefault(what, []).append(report.nodeid)
    return missing


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from tests import reallima
    from tests.test_real_distro import cache_dir

    tier = reallima.report(terminalreporter.stats, cache_dir())
    if tier:
        terminalreporter.write_sep("=", f"the real-Lima tier's report ({cache_dir() / reallima.REPORT_NAME})")
        for line in tier:
            terminalreporter.write_line(line)
    missing = _missing_capabilities(terminalreporter)
    if not missing:
        return
    count = sum(len(ids) for ids in missing.values())
    terminalreporter.write_sep("!", f"{count} TESTS DID NOT RUN: this machine lacks what they need", red=True, bold=True)
    for what, ids in sorted(missing.items()):
        terminalreporter.write_line(f"{len(ids):4} need {what}:", red=True, bold=True)
        for nodeid in ids:
            terminalreporter.write_line(f"       {nodeid}")
    terminalreporter.write_line("Install what is missing and run again; with CI=1 these are failures, not skips.",
                                red=True, bold=True)
    terminalreporter.write_sep("!", red=True, bold=True)
