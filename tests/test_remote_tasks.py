"""Isolated tasks on another machine (`agentbox run --on HOST`) through the real CLI: a real sshd on 127.0.0.1, a
second local user standing for the remote machine with the limactl double on its PATH (tests/remotehost.py), and
agentbox's far end there. The agent works on a copy made from git bundles, and its changes come home as a
proposal; outputs and records live on this machine."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import (
    COPY_AGENT,
    GUEST_PROXY,
    FakeLima,
    Live,
    make_repository,
    run_agentbox,
    run_cli,
    snapshot_tree,
    wait_for,
    write,
)
from tests.remotehost import RemoteHost

Hosts = Callable[..., list[RemoteHost]]
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("tasks")]

# The stand-in agent (tests/helpers.py), defined by the config: python3 is in every guest.
AGENT = COPY_AGENT.split("\n", 1)[1]  # without its #! line: python3 -c runs it
EDITS = "do:write:modified.txt:by the agent;rm:deleted.txt;write:new/added.txt:new file;summary:what I did"
CONFIG = ("notify: false\ntasks:\n  maxConcurrent: 2\nagents:\n  stub:\n    binary: python3\n"
          f"    defaultArgs: [-c, {json.dumps(AGENT)}]\n")
# What must never reach a remote host: the laptop's logins, keys and agentbox state.
SECRETS = {".claude/.credentials.json": b'{"claudeAiOauth": {"accessToken": "sk-ant-oat01-LAPTOPSECRET"}}',
           ".codex/auth.json": b'{"OPENAI_API_KEY": "sk-LAPTOPSECRET-codex"}',
           ".ssh/id_laptop": b"-----BEGIN OPENSSH PRIVATE KEY-----\nLAPTOPSECRETKEY\n"}


@pytest.fixture
def remote_project(project: Path, home: Path, remote_hosts: Hosts) -> tuple[Path, RemoteHost]:
    host = remote_hosts(1)[0]
    make_repository(project, config=CONFIG)
    for name, data in SECRETS.items():
        write(home / name, data.decode(), mode=0o600)
    added = run_agentbox("hosts", "add", "big", host.url, "--no-check", cwd=project)
    assert added.returncode == 0, added.stderr
    run_agentbox("trust", cwd=project)
    return project, host


def submit(project: Path, *args: str) -> int:
    result = run_agentbox("run", "--agent", "stub", *args, cwd=project, timeout=240)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def record(project: Path, task_id: int) -> dict:
    result = run_agentbox("tasks", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    return next(t for t in json.loads(result.stdout) if t["id"] == task_id)


def remote_calls(host: RemoteHost) -> list[list[str]]:
    return FakeLima(host.lima_home).calls()


def test_a_task_on_a_host_works_on_a_copy_and_its_changes_come_home_as_a_proposal(
        remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    before = snapshot_tree(project)
    task_id = submit(project, "--on", "big", EDITS)
    done = run_agentbox("wait", str(task_id), cwd=project, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "proposal 1: 3 files changed" in done.stderr
    assert snapshot_tree(project) == before  # the laptop's workspace is never touched
    logs = run_agentbox("logs", str(task_id), cwd=project)
    seen = json.loads(logs.stdout.splitlines()[0])
    assert seen["cwd"].endswith(f"/.agentbox/tasks/{task_id}/{project.name}")
    assert {"modified.txt", "untracked.txt", "tracked.txt", "deleted.txt", ".gitignore"} <= set(seen["files"])
    assert "build/out.o" not in seen["files"]
    task = record(project, task_id)
    assert (task["host"], task["isolated"], task["state"], task["proposal"]) == ("big", True, "Completed", 1)
    assert "Completed, proposal 1 on big" in run_agentbox("tasks", cwd=project, env={**os.environ, "COLUMNS": ""}).stdout
    review = run_cli("review", "1", cwd=project)
    assert review.exit_code == 0 and "+by the agent" in review.stdout and "what I did" in review.stdout
    applied = run_cli("apply", "1", cwd=project)
    assert applied.exit_code == 0, applied.stderr
    assert (project / "modified.txt").read_text() == "by the agent\n"
    assert not (project / "deleted.txt").exists()
    # The task's folder there is gone once its results came home; the outputs outlive it here.
    assert not list((host.home / ".agentbox-remote" / "vms").glob("*/outbox/tasks/*"))
    # Nothing of the laptop's logins, keys or state went there.
    assert host.containing([b"LAPTOPSECRET"]) == []
    assert not [path for path in host.files() if path.name in (".credentials.json", "auth.json", "id_laptop")]


def test_a_second_task_on_the_warm_vm_is_one_limactl_call_and_a_delta(remote_project: tuple[Path, RemoteHost]
                                                                      ) -> None:
    project, host = remote_project
    first = submit(project, "--on", "big", "do:out:first")
    assert run_agentbox("wait", str(first), cwd=project, timeout=240).returncode == 0
    calls_before = len(remote_calls(host))
    bundles_dir = host.home / ".agentbox-remote" / "vms"
    sent_before = {path.name: path.stat().st_size for path in bundles_dir.glob("*/staging/bundles/*.bundle")}
    write(project / "untracked.txt", "changed for the second task\n")
    second = submit(project, "--on", "big", "do:out:second")
    assert run_agentbox("wait", str(second), cwd=project, timeout=240).returncode == 0
    submitted = remote_calls(host)[calls_before:]
    assert [call[0] for call in submitted if call[0] != "list"][:1] == ["shell"]
    assert sum(1 for call in submitted if call[0] in ("create", "start")) == 0
    sent_after = {path.name: path.stat().st_size for path in bundles_dir.glob("*/staging/bundles/*.bundle")}
    new = set(sent_after) - set(sent_before)
    assert len(new) == 1 and sent_after[new.pop()] < min(sent_before.values())  # only what changed
    assert run_agentbox("logs", str(second), cwd=project).stdout.splitlines()[-1] == "second"
    assert host.accepted() == 1  # every call over one connection


def test_tasks_shows_the_last_known_state_without_asking_and_refresh_asks(
        remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    task_id = submit(project, "--on", "big", "do:out:started;sleep:30")
    wait_for(lambda: record(project, task_id)["state"], 60, "the task running", until=lambda state: state == "Running")
    accepted = host.accepted()
    host.close()  # the host goes away mid-run: its runner goes on there
    started = time.monotonic()
    listing = run_agentbox("tasks", cwd=project)
    assert time.monotonic() - started < 5  # no host is asked
    assert "Running on big" in listing.stdout
    # Whole cells, as in a pipe (the worker may have a COLUMNS in its environment, which would cut the state).
    refreshed = run_agentbox("tasks", "--refresh", cwd=project, env={**os.environ, "COLUMNS": ""})
    assert "Running on big (unreachable since" in refreshed.stdout
    assert record(project, task_id)["unreachableSince"] is not None
    host.start()
    # The keeper makes the forward to this machine's proxy again, on the same port, over the new connection.
    port = record(project, task_id)["forwardPort"]
    wait_for(lambda: host.run(["sh", "-c", f"ss -ltn 'sport = :{port}' | tail -n +2"]).stdout.strip(), 60,
             f"the host's port {port} forwarded again")
    cancelled = run_agentbox("cancel", str(task_id), cwd=project, timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    done = run_agentbox("wait", str(task_id), cwd=project, timeout=120)
    assert done.returncode == 130 and "Cancelled" in done.stderr
    assert record(project, task_id)["unreachableSince"] is None
    assert host.accepted() > accepted


def test_a_host_that_does_not_answer_at_submit_keeps_the_task_waiting_until_it_does(
        remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    host.close()
    task_id = submit(project, "--on", "big", "do:write:late.txt:done")
    task = record(project, task_id)
    assert task["state"] == "Pending"
    assert "waiting for the host" in run_agentbox("tasks", cwd=project, env={**os.environ, "COLUMNS": ""}).stdout
    host.start()
    done = run_agentbox("wait", str(task_id), cwd=project, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "proposal" in done.stderr


def test_a_remote_vm_deleted_under_a_task_fails_it_with_the_reason(remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    task_id = submit(project, "--on", "big", "do:sleep:60")
    wait_for(lambda: record(project, task_id)["state"], 60, "the task running", until=lambda state: state == "Running")
    vm = record(project, task_id)["vm"]
    deleted = host.run(["limactl", "delete", "--force", vm])
    assert deleted.returncode == 0, deleted.stderr
    done = run_agentbox("wait", str(task_id), cwd=project, timeout=120)
    assert done.returncode == 1
    assert f"its VM {vm} on big was deleted" in done.stderr


def test_a_first_create_that_fails_halfway_there_is_cleaned_up_and_the_next_task_runs(
        remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    # The first `limactl create` there dies with the disk full, leaving the instance folder with an empty lima.yaml.
    host.set_variables(FAKE_LIMACTL_FAIL_CREATE="no space left on device", FAKE_LIMACTL_FAIL_CREATE_STAGE="write",
                       FAKE_LIMACTL_FAIL_CREATE_TIMES="1")
    first = run_agentbox("run", "--agent", "stub", "--on", "big", "do:out:first", cwd=project, timeout=240)
    if first.returncode == 0:
        run_agentbox("wait", first.stdout.strip(), cwd=project, timeout=240)
    said = run_agentbox("tasks", "--json", cwd=project).stdout + first.stderr
    assert "no space left on device" in said
    assert "the half-created VM was removed" in said
    vms = [path.name for path in host.lima_home.iterdir() if path.name.startswith("agentbox-")]
    assert vms == []  # nothing half-made is left there

    second = submit(project, "--on", "big", "do:out:second")
    done = run_agentbox("wait", str(second), cwd=project, timeout=240)
    assert done.returncode == 0, done.stderr
    assert run_agentbox("logs", str(second), cwd=project).stdout.splitlines()[-1] == "second"

    # One left by an earlier agentbox (or a far end cut off mid-create) is not deleted unasked (its disk may
    # be worth keeping): the refusal says how to go on.
    vm = record(project, second)["vm"]
    assert host.run(["limactl", "delete", "--force", vm]).returncode == 0
    template = host.home / ".agentbox-remote" / "vms" / vm / "lima.yaml"
    made = host.run(["env", "FAKE_LIMACTL_FAIL_CREATE=cut short", "FAKE_LIMACTL_FAIL_CREATE_STAGE=write",
                     "FAKE_LIMACTL_FAIL_CREATE_TIMES=99",
                     "limactl", "--tty=false", "create", f"--name={vm}", str(template)])
    assert made.returncode == 1 and (host.lima_home / vm / "lima.yaml").stat().st_size == 0
    third = run_agentbox("run", "--agent", "stub", "--on", "big", "do:out:third", cwd=project, timeout=240)
    assert third.returncode == 1
    assert f"Remove it there with `limactl delete --force {vm}`, then run the task again" in third.stderr
    assert made.returncode == 1 and (host.lima_home / vm / "lima.yaml").stat().st_size == 0  # left alone


@pytest.mark.parametrize(("agent", "login", "extra", "why"), [
    ("opencode", ".local/share/opencode/auth.json", "", "the credential broker keeps only"),
    ("claude", ".claude/.credentials.json", "credentials:\n  broker: false\n", "the credential broker is off"),
])
def test_an_agent_whose_login_would_be_staged_there_is_refused_before_anything_is_made(
        remote_project: tuple[Path, RemoteHost], home: Path, agent: str, login: str, extra: str, why: str) -> None:
    project, host = remote_project
    write(home / login, '{"token": "LAPTOPSECRET-login"}', mode=0o600)
    if extra:
        write(project / "agentbox.yml", CONFIG + extra)
        assert run_agentbox("trust", cwd=project).returncode == 0
    result = run_agentbox("run", "--agent", agent, "--on", "big", "hello", cwd=project)
    assert result.returncode == 1, result.stderr
    assert f"would stage your login files (~/{login}) on big" in result.stderr
    assert "agentbox never writes a login on another machine" in result.stderr and why in result.stderr
    assert json.loads(run_agentbox("tasks", "--json", cwd=project).stdout) == []
    assert not (host.home / ".agentbox-remote").exists()
    # The control: an agent with no login of the host's goes there, the same login files present.
    task_id = submit(project, "--on", "big", "do:out:fine")
    assert run_agentbox("wait", str(task_id), cwd=project, timeout=240).returncode == 0
    assert host.containing([b"LAPTOPSECRET"]) == []


def test_two_hosts_run_tasks_at_once_and_any_fills_local_first_then_the_next(
        project: Path, home: Path, remote_hosts: Hosts) -> None:
    one, two = remote_hosts(2)
    make_repository(project, config=CONFIG.replace(
        "tasks:\n  maxConcurrent: 2\n",
        "tasks:\n  maxConcurrent: 2\n  hosts: [{name: one, maxConcurrent: 1}, {name: two, maxConcurrent: 1}]\n"))
    for name, host in (("one", one), ("two", two)):
        assert run_agentbox("hosts", "add", name, host.url, "--no-check", cwd=project).returncode == 0
    assert run_agentbox("trust", cwd=project).returncode == 0
    first = submit(project, "--on", "any", "do:sleep:5;write:a.txt:one")
    second = submit(project, "--on", "any", "do:sleep:5;write:b.txt:two")
    hosts = {record(project, first)["host"], record(project, second)["host"]}
    assert hosts == {"one", "two"}
    for task_id in (first, second):
        assert run_agentbox("wait", str(task_id), cwd=project, timeout=240).returncode == 0
    assert sorted(p["id"] for p in json.loads(run_agentbox("proposals", "--json", cwd=project).stdout)) == [1, 2]


def test_follow_prints_a_remote_task_s_output_as_it_comes(remote_project: tuple[Path, RemoteHost]) -> None:
    project, _ = remote_project
    task_id = submit(project, "--on", "big", "do:out:one;sleep:3;out:two")
    followed = run_agentbox("logs", "-f", str(task_id), cwd=project, timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[1:] == ["one", "two"]


def test_follow_shows_a_remote_task_s_first_line_while_it_still_runs(remote_project: tuple[Path, RemoteHost]) -> None:
    project, _ = remote_project
    task_id = submit(project, "--on", "big", "do:out:one;sleep:120;out:two")
    with Live(project, ["logs", "-f", str(task_id)]) as follow:
        wait_for(follow.read, 60, "the remote task's first line in `logs -f`", until=lambda out: b"one\n" in out)
        assert follow.proc.poll() is None and b"two" not in follow.seen
        assert run_agentbox("cancel", str(task_id), cwd=project, timeout=120).returncode == 0
        assert follow.wait(timeout=120) == 0



REAL_ACCESS = "sk-ant-oat01-REAL-ACCESS-" + "x" * 40
REAL_REFRESH = "sk-ant-ort01-REAL-REFRESH-" + "y" * 40
# The agent in the remote VM: a request through $HTTPS_PROXY to api.anthropic.com with the login its VM holds,
# trusting only the guest's bundle (where launch.sh put the broker's CA).
REQUEST = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, urllib.parse
login = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))["claudeAiOauth"]["accessToken"]
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
connection.set_tunnel("api.anthropic.com", 443, headers=proxy_auth)
connection.request("GET", "/api/oauth/profile", headers={"Authorization": "Bearer " + login})
response = connection.getresponse()
print(json.dumps({"status": response.status, "body": json.loads(response.read()), "proxy": proxy.port,
                  "login": login, "secret": proxy.password}))
"""


