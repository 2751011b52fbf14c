"""Background tasks through the CLI against the limactl double, whose guest keeps what a shell left
running: `agentbox run`, `tasks`, `logs`, `wait`, `cancel`, `tasks prune`, `diff --since task:ID`."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import paths
from tests.helpers import (
    NAME,
    FakeLima,
    Live,
    git,
    launch_workdir,
    make_repository,
    notify_send_stand_in,
    on_terminal,
    run_agentbox,
    run_cli,
    wait_for,
    write,
)

pytestmark = pytest.mark.xdist_group("tasks")

# A stand-in agent for tasks: prints its arguments as JSON, then does what a prompt starting with `do:` asks
# (`;`-separated): sleep:S, exit:N, write:FILE:TEXT (in its folder), spam:MB (MiB on stdout), err:TEXT,
# ignore-term (TERM does not stop it), say:TEXT (a line on stdout, not flushed: as a program that leaves its
# buffering to stdio), await:PATH (until that file exists), env:NAME:FILE (the variable's value, in its folder).
TASK_AGENT = r"""#!/usr/bin/python3
import json, os, signal, sys, time
prompt = sys.argv[-1]
print(json.dumps({"args": sys.argv[1:], "cwd": os.getcwd()}), flush=True)
code = 0
if prompt.startswith("do:"):
    for step in prompt[3:].split(";"):
        what, _, arg = step.partition(":")
        if what == "sleep":
            time.sleep(float(arg))
        elif what == "exit":
            code = int(arg)
        elif what == "write":
            name, _, text = arg.partition(":")
            with open(name, "a") as f:
                f.write(text + "\n")
        elif what == "spam":
            block = b"x" * 1023 + b"\n"
            for _ in range(int(arg) * 1024):
                sys.stdout.buffer.write(block)
            sys.stdout.flush()
        elif what == "err":
            print(arg, file=sys.stderr, flush=True)
        elif what == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif what == "say":
            print(arg)
        elif what == "await":
            while not os.path.exists(arg):
                time.sleep(0.05)
        elif what == "env":
            name, _, file = arg.partition(":")
            with open(file, "a") as f:
                f.write(os.environ.get(name, "") + "\n")
