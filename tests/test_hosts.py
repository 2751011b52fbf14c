"""`agentbox hosts add|ls|doctor|rm` through the real CLI, against a real sshd on 127.0.0.1 with a second local user
standing for the remote machine and the limactl double on its PATH (tests/remotehost.py)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import run_agentbox
from tests.remotehost import RemoteHost

Hosts = Callable[..., list[RemoteHost]]
pytestmark = pytest.mark.timeout(180)


def test_add_checks_the_host_and_ls_and_doctor_say_what_it_is(remote_hosts: Hosts, project: Path) -> None:
    host = remote_hosts(1)[0]
    added = run_agentbox("hosts", "add", "big", host.url, cwd=project)
    assert added.returncode == 0, added.stderr
    assert "added host big (ssh://remote1)" in added.stderr
    assert "OK    ssh reaches remote1" in added.stderr
    assert "Lima 2.2.0" in added.stderr
    # The remote user cannot use /dev/kvm here: the check says so and how to fix it.
    assert "FAIL  neither KVM (/dev/kvm) nor Apple's VZ is usable there" in added.stderr
    assert "usermod -aG kvm" in added.stderr

    listed = run_agentbox("hosts", "ls", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    local, row = json.loads(listed.stdout)
    # This machine is a host like the others, first (its limactl is this test's double).
    assert (local["name"], local["reachable"], local["limaVersion"]) == ("local", True, "2.2.0")
    assert row["name"] == "big" and row["url"] == "ssh://remote1" and row["reachable"] is True
    assert row["limaVersion"] == "2.2.0" and row["virt"] == "none" and row["cpus"] >= 1
    assert row["slots"] == 2 and row["freeSlots"] == 2 and row["running"] == 0
    table = run_agentbox("hosts", "ls", cwd=project)
    assert table.stdout.splitlines()[0].split() == ["NAME", "ADDRESS", "REACHABLE", "LIMA", "VIRT", "CPUS", "MEMORY",
                                                    "FREE", "SLOTS", "RUNNING"]
    local_line, big_line = table.stdout.splitlines()[1:3]
    assert local_line.startswith("local ") and " yes " in local_line
    assert big_line.startswith("big ") and big_line.split()[-8:-5] == ["yes", "2.2.0", "none"]

    doctor = run_agentbox("hosts", "doctor", "big", "--json", cwd=project)
    assert doctor.returncode == 1  # the virtualisation check fails here
    checks = {check["check"]: check["status"] for check in json.loads(doctor.stdout)}
    assert checks == {"ssh": "OK", "python3": "OK", "lima": "OK", "virtualisation": "FAIL", "disk": checks["disk"]}
    assert checks["disk"] in ("OK", "WARN")
    # One connection served every command above (the master is reused across agentbox processes).
    assert host.accepted() == 1


def test_a_host_that_does_not_answer_is_listed_as_unreachable_with_since_when(remote_hosts: Hosts,
                                                                                project: Path) -> None:
    host = remote_hosts(1)[0]
    assert run_agentbox("hosts", "add", "big", host.url, "--no-check", cwd=project).returncode == 0
    host.close()
    listed = run_agentbox("hosts", "ls", "--json", cwd=project)
    _, row = json.loads(listed.stdout)
    assert row["reachable"] is False and row["unreachableSince"] is not None
    assert "host big is unreachable" in row["error"] and "Connection refused" in row["error"]
    doctor = run_agentbox("hosts", "doctor", "big", cwd=project)
    assert doctor.returncode == 1 and "FAIL  ssh to remote1 failed: host big is unreachable" in doctor.stdout
    assert "batch mode" in doctor.stdout
    table = run_agentbox("hosts", "ls", cwd=project, env={**os.environ, "COLUMNS": "250"})
    assert "no, since 20" in table.stdout  # "no, since YYYY-MM-DD HH:MM"
    host.start()
    again = run_agentbox("hosts", "ls", "--json", cwd=project)
    assert json.loads(again.stdout)[1]["reachable"] is True
    assert json.loads(again.stdout)[1]["unreachableSince"] is None


@pytest.mark.parametrize(("name", "url", "said"), [
    ("any", "ssh://x", "'any' is reserved"),
    ("local", "ssh://x", "'local' is reserved"),
    ("Big", "ssh://x", "is not a host name agentbox takes"),
    ("big", "http://x", "is not an ssh:// address"),
    ("big", "ssh://-oProxyCommand=touch", "is not a host name agentbox passes to ssh"),
    ("big", "ssh://me@host:99999", "port 99999 is out of range"),
    ("big", "ssh://host/path", "with no path"),
])
def test_add_refuses_bad_names_and_addresses_before_anything_is_written(project: Path, name: str, url: str,
                                                                         said: str) -> None:
    result = run_agentbox("hosts", "add", name, url, "--no-check", cwd=project)
    assert result.returncode == 2 and said in result.stderr
    assert [row["name"] for row in json.loads(run_agentbox("hosts", "ls", "--json", cwd=project).stdout)] == ["local"]


@pytest.fixture
def ssh_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ssh first on PATH: records each argv (one JSON line), then fails as ssh does for a host that
    does not answer."""
    log = tmp_path / "ssh-argv.jsonl"
    bin_dir = tmp_path / "ssh-bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "ssh"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"with open({str(log)!r}, 'a') as log:\n"
                        "    log.write(json.dumps(sys.argv[1:]) + '\\n')\n"
                        "sys.stderr.write('ssh: connect to host port 22: Connection refused\\n')\n"
                        "sys.exit(255)\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.mark.parametrize(("args", "said"), [
    (["ssh://-Jevil.example.com"], "'ssh://-Jevil.example.com': '-Jevil.example.com' is not a host name agentbox"
     " passes to ssh"),
    (["ssh://-oProxyCommand=touch"], "'ssh://-oProxyCommand=touch': '-oProxyCommand=touch' is not a host name"
     " agentbox passes to ssh"),
    (["ssh://-Jevil.example.com:22"], "'ssh://-Jevil.example.com:22': '-Jevil.example.com' is not a host name"
     " agentbox passes to ssh"),
    (["ssh://-Jevil@build.example.com"], "'ssh://-Jevil@build.example.com': '-Jevil' is not a user name agentbox"
     " passes to ssh"),
    (["--", "-Jevil.example.com"], "'-Jevil.example.com' is not an address: ssh would read it as an option"),
    (["--", "-oProxyCommand=touch /tmp/x"], "'-oProxyCommand=touch /tmp/x' is not an address: ssh would read it as"
     " an option"),
    (["--", "me@-Jevil.example.com"], "'me@-Jevil.example.com': '-Jevil.example.com' is not a host name"),
    (["--", "-Jevil@build.example.com"], "'-Jevil@build.example.com' is not an address: ssh would read it as an"
     " option"),
    (["-Jevil.example.com"], "No such option"),  # click's own refusal (its wording varies by version)
], ids=["ssh-J", "ssh-oProxyCommand", "ssh-J-port", "ssh-user-J", "bare-J", "bare-oProxyCommand", "bare-host-J",
        "bare-user-J", "option-J"])
