"""The signed report each session and background task leaves (agentbox.session.endreport), through the CLI:
`agentbox report [ID | --last] [--json]`, `report export --since DATE`, `report verify` (agentbox.review.reportcheck).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import paths
from agentbox.net import pushes
from tests.helpers import NAME, FakeLima, agentbox, git, make_repository, run_agentbox, run_cli, wait_for, write
from tests.test_broker_report import BROKER_ON, FOREIGN, REQUESTS, host_logins, upstream  # noqa: F401 (fixtures)
from tests.test_launch_plan import SETTLE, configure, launch
from tests.test_sessions import install
from tests.test_tasks import TASK_AGENT

pytestmark = pytest.mark.timeout(180)

NAMESPACE = f"refs/heads/agentbox/{NAME}/"
ZERO = "0" * 40
SHA_A = "1a2b3c4d" + "a" * 32

# The session: changes files, waits while the broker records a push (the test stands in for GitHub's side), sends one
# request the broker substitutes and one it refuses, and plants .envrc (the tripwire).
SESSION = """set -e
echo new > added.txt
echo changed > tracked.txt
rm deleted.txt
echo 'export X=1' > .envrc
touch .pushing
while [ ! -e .pushed ]; do sleep 0.05; done
python3 -c "$1" "Bearer LOGIN" "Bearer $2"
"""


def reports() -> Path:
    return paths.state_dir() / "reports"


def last(project: Path) -> dict:
    result = run_cli("report", "--last", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_sessions_report_has_its_files_network_broker_pushes_and_tripwire(
        project: Path, vm: FakeLima, upstream, host_logins) -> None:  # noqa: F811
    make_repository(project, config=BROKER_ON)
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work in progress")
    ledger = pushes.ledger_path(NAME)
    ledger.parent.mkdir(parents=True, exist_ok=True)  # an earlier session's push: not this report's
    ledger.write_text(json.dumps({"time": "2020-01-01T00:00:00Z", "outcome": "ok",
                                  "updates": [{"ref": NAMESPACE + "old", "old": ZERO, "new": SHA_A}]}) + "\n")
    log = paths.vm_state_dir(NAME) / "network" / "log.jsonl"  # an earlier window's request: not this report's
    write(log, json.dumps({"time": "2020-01-01T00:00:00Z", "host": "earlier.example", "decision": "deny",
                           "bytes_up": 5, "bytes_down": 0}) + "\n")
    session = subprocess.Popen([sys.executable, "-m", "agentbox", "shell", "--", "bash", "-c", SESSION, "s",
                                REQUESTS, FOREIGN], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_for(lambda: (project / ".pushing").exists(), 60, "the session to push")
        pushes.Ledger(NAME).record([(NAMESPACE + "fix", ZERO, SHA_A)], "ok")  # as the broker records a push
        (project / ".pushed").touch()
        out, err = session.communicate(timeout=120)
    finally:
        session.kill()
    assert session.returncode == 0, err
    assert out.split()[-2:] == ["200", "403"]

    record = last(project)
    assert (record["kind"], record["vm"], record["workspace"], record["state"], record["exitCode"]) == (
        "session", NAME, str(project), "ended", 0)
    assert record["mode"] == {"work": "live", "network": "open"} and record["kept"] is False
    assert record["started"] <= record["ended"] and record["ended"].endswith("Z")
    assert record["checkpoints"]["start"] is not None and record["checkpoints"]["end"] is not None
    files = record["files"]
    assert (files["added"], files["modified"], files["removed"]) == (4, 1, 1)
    assert files["paths"] == [".envrc", ".pushed", ".pushing", "added.txt", "deleted.txt", "tracked.txt"]
    network = record["network"]
    assert [row["host"] for row in network["hosts"]] == ["api.anthropic.com"]
    assert network["denials"] == 1 and network["leaks"] == 0 and network["uploadCapRefusals"] == 0
    assert network["up"] > 0 and network["down"] > 0
    broker = record["broker"]
    assert (broker["substitutions"], broker["refusals"]) == (1, 1)
    assert broker["pushes"] == [{"time": broker["pushes"][0]["time"], "outcome": "ok", "refs": [NAMESPACE + "fix"]}]
    assert {"path": ".envrc", "change": "added"} in record["tripwire"]["changed"]
    assert record["heldInstructions"] == []
    assert FOREIGN not in json.dumps(record)

    shown = run_cli("report", "--last", cwd=project)
    assert shown.exit_code == 0, shown.stderr
    assert f"report {record['seq']} ({record['id']}): session of " in shown.stdout
    assert "  files:        4 added, 1 modified, 1 removed: .envrc, " in shown.stdout
    assert f"    push ok: {NAMESPACE}fix" in shown.stdout
    assert "  tripwire:     .envrc (added)" in shown.stdout
    assert run_cli("report", record["id"], "--json", cwd=project).stdout == run_cli(
        "report", "--last", "--json", cwd=project).stdout


def test_a_launch_from_its_plan_leaves_a_report_too(project: Path, vm: FakeLima) -> None:
    configure(project)
    launches = 0
    for _ in range(4):  # as planned_launch: until one runs from its plan
        vm.clear()
        ran = launch(project, "codex", "exec", "hi")
        launches += 1
        if ran.planned:
            break
        time.sleep(SETTLE)
    assert ran.planned and ran.result.returncode == 0
    records = json.loads(run_cli("report", "--json", cwd=project).stdout)
    assert len(records) == launches  # one each: the full launches and the one from the plan
    newest = records[0]
    assert (newest["kind"], newest["agent"], newest["mode"], newest["exitCode"], newest["state"]) == (
        "session", "codex", {"work": "live", "network": "open"}, 0, "ended")
    assert [record["seq"] for record in records] == sorted((record["seq"] for record in records), reverse=True)
    assert run_agentbox("report", "verify", cwd=project).returncode == 0


def test_a_detached_sessions_report_is_written_when_the_launch_returns_as_running(project: Path,
                                                                                  vm: FakeLima) -> None:
    install(vm)
    started = run_agentbox("claude", "--detach", cwd=project, timeout=120)
    assert started.returncode == 0, started.stderr
    record = last(project)
    assert (record["kind"], record["agent"], record["kept"], record["state"], record["ended"], record["exitCode"]) \
        == ("session", "claude", True, "running", None, None)
    assert "  mode:         live, network open, kept (detached)" in run_cli("report", "--last", cwd=project).stdout


@pytest.mark.xdist_group("tasks")
def test_a_background_task_leaves_a_report(project: Path, vm: FakeLima) -> None:
    make_repository(project, config="")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work in progress")
    write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / "claude", TASK_AGENT, mode=0o755)
    started = run_cli("run", "do:write:out.txt:hi;exit:3", cwd=project)
    assert started.exit_code == 0, started.stderr
    task_id = int(started.stdout.strip())
    assert run_agentbox("wait", str(task_id), cwd=project, timeout=90).returncode == 3
    record = last(project)
    assert (record["kind"], record["task"], record["agent"], record["state"], record["exitCode"]) == (
        "task", task_id, "claude", "Failed", 3)
    assert record["checkpoints"]["start"] is not None and record["mode"]["work"] == "live"


# -- the chain ---------------------------------------------------------------------------------------------------


@pytest.fixture
def chain(project: Path, vm: FakeLima) -> list[dict]:
    """Four sessions' reports (a folder that is no git repository: no checkpoints to wait for)."""
    write(project / "agentbox.yml", "")
    for code in range(4):
        assert agentbox(project, "shell", "--", "sh", "-c", f"exit {code}").returncode == code
    result = run_cli("report", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    records = json.loads(result.stdout)
    assert [(record["seq"], record["exitCode"]) for record in records] == [(4, 3), (3, 2), (2, 1), (1, 0)]
    return records


def verify(project: Path) -> subprocess.CompletedProcess:
    return run_agentbox("report", "verify", cwd=project)


def test_verify_passes_then_names_an_edited_record_a_gap_and_removed_newest(project: Path, chain: list[dict]) -> None:
    whole = verify(project)
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.startswith("all 4 reports verified: signatures, chain and head intact")

    second = reports() / "00000002.json"
    kept = second.read_bytes()
    second.write_bytes(kept.replace(b'"exitCode":1', b'"exitCode":0'))
    edited = verify(project)
    assert edited.returncode == 1 and "Traceback" not in edited.stderr
    assert edited.stdout.splitlines() == [
        f"record 2 (file {second}): its content was changed after it was written (its signature does not match)"]

    second.unlink()
    (reports() / "00000003.json").unlink()
    gap = verify(project)
    assert gap.returncode == 1 and gap.stdout.splitlines() == ["records 2\u20133 are missing"]

    second.write_bytes(kept)
    newest = reports() / "00000004.json"
    newest.unlink()
    gone = verify(project)
    assert gone.returncode == 1
    assert "the newest record(s) after 2 were removed (records 3\u20134; the head says 4 is the newest)" in gone.stdout


def test_a_record_moved_to_another_seq_is_named(project: Path, chain: list[dict]) -> None:
    os.replace(reports() / "00000004.json", reports() / "00000005.json")
    (reports() / "00000003.json").rename(reports() / "00000004.json")
    result = verify(project)
    assert result.returncode == 1
    assert "record 3 is missing" in result.stdout
    assert f"record 4 (file {reports() / '00000004.json'}) is a signed record 3 under another name" in result.stdout


def test_a_corrupt_report_file_is_named_by_every_sub_command(project: Path, chain: list[dict]) -> None:
    broken = reports() / "00000003.json"
    broken.write_bytes(b"{not json")
    named = f"the report file {broken} is not a report (not valid JSON"
    listing = run_agentbox("report", cwd=project)
    assert listing.returncode == 0 and named in listing.stderr and "Traceback" not in listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == ["ID", "4", "2", "1"]
    one = run_agentbox("report", "3", cwd=project)
    assert one.returncode == 1 and f"the report file {broken} cannot be read: not valid JSON" in one.stderr
    assert "Traceback" not in one.stderr
    exported = run_agentbox("report", "export", "--since", "2000-01-01", cwd=project)
    assert exported.returncode == 1 and named in exported.stderr
    assert [json.loads(line)["seq"] for line in exported.stdout.splitlines()] == [1, 2, 4]
    checked = verify(project)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr
    assert f"record 3 (file {broken}) cannot be read: not valid JSON" in checked.stdout


def test_export_writes_json_lines_since_a_day_or_a_moment(project: Path, chain: list[dict], tmp_path: Path) -> None:
    today = time.strftime("%Y-%m-%d", time.gmtime())
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    out = tmp_path / "reports.jsonl"
    assert run_cli("report", "export", "--since", today, "-o", str(out), cwd=project).exit_code == 0
    lines = out.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3, 4] and out.stat().st_mode & 0o777 == 0o600
    assert run_cli("report", "export", "--since", tomorrow, cwd=project).stdout == ""
    third = chain[1]
    later = run_cli("report", "export", "--since", third["ended"], cwd=project)
    assert [json.loads(line)["seq"] for line in later.stdout.splitlines()] == [
        record["seq"] for record in reversed(chain) if record["ended"] >= third["ended"]]
    bad = run_cli("report", "export", "--since", "30/11/2026", cwd=project)
    assert bad.exit_code == 2
    assert "--since '30/11/2026' is not a date" in bad.stderr and "YYYY-MM-DD" in bad.stderr


def test_the_listing_stays_a_table_at_80_columns(project: Path, chain: list[dict]) -> None:
    result = run_agentbox("report", "--all", cwd=project, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "ENDED", "AGENT", "KIND", "EXIT", "FILES", "REFUSED", "TRIPWIRE", "WORKSPACE"]
    assert len(lines) == 5 and all(len(line) <= 80 for line in lines)
