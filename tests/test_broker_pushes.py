"""Scoped pushes through the broker (`git.allowPush: session`): real git pushes over HTTPS through the proxy to git's
own smart-HTTP server (tests/brokerharness.git_http_backend) standing for github.com. The broker reads receive-pack's
commands before anything is sent and lets the whole push through only when every ref is a branch under
agentbox/<vm>/ that is new or one a push of this VM created; no delete, no other ref."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from agentbox.net import pushes
from tests.brokerharness import GH_PH, GH_REAL, GITHUB, Harness, git_http_backend

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

VM = "agentbox-broker-test"
MINE = f"refs/heads/agentbox/{VM}"


class Setup(NamedTuple):
    broker: Harness
    origin: Path
    clone: Path
    git: object


def git_in(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def scoped(broker: Harness, tmp_path: Path) -> Iterator[Setup]:
    broker.proxy.set_broker(broker.brokering._replace(
        push_namespace=pushes.namespace(VM), pushes=pushes.Ledger(VM),
        push_hint="git.allowPush: session (or sync.remoteWrite: true) in agentbox.yml"))
    origin = tmp_path / "served" / "owner" / "repo.git"
    work = tmp_path / "work"
    assert git_in(tmp_path, "init", "-q", "--bare", "--initial-branch=main", str(origin)).returncode == 0
    assert git_in(tmp_path, "init", "-q", "--initial-branch=main", str(work)).returncode == 0
    (work / "README").write_text("one\n")
    assert git_in(tmp_path, "add", "README", cwd=work).returncode == 0
    assert git_in(tmp_path, "commit", "-qm", "one", cwd=work).returncode == 0
    assert git_in(tmp_path, "push", "-q", str(origin), "HEAD:refs/heads/main", cwd=work).returncode == 0
    basic = "Basic " + base64.b64encode(f"x-access-token:{GH_REAL}".encode()).decode()
    for method in ("GET", "POST"):
        for end in ("info/refs", "git-upload-pack", "git-receive-pack"):
            broker.upstream.route(method, f"/owner/repo.git/{end}", host=GITHUB,
                                  handler=git_http_backend(origin.parent.parent, basic))
    bundle = broker.log.parent / "guest-bundle.pem"
    bundle.write_text(broker.ca.cert_pem())
    through = ["-c", f"http.proxy=http://127.0.0.1:{broker.proxy.port}", "-c", f"http.sslCAInfo={bundle}"]

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return git_in(tmp_path, *through, *args, cwd=tmp_path / "clone")

    url = f"https://x-access-token:{GH_PH}@{GITHUB}/owner/repo.git"
    clone = git_in(tmp_path, *through, "clone", "-q", url, str(tmp_path / "clone"))
    assert clone.returncode == 0, clone.stderr
    yield Setup(broker, origin, tmp_path / "clone", git)


def commit(setup: Setup, text: str) -> str:
    (setup.clone / "README").write_text(text)
    git = setup.git
    assert git("commit", "-qam", text).returncode == 0  # type: ignore[operator]
    return git("rev-parse", "HEAD").stdout.strip()  # type: ignore[operator,no-any-return]


def refs(origin: Path) -> dict[str, str]:
    listed = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)"], cwd=origin,
                            capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ") for line in listed.splitlines())


def test_a_scoped_push_creates_and_updates_the_vms_own_branches(scoped: Setup) -> None:
    git = scoped.git
    first = commit(scoped, "two\n")
    pushed = git("push", "-q", "origin", f"HEAD:{MINE}/fix")  # type: ignore[operator]
    assert pushed.returncode == 0, pushed.stderr
    assert refs(scoped.origin)[f"{MINE}/fix"] == first
    second = commit(scoped, "three\n")
    assert git("push", "-q", "origin", f"HEAD:{MINE}/fix").returncode == 0  # type: ignore[operator]
    assert git("reset", "-q", "--hard", "HEAD~2").returncode == 0  # type: ignore[operator]
    rewritten = commit(scoped, "rewritten\n")
    forced = git("push", "-q", "--force", "origin", f"HEAD:{MINE}/fix")  # type: ignore[operator]
    assert forced.returncode == 0, forced.stderr  # a branch it created: its own to rewrite
    assert refs(scoped.origin)[f"{MINE}/fix"] == rewritten != second
    assert pushes.Ledger(VM).created() == {f"{MINE}/fix": rewritten}
    entries = [e for e in scoped.broker.entries() if e.get("pushed")]
    assert [e["pushed"][0]["new"] for e in entries] == [first, second, rewritten]
    assert all(e["decision"] == "substitute" for e in entries)


@pytest.mark.parametrize("refspec,why", [
    ("HEAD:refs/heads/main", "may push only to new branches under"),
    ("HEAD:refs/heads/agentbox/another-vm/fix", "may push only to new branches under"),
    ("HEAD:refs/tags/v1", "may push only to new branches under"),
    (f"HEAD:{MINE}/../../main", None),
])
def test_a_push_outside_the_namespace_is_refused_whole(scoped: Setup, refspec: str, why: str | None) -> None:
    before = refs(scoped.origin)
    commit(scoped, "two\n")
    pushed = scoped.git("push", "origin", refspec, f"HEAD:{MINE}/alongside")  # type: ignore[operator]
    assert pushed.returncode != 0
    if why:
        assert "403" in pushed.stderr and why in scoped.broker.logged("/owner/repo.git/git-receive-pack")[-1]["reason"]
    assert refs(scoped.origin) == before  # the allowed ref beside it was not pushed either
    assert pushes.Ledger(VM).created() == {}


def test_a_delete_and_a_rewrite_of_a_branch_the_vm_did_not_create_are_refused(scoped: Setup) -> None:
    git = scoped.git
    commit(scoped, "two\n")
    assert git("push", "-q", "origin", f"HEAD:{MINE}/mine").returncode == 0  # type: ignore[operator]
    deleted = git("push", "origin", f":{MINE}/mine")  # type: ignore[operator]
    assert deleted.returncode != 0 and f"{MINE}/mine" in refs(scoped.origin)
    assert "deletes" in scoped.broker.logged("/owner/repo.git/git-receive-pack", 2)[-1]["reason"]
    # someone else's branch in the namespace (made on the server, not by a push of this VM)
    main = refs(scoped.origin)["refs/heads/main"]
    subprocess.run(["git", "update-ref", f"{MINE}/theirs", main], cwd=scoped.origin, check=True)
    assert git("fetch", "-q", "origin").returncode == 0  # type: ignore[operator]
    rewrite = git("push", "--force", "origin", f"HEAD:{MINE}/theirs")  # type: ignore[operator]
    assert rewrite.returncode != 0 and refs(scoped.origin)[f"{MINE}/theirs"] == main
    assert "no push of this VM created" in scoped.broker.logged("/owner/repo.git/git-receive-pack", 3)[-1]["reason"]
    refused = [e for e in pushes.Ledger(VM).read() if e["outcome"].startswith("refused")]
    assert len(refused) == 2
