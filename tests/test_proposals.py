"""Proposals through the CLI and the limactl double: what an isolated session leaves is filed, listed, reviewed,
applied (only when safe, and atomically) or rejected; each step lands in the event log."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox import staginglayout
from agentbox.review import isolation, proposals
from tests.helpers import (
    NAME,
    FakeLima,
    agentbox,
    copy_in_guest,
    git,
    install_agent,
    returns_within,
    snapshot_tree,
    write,
)

# A stand-in agent that skips launch.sh's own collection: it plants a patch (from the guest's /tmp) and the
# copy's real base in its outbox folder, then kills launch.sh, as a hostile agent could.
PLANTING_AGENT = r"""#!/bin/bash
out="$(dirname "$AGENTBOX_SUMMARY")"
cp /tmp/planted.patch "$out/changes.patch"
[ ! -e /tmp/planted-summary ] || cp /tmp/planted-summary "$out/summary.md"
if [ -e /tmp/planted-base ]; then cp /tmp/planted-base "$out/base"; else cp ~/.agentbox/isolated/base "$out/base"; fi
kill -KILL "$PPID"
"""


def session_folders() -> list[str]:
    """The isolated sessions' folders left in the VM's outbox (write-back's creds/ lives there too)."""
    return [name for name in os.listdir(isolation.outbox(NAME)) if name != staginglayout.OUTBOX_CREDS]


def workspace_state(project: Path) -> dict[str, object]:
    """The workspace as the user sees it: every file and link (not .git), plus HEAD, the index and the branch."""
    return {
        "tree": snapshot_tree(project),
        "head": (project / ".git" / "HEAD").read_bytes(),
        "index": (project / ".git" / "index").read_bytes(),
        "refs": sorted(p.name for p in (project / ".git" / "refs" / "heads").iterdir()),
    }


def events(project: Path) -> list[dict[str, object]]:
    path = proposals.events_file(project)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def proposal_list(project: Path) -> list[dict[str, object]]:
    result = agentbox(project, "proposals", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def plant(limactl: FakeLima, patch: bytes, summary: bytes | None = None) -> None:
    tmp = limactl.home / NAME / "guestfs" / "tmp"
    (tmp / "planted.patch").write_bytes(patch)
    if summary is not None:
        (tmp / "planted-summary").write_bytes(summary)
    install_agent(limactl, PLANTING_AGENT)


def blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def added_file(path: str, content: bytes = b"x\n", mode: str = "100644") -> bytes:
    """The patch git writes for one new file, with the path as given (git would never write some of these)."""
    body = b"".join(b"+" + line + b"\n" for line in content.split(b"\n")[:-1])
    lines = content.count(b"\n")
    return (f"diff --git a/{path} b/{path}\nnew file mode {mode}\nindex {'0' * 40}..{blob_id(content)}\n"
            f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{lines} @@\n").encode() + body


def git_patch(tmp_path: Path, build: str) -> bytes:
    """The patch real git makes for what the shell command `build` adds to an empty repository."""
    repo = tmp_path / "patch-source"
    repo.mkdir()
    git(repo, "init", "-q")
    subprocess.run(["bash", "-c", build], cwd=repo, check=True)
    git(repo, "add", "-A")
    return subprocess.run([*["git"], "diff", "--cached", "--binary", "--full-index", "--no-renames"], cwd=repo,
                          check=True, capture_output=True).stdout


# -- the whole cycle ----------------------------------------------------------------------------


def test_a_session_becomes_a_proposal_that_applies_to_exactly_the_copy(project: Path, isolated_vm: FakeLima) -> None:
    result = agentbox(project, "claude")
    assert result.returncode == 0, result.stderr
    assert (f"agentbox: proposal 1: 9 files changed; `agentbox review` shows it, `agentbox apply` applies it to "
            f"{project}\n") in result.stderr
    listed = proposal_list(project)
    assert [(p["id"], p["status"], p["agent"]) for p in listed] == [(1, "pending", "claude")]
    record = listed[0]
    assert sorted((f["status"], f["path"]) for f in record["files"]) == [
        ("added", "created file.txt"), ("added", "data.bin"), ("added", "link.txt"), ("added", "src/added.py"),
        ("deleted", "deleted.txt"), ("deleted", "untracked.txt"), ("mode", "script.sh"),
        ("modified", "modified.txt"), ("modified", "tracked.txt"),
    ]
    assert record["base"]["head"] == git(project, "rev-parse", "HEAD").strip()
    assert record["base"]["tree"] and record["base"]["commit"] != record["base"]["head"]
    assert record["patchSha256"] == hashlib.sha256(
        (proposals.folder(project) / "1" / "changes.patch").read_bytes()).hexdigest()
    assert (proposals.folder(project) / "1" / "summary.md").read_text() == (
        "# Tidy the files\n\nChanged, created and deleted some.\n")
    text = agentbox(project, "proposals")
    assert text.returncode == 0
    assert text.stdout.splitlines()[1].split()[:3] == ["1", "pending", "claude"]
    assert text.stdout.rstrip().endswith("Tidy the files")
    # Nothing is left in the outbox.
    assert session_folders() == []

    review = agentbox(project, "review")
    assert review.returncode == 0, review.stderr
    assert "# Tidy the files" in review.stdout
    assert "diff --git a/tracked.txt b/tracked.txt" in review.stdout
    assert "apply refuses it" not in review.stdout

    before_apply = snapshot_tree(project)
    applied = agentbox(project, "apply")
    assert applied.returncode == 0, applied.stderr
    copy = snapshot_tree(copy_in_guest(isolated_vm, project), skip=(".git", "build"))
    assert snapshot_tree(project, skip=(".git", "build")) == copy
    assert snapshot_tree(project)["build/out.o"] == before_apply["build/out.o"]  # ignored files stay
    assert "build/new.o" not in snapshot_tree(project)  # what the agent made there is ignored: not proposed
    assert git(project, "status", "--short", "tracked.txt") == " M tracked.txt\n"  # the user's index is theirs
    record = proposal_list(project)[0]
    assert record["status"] == "applied" and isinstance(record["checkpoint"], int)
    assert f"checkpoint {record['checkpoint']} holds the workspace as it was before" in applied.stderr
    assert [e["event"] for e in events(project)] == ["proposal_created", "proposal_reviewed", "proposal_applied"]
    assert events(project)[-1]["checkpoint"] == record["checkpoint"]

    again = agentbox(project, "apply", "1")
    assert again.returncode == 1
    assert "agentbox: error: proposal 1 was applied already" in again.stderr


def test_an_agent_summary_is_optional_and_a_session_without_changes_leaves_nothing(
        project: Path, isolated_vm: FakeLima) -> None:
    result = agentbox(project, "shell", "--isolated", "--", "bash", "-c", "echo more >> tracked.txt")
    assert result.returncode == 0, result.stderr
    summary = (proposals.folder(project) / "1" / "summary.md").read_text()
    assert summary.startswith("# Changes from an isolated session of shell\n")
    assert "- modified: tracked.txt\n" in summary
    assert proposal_list(project)[0]["summary"] == "generated"
    nothing = agentbox(project, "shell", "--", "true")  # the copy carries over, as proposal 1 filed it
    assert "the session changed nothing in the workspace copy since proposal 1: no new proposal" in nothing.stderr
    assert [p["status"] for p in proposal_list(project)] == ["pending"]


def test_the_exit_code_and_the_proposal_survive_a_failing_agent(project: Path, isolated_vm: FakeLima) -> None:
    result = agentbox(project, "shell", "--", "bash", "-c", "echo x > new.txt; exit 3")
    assert result.returncode == 3
    assert [f["path"] for f in proposal_list(project)[0]["files"]] == ["new.txt"]


def test_ctrl_c_ends_the_agent_and_its_changes_still_become_a_proposal(project: Path, isolated_vm: FakeLima) -> None:
    """A terminal's Ctrl-C reaches launch.sh and the agent alike (one process group): here the agent sends it."""
    result = agentbox(project, "shell", "--", "bash", "-c", "echo x > new.txt; kill -INT $PPID $$; sleep 5")
    assert result.returncode == 130, result.stderr
    assert [f["path"] for f in proposal_list(project)[0]["files"]] == ["new.txt"]


# -- refusals, with the workspace left exactly as it was ------------------------------------------


CORPUS = {
    "absolute": (lambda tmp: added_file("/tmp/evil"), "absolute path"),
    "dotdot": (lambda tmp: added_file("../outside.txt"), "`..` component"),
    "git hook": (lambda tmp: added_file(".git/hooks/pre-commit", b"#!/bin/sh\ntouch pwned\n", "100755"),
                 "inside a git folder"),
    "nested git config": (lambda tmp: added_file("sub/.GIT/config"), "inside a git folder"),
    "symlink to /": (lambda tmp: git_patch(tmp, "ln -s / evil"), "symbolic link to an absolute path"),
    "symlink out": (lambda tmp: git_patch(tmp, "ln -s ../../.. up"), "leads out of the tree"),
    "makefile": (lambda tmp: git_patch(tmp, "printf 'all:\\n\\ttouch pwned\\n' > Makefile"), "your host runs"),
    "crlf name": (lambda tmp: git_patch(tmp, "printf 'x\\n' > \"$(printf 'crlf\\r')\""), "control character"),
    "not a patch": (lambda tmp: b"rm -rf ~\n", "the patch cannot be read"),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_hostile_patch_is_refused_and_the_workspace_stays_as_it_was(
        project: Path, isolated_vm: FakeLima, tmp_path: Path, case: str) -> None:
    make_patch, reason = CORPUS[case]
    plant(isolated_vm, make_patch(tmp_path))
    session = agentbox(project, "claude")
    assert session.returncode == 255, session.stderr  # the agent killed launch.sh: ssh gives no status
    assert "agentbox: warning: apply will refuse proposal 1 as it is: " in session.stderr
    assert [p["status"] for p in proposal_list(project)] == ["pending"]
    before = workspace_state(project)
    for extra in ([], ["--3way"], ["--check"]):
        refused = agentbox(project, "apply", *extra)
        assert refused.returncode == 1, refused.stdout
        assert "agentbox: error: proposal 1 is refused; nothing was changed in" in refused.stderr
        assert reason in refused.stderr
        assert workspace_state(project) == before
    assert not (project.parent / "outside.txt").exists() and not Path("/tmp/evil").exists()
    review = agentbox(project, "review")
    assert "apply refuses it:" in review.stdout and reason in review.stdout
    assert proposal_list(project)[0]["status"] == "pending"


def test_a_change_to_a_file_the_host_runs_applies_only_when_allowed(
        project: Path, isolated_vm: FakeLima, tmp_path: Path) -> None:
    plant(isolated_vm, git_patch(tmp_path, "printf 'all:\\n\\ttrue\\n' > Makefile"))
    agentbox(project, "claude")
    review = agentbox(project, "review")
    assert "added     Makefile  <- YOUR HOST RUNS THIS FILE" in review.stdout
    assert agentbox(project, "apply").returncode == 1
    assert not (project / "Makefile").exists()
    allowed = agentbox(project, "apply", "--allow-host-exec")
    assert allowed.returncode == 0, allowed.stderr
    assert (project / "Makefile").read_text() == "all:\n\ttrue\n"


def test_a_patch_edited_after_it_was_filed_is_refused(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent > tracked.txt").returncode == 0
    stored = proposals.folder(project) / "1" / "changes.patch"
    stored.write_bytes(stored.read_bytes().replace(b"+agent", b"+evil!"))
    before = workspace_state(project)
    refused = agentbox(project, "apply")
    assert refused.returncode == 1
    assert (f"agentbox: error: proposal 1: {stored} was changed after agentbox collected it (its sha256 is not the "
            "one recorded then), so agentbox will not apply it\n") in refused.stderr
    assert workspace_state(project) == before


def test_a_base_agentbox_did_not_give_is_not_believed(project: Path, isolated_vm: FakeLima) -> None:
    plant(isolated_vm, added_file("new.txt"))
    (isolated_vm.home / NAME / "guestfs" / "tmp" / "planted-base").write_text("0" * 40 + "\n")
    session = agentbox(project, "claude")
    assert "names a base agentbox did not give agentbox-myproject" in session.stderr
    assert proposal_list(project) == []


def test_an_unfinished_outbox_is_dropped_and_said(project: Path, isolated_vm: FakeLima) -> None:
    install_agent(isolated_vm, '#!/bin/bash\necho partial > "$AGENTBOX_SUMMARY"\nkill -KILL "$PPID"\n')
    result = agentbox(project, "claude")
    assert result.returncode == 255
    assert (f"agentbox: the session's changes were not collected (the launch step ended early); they stay in the "
            f"VM's copy at {project}\n") in result.stderr
    # ssh's 255 cannot tell a killed launch step from a lost connection, behind which it may still write: the
    # folder is kept (not collected), and said.
    assert len(session_folders()) == 1
    assert proposal_list(project) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo", "huge"])
def test_outbox_files_are_read_safely(project: Path, isolated_vm: FakeLima, kind: str) -> None:
    make = {
        "symlink": 'ln -s /etc/passwd "$out/changes.patch"',
        "fifo": 'mkfifo "$out/changes.patch"',
        "huge": 'truncate -s 65M "$out/changes.patch"',
    }[kind]
    install_agent(isolated_vm, "#!/bin/bash\n" + 'out="$(dirname "$AGENTBOX_SUMMARY")"\n' + make + "\n"
                  'cp ~/.agentbox/isolated/base "$out/base"\nkill -KILL "$PPID"\n')
    result = returns_within(120, lambda: agentbox(project, "claude"))
    assert "its changes are not taken (they stay in the VM's copy)" in result.stderr
    assert {"symlink": "is a symbolic link, which agentbox does not follow", "fifo": "is a FIFO (named pipe), not a regular file",
            "huge": "is larger than 67,108,864 bytes, the most agentbox reads"}[kind] in result.stderr
    assert proposal_list(project) == []
    assert session_folders() == []


def test_apply_on_a_dirty_tree_that_conflicts_is_refused(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent > tracked.txt").returncode == 0
    write(project / "tracked.txt", "the user's own edit\n")
    before = workspace_state(project)
    refused = agentbox(project, "apply")
    assert refused.returncode == 1
    assert "tracked.txt" in refused.stderr
    assert workspace_state(project) == before
    assert proposal_list(project)[0]["status"] == "pending"


def test_a_moved_head_needs_3way_which_refuses_conflicts(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent >> tracked.txt").returncode == 0
    base_head = git(project, "rev-parse", "HEAD").strip()
    write(project / "other.txt", "unrelated\n")
    git(project, "add", "other.txt")
    git(project, "commit", "-qm", "moved on")
    before = workspace_state(project)
    refused = agentbox(project, "apply")
    assert refused.returncode == 1
    assert (f"agentbox: error: HEAD moved since proposal 1 was made (from {base_head[:12]} to "
            f"{git(project, 'rev-parse', 'HEAD').strip()[:12]})") in refused.stderr
    assert "agentbox apply 1 --3way" in refused.stderr
    assert workspace_state(project) == before
    merged = agentbox(project, "apply", "--3way")
    assert merged.returncode == 0, merged.stderr
    assert (project / "tracked.txt").read_text() == "one\nagent\n"
    assert (project / "other.txt").read_text() == "unrelated\n"

    # A three-way merge that conflicts is refused whole: no conflict markers are left behind.
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent2 > tracked.txt").returncode == 0
    write(project / "tracked.txt", "user\n")
    git(project, "commit", "-qam", "user edit")
    before = workspace_state(project)
    conflict = agentbox(project, "apply", "--3way")
    assert conflict.returncode == 1, conflict.stderr
    assert workspace_state(project) == before
    assert b"<<<<<<<" not in (project / "tracked.txt").read_bytes()


def test_reject_keeps_the_files_and_the_next_session_starts_afresh(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent > scratch.txt").returncode == 0
    rejected = agentbox(project, "reject")
    assert rejected.returncode == 0, rejected.stderr
    assert f"rejected proposal 1; its files stay in {proposals.folder(project) / '1'}" in rejected.stderr
    assert (proposals.folder(project) / "1" / "changes.patch").exists()
    assert proposal_list(project)[0]["status"] == "rejected"
    assert [e["event"] for e in events(project)] == ["proposal_created", "proposal_rejected"]
    fresh = agentbox(project, "shell", "--", "bash", "-c", "ls scratch.txt 2>&1 || true")
    assert "copying the workspace" in fresh.stderr
    assert "No such file" in fresh.stdout
    nothing = agentbox(project, "reject")
    assert nothing.returncode == 1
    assert "no pending proposal" in nothing.stderr


def test_review_escapes_on_a_terminal_and_is_raw_when_piped(project: Path, isolated_vm: FakeLima) -> None:
    plant(isolated_vm, added_file("new.txt"), summary=b"# Done \x1b[2J\x1b]0;owned\x07\n")
    agentbox(project, "claude")
    piped = subprocess.run([sys.executable, "-m", "agentbox", "review"], cwd=project, capture_output=True,
                           timeout=60)
    assert b"# Done \x1b[2J\x1b]0;owned\x07\n" in piped.stdout
    main, child = pty.openpty()
    env = {**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm"}
    with subprocess.Popen([sys.executable, "-m", "agentbox", "review"], cwd=project, stdin=subprocess.DEVNULL,
                          stdout=child, stderr=subprocess.DEVNULL, env=env) as proc:
        os.close(child)
        shown = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        proc.wait(timeout=60)
    os.close(main)
    assert b"# Done \\x1b[2J\\x1b]0;owned\\x07" in shown
    assert b"\x1b[2J" not in shown and b"\x1b]" not in shown and b"\x07" not in shown
    assert b"\x1b[32m+x\x1b[0m" in shown  # the patch is coloured, line by line


# -- the type of a changed file is the host's, never the patch's ---------------------------------------


def git_change(tmp_path: Path, before: str, after: str) -> bytes:
    """The patch real git makes for the shell command `after` run on what `before` built (and committed)."""
    repo = tmp_path / "change-source"
    repo.mkdir()
    git(repo, "init", "-q")
    subprocess.run(["bash", "-c", before], cwd=repo, check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "before", "--allow-empty")
    subprocess.run(["bash", "-c", after], cwd=repo, check=True)
    git(repo, "add", "-A")
    return subprocess.run(["git", "diff", "--cached", "--binary", "--full-index", "--no-renames"], cwd=repo,
                          check=True, capture_output=True).stdout


# The host's workspace gets `link -> tracked.txt` and `linked -> <a folder outside the tree>` before the session.
LINK_CASES = {
    # git apply keeps the host's type when the index line names no mode: the link would point at /etc/passwd.
    "mode-less index on a host link": (
        lambda tmp: git_change(tmp, "ln -s tracked.txt link", "ln -sfn /etc/passwd link").replace(b" 120000\n", b"\n"),
        "link: changed by a patch whose `index` line names no file mode"),
    "a host link claimed as a regular file": (
        lambda tmp: git_change(tmp, "ln -s tracked.txt link", "ln -sfn /etc/passwd link").replace(b" 120000\n",
                                                                                                 b" 100644\n"),
        "link: the patch takes it for a regular file, but on your host it is a symbolic link"),
    "a host link claimed as a regular file, retargeted inside the tree": (
        lambda tmp: git_change(tmp, "ln -s tracked.txt link", "ln -sfn modified.txt link").replace(b" 120000\n",
                                                                                                  b" 100644\n"),
        "link: the patch takes it for a regular file, but on your host it is a symbolic link"),
    "a file added through a folder that is a link on the host": (
        lambda tmp: git_change(tmp, "true", "mkdir linked; echo evil > linked/new.txt"),
        "linked/new.txt: inside linked, which is a symbolic link on your host"),
    "a file changed through a folder that is a link on the host": (
        lambda tmp: git_change(tmp, "mkdir linked; echo x > linked/f.txt", "echo evil > linked/f.txt"),
        "linked/f.txt: inside linked, which is a symbolic link on your host"),
    "a file added where the host has a link": (
        lambda tmp: git_change(tmp, "true", "echo evil > link"),
        "link: already a symbolic link on your host, which the patch does not remove"),
}


def plant_host_links(project: Path, outside: Path) -> None:
    outside.mkdir()
    write(outside / "f.txt", "outside\n")
    os.symlink("tracked.txt", project / "link")
    os.symlink(outside, project / "linked")


@pytest.mark.parametrize("case", sorted(LINK_CASES))
def test_a_host_link_is_typed_by_the_host_whatever_the_patch_says(
        project: Path, isolated_vm: FakeLima, tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    plant_host_links(project, outside)
    make_patch, reason = LINK_CASES[case]
    plant(isolated_vm, make_patch(tmp_path))
    session = agentbox(project, "claude")
    assert session.returncode == 255, session.stderr
    assert f"agentbox: warning: apply will refuse proposal 1 as it is: {reason}" in session.stderr
    before = workspace_state(project)
    outside_before = snapshot_tree(outside)
    for extra in ([], ["--3way"], ["--check"]):
        refused = agentbox(project, "apply", *extra)
        assert refused.returncode == 1, refused.stdout
        assert "agentbox: error: proposal 1 is refused; nothing was changed in" in refused.stderr
        assert f"  - {reason}" in refused.stderr
        assert workspace_state(project) == before
        assert snapshot_tree(outside) == outside_before
    assert os.readlink(project / "link") == "tracked.txt"
    review = agentbox(project, "review")
    assert "apply refuses it:" in review.stdout and reason in review.stdout


def test_a_link_only_in_the_base_is_a_link_too(project: Path, isolated_vm: FakeLima, tmp_path: Path) -> None:
    """The base has the link; the workspace lost it since: the patch's `100644` still does not make it a file."""
    os.symlink("tracked.txt", project / "link")
    plant(isolated_vm, git_change(tmp_path, "ln -s tracked.txt link", "ln -sfn /etc/passwd link")
          .replace(b" 120000\n", b" 100644\n"))
    assert agentbox(project, "claude").returncode == 255
    (project / "link").unlink()
    write(project / "link", "tracked.txt")
    refused = agentbox(project, "apply")
    assert refused.returncode == 1
    assert "  - link: the patch takes it for a regular file, but on your host it is a symbolic link" in refused.stderr
    assert (project / "link").read_text() == "tracked.txt"


@pytest.mark.parametrize("case", ["file", "link", "beside a linked folder"])
def test_ordinary_changes_apply_beside_host_links(
        project: Path, isolated_vm: FakeLima, tmp_path: Path, case: str) -> None:
    """The controls: a stated mode that is the host's type, a link kept in the tree, a path through no link."""
    outside = tmp_path / "outside"
    plant_host_links(project, outside)
    before, after = {
        "file": ("echo one > tracked.txt", "echo two > tracked.txt"),
        "link": ("ln -s tracked.txt link", "ln -sfn modified.txt link"),
        "beside a linked folder": ("true", "mkdir linked2; echo new > linked2/new.txt"),
    }[case]
    patch = git_change(tmp_path, before, after)
    plant(isolated_vm, patch)
    session = agentbox(project, "claude")
    assert "apply will refuse" not in session.stderr
    applied = agentbox(project, "apply")
    assert applied.returncode == 0, applied.stderr
    if case == "file":
        assert (project / "tracked.txt").read_text() == "two\n"
    elif case == "link":
        assert os.readlink(project / "link") == "modified.txt"
    else:
        assert (project / "linked2" / "new.txt").read_text() == "new\n"
    assert snapshot_tree(outside) == {"f.txt": ("file", b"outside\n")}


# -- issue 27: a settled proposal stays settled; a new session starts from the workspace ------------------------


def test_a_rejected_proposal_is_never_applied_and_an_applied_one_not_twice(
        project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent > scratch.txt").returncode == 0
    assert agentbox(project, "reject").returncode == 0
    before = workspace_state(project)
    for args in (("apply", "1"), ("apply", "1", "--check"), ("apply", "1", "--3way")):
        refused = agentbox(project, *args)
        assert refused.returncode == 1, refused.stderr
        assert "agentbox: error: proposal 1 was rejected (at " in refused.stderr
        assert "a rejected proposal is never applied; nothing was changed" in refused.stderr
        assert "run an isolated session again" in refused.stderr
        assert workspace_state(project) == before
    assert [e["event"] for e in events(project)] == ["proposal_created", "proposal_rejected"]
    # Control: a pending proposal of the same kind applies; applied, it is refused a second time, with its state.
    assert agentbox(project, "shell", "--", "bash", "-c", "echo agent2 > scratch.txt").returncode == 0
    applied = agentbox(project, "apply", "2")
    assert applied.returncode == 0, applied.stderr
    assert (project / "scratch.txt").read_text() == "agent2\n"
    again = agentbox(project, "apply", "2")
    assert again.returncode == 1
    checkpoint = proposal_list(project)[1]["checkpoint"]
    assert "agentbox: error: proposal 2 was applied already (at " in again.stderr
    assert f"`agentbox undo {checkpoint}` returns the workspace to how it was before it" in again.stderr
    assert [p["status"] for p in proposal_list(project)] == ["rejected", "applied"]


def test_a_rejected_proposals_changes_never_reach_the_next_proposal(project: Path, isolated_vm: FakeLima) -> None:
    # Two sessions on one copy: the second proposal holds the first one's changes (and supersedes it).
    assert agentbox(project, "shell", "--", "bash", "-c", "echo a > a.txt").returncode == 0
    assert agentbox(project, "shell", "--", "bash", "-c", "echo b > b.txt").returncode == 0
    rejected = agentbox(project, "reject", "1")
    assert rejected.returncode == 0, rejected.stderr
    assert ("agentbox: proposal 2 came from the same copy and still holds its changes (pending): "
            "`agentbox reject 2` rejects it too") in rejected.stderr
    third = agentbox(project, "shell", "--", "bash", "-c", "ls a.txt b.txt 2>&1; echo c > c.txt")
    assert third.returncode == 0, third.stderr
    assert "copying the workspace" in third.stderr
    assert third.stdout.count("No such file") == 2
    listed = {p["id"]: (p["status"], sorted(f["path"] for f in p["files"])) for p in proposal_list(project)}
    assert listed[3] == ("pending", ["c.txt"])
    assert listed[1][0] == "rejected" and listed[2] == ("pending", ["a.txt", "b.txt"])


def test_after_an_apply_the_next_session_starts_from_the_workspace(project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "shell", "--", "bash", "-c", "echo a > a.txt").returncode == 0
    assert agentbox(project, "apply").returncode == 0
    nxt = agentbox(project, "shell", "--", "bash", "-c", "echo b > b.txt")
    assert nxt.returncode == 0, nxt.stderr
    assert [sorted(f["path"] for f in p["files"]) for p in proposal_list(project)] == [["a.txt"], ["b.txt"]]


# -- issue 37: rejected changes never come back ------------------------------------------------------------


def test_a_session_that_changed_nothing_since_the_last_proposal_files_nothing(
        project: Path, isolated_vm: FakeLima) -> None:
    # The day of use: `claude -p` files proposal 1; a plain `shell -- true` on the same copy filed the same changes
    # again (crediting `shell`), superseding 1; `reject` rejected that one and `apply 1` applied the changes.
    made = agentbox(project, "claude", "-p", "tidy up")
    assert made.returncode == 0, made.stderr
    assert "agentbox: proposal 1: 9 files changed;" in made.stderr
    idle = agentbox(project, "shell", "--", "true")
    assert idle.returncode == 0, idle.stderr
    assert ("agentbox: the session changed nothing in the workspace copy since proposal 1: no new proposal\n"
            in idle.stderr)
    assert [(p["id"], p["status"], p["agent"]) for p in proposal_list(project)] == [(1, "pending", "claude")]
    rejected = agentbox(project, "reject")
    assert rejected.returncode == 0, rejected.stderr
    assert "rejected proposal 1;" in rejected.stderr
    before = workspace_state(project)
    refused = agentbox(project, "apply", "1")
    assert refused.returncode == 1
    assert "agentbox: error: proposal 1 was rejected (at " in refused.stderr
    assert workspace_state(project) == before


def test_a_superseded_proposal_is_never_applied_and_is_rejected_with_the_one_that_superseded_it(
        project: Path, isolated_vm: FakeLima) -> None:
    assert agentbox(project, "claude", "-p", "tidy up").returncode == 0
    more = agentbox(project, "shell", "--", "bash", "-c", "echo more > more.txt")
    assert more.returncode == 0, more.stderr
    assert "agentbox: proposal 2: 10 files changed;" in more.stderr
    assert [(p["id"], p["status"]) for p in proposal_list(project)] == [(1, "superseded"), (2, "pending")]
    before = workspace_state(project)
    for args in (("apply", "1"), ("apply", "1", "--check"), ("apply", "1", "--3way")):
        refused = agentbox(project, *args)
        assert refused.returncode == 1, refused.stderr
        assert ("agentbox: error: proposal 1 was superseded by proposal 2 (pending), a later session of the same copy "
                "whose proposal holds these changes too; a superseded proposal is never applied; nothing was "
                "changed\n") in refused.stderr
        assert "`agentbox review 2` shows proposal 2; `agentbox apply 2` applies it." in refused.stderr
        assert workspace_state(project) == before
    rejected = agentbox(project, "reject")
    assert rejected.returncode == 0, rejected.stderr
    assert ("rejected proposal 2 and with it proposal 1, which it superseded (it held their changes); "
            f"its files stay in {proposals.folder(project) / '2'}") in rejected.stderr
    assert [(p["id"], p["status"]) for p in proposal_list(project)] == [(1, "rejected"), (2, "rejected")]
    assert [(e["event"], e["proposal"], e.get("rejectedWith")) for e in events(project)][-2:] == [
        ("proposal_rejected", 2, None), ("proposal_rejected", 1, 2)]
    for number, said in (("1", "proposal 1 was rejected with proposal 2, which superseded it (at "),
                         ("2", "proposal 2 was rejected (at ")):
        refused = agentbox(project, "apply", number)
        assert refused.returncode == 1
        assert f"agentbox: error: {said}" in refused.stderr
        assert workspace_state(project) == before