def test_the_remote_vm_reaches_its_api_only_through_this_machine_s_broker_over_the_forward(
        project: Path, home: Path, remote_hosts: Hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbox.net import guard as netguard
    from tests.fake_upstream import FakeUpstream

    host = remote_hosts(1)[0]
    expires = int((time.time() + 3600) * 1000)
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": REAL_ACCESS, "refreshToken": REAL_REFRESH, "expiresAt": expires,
        "scopes": ["user:inference"], "subscriptionType": "max"}}), mode=0o600)
    make_repository(project, config="notify: false\nagents:\n  claude:\n    binary: python3\n"
                                     f"    defaultArgs: [-c, {json.dumps(REQUEST)}]\n")
    assert run_agentbox("hosts", "add", "big", host.url, "--no-check", cwd=project).returncode == 0
    assert run_agentbox("trust", cwd=project).returncode == 0
    with FakeUpstream(tmp_path / "upstream", ["api.anthropic.com"]) as upstream:
        upstream.route("GET", "/api/oauth/profile", {"account": "the host's"}, host="api.anthropic.com",
                       authorization=f"Bearer {REAL_ACCESS}")
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(upstream.address), "caFile": str(upstream.ca_file)}))
        submitted = run_agentbox("run", "--agent", "claude", "--on", "big", "hello", cwd=project, timeout=240)
        assert submitted.returncode == 0, submitted.stderr
        task_id = int(submitted.stdout)
        done = run_agentbox("wait", str(task_id), cwd=project, timeout=240)
        assert done.returncode == 0, done.stderr + run_agentbox("logs", str(task_id), cwd=project).stderr
        answer = json.loads(run_agentbox("logs", str(task_id), cwd=project).stdout.splitlines()[-1])
        assert (answer["status"], answer["body"]) == (200, {"account": "the host's"})
        assert "agentbox-ph-" in answer["login"]  # the VM held a placeholder; the broker put the real one in
        assert [r.headers["authorization"] for r in upstream.requests_to("api.anthropic.com")] == \
            [f"Bearer {REAL_ACCESS}"]
    mirror = record(project, task_id)["vm"] + ".on-big"
    assert mirror.startswith("agentbox-myproject-")  # the project's VM there carries the provisioning's key
    # The VM's proxy port was the host's end of the forward, not this machine's proxy port; its proxy password the
    # secret of this machine's mirror of that VM, in files only the remote user can read.
    assert answer["proxy"] == record(project, task_id)["forwardPort"]
    assert answer["secret"] == netguard.secret(mirror)
    staged = [path for path, _ in host.containing([answer["secret"].encode()])
              if path.is_relative_to(host.home / ".agentbox-remote")]
    assert staged, "the remote VM's staged env"
    for path in staged:
        assert path.stat().st_mode & 0o777 == 0o600, path
        for folder in path.relative_to(host.home).parents:
            if folder != Path("."):
                assert (host.home / folder).stat().st_mode & 0o777 == 0o700, folder
    # No real token on the remote host; the forward and the proxy ended with the task.
    assert host.containing([REAL_ACCESS.encode(), REAL_REFRESH.encode()]) == []
    assert host.containing([b"agentbox-ph-"]) != []
    wait_for(lambda: netguard.running(mirror), 30, "the proxy to end", until=lambda running: running is None)
    listening = host.run(["sh", "-c", f"ss -ltn 'sport = :{answer['proxy']}' | tail -n +2"])
    assert listening.stdout.strip() == b""