def test_an_address_ssh_would_read_as_an_option_is_refused_and_ssh_never_runs(project: Path, ssh_log: Path,
                                                                              args: list[str], said: str) -> None:
    """ssh reads a destination that starts with `-` as its options (`-J` a jump host, `-o ProxyCommand=` a
    command run on this machine): such an address is refused before anything is written or run."""
    result = run_agentbox("hosts", "add", "big", *args, cwd=project)  # no --no-check: an added host is contacted
    assert (result.returncode, said in result.stderr) == (2, True), result.stderr
    assert not ssh_log.exists()
    assert [row["name"] for row in json.loads(run_agentbox("hosts", "ls", "--json", cwd=project).stdout)] == ["local"]
    # The control: an address agentbox takes is added and contacted, its host name after ssh's options.
    added = run_agentbox("hosts", "add", "big", "ssh://me@build.example.com:2222", cwd=project)
    assert added.returncode == 0, added.stderr
    first = json.loads(ssh_log.read_text().splitlines()[0])
    assert first[first.index("-p"):first.index("--")] == ["-p", "2222", "-l", "me", "-T", "build.example.com"]


def test_add_twice_is_refused_and_rm_forgets_the_host(project: Path) -> None:
    assert run_agentbox("hosts", "add", "big", "ssh://me@build.example:2222", "--no-check", cwd=project).returncode == 0
    again = run_agentbox("hosts", "add", "big", "ssh://other", "--no-check", cwd=project)
    assert again.returncode == 2 and "already added (ssh://me@build.example:2222)" in again.stderr
    removed = run_agentbox("hosts", "rm", "big", cwd=project)
    assert removed.returncode == 0 and "removed host big" in removed.stderr
    missing = run_agentbox("hosts", "rm", "big", cwd=project)
    assert missing.returncode == 2 and "no host named 'big'" in missing.stderr