sys.exit(code)
"""


@pytest.fixture
def tasks_vm(project: Path, vm: FakeLima) -> FakeLima:
    """The project as a git repository (committed files, a local config), its VM running, the stand-in agent."""
    make_repository(project, config="tasks:\n  maxConcurrent: 2\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work in progress")
    bin_dir = vm.home / NAME / "guestfs" / "usr-local" / "bin"
    write(bin_dir / "claude", TASK_AGENT, mode=0o755)
    vm.clear()
    return vm


def run_task(project: Path, *args: str, input: str | None = None) -> int:
    result = run_cli("run", *args, cwd=project, input=input)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout.strip())


def listing(project: Path, *args: str) -> list[dict]:
    result = run_cli("tasks", "--json", *args, cwd=project)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def task(project: Path, task_id: int) -> dict:
    return next(t for t in listing(project, "--all") if t["id"] == task_id)


def running(project: Path, task_id: int, timeout: float = 60) -> None:
    """Wait until the task is Running (fail the test at the deadline with the state it is in)."""
    wait_for(lambda: task(project, task_id)["state"], timeout, f"task {task_id} to be Running",
             until=lambda state: state == "Running")


def wait(project: Path, task_id: int, *args: str) -> subprocess.CompletedProcess:
    return run_agentbox("wait", *args, str(task_id), cwd=project, timeout=90)


def test_a_task_runs_the_agents_non_interactive_form_with_the_prompt_byte_for_byte(project: Path,
                                                                                    tasks_vm: FakeLima) -> None:
    prompt = "it's \"quoted\", $HOME and `cmd`,\nnew lines\n\n, tabs\t, unicode ✓ é 𝄞, and a trailing newline\n"
    task_id = run_task(project, "--", prompt)
    # A warm VM: one list and one shell, and `run` returned before the agent ended.
    assert tasks_vm.subcommands() == ["list", "shell"]
    done = wait(project, task_id)
    assert done.returncode == 0, done.stderr
    out = run_agentbox("logs", str(task_id), cwd=project)
    report = json.loads(out.stdout.splitlines()[0])
    assert report["args"] == ["--dangerously-skip-permissions", "-p", prompt]
    assert report["cwd"] == str(project)
    record = task(project, task_id)
    assert record["state"] == "Completed" and record["exitCode"] == 0
    assert [t["state"] for t in record["transitions"]] == ["Pending", "Queued", "Running", "Completed"]
    assert record["argv"] == ["claude", "--dangerously-skip-permissions", "-p"]
    assert record["checkpoint"] is not None
    # The next one, after that launch checked the VM: one shell, its guest proving it is that VM.
    tasks_vm.clear()
    again = run_task(project, "--", "second")
    assert tasks_vm.subcommands() == ["shell"]
    assert wait(project, again).returncode == 0
    second = run_agentbox("logs", str(again), cwd=project)
    assert json.loads(second.stdout.splitlines()[0])["args"][-1] == "second"


def test_a_task_is_a_session_with_canaries_of_its_own_the_proxy_knows(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:env:STRIPE_API_KEY:canary.txt")
    assert wait(project, task_id).returncode == 0
    value = (project / "canary.txt").read_text().strip()
    assert value.startswith("sk_live_"), value
    known = json.loads((paths.vm_state_dir(NAME) / "network" / "canaries.json").read_text())
    assert value in json.dumps(known)
    assert not any((paths.staging_dir(NAME) / "canaries").iterdir())  # placed, then gone from the staging folder


def test_a_task_on_a_vm_stopped_outside_agentbox_starts_it_and_runs(project: Path, tasks_vm: FakeLima) -> None:
    first = run_task(project, "--", "first")
    assert wait(project, first).returncode == 0
    subprocess.run(["limactl", "--tty=false", "stop", NAME], check=True, capture_output=True, timeout=120)
    tasks_vm.clear()
    task_id = run_task(project, "--", "after the stop")
    assert tasks_vm.subcommands() == ["shell", "list", "start", "list", "shell"]
    assert wait(project, task_id).returncode == 0
    out = run_agentbox("logs", str(task_id), cwd=project)
    assert json.loads(out.stdout.splitlines()[0])["args"][-1] == "after the stop"


def test_the_prompt_can_come_from_stdin(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "--agent", "claude", input="from stdin\n")
    assert wait(project, task_id).returncode == 0
    out = run_agentbox("logs", str(task_id), cwd=project)
    assert json.loads(out.stdout.splitlines()[0])["args"][-1] == "from stdin\n"


def test_a_failing_task_is_failed_and_wait_exits_with_its_code(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:err:something broke;exit:3")
    done = wait(project, task_id)
    assert done.returncode == 3
    assert f"task {task_id} Failed: exited with 3" in done.stderr
    logs = run_agentbox("logs", str(task_id), cwd=project)
    assert logs.stderr == "something broke\n"
    assert task(project, task_id)["state"] == "Failed"


def test_a_task_that_outlives_its_timeout_is_stopped_and_wait_exits_124(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "--timeout", "2s", "do:write:timed.txt:started;sleep:60;write:timed.txt:finished")
    started = time.monotonic()
    done = wait(project, task_id)
    assert done.returncode == 124, done.stderr
    assert time.monotonic() - started < 30
    record = task(project, task_id)
    assert record["state"] == "Timeout" and record["timeoutSec"] == 2
    assert "timeout of 2s" in record["reason"]
    time.sleep(1)
    assert (project / "timed.txt").read_text() == "started\n"  # the agent was stopped, not left running


def test_cancel_stops_a_running_task_and_kills_one_that_ignores_term(project: Path, tasks_vm: FakeLima) -> None:
    polite = run_task(project, "do:sleep:60")
    stubborn = run_task(project, "--worktree", "--", "do:ignore-term;sleep:60;write:late.txt:too late")
    for task_id in (polite, stubborn):
        running(project, task_id, timeout=30)
    result = run_cli("cancel", str(polite), cwd=project)
    assert result.exit_code == 0, result.stderr
    assert f"task {polite} Cancelled" in result.stderr
    assert wait(project, polite).returncode == 130
    started = time.monotonic()
    assert run_cli("cancel", str(stubborn), cwd=project).exit_code == 0
    assert wait(project, stubborn).returncode == 130
    assert time.monotonic() - started >= 4  # TERM was ignored: KILL came after the grace period
    assert task(project, stubborn)["state"] == "Cancelled"
    # Ended: cancelling again is refused, the record stays as it is.
    again = run_cli("cancel", str(polite), cwd=project)
    assert again.exit_code == 1 and "already ended: Cancelled" in again.stderr


def test_queued_tasks_start_in_order_as_slots_free(project: Path, tasks_vm: FakeLima) -> None:
    write(project / "agentbox.yml", "tasks:\n  maxConcurrent: 1\n")
    ids = [run_task(project, "--worktree", "--", f"do:sleep:{6 if n == 0 else 1};write:order.txt:{n}") for n in range(3)]
    states = {t["id"]: t["state"] for t in listing(project)}
    assert states[ids[0]] == "Running"
    assert states[ids[1]] == states[ids[2]] == "Queued"
    dropped = run_task(project, "--worktree", "--", "do:write:order.txt:never")
    assert run_cli("cancel", str(dropped), cwd=project).exit_code == 0
    for task_id in ids:
        assert wait(project, task_id).returncode == 0
    records = [task(project, task_id) for task_id in ids]
    for before, after in itertools.pairwise(records):
        assert after["started"] >= before["ended"], (before, after)
    cancelled = task(project, dropped)
    assert cancelled["state"] == "Cancelled"
    assert "Running" not in [t["state"] for t in cancelled["transitions"]]
    assert not (Path(cancelled["worktree"]) / "order.txt").exists() or \
        "never" not in (Path(cancelled["worktree"]) / "order.txt").read_text()


def test_live_tree_tasks_never_run_side_by_side(project: Path, tasks_vm: FakeLima) -> None:
    first = run_task(project, "do:sleep:2")
    second = run_task(project, "do:sleep:0.1")
    assert wait(project, first).returncode == 0 and wait(project, second).returncode == 0
    one, two = task(project, first), task(project, second)
    assert two["started"] >= one["ended"]


def test_two_worktree_tasks_edit_the_same_file_without_clobbering(project: Path, tasks_vm: FakeLima) -> None:
    before = (project / "tracked.txt").read_text()
    first = run_task(project, "--worktree", "--name", "alpha", "do:write:tracked.txt:from alpha;sleep:6")
    second = run_task(project, "--worktree", "--name", "beta", "do:write:tracked.txt:from beta;sleep:6")
    assert wait(project, first).returncode == 0 and wait(project, second).returncode == 0
    one, two = task(project, first), task(project, second)
    assert one["started"] < two["ended"] and two["started"] < one["ended"]  # side by side
    assert (project / "tracked.txt").read_text() == before  # the live tree is untouched
    assert git(project, "show", f"agentbox/task-{first}:tracked.txt") == before + "from alpha\n"
    assert git(project, "show", f"agentbox/task-{second}:tracked.txt") == before + "from beta\n"
    assert one["branch"] == f"agentbox/task-{first}" and Path(one["worktree"]).is_dir()
    assert ".agentbox/" not in git(project, "status", "--short")  # the worktrees' folder is ignored
    diff = run_cli("diff", "--since", "task:alpha", "--name-only", cwd=project)
    assert diff.exit_code == 0, diff.stderr
    assert diff.stdout == "tracked.txt\n"
    pruned = run_cli("tasks", "prune", cwd=project)
    assert pruned.exit_code == 0, pruned.stderr
    assert not Path(one["worktree"]).exists() and not Path(two["worktree"]).exists()
    assert listing(project) == []
    assert f"agentbox/task-{first}" in git(project, "branch", "--list", "agentbox/*")
    merged = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "merge", "-q",
                             f"agentbox/task-{first}"], cwd=project, capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    assert (project / "tracked.txt").read_text() == before + "from alpha\n"


def test_diff_since_a_live_task_shows_what_it_changed(project: Path, tasks_vm: FakeLima) -> None:
    (project / "before.txt").write_text("the user's edit before the task\n")
    task_id = run_task(project, "do:write:made-by-task.txt:hello")
    assert wait(project, task_id).returncode == 0
    diff = run_cli("diff", "--since", f"task:{task_id}", "--name-only", cwd=project)
    assert diff.exit_code == 0, diff.stderr
    assert diff.stdout == "made-by-task.txt\n"


def test_a_replace_ref_in_the_workspace_cannot_hide_what_a_task_changed(project: Path, tasks_vm: FakeLima) -> None:
    """refs/replace/* in the workspace's .git (agent-written) is not honoured by agentbox's host side: the task's
    start commit is read as its real objects, so a replacement that looks like the task's result hides nothing."""
    task_id = run_task(project, "--worktree", "--", "do:write:tracked.txt:from the task")
    assert wait(project, task_id).returncode == 0
    record = task(project, task_id)
    start, worktree = git(project, "rev-parse", "HEAD").strip(), Path(record["worktree"])
    # The attacker's replacement: the start commit's id now names a commit of the task's own tree.
    git(worktree, "add", "-A")
    decoy = git(worktree, "commit-tree", "-m", "decoy", git(worktree, "write-tree").strip()).strip()
    git(project, "replace", start, decoy)
    assert (project / ".git" / "refs" / "replace" / start).is_file()
    assert git(worktree, "diff", "--name-only", start) == ""  # a git that honours it sees no change
    diff = run_cli("diff", "--since", f"task:{task_id}", "--name-only", cwd=project)
    assert diff.exit_code == 0, diff.stderr
    assert diff.stdout == "tracked.txt\n"
    full = run_cli("diff", "--since", f"task:{task_id}", cwd=project)
    assert "+from the task" in full.stdout


def test_outputs_outlive_the_vm_and_agentbox_rm(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:err:to stderr;exit:5")
    assert wait(project, task_id).returncode == 5
    removed = run_cli("rm", "--yes", cwd=project)
    assert removed.exit_code == 0, removed.stderr
    assert tasks_vm.status(NAME) is None
    logs = run_agentbox("logs", str(task_id), cwd=project)
    assert logs.returncode == 0
    assert json.loads(logs.stdout.splitlines()[0])["args"][-1] == "do:err:to stderr;exit:5"
    assert logs.stderr == "to stderr\n"
    assert wait(project, task_id).returncode == 5  # the host's record answers, with no VM
    assert task(project, task_id)["state"] == "Failed"


def test_a_task_whose_vm_stops_is_failed_and_nothing_hangs(project: Path, tasks_vm: FakeLima) -> None:
    through_agentbox = run_task(project, "--worktree", "--", "do:sleep:120")
    behind_its_back = run_task(project, "--worktree", "--", "do:sleep:120")
    running(project, through_agentbox)
    stopped = run_cli("stop", "--yes", cwd=project)
    assert stopped.exit_code == 0, stopped.stderr
    record = task(project, through_agentbox)
    assert record["state"] == "Failed" and "was stopped" in record["reason"]
    started = time.monotonic()
    assert wait(project, behind_its_back).returncode == 1
    assert time.monotonic() - started < 20
    # Started again and stopped with limactl itself: agentbox notices when it next looks.
    third = run_task(project, "--worktree", "--", "do:sleep:120")
    running(project, third)
    subprocess.run(["limactl", "stop", NAME], check=True, capture_output=True)
    record = task(project, third)
    assert record["state"] == "Failed" and "stopped (Stopped)" in record["reason"]


def test_two_runs_at_once_lose_no_task(project: Path, tasks_vm: FakeLima) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", "agentbox", "run", "--worktree", "--", f"do:write:n.txt:{n}"],
                              cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(2)]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        ids.append(int(out))
    assert len(set(ids)) == 2
    for task_id in ids:
        assert wait(project, task_id).returncode == 0
        assert [t["state"] for t in task(project, task_id)["transitions"]].count("Running") == 1


def test_a_huge_output_streams_without_filling_memory(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:spam:200")
    assert wait(project, task_id).returncode == 0
    # The peak is read by a small parent of `logs`: a child's maxrss as wait4 gives it here would start from
    # pytest's own (Linux keeps the high-water mark of the memory a process had before exec).
    peak_file = project.parent / "logs-peak"
    measure = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
               "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
               "sys.exit(code)")
    proc = subprocess.Popen([sys.executable, "-c", measure, str(peak_file),
                             sys.executable, "-m", "agentbox", "logs", str(task_id)], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    size = 0
    assert proc.stdout is not None
    while chunk := proc.stdout.read(1 << 20):
        size += len(chunk)
    assert proc.wait() == 0
    assert size > 200 << 20
    assert int(peak_file.read_text()) < 100 * 1024  # KiB: far less than the output


def test_logs_follow_stops_when_the_task_ends(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:sleep:1;err:late line;sleep:1")
    followed = run_agentbox("logs", "-f", str(task_id), cwd=project, timeout=60)
    assert followed.returncode == 0
    assert followed.stderr == "late line\n"
    assert task(project, task_id)["state"] == "Completed"


@pytest.mark.parametrize("args, message", [
    (("logs", "999"), "there is no task '999'"),
    (("wait", "nope"), "there is no task 'nope'"),
    (("cancel", "12"), "there is no task '12'"),
    (("run", "--timeout", "soon", "x"), "is not a duration"),
    (("run", "--timeout", "0s", "x"), "at least one second"),
    (("wait", "--timeout", "1x", "1"), "is not a duration"),
])
def test_bad_input_is_refused_with_exit_2(project: Path, limactl: FakeLima, args: tuple[str, ...],
                                          message: str) -> None:
    result = run_cli(*args, cwd=project)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert limactl.calls() == []


def test_wait_timeout_leaves_the_task_running(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:sleep:30")
    done = wait(project, task_id, "--timeout", "1s")
    assert done.returncode == 75
    assert task(project, task_id)["state"] in ("Queued", "Running")
    assert run_cli("cancel", str(task_id), cwd=project).exit_code == 0


def test_links_the_vm_plants_in_the_outbox_are_never_followed(project: Path, tasks_vm: FakeLima,
                                                               tmp_path: Path) -> None:

    decoy = tmp_path / "host-folder"
    write(decoy / "state", "state=completed\nexit=0\n")
    write(decoy / "stdout", "a host file\n")
    write(decoy / "precious", "keep me\n")
    task_id = run_task(project, "--worktree", "--", "do:sleep:60")
    box = paths.vm_outbox(NAME) / "tasks" / str(task_id)
    running(project, task_id)
    aside = box.with_name("moved-away")
    box.rename(aside)
    box.symlink_to(decoy)  # what a root agent in the VM could do
    assert task(project, task_id)["state"] == "Running"  # the decoy's "completed" was not read
    logs = run_cli("logs", str(task_id), cwd=project)
    assert "a host file" not in logs.stdout
    assert run_cli("stop", "--yes", cwd=project).exit_code == 0
    assert task(project, task_id)["state"] == "Failed"
    assert sorted(p.name for p in decoy.iterdir()) == ["precious", "state", "stdout"]
    assert (decoy / "stdout").read_text() == "a host file\n"
    assert not (decoy / "cancel").exists()
    assert run_agentbox("logs", str(task_id), cwd=project).stdout == ""


def test_an_interactive_session_runs_in_a_worktree_of_its_own(project: Path, tasks_vm: FakeLima) -> None:
    from agentbox.session import worktrees

    assert worktrees.FOLDER == ".agentbox/worktrees"
    first = run_agentbox("claude", "--worktree", "fix-it", "--", "do:write:tracked.txt:in the worktree",
                         cwd=project)
    assert first.returncode == 0, first.stderr
    place = project / ".agentbox" / "worktrees" / "fix-it"
    report = json.loads(first.stdout.splitlines()[0])
    assert report["cwd"] == str(place)
    assert report["args"][-1] == "do:write:tracked.txt:in the worktree"
    assert "--worktree" not in report["args"]
    assert (place / "tracked.txt").read_text().endswith("in the worktree\n")
    assert "in the worktree" not in (project / "tracked.txt").read_text()
    assert git(place, "rev-parse", "--abbrev-ref", "HEAD").strip() == "agentbox/fix-it"
    assert ".agentbox" not in git(project, "status", "--short")
    again = run_agentbox("claude", "--worktree", "fix-it", "--", "do:write:tracked.txt:again", cwd=project)
    assert again.returncode == 0, again.stderr
    assert (place / "tracked.txt").read_text().endswith("in the worktree\nagain\n")  # the same worktree
    bad = run_cli("claude", "--worktree", "../escape", cwd=project)
    assert bad.exit_code == 2 and "is not a worktree name" in bad.stderr


def test_the_state_machine_refuses_every_move_it_does_not_have() -> None:
    from agentbox.tasks import transitions as taskstate

    allowed = {("Pending", "Queued"), ("Pending", "Failed"), ("Pending", "Cancelled"), ("Queued", "Running"),
               ("Queued", "Failed"), ("Queued", "Cancelled"), ("Running", "Completed"), ("Running", "Failed"),
               ("Running", "Timeout"), ("Running", "Cancelled")}
    for current in taskstate.STATES:
        for new in taskstate.STATES:
            if (current, new) in allowed:
                taskstate.check(current, new)
            else:
                with pytest.raises(taskstate.IllegalTransition):
                    taskstate.check(current, new)
    # A runner seen late: the states it went through, in order; none out of an ended state.
    assert taskstate.path_to("Pending", "Completed") == ["Queued", "Running", "Completed"]
    assert taskstate.path_to("Queued", "Cancelled") == ["Cancelled"]
    assert taskstate.path_to("Completed", "Running") == []


def test_a_task_is_refused_in_an_isolated_vm(project: Path, isolated_vm: FakeLima) -> None:
    result = run_cli("run", "do:exit:0", cwd=project)
    assert result.exit_code == 1
    assert "is isolated" in result.stderr
    assert isolated_vm.calls() == []
    assert listing(project) == []


def test_a_task_that_ends_is_a_desktop_notification_and_its_outputs_come_home(
    project: Path, tasks_vm: FakeLima, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sys.platform == "darwin":
        pytest.skip("the stand-in is Linux's notify-send")
    from agentbox.tasks import records as tasks

    log = notify_send_stand_in(tmp_path, monkeypatch)
    failing = run_task(project, "do:sleep:1;exit:3")
    completed = run_task(project, "do:sleep:1")
    cancelled = run_task(project, "do:sleep:60")
    assert run_cli("cancel", str(cancelled), cwd=project).exit_code == 0
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # a notification for the cancelled task would be there by now
    vm_name = f"agentbox-{project.name}"
    assert sorted(log.read_text().splitlines()) == sorted([
        f"--app-name=agentbox -- agentbox: task {failing} ended claude in {vm_name}: failed: exited with 3. "
        f"`agentbox logs {failing}` shows it.",
        f"--app-name=agentbox -- agentbox: task {completed} ended claude in {vm_name}: completed. "
        f"`agentbox logs {completed}` shows it."])
    # the watcher moved the outputs into the host's record without any agentbox command asking
    record = tasks.get(completed)
    assert record is not None and record.harvested and record.state == "Completed"
    assert b'"args"' in (tasks.folder(completed) / "stdout").read_bytes()


def test_notify_false_leaves_task_ends_quiet(project: Path, tasks_vm: FakeLima, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    log = notify_send_stand_in(tmp_path, monkeypatch)
    write(project / "agentbox.yml", "tasks:\n  maxConcurrent: 2\nnotify: false\n")
    task_id = run_task(project, "do:exit:0")
    assert wait(project, task_id).returncode == 0
    time.sleep(2)
    assert not log.exists()
    from agentbox.session import detached as sessions

    events = sessions.events_folder(f"agentbox-{project.name}")
    assert not list(events.glob("*.event"))  # no event (its live marker, kept for the network proxy, is gone too)
    assert not list(events.glob("live/*"))


def test_wait_on_a_task_whose_vm_was_deleted_under_it_answers_from_the_host(project: Path,
                                                                             tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "do:err:half way;sleep:120")
    running(project, task_id)
    subprocess.run(["limactl", "delete", "--force", NAME], check=True, capture_output=True)
    started = time.monotonic()
    assert wait(project, task_id).returncode == 1
    assert time.monotonic() - started < 20
    record = task(project, task_id)
    assert record["state"] == "Failed" and "no longer exists" in record["reason"]
    logs = run_agentbox("logs", str(task_id), cwd=project)
    assert logs.returncode == 0 and logs.stderr == "half way\n"  # what it wrote before, kept on the host


def test_tasks_json_is_as_documented(project: Path, tasks_vm: FakeLima) -> None:
    from datetime import datetime

    task_id = run_task(project, "--worktree", "--name", "doc", "--timeout", "10m", "do:exit:0;\nsecond line")
    assert wait(project, task_id).returncode == 0
    [record] = listing(project)
    assert set(record) == {"id", "name", "state", "exitCode", "reason", "agent", "vm", "workspace", "cwd", "argv",
                           "prompt", "timeoutSec", "created", "started", "ended", "transitions", "checkpoint",
                           "worktree", "branch", "base", "stdout", "stderr", "host", "isolated", "proposal",
                           "session", "seen", "unreachableSince", "forwardPort"}
    assert (record["id"], record["name"], record["state"], record["exitCode"], record["reason"]) == (
        task_id, "doc", "Completed", 0, None)
    assert (record["agent"], record["vm"], record["workspace"]) == ("claude", NAME, str(project))
    assert record["prompt"] == "do:exit:0;..." and "do:exit:0;\nsecond line" not in record["argv"]
    assert record["timeoutSec"] == 600 and record["branch"] == f"agentbox/task-{task_id}"
    assert record["base"] == git(project, "rev-parse", "HEAD").strip()
    times = [datetime.fromisoformat(record[key].replace("Z", "+00:00")) for key in ("created", "started", "ended")]
    assert times == sorted(times)
    assert [step["state"] for step in record["transitions"]] == ["Pending", "Queued", "Running", "Completed"]
    assert Path(record["stdout"]).is_file() and Path(record["stderr"]).is_file()
    assert isinstance(record["checkpoint"], int)  # the id `agentbox checkpoints` shows
    assert (record["host"], record["isolated"], record["proposal"]) == ("local", False, None)


def _rewrite_in_place(path: Path, old: str, new: str) -> None:
    """Change a record as an editor writing over it would: the same file, the same size, its mtime put back (only
    its inode's change time tells)."""
    before = path.stat()
    text = path.read_text()
    assert old in text and len(old) == len(new)
    with open(path, "r+") as handle:
        handle.write(text.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_a_record_changed_behind_the_listings_back_is_listed_as_it_is_now(project: Path, tasks_vm: FakeLima) -> None:
    """A listing keeps what it read in the tasks folder's cache; a record changed since, however quietly, is read
    again."""
    first = run_task(project, "--name", "first", "do:exit:0")
    second = run_task(project, "--name", "other", "do:exit:0")
    assert wait(project, first).returncode == 0 and wait(project, second).returncode == 0
    assert [t["name"] for t in listing(project)] == ["first", "other"]
    cache = paths.tasks_dir() / ".records-cache.json"
    assert cache.is_file() and cache.stat().st_mode & 0o777 == 0o600
    record = paths.tasks_dir() / str(first) / "task.json"
    _rewrite_in_place(record, '"name": "first"', '"name": "final"')
    assert [t["name"] for t in listing(project)] == ["final", "other"]
    # Replaced, as agentbox writes records (a new file), the same size and mtime again.
    before = record.stat()
    replaced = record.with_name("task.json.new")
    replaced.write_text(record.read_text().replace('"name": "final"', '"name": "fixed"'))
    os.utime(replaced, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replaced, record)
    shown = run_cli("tasks", cwd=project)
    assert shown.exit_code == 0, shown.stderr
    assert [line.split()[1] for line in shown.stdout.splitlines()[1:]] == ["fixed", "other"]
    # A cache that is not one (cut short, another version) is ignored and made anew.
    for broken in ('{"version": 1, "records": {', '{"version": 99, "records": {}}'):
        cache.write_text(broken)
        assert [t["name"] for t in listing(project)] == ["fixed", "other"]
        assert json.loads(cache.read_text())["version"] == 1


def test_a_record_that_cannot_be_read_is_named_and_the_others_listed(project: Path, tasks_vm: FakeLima) -> None:
    broken = run_task(project, "do:exit:0")
    fine = run_task(project, "do:exit:0")
    assert wait(project, broken).returncode == 0 and wait(project, fine).returncode == 0
    assert [t["id"] for t in listing(project)] == [broken, fine]  # both read, and kept in the cache
    record = paths.tasks_dir() / str(broken) / "task.json"
    for text, why in (('{"id": 1, "vm": ', "it is not valid JSON"),
                      ('{"id": 1}', "it is not a task record (a field is missing or of the wrong kind)")):
        record.write_text(text)
        for _ in range(2):  # the second time with the cache this listing wrote
            shown = run_cli("tasks", cwd=project)
            assert shown.exit_code == 0, shown.stderr
            assert [line.split()[0] for line in shown.stdout.splitlines()[1:]] == [str(fine)]
            assert shown.stderr == (f"agentbox: warning: task {broken}'s record {record} cannot be read: {why}; it is "
                                    f"left out of the tasks (remove the folder {record.parent} to forget it)\n")


@pytest.mark.parametrize("kind", ["control", "symlink", "fifo", "oversize"])
def test_the_runners_state_and_output_are_read_only_as_small_regular_files(project: Path, tasks_vm: FakeLima,
                                                                         tmp_path: Path, kind: str) -> None:
    """`agentbox tasks` and `agentbox logs` read the VM's state and stdout through vmread: a link, a FIFO (which
    must not block) or an oversize state file is not taken; the control, the same bytes as a small regular
    file, is."""
    from agentbox.tasks import records as tasks

    decoy = write(tmp_path / "decoy-state", "state=completed\nexit=0\n")
    host_out = write(tmp_path / "decoy-out", "a host file\n")
    task_id = run_task(project, "do:sleep:60")
    box = paths.vm_outbox(NAME) / "tasks" / str(task_id)
    running(project, task_id)
    for name in ("state", "stdout"):
        (box / name).unlink()
    if kind == "control":
        write(box / "state", decoy.read_text())
        write(box / "stdout", host_out.read_text())
    elif kind == "symlink":
        (box / "state").symlink_to(decoy)
        (box / "stdout").symlink_to(host_out)
    elif kind == "fifo":
        os.mkfifo(box / "state")
        os.mkfifo(box / "stdout")
    else:
        write(box / "state", decoy.read_text() + "#" * tasks.MAX_STATE_BYTES)
        write(box / "stdout", "")
    listed = run_agentbox("tasks", "--json", cwd=project, timeout=30)
    logs = run_agentbox("logs", str(task_id), cwd=project, timeout=30)
    assert listed.returncode == 0 and logs.returncode == 0, listed.stderr + logs.stderr
    state = next(t for t in json.loads(listed.stdout) if t["id"] == task_id)["state"]
    if kind == "control":
        assert state == "Completed" and logs.stdout == "a host file\n"
    else:
        assert state == "Running" and logs.stdout == ""
        assert run_cli("cancel", str(task_id), cwd=project).exit_code == 0


# -- a worktree agentbox made belongs to its project (issue 27, item 2) -----------------------------------


def _shell_call(vm: FakeLima) -> list[str]:
    return next(argv for argv in vm.calls() if "shell" in argv)


def test_a_launch_inside_a_worktree_uses_the_projects_vm_in_that_folder(project: Path, tasks_vm: FakeLima) -> None:
    made = run_agentbox("claude", "--worktree", "fix-it", "--", "do:write:tracked.txt:made", cwd=project)
    assert made.returncode == 0, made.stderr
    place = project / ".agentbox" / "worktrees" / "fix-it"
    assert (place / "agentbox.yml").is_file()  # the checked-out copy of the project's file is not read
    (place / "sub").mkdir()
    for where in (place, place / "sub"):
        tasks_vm.clear()
        inside = run_agentbox("claude", "--", "do:write:inside.txt:from inside", cwd=where)
        assert inside.returncode == 0, inside.stderr
        # A warm launch of the project's VM: no create or clone of agentbox-fix-it, no extra limactl call.
        assert tasks_vm.subcommands() == ["shell"]
        shell = _shell_call(tasks_vm)
        assert NAME in shell and not any("fix-it" in word for word in shell[:shell.index(NAME)])
        assert launch_workdir(shell) == str(where)
        assert json.loads(inside.stdout.splitlines()[0])["cwd"] == str(where)
        assert (where / "inside.txt").read_text() == "from inside\n"
    assert not (tasks_vm.home / "agentbox-fix-it").exists()
    status = run_cli("status", cwd=place)
    assert status.exit_code == 0, status.stderr
    assert NAME in status.stdout + status.stderr and "agentbox-fix-it" not in status.stdout + status.stderr


def test_a_worktree_session_has_checkpoints_of_its_own_for_diff_and_undo(project: Path, tasks_vm: FakeLima) -> None:
    made = run_agentbox("claude", "--worktree", "fix-it", "--", "do:write:tracked.txt:made", cwd=project)
    assert made.returncode == 0, made.stderr
    place = project / ".agentbox" / "worktrees" / "fix-it"
    in_worktree = run_cli("checkpoints", "--json", cwd=place)
    assert in_worktree.exit_code == 0, in_worktree.stderr
    assert [c["kind"] for c in json.loads(in_worktree.stdout)] == ["start", "end"]
    # The session made the worktree: its start checkpoint holds the fresh checkout, so diff shows the agent's work.
    diff = run_cli("diff", "--name-only", cwd=place)
    assert (diff.exit_code, diff.stdout) == (0, "tracked.txt\n"), diff.stderr
    assert json.loads(run_cli("checkpoints", "--json", cwd=project).stdout) == []  # the project's stay its own
    # A session launched inside the worktree checkpoints it too; undo there puts back the worktree only.
    (project / "edited-on-the-host.txt").write_text("new\n")
    inside = run_agentbox("claude", "--", "do:write:tracked.txt:again;write:added.txt:x", cwd=place)
    assert inside.returncode == 0, inside.stderr
    diff = run_cli("diff", "--name-only", cwd=place)
    assert (diff.exit_code, diff.stdout) == (0, "added.txt\ntracked.txt\n"), diff.stderr
    undone = run_cli("undo", "--clean", cwd=place)
    assert undone.exit_code == 0, undone.stderr
    assert (place / "tracked.txt").read_text().endswith("made\n") and not (place / "added.txt").exists()
    assert (project / "edited-on-the-host.txt").read_text() == "new\n"
    assert run_cli("diff", "--name-only", cwd=place).stdout == ""


def test_the_worktrees_agentbox_makes_raise_no_tripwire_alarm(project: Path, tasks_vm: FakeLima) -> None:
    made = run_agentbox("claude", "--worktree", "fix-it", "--", "do:exit:0", cwd=project)
    assert made.returncode == 0, made.stderr
    assert "WARNING" not in made.stderr and ".git/worktrees" not in made.stderr
    task_id = run_task(project, "--worktree", "--", "do:write:tracked.txt:from the task")
    assert wait(project, task_id).returncode == 0
    later = run_agentbox("claude", "--", "do:exit:0", cwd=project)
    assert later.returncode == 0, later.stderr
    assert ".git/worktrees" not in later.stderr and "not acknowledged" not in later.stderr
    assert run_cli("audit", cwd=project).exit_code == 0
    # Control: the agent pointing a worktree's note elsewhere is the full warning.
    moved = run_agentbox("claude", "--", "do:write:.git/worktrees/fix-it/gitdir:/elsewhere/.git", cwd=project)
    assert "agentbox: WARNING: the session changed 1 watched file that your host runs without asking: " \
           ".git/worktrees/fix-it/gitdir." in moved.stderr


def test_a_hand_made_worktree_lookalike_is_the_projects_folder_whatever_it_holds(project: Path, tasks_vm: FakeLima,
                                                                             tmp_path: Path) -> None:
    # Decided from the path: `.agentbox/worktrees/NAME` below the project. What the VM could have written
    # inside it (an agentbox.yml naming another VM, a .git file pointing at another repository) is not read.
    other = tmp_path / "other"
    make_repository(other, config="vm:\n  name: agentbox-other\n")
    lookalike = project / ".agentbox" / "worktrees" / "x"
    write(lookalike / "agentbox.yml", "vm:\n  name: agentbox-planted\n")
    launched = run_agentbox("claude", "--", "do:exit:0", cwd=lookalike)
    assert launched.returncode == 0, launched.stderr
    assert tasks_vm.subcommands() == ["list", "shell"]
    shell = _shell_call(tasks_vm)
    assert NAME in shell and launch_workdir(shell) == str(lookalike)
    write(lookalike / ".git", f"gitdir: {other}/.git\n")
    decided = run_cli("config", "--json", cwd=lookalike)
    assert decided.exit_code == 0, decided.stderr
    assert (json.loads(decided.stdout)["vm"]["name"], json.loads(decided.stdout)["workspace"]) == (NAME, str(project))
    # Control: the same shape below a folder that is no project (no agentbox.yml, no git work tree) is not
    # taken for a worktree: the nearest agentbox.yml decides as anywhere else.
    stray = tmp_path / "plain" / ".agentbox" / "worktrees" / "y"
    write(stray / "agentbox.yml", "vm:\n  name: agentbox-stray\n")
    shown = run_cli("config", "--json", cwd=stray)
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["vm"]["name"] == "agentbox-stray"


# -- run --worktree NAME, worktree tasks beside live ones, logs -f as it comes (issue 27, item 4) ---------


def test_run_worktree_name_runs_the_task_in_that_worktree_and_not_in_the_prompt(project: Path,
                                                                               tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "--worktree", "fix-it", "do:write:tracked.txt:from the task")
    assert wait(project, task_id).returncode == 0
    place = project / ".agentbox" / "worktrees" / "fix-it"
    record = task(project, task_id)
    assert (record["worktree"], record["branch"]) == (str(place), "agentbox/fix-it")
    report = json.loads(run_agentbox("logs", str(task_id), cwd=project).stdout.splitlines()[0])
    assert report["args"][-1] == "do:write:tracked.txt:from the task"  # NAME is not part of the prompt
    assert report["cwd"] == str(place)
    assert git(project, "show", "agentbox/fix-it:tracked.txt").endswith("from the task\n")
    # The same name again: the same worktree and branch, used again (as `agentbox claude --worktree` does).
    again = run_task(project, "--worktree", "fix-it", "do:write:tracked.txt:again")
    assert wait(project, again).returncode == 0
    assert (place / "tracked.txt").read_text().endswith("from the task\nagain\n")
    assert git(project, "show", "agentbox/fix-it:tracked.txt").endswith("from the task\nagain\n")
    # `--worktree` alone still gives the task a worktree of its own; a bad name is refused before anything runs.
    own = run_task(project, "--worktree", "--", "do:exit:0")
    assert task(project, own)["branch"] == f"agentbox/task-{own}"
    tasks_vm.clear()
    bad = run_cli("run", "--worktree", "../escape", "do:exit:0", cwd=project)
    assert bad.exit_code == 2 and "is not a worktree name" in bad.stderr
    assert tasks_vm.calls() == []


def test_a_worktree_task_starts_beside_a_live_tree_task_while_a_slot_is_free(project: Path, tasks_vm: FakeLima,
                                                                            tmp_path: Path) -> None:
    release = project / "release"
    live = run_task(project, f"do:await:{release}")
    try:
        running(project, live)
        waiting = run_task(project, "do:exit:0")  # a second live-tree task waits for the first one's tree
        side = run_task(project, "--worktree", "side", f"do:await:{release}")
        running(project, side)  # slots: 2, one taken; the waiting live-tree task holds it back no longer
        assert task(project, waiting)["state"] == "Queued"
    finally:
        release.write_text("")
    for task_id in (live, waiting, side):
        assert wait(project, task_id).returncode == 0
    assert task(project, waiting)["started"] >= task(project, live)["ended"]


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_logs_follow_shows_a_running_tasks_output_as_it_is_written(project: Path, tasks_vm: FakeLima,
                                                                    terminal: bool) -> None:
    release = project / "release"
    task_id = run_task(project, f"do:say:first line;err:on stderr;await:{release}")
    try:
        with Live(project, ["logs", "-f", str(task_id)], terminal=terminal) as follow:
            wait_for(follow.read, 30, "the task's lines in `logs -f`",
                     until=lambda out: b"first line\n" in out and b"on stderr\n" in out)
            assert task(project, task_id)["state"] == "Running" and follow.proc.poll() is None
            release.write_text("")
            assert follow.wait() == 0
    finally:
        release.write_text("")
    assert task(project, task_id)["state"] == "Completed"


def test_prune_removes_completed_tasks_and_asks_before_failed_ones(project: Path, tasks_vm: FakeLima) -> None:
    done = run_task(project, "--name", "fine", "do:exit:0")
    failed = run_task(project, "--name", "broke", "do:err:why it broke;exit:3")
    assert wait(project, done).returncode == 0 and wait(project, failed).returncode == 3

    scripted = run_cli("tasks", "prune", cwd=project)  # no terminal, no --yes: the failed task stays, and why
    assert scripted.exit_code == 0, scripted.stderr
    assert [t["id"] for t in listing(project)] == [failed]
    assert scripted.stderr == (
        f"agentbox: warning: kept task {failed} (broke): it ended without success, and there is no terminal to ask "
        "whether to remove it; `agentbox tasks prune --yes` removes it too\n"
        f"agentbox: removed task {done} (fine) (Completed)\n")

    code, said = on_terminal(project, ["tasks", "prune"], b"n\n")
    assert code == 0, said
    assert f"  task {failed} (broke): Failed (exit 3)" in said and "[y/N]" in said
    assert "agentbox: kept the failed task" in said and "Aborted" not in said
    assert [t["id"] for t in listing(project)] == [failed]
    assert run_agentbox("logs", str(failed), cwd=project).stderr == "why it broke\n"

    code, said = on_terminal(project, ["tasks", "prune"], b"y\n")
    assert code == 0, said
    assert f"agentbox: removed task {failed} (broke) (Failed)" in said
    assert listing(project) == []


def test_prune_yes_removes_failed_tasks_from_a_script(project: Path, tasks_vm: FakeLima) -> None:
    failed = run_task(project, "--timeout", "1s", "do:sleep:30")
    assert wait(project, failed).returncode == 124
    pruned = run_cli("tasks", "prune", "--yes", cwd=project)
    assert pruned.exit_code == 0, pruned.stderr
    assert pruned.stderr == f"agentbox: removed task {failed} (Timeout)\n"
    assert listing(project) == []