def test_another_user_of_the_host_reaches_the_forward_but_not_the_proxy(remote_project: tuple[Path, RemoteHost]
                                                                        ) -> None:
    """The forward listens on the host's 127.0.0.1, where any of its users can connect: the proxy asks each of
    them for the remote VM's proxy credentials, which only that VM (and the remote user's own files) holds."""
    from agentbox.net import guard as netguard
    from agentbox.runtime.sshhost import mirror_name

    project, _ = remote_project
    task_id = submit(project, "--on", "big", "do:sleep:30")
    wait_for(lambda: record(project, task_id)["state"], 120, "the task running", until=lambda state: state == "Running")
    task = record(project, task_id)
    forward = task["forwardPort"]
    secret = netguard.secret(mirror_name(task["vm"], "big"))

    def through_forward(auth: str) -> bytes:  # this test's user is not the remote user: another user of the host
        with socket.create_connection(("127.0.0.1", forward), timeout=10) as sock:
            sock.sendall(f"CONNECT 127.0.0.1:1 HTTP/1.1\r\n{auth}\r\n".encode())
            return sock.recv(100)

    assert through_forward("").startswith(b"HTTP/1.1 407 ")
    token = base64.b64encode(f"agentbox:{secret}".encode()).decode()
    # The control: with the VM's credentials the proxy decides (and refuses the host's own loopback).
    assert through_forward(f"Proxy-Authorization: Basic {token}\r\n").startswith(b"HTTP/1.1 403 ")
    assert run_agentbox("cancel", str(task_id), cwd=project).returncode == 0