def test_doctor_local_checks_this_machine_like_a_host(project: Path, limactl: object) -> None:
    import os

    doctor = run_agentbox("hosts", "doctor", "local", "--json", cwd=project)
    checks = {check["check"]: check for check in json.loads(doctor.stdout)}
    assert set(checks) == {"lima", "virtualisation", "disk"}  # no ssh, no far end here
    assert checks["lima"]["status"] == "OK" and "Lima 2.2.0" in checks["lima"]["message"]
    kvm = os.access("/dev/kvm", os.R_OK | os.W_OK)
    assert checks["virtualisation"]["status"] == ("OK" if kvm else "FAIL")
    assert doctor.returncode == (0 if kvm and checks["disk"]["status"] != "FAIL" else 1)


def test_add_takes_the_address_as_ssh_users_type_it_and_ssh_logs_in_as_that_user(project: Path,
                                                                                 ssh_log: Path) -> None:
    added = run_agentbox("hosts", "add", "big", "me@build.example.com", cwd=project)
    assert added.returncode == 0, added.stderr
    assert "added host big (ssh://me@build.example.com)" in added.stderr
    first = json.loads(ssh_log.read_text().splitlines()[0])
    assert first[first.index("-l"):first.index("--")] == ["-l", "me", "-T", "build.example.com"]
    listed = json.loads(run_agentbox("hosts", "ls", "--json", cwd=project).stdout)
    assert [row["url"] for row in listed] == ["this machine", "ssh://me@build.example.com"]
    # A host alone (an alias of the ssh config) is taken too; then ssh's configuration says who logs in.
    assert run_agentbox("hosts", "add", "mini", "mini", cwd=project).returncode == 0
    mini = next(argv for argv in map(json.loads, ssh_log.read_text().splitlines()) if "mini" in argv and "--" in argv)
    assert "-l" not in mini and mini[mini.index("--") - 1] == "mini"


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_ls_json_says_why_a_host_is_unreachable_each_time_with_iso_times(project: Path, ssh_log: Path) -> None:
    assert run_agentbox("hosts", "add", "big", "ssh://me@build.example.com", "--no-check", cwd=project).returncode == 0
    for attempt in ("first", "again"):
        listed = run_agentbox("hosts", "ls", "--json", cwd=project)
        assert listed.returncode == 0, listed.stderr
        row = json.loads(listed.stdout)[1]
        assert row["reachable"] is False, attempt
        assert "host big is unreachable" in row["error"] and "Connection refused" in row["error"], (attempt, row)
        assert ISO.fullmatch(row["unreachableSince"]), (attempt, row)
        assert row["lastSeen"] is None
    # The table says the reason once, then "no, since ...".
    table = run_agentbox("hosts", "ls", cwd=project, env={**os.environ, "COLUMNS": "250"})
    assert "no, since 20" in table.stdout and "Connection refused" not in table.stderr


def test_ls_at_80_columns_cuts_the_free_text_and_stays_a_table(project: Path, ssh_log: Path,
                                                               limactl: object) -> None:
    address = "ssh://someone-with-a-long-name@build-server-east.example.com:2222"
    assert run_agentbox("hosts", "add", "big", address, "--no-check", cwd=project).returncode == 0
    for width, rows in ((80, 3), (250, 3)):
        table = run_agentbox("hosts", "ls", cwd=project, env={**os.environ, "COLUMNS": str(width)})
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert len(lines) == rows, lines  # the header and one line a host
        assert lines[0].split()[:3] == ["NAME", "ADDRESS", "REACHABLE"]
        assert all(len(line) <= width for line in lines), lines
        assert lines[2].startswith("big ")
        assert (address in lines[2]) == (width == 250) and ("…" in lines[2]) == (width == 80)