def test_hosts_rm_refuses_while_a_task_there_is_active_and_force_fails_it(remote_project: tuple[Path, RemoteHost]
                                                                          ) -> None:
    project, host = remote_project
    task_id = submit(project, "--on", "big", "do:sleep:60")
    wait_for(lambda: record(project, task_id)["state"], 60, "the task running", until=lambda state: state == "Running")
    refused = run_agentbox("hosts", "rm", "big", cwd=project)
    assert refused.returncode == 1 and "1 task on big is still active (task 1)" in refused.stderr
    assert "hosts rm --force" in refused.stderr
    forced = run_agentbox("hosts", "rm", "big", "--force", cwd=project)
    assert forced.returncode == 0, forced.stderr
    task = record(project, task_id)
    assert task["state"] == "Failed" and "was removed with `agentbox hosts rm --force`" in task["reason"]
    listed = json.loads(run_agentbox("hosts", "ls", "--json", cwd=project).stdout)
    assert [row["name"] for row in listed] == ["local"]
    # Its runner there was asked to stop before the host was forgotten.
    wait_for(lambda: host.containing([b"state=cancelled"]), 30, "the runner there to end the task as cancelled")


def test_a_task_whose_keeper_is_gone_is_followed_again_after_tasks(remote_project: tuple[Path, RemoteHost]) -> None:
    from agentbox.tasks import keeper

    project, _ = remote_project
    task_id = submit(project, "--on", "big", "do:sleep:3;write:later.txt:done")
    wait_for(lambda: keeper.running(task_id), 30, "the keeper to run")
    # This machine restarted: the keeper is gone (killed here), the task goes on there.
    import signal
    import subprocess as sp

    pids = sp.run(["pgrep", "-f", f"agentbox.tasks.keeper {task_id}$"], capture_output=True, text=True)
    for pid in pids.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    wait_for(lambda: not keeper.running(task_id), 30, "the keeper to be gone")
    assert record(project, task_id)["state"] in ("Queued", "Running", "Pending")
    assert run_agentbox("tasks", cwd=project).returncode == 0  # no host asked; a keeper started
    task = wait_for(lambda: record(project, task_id), 120, "the task to end with its proposal",
                    until=lambda task: task["proposal"] is not None)
    assert task["state"] == "Completed"
