"""The readonly-remote guards in wrappers/ (git, gh, pre-push), run directly on this host.

Every git test works in a sandbox of its own: copies of the wrappers in `bin/` (first on PATH), a
recording stand-in for the real git in `realbin/` (next on PATH, so the wrapper's PATH search
finds it), a bare repository `remote.git` and a clone `work/` with one commit. A refused push must
leave every ref of `remote.git` as it was, and the real git must only have been asked the guard's
own config questions. The control tests show that the same pushes do land when nothing guards
them, so the "refs unchanged" checks can fail. Settings that make git run a program are tried
with a stand-in program that leaves a marker and pushes; their controls show the real git does
run it.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

WRAPPERS = Path(__file__).resolve().parent.parent / "wrappers"
GUARDS = ("git", "gh", "pre-push")
MARKER = "# agentbox-managed: readonly-remote"
BLOCKED = "remote writes are blocked for this project by agentbox's readonly-remote guard"
HOW_TO_ALLOW = "`sync: {remoteWrite: true}` in agentbox.yml"

REAL_GIT = shutil.which("git")
BASH = shutil.which("bash")

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = [pytest.mark.needs("git", "bash"), pytest.mark.timeout(60)]

# The stand-in for the real git: records each call (one file per call, NUL-separated argv), then
# runs the real git.
RECORDER = """#!/bin/sh
f=$(mktemp "$RECORD_DIR/call.XXXXXX")
for a in "$@"; do printf '%s\\0' "$a" >>"$f"; done
exec {real} "$@"
"""

# A stand-in for the real gh: records argv (NUL-separated) and standard input, exits 0.
GH_STUB = """#!/bin/sh
: >"$GH_ARGV"
for a in "$@"; do printf '%s\\0' "$a" >>"$GH_ARGV"; done
cat >"$GH_STDIN"
exit 0
"""


def install(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755)
    return dest


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


def clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GIT_", "AGENTBOX_REAL_")) and k != "XDG_CONFIG_HOME"
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="Agent",
        GIT_AUTHOR_EMAIL="agent@example.invalid",
        GIT_COMMITTER_NAME="Agent",
        GIT_COMMITTER_EMAIL="agent@example.invalid",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        PAGER="cat",
        MANPAGER="cat",
        LC_ALL="C",
        TERM="xterm",  # the terminal runs need one git colours for, whatever the caller's TERM (CI has none)
    )
    return env


@dataclass
class Sandbox:
    root: Path
    bin: Path
    realbin: Path
    hooks: Path
    records: Path
    env: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def remote(self) -> Path:
        return self.root / "remote.git"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def real(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """The real git, bypassing every guard (for setting up and inspecting)."""
        return subprocess.run(
            [REAL_GIT, *args], cwd=cwd or self.work, env=self.env, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, check=check, timeout=60,
        )

    def git(self, *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None,
            stdin: str | None = None, tty: bool = False) -> subprocess.CompletedProcess:
        """`git ARGS` as the agent types it: found on PATH, which is the wrapper in bin/. An env
        value of None removes that variable; tty=True gives git a terminal as standard output
        (git only starts a pager on one)."""
        run_env = merged_env(self.env, self.extra_env, env or {})
        exe = shutil.which("git", path=run_env["PATH"])
        assert exe == str(self.bin / "git")
        return run(["git", *args], cwd=cwd or self.work, env=run_env, stdin=stdin, tty=tty)

    def real_git(self, *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None,
                 stdin: str | None = None, tty: bool = False) -> subprocess.CompletedProcess:
        """The same with the real git binary called directly (the wrappers stay on PATH)."""
        run_env = merged_env(self.env, self.extra_env, env or {})
        return run([REAL_GIT, *args], cwd=cwd or self.work, env=run_env, stdin=stdin, tty=tty)

    def remote_refs(self) -> dict[str, str]:
        out = self.real("--git-dir", str(self.remote), "for-each-ref", "--format=%(refname) %(objectname)").stdout
        return dict(line.split(" ", 1) for line in out.splitlines())

    def remote_main(self) -> str:
        return self.real("--git-dir", str(self.remote), "rev-parse", "refs/heads/main").stdout.strip()

    def commit_ahead(self) -> str:
        """A local commit that any successful push of main would carry to remote.git."""
        self.real("commit", "-q", "--allow-empty", "-m", "local work")
        return self.real("rev-parse", "HEAD").stdout.strip()

    def advance_remote(self) -> str:
        """A new commit on remote.git's main, made from another clone with the real git."""
        other = self.root / "other"
        if not other.exists():
            self.real("clone", "-q", str(self.remote), str(other), cwd=self.root)
        self.real("pull", "-q", "--ff-only", cwd=other)
        self.real("commit", "-q", "--allow-empty", "-m", "upstream work", cwd=other)
        self.real("push", "-q", "origin", "main", cwd=other)
        return self.remote_main()

    def calls(self) -> list[list[str]]:
        found = []
        for path in sorted(self.records.iterdir()):
            data = path.read_bytes()
            found.append([a.decode() for a in data.split(b"\0")[:-1]])
        return found

    def clear_calls(self) -> None:
        for path in self.records.iterdir():
            path.unlink()


def merged_env(*layers: dict[str, str | None]) -> dict[str, str]:
    env: dict[str, str | None] = {}
    for layer in layers:
        env.update(layer)
    return {k: v for k, v in env.items() if v is not None}


def run(argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None, tty: bool) -> subprocess.CompletedProcess:
    if not tty:
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, input=stdin or "", timeout=60,
        )
    assert stdin is None, "a terminal run reads no input"
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
        )
    finally:
        os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(argv, 60)
            if not select.select([leader], [], [], remaining)[0]:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            out += chunk
        _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def is_guard_query(argv: list[str]) -> bool:
    """The config look-ups the git wrapper itself makes before deciding."""
    return (
        ("config" in argv and ("--get-regexp" in argv or "--show-scope" in argv))
        or any(a.startswith("--list-cmds=") for a in argv)
        or argv == ["--exec-path"]
    )


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    root = tmp_path / "gw"
    home = tmp_path / "ghome"
    home.mkdir()
    bin_dir = root / "bin"
    realbin = root / "realbin"
    hooks = root / "hooks"
    records = root / "records"
    records.mkdir(parents=True)
    for name in ("git", "gh"):
        install(WRAPPERS / name, bin_dir / name)
    install(WRAPPERS / "pre-push", hooks / "pre-push")
    write_exe(realbin / "git", RECORDER.format(real=REAL_GIT))
    env = clean_env(home)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(realbin), os.environ.get("PATH", os.defpath)])
    env["RECORD_DIR"] = str(records)
    box = Sandbox(root=root, bin=bin_dir, realbin=realbin, hooks=hooks, records=records, env=env)

    box.real("init", "-q", "--bare", "--initial-branch=main", str(box.remote), cwd=root)
    box.real("clone", "-q", str(box.remote), str(box.work), cwd=root)
    box.real("checkout", "-q", "-b", "main")
    (box.work / "README").write_text("hello\n")
    box.real("add", "README")
    box.real("commit", "-q", "-m", "first")
    box.real("push", "-q", "origin", "main")
    box.real("branch", "-q", "--set-upstream-to=origin/main")
    box.clear_calls()
    return box


def assert_refused(result: subprocess.CompletedProcess, *mentions: str) -> None:
    assert result.returncode != 0, result
    assert BLOCKED in result.stderr, result.stderr
    assert HOW_TO_ALLOW in result.stderr, result.stderr
    for text in mentions:
        assert text in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------
# The files themselves


@pytest.mark.parametrize("name", GUARDS)
def test_guard_file_is_marked_strict_bash(name: str) -> None:
    path = WRAPPERS / name
    lines = path.read_text().splitlines()
    assert lines[0] in ("#!/usr/bin/env bash", "#!/bin/bash")
    assert MARKER in lines[:3]
    assert "set -euo pipefail" in lines
    assert path.stat().st_mode & stat.S_IXUSR, f"{name} is not executable in the repository"
    subprocess.run([BASH, "-n", str(path)], check=True)


@pytest.mark.needs("shellcheck")
@pytest.mark.parametrize("name", GUARDS)
def test_shellcheck_is_clean(name: str) -> None:
    result = subprocess.run(["shellcheck", "--severity=style", str(WRAPPERS / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# The bash they need: 4.4 or newer, else they refuse everything (a guard that failed somewhere
# further down could let a command through).

BASH_GUARDS = ("git", "gh")  # pre-push refuses every push on any bash; hook-dispatch is plain sh
CHECK_START = "# -- bash version check"
CHECK_END = "# -- end of the bash version check --\n"
OLD_BASH = "4.3.48(1)-release"
REFUSED_ON_OLD_BASH = (
    "agentbox: refused to run {name}: agentbox's readonly-remote guard needs bash 4.4 or newer, "
    "and this is bash 4.3.48(1)-release.\n"
    "agentbox: nothing was run. Put bash 4.4 or newer first on PATH (the guard starts with `/usr/bin/env bash`).\n"
)


def version_check(name: str) -> str:
    text = (WRAPPERS / name).read_text()
    return text[text.index(CHECK_START):text.index(CHECK_END) + len(CHECK_END)]


def as_bash(version: str, wrapper: Path, *args: str) -> list[str]:
    """argv that runs WRAPPER as a bash reporting VERSION would. bash sets $BASH_VERSION itself at
    start-up (the environment cannot change it), so a bash -c sets it and then sources the wrapper,
    with $0 and BASH_SOURCE naming the wrapper as when it runs by itself."""
    return [BASH, "-c", f"BASH_VERSION='{version}'; source \"$0\" \"$@\"", str(wrapper), *args]


def test_bash_version_check_runs_first_and_is_the_same_in_every_guard() -> None:
    for name in BASH_GUARDS:
        text = (WRAPPERS / name).read_text()
        before = text[:text.index(CHECK_START)].splitlines()
        assert all(line.startswith("#") or not line.strip() for line in before), f"{name} runs something before it"
    assert version_check("git") == version_check("gh")


@pytest.mark.parametrize("shell", ["bash", "sh"])  # plain POSIX sh: it must work whatever runs the file
@pytest.mark.parametrize(("major", "minor", "too_old"), [
    ("3", "2", True), ("4", "3", True), ("4", "4", False), ("4", "10", False), ("5", "0", False),
    ("5", "2", False), ("10", "0", False), ("2", "05b", True), ("", "", True), ("4", "", True),
    ("", "4", True), ("five", "0", True),
])
def test_bash_version_check_logic(shell: str, major: str, minor: str, too_old: bool) -> None:
    function = re.search(r"^bash_too_old\(\) \{.*?^\}$", version_check("git"), re.M | re.S)[0]
    result = subprocess.run([shell, "-c", f'{function}\nbash_too_old "$1" "$2"', "check", major, minor],
                            capture_output=True, text=True)
    assert result.stderr == ""
    assert (result.returncode == 0) == too_old, result.returncode


@pytest.mark.parametrize("argv", [["push", "origin", "main"], ["status"], ["--version"]])
def test_git_guard_on_an_old_bash_runs_nothing(sandbox: Sandbox, argv: list[str]) -> None:
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    result = run(as_bash(OLD_BASH, sandbox.bin / "git", *argv), cwd=sandbox.work, env=sandbox.env, stdin=None, tty=False)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == REFUSED_ON_OLD_BASH.format(name="git")
    assert sandbox.calls() == []  # the real git never ran, not even for the guard's own questions
    assert sandbox.remote_refs() == before


def test_control_git_guard_sourced_as_bash_4_4_works_as_usual(sandbox: Sandbox) -> None:
    """The same way of running it, with 4.4 reported: the guard lets status through and refuses the
    push itself, so the refusals above are the version check's."""
    status = run(as_bash("4.4.0(1)-release", sandbox.bin / "git", "status", "--short"), cwd=sandbox.work,
                 env=sandbox.env, stdin=None, tty=False)
    assert status.returncode == 0, status.stderr
    assert ["status", "--short"] in sandbox.calls()
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    push = run(as_bash("4.4.0(1)-release", sandbox.bin / "git", "push", "origin", "main"), cwd=sandbox.work,
               env=sandbox.env, stdin=None, tty=False)
    assert_refused(push, "`git push`")
    assert sandbox.remote_refs() == before


def test_gh_guard_on_an_old_bash_runs_nothing(ghbox: GhBox) -> None:
    for argv in (["pr", "list"], ["version"], ["api", "repos/o/r"]):
        result = subprocess.run(as_bash(OLD_BASH, ghbox.root / "bin" / "gh", *argv), cwd=ghbox.root, env=ghbox.env,
                                capture_output=True, text=True, input="", timeout=60)
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == REFUSED_ON_OLD_BASH.format(name="gh")
        assert ghbox.reached() is None
    control = subprocess.run(as_bash("5.0.0(1)-release", ghbox.root / "bin" / "gh", "pr", "list"), cwd=ghbox.root,
                             env=ghbox.env, capture_output=True, text=True, input="", timeout=60)
    assert control.returncode == 0, control.stderr
    assert ghbox.reached() == ["pr", "list"]


# ---------------------------------------------------------------------------------------------
# git: controls (without the guards these pushes do land)


def test_control_real_git_push_lands(sandbox: Sandbox) -> None:
    head = sandbox.commit_ahead()
    sandbox.real("push", "-q", "origin", "main")
    assert sandbox.remote_main() == head


def test_control_send_pack_lands(sandbox: Sandbox) -> None:
    head = sandbox.commit_ahead()
    sandbox.real("send-pack", "../remote.git", "main")
    assert sandbox.remote_main() == head


# ---------------------------------------------------------------------------------------------
# git: the bypass matrix. (id, argv, cwd relative to the sandbox root, setup, extra env)


def _alias(name: str, value: str):
    def setup(box: Sandbox) -> None:
        box.real("config", f"alias.{name}", value)

    return setup


def _aliases(*pairs: tuple[str, str]):
    def setup(box: Sandbox) -> None:
        for name, value in pairs:
            box.real("config", f"alias.{name}", value)

    return setup


def _include_file_alias(box: Sandbox) -> None:
    (box.root / "extra.gitconfig").write_text("[alias]\n\txx = push\n")


def _global_alias(box: Sandbox) -> None:
    box.real("config", "--global", "alias.gp", "push origin main")


def _subsection_alias(box: Sandbox) -> None:
    box.real("config", "alias.sub.command", "push")


REFUSED = [
    ("push", ["push"], "work", None, {}),
    ("push-origin-main", ["push", "origin", "main"], "work", None, {}),
    ("push-other-ref", ["push", "origin", "HEAD:refs/heads/other"], "work", None, {}),
    ("push-tag", ["push", "origin", "--tags"], "work", None, {}),
    ("-C", ["-C", "work", "push"], ".", None, {}),
    ("--git-dir=/--work-tree=", ["--git-dir=work/.git", "--work-tree=work", "push"], ".", None, {}),
    ("--git-dir/--work-tree", ["--git-dir", "work/.git", "--work-tree", "work", "push"], ".", None, {}),
    ("-c-user.name", ["-c", "user.name=x", "push"], "work", None, {}),
    ("--no-pager", ["--no-pager", "push"], "work", None, {}),
    ("-p", ["-p", "push"], "work", None, {}),
    ("many-globals", ["--no-replace-objects", "--literal-pathspecs", "--no-optional-locks", "-P", "--namespace", "x",
                      "-c", "color.ui=never", "--config-env=user.name=HOME", "push"], "work", None, {}),
    ("--attr-source", ["--attr-source", "HEAD", "push"], "work", None, {}),
    ("unknown-global-option", ["--some-future-option", "value", "push"], "work", None, {}),
    ("-c-alias", ["-c", "alias.p=push", "p"], "work", None, {}),
    ("-c-Alias-case", ["-c", "Alias.P=push", "P"], "work", None, {}),
    ("-c-alias-harmless", ["-c", "alias.st=status", "st"], "work", None, {}),
    ("-c-core.hooksPath", ["-c", "core.hooksPath=/dev/null", "push"], "work", None, {}),
    ("-c-core.hookspath-status", ["-c", "core.hookspath=/dev/null", "status"], "work", None, {}),
    ("--config-env=hooksPath", ["--config-env=core.hooksPath=X", "push"], "work", None, {"X": "/dev/null"}),
    ("--config-env-hooksPath", ["--config-env", "core.HooksPath=X", "status"], "work", None, {"X": "/dev/null"}),
    ("--config-env-alias", ["--config-env=alias.p=X", "p"], "work", None, {"X": "push"}),
    ("config-alias", ["pp"], "work", _alias("pp", "push"), {}),
    ("config-alias-args", ["pp", "origin", "main"], "work", _alias("pp", "push"), {}),
    ("config-alias-upper", ["PP"], "work", _alias("pp", "push"), {}),
    ("config-alias-with-options", ["xp"], "work", _alias("xp", "-c user.name=x push"), {}),
    ("config-alias-quoted", ["qp"], "work", _alias("qp", "'push' origin"), {}),
    ("config-alias-chain", ["p1"], "work", _aliases(("p1", "p2 -q"), ("p2", "pp"), ("pp", "push")), {}),
    ("config-alias-chain-end", ["p1"], "work", _aliases(("p1", "p2"), ("p2", "push")), {}),
    ("config-alias-send-pack", ["sp"], "work", _alias("sp", "send-pack ../remote.git main"), {}),
    ("config-alias-sets-alias", ["ca"], "work", _alias("ca", "-c alias.z=push z"), {}),
    ("global-alias", ["gp"], "work", _global_alias, {}),
    ("alias-via--C", ["-C", "work", "pp"], ".", _alias("pp", "push"), {}),
    ("alias-via--git-dir", ["--git-dir=work/.git", "--work-tree=work", "pp"], ".", _alias("pp", "push"), {}),
    ("alias-via-include", ["-c", "include.path={root}/extra.gitconfig", "xx"], "work", _include_file_alias, {}),
    ("alias-from-env", ["ep"], "work", None,
     {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "alias.ep", "GIT_CONFIG_VALUE_0": "push"}),
    ("alias-subsection-syntax", ["sub"], "work", _subsection_alias, {}),
    ("shell-alias", ["shp"], "work", _alias("shp", "!git push"), {}),
    ("shell-alias-full-path", ["shp"], "work", _alias("shp", "!f() { /usr/bin/git push origin main; }; f"), {}),
    ("send-pack", ["send-pack", "../remote.git", "main"], "work", None, {}),
    ("receive-pack", ["receive-pack", "../remote.git"], "work", None, {}),
    ("http-push", ["http-push", "http://127.0.0.1:9/remote.git", "main"], "work", None, {}),
    ("remote-ext", ["remote-ext", "origin", "git-receive-pack ../remote.git"], "work", None, {}),
    ("remote-fd", ["remote-fd", "origin", "0"], "work", None, {}),
    ("remote-https", ["remote-https", "origin", "https://example.invalid/r.git"], "work", None, {}),
    ("autocorrect-typo", ["-c", "help.autocorrect=-1", "psuh"], "work", None, {}),
]


@pytest.mark.parametrize(
    "argv,cwd,setup,extra_env", [pytest.param(a, c, s, e, id=i) for i, a, c, s, e in REFUSED]
)
def test_git_refuses(sandbox: Sandbox, argv, cwd, setup, extra_env) -> None:
    if setup:
        setup(sandbox)
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    sandbox.clear_calls()

    argv = [a.replace("{root}", str(sandbox.root)) for a in argv]
    result = sandbox.git(*argv, cwd=sandbox.root / cwd, env=extra_env)

    assert_refused(result)
    assert sandbox.remote_refs() == before
    others = [c for c in sandbox.calls() if not is_guard_query(c)]
    assert others == [], f"the real git ran: {others}"


def test_git_refusal_names_the_operation(sandbox: Sandbox) -> None:
    assert_refused(sandbox.git("push", "origin", "main"), "`git push`")
    assert_refused(sandbox.git("send-pack", "../remote.git", "main"), "`git send-pack`")
    assert_refused(sandbox.git("-c", "alias.p=push", "p"), "alias.p=push")
    sandbox.real("config", "alias.pp", "push")
    assert_refused(sandbox.git("pp"), "`git pp`", "push")
    sandbox.real("config", "alias.shp", "!git push")
    assert_refused(sandbox.git("shp"), "shell alias", "cannot be guarded")


# ---------------------------------------------------------------------------------------------
# git: settings that make git run a program. Each case injects `evil`, a script standing for any
# such program: it leaves a marker file and pushes with the first `git` on its PATH (git puts
# its own exec-path, the real git, first). Through the wrapper the marker must stay absent, the
# remote untouched and the real git unasked; the controls run the same command with the real
# git binary and show the program does run (and, where marked, that its push lands).

EVIL = """#!/bin/sh
if [ ! -e {marker} ]; then
  : >{marker}
  env -i PATH="$PATH" HOME="$HOME" GIT_CONFIG_NOSYSTEM=1 \\
    git -C {work} push -q --no-verify origin HEAD:refs/heads/pwned >/dev/null 2>&1 </dev/null || true
fi
exit 0
"""

SSH_URL = "ssh://example.invalid/r.git"
CREDENTIAL_REQUEST = "protocol=https\nhost=example.invalid\n\n"
NO_PAGER_ENV = {"GIT_PAGER": None, "PAGER": None}


@dataclass(frozen=True)
class Injection:
    argv: tuple[str, ...]
    setups: tuple = ()
    env: tuple[tuple[str, str | None], ...] = ()
    stdin: str | None = None
    tty: bool = False
    cwd: str = "work"
    control: bool = True  # the real git runs the program (git 2.39 knows the setting and the command works)
    pushes: bool = True  # ... and the program's push lands


def inj(name: str, argv: list[str], *setups, env: dict[str, str | None] | None = None, **kwargs):
    return pytest.param(Injection(tuple(argv), tuple(setups), tuple((env or {}).items()), **kwargs), id=name)


def substitute(box: Sandbox, text: str) -> str:
    for name, value in {
        "{evil}": str(box.root / "evil"),
        "{marker}": str(box.root / "pwned"),
        "{root}": str(box.root),
        "{work}": str(box.work),
        "{remote}": str(box.remote),
        "{path}": box.env["PATH"],
    }.items():
        text = text.replace(name, value)
    return text


def arm(box: Sandbox, case: Injection) -> tuple[list[str], dict[str, str | None]]:
    """Write `evil`, run the case's setups; the argv and env to run."""
    write_exe(box.root / "evil", substitute(box, EVIL))
    for setup in case.setups:
        setup(box)
    argv = [substitute(box, a) for a in case.argv]
    env = {k: None if v is None else substitute(box, v) for k, v in case.env}
    return argv, env


def _changed_readme(box: Sandbox) -> None:
    (box.work / "README").write_text("hello\nchanged\n")


def _attributes(line: str):
    def setup(box: Sandbox) -> None:
        info = box.work / ".git" / "info"
        info.mkdir(exist_ok=True)
        (info / "attributes").write_text(line + "\n")

    return setup


def _readme_deleted(box: Sandbox) -> None:
    (box.work / "README").unlink()


def _conflict(box: Sandbox) -> None:
    """Branch `other` and main both change README: merging other needs a 3-way merge."""
    box.real("checkout", "-q", "-b", "other")
    (box.work / "README").write_text("theirs\n")
    box.real("commit", "-q", "-am", "theirs")
    box.real("checkout", "-q", "main")
    (box.work / "README").write_text("ours\n")
    box.real("commit", "-q", "-am", "ours")


def _merge_stopped(box: Sandbox) -> None:
    _conflict(box)
    box.real("merge", "-q", "other", check=False)


def _evil_in(*relative: str):
    def setup(box: Sandbox) -> None:
        for rel in relative:
            install(box.root / "evil", box.root / rel)

    return setup


def _evil_config(box: Sandbox) -> None:
    (box.root / "evil.gitconfig").write_text(f"[core]\n\tfsmonitor = {box.root / 'evil'}\n")


def _alternates(box: Sandbox) -> None:
    (box.work / ".git" / "objects" / "info" / "alternates").write_text(str(box.remote / "objects") + "\n")
    box.advance_remote()


def _upstream_moved(box: Sandbox) -> None:
    box.advance_remote()


def _submodule(box: Sandbox) -> None:
    box.real("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(box.remote), "sub")
    box.real("commit", "-q", "-m", "add sub")


def _submodule_behind(box: Sandbox) -> None:
    """sub is checked out one commit behind the commit work records: `submodule update` moves it."""
    _submodule(box)
    box.advance_remote()
    sub = box.work / "sub"
    box.real("fetch", "-q", cwd=sub)
    box.real("checkout", "-q", "origin/main", cwd=sub)
    box.real("add", "sub")
    box.real("commit", "-q", "-m", "bump sub")
    box.real("checkout", "-q", "HEAD~1", cwd=sub)


def _setting_alias(box: Sandbox) -> None:
    box.real("config", "alias.st2", f"-c core.fsmonitor={box.root / 'evil'} status")


def _foreach_alias(box: Sandbox) -> None:
    box.real("config", "alias.sf", f"submodule foreach {box.root / 'evil'}")


HELPER_PATH = {"PATH": "{path}" + os.pathsep + "{root}/helpers"}

INJECTIONS = [
    # -c / --config-env, wherever git reads them
    inj("core.sshCommand", ["-c", "core.sshCommand={evil}", "ls-remote", SSH_URL]),
    inj("core.sshCommand-after--C", ["-C", "work", "-c", "core.sshCommand={evil}", "ls-remote", SSH_URL], cwd="."),
    inj("core.sshCommand-after--git-dir", ["--git-dir=work/.git", "--work-tree", "work", "-c", "core.sshCommand={evil}",
                                           "fetch", SSH_URL], cwd="."),
    inj("--config-env=core.sshCommand", ["--config-env=core.sshCommand=EVIL_CMD", "ls-remote", SSH_URL],
        env={"EVIL_CMD": "{evil}"}),
    inj("--config-env-Core.SSHCommand", ["--config-env", "Core.SSHCommand=EVIL_CMD", "ls-remote", SSH_URL],
        env={"EVIL_CMD": "{evil}"}),
    inj("-c-glued", ["-ccore.sshCommand={evil}", "ls-remote", SSH_URL], control=False),  # git 2.39 rejects it
    inj("core.gitProxy", ["-c", "core.gitProxy={evil}", "ls-remote", "git://example.invalid/r.git"]),
    inj("core.askPass", ["-c", "core.askPass={evil}", "credential", "fill"], stdin=CREDENTIAL_REQUEST),
    inj("core.pager", ["-c", "core.pager={evil}", "log", "-1"], env=NO_PAGER_ENV, tty=True),
    inj("pager.log", ["-c", "pager.log={evil}", "log", "-1"], env=NO_PAGER_ENV, tty=True),
    inj("core.editor", ["-c", "core.editor={evil}", "commit", "--allow-empty"]),
    inj("sequence.editor", ["-c", "sequence.editor={evil}", "rebase", "-i", "HEAD~1"]),
    inj("core.fsmonitor", ["-c", "core.fsmonitor={evil}", "status"]),
    inj("core.hooksPath", ["-c", "core.hooksPath={root}/evilhooks", "commit", "--allow-empty", "-m", "x"],
        _evil_in("evilhooks/pre-commit")),
    inj("core.alternateRefsCommand", ["-c", "core.alternateRefsCommand={evil}", "fetch"], _alternates),
    inj("diff.external", ["-c", "diff.external={evil}", "diff"], _changed_readme),
    inj("diff.driver.command", ["-c", "diff.x.command={evil}", "diff"], _changed_readme, _attributes("* diff=x")),
    inj("diff.driver.textconv", ["-c", "diff.x.textconv={evil}", "diff"], _changed_readme, _attributes("* diff=x")),
    inj("merge.driver.driver", ["-c", "merge.x.driver={evil}", "merge", "-q", "--no-edit", "other"], _conflict,
        _attributes("* merge=x")),
    inj("filter.clean", ["-c", "filter.x.clean={evil}", "add", "README"], _changed_readme, _attributes("* filter=x")),
    inj("filter.smudge", ["-c", "filter.x.smudge={evil}", "checkout", "--", "README"], _readme_deleted,
        _attributes("* filter=x")),
    inj("filter.process", ["-c", "filter.x.process={evil}", "add", "README"], _changed_readme,
        _attributes("* filter=x")),
    inj("credential.helper", ["-c", "credential.helper={evil}", "credential", "fill"], stdin=CREDENTIAL_REQUEST),
    inj("credential.url.helper", ["-c", "credential.https://example.invalid.helper=!{evil}", "credential", "fill"],
        stdin=CREDENTIAL_REQUEST),
    inj("gpg.program", ["-c", "gpg.program={evil}", "commit", "-q", "-S", "--allow-empty", "-m", "signed"]),
    inj("gpg.ssh.program", ["-c", "gpg.format=ssh", "-c", "user.signingKey=key::ssh-ed25519 AAAA", "-c",
                            "gpg.ssh.program={evil}", "commit", "-q", "-S", "--allow-empty", "-m", "signed"]),
    inj("gpg.ssh.defaultKeyCommand", ["-c", "gpg.format=ssh", "-c", "gpg.ssh.defaultKeyCommand={evil}", "commit", "-q",
                                      "-S", "--allow-empty", "-m", "signed"]),
    inj("alias-shell", ["-c", "alias.x=!{evil}", "x"]),
    inj("interactive.diffFilter", ["-c", "interactive.diffFilter={evil}", "add", "-p"], _changed_readme,
        tty=True),  # git filters only the coloured diff it shows on a terminal
    inj("uploadpack.packObjectsHook", ["-c", "uploadpack.packObjectsHook={evil}", "fetch"], _upstream_moved,
        control=False),  # honoured by `git upload-pack`; a local fetch starts it without the command line's config
    inj("tar.format.command", ["-c", "tar.evil.command={evil}", "archive", "--format=evil", "-o", "{root}/out.evil",
                               "HEAD"]),
    inj("trailer.token.command", ["-c", "trailer.sign.command={evil}", "interpret-trailers", "--trailer", "sign=x"],
        stdin="subject\n"),
    inj("trailer.token.cmd", ["-c", "trailer.sign.cmd={evil}", "interpret-trailers", "--trailer", "sign=x"],
        stdin="subject\n"),
    inj("remote.uploadpack", ["-c", "remote.origin.uploadpack={evil}", "fetch"]),
    inj("remote.receivepack", ["-c", "remote.origin.receivepack={evil}", "fetch"], control=False),  # push only
    inj("remote.vcs", ["-c", "remote.origin.vcs=evil", "fetch"], _evil_in("helpers/git-remote-evil"),
        env=HELPER_PATH),
    inj("remote.url", ["-c", "remote.zz.url=evil::x", "fetch", "zz"], _evil_in("helpers/git-remote-evil"),
        env=HELPER_PATH),
    inj("url.insteadOf", ["-c", "url.evil::x.insteadOf={remote}", "fetch"], _evil_in("helpers/git-remote-evil"),
        env=HELPER_PATH),
    inj("url.pushInsteadOf", ["-c", "url.evil::x.pushInsteadOf={remote}", "fetch"], control=False),  # push only
    inj("protocol.ext.allow", ["-c", "protocol.ext.allow=always", "ls-remote", "ext::{evil}"]),
    inj("protocol.allow", ["-c", "protocol.allow=always", "ls-remote", "ext::{evil}"]),
    inj("include.path", ["-c", "include.path={root}/evil.gitconfig", "status"], _evil_config),
    inj("includeIf.path", ["-c", "includeIf.onbranch:main.path={root}/evil.gitconfig", "status"], _evil_config,
        control=False),  # git reads includeIf conditions only from files
    inj("init.templateDir", ["-c", "init.templateDir={root}/tpl", "clone", "-q", "{remote}", "{root}/clone2"],
        _evil_in("tpl/hooks/post-checkout")),
    inj("submodule.update", ["-c", "submodule.sub.update=!{evil}", "submodule", "update"], _submodule_behind),
    inj("submodule.url", ["-c", "submodule.sub.url=evil::x", "submodule", "update", "--init"], control=False),
    inj("hook.command", ["-c", "hook.evil.command={evil}", "-c", "hook.evil.event=pre-commit", "commit",
                         "--allow-empty", "-m", "x"], control=False),  # git 2.50+
    inj("gc.recentObjectsHook", ["-c", "gc.recentObjectsHook={evil}", "gc", "--cruft"], control=False),  # git 2.42+
    inj("difftool.cmd", ["-c", "difftool.x.cmd={evil}", "difftool", "-y", "-t", "x"], _changed_readme),
    inj("mergetool.cmd", ["-c", "mergetool.x.cmd={evil}", "mergetool", "-t", "x", "--no-prompt"], _merge_stopped),
    inj("man.cmd", ["-c", "man.viewer=x", "-c", "man.x.cmd={evil}", "help", "-m", "log"]),
    inj("browser.cmd", ["-c", "browser.x.cmd={evil}", "web--browse", "--browser=x", "http://example.invalid/"]),
    inj("guitool.cmd", ["-c", "guitool.x.cmd={evil}", "gui"], control=False),
    inj("sendemail.smtpServer", ["-c", "sendemail.smtpServer={evil}", "send-email", "--to=x@example.invalid", "-1"],
        control=False),
    inj("sendemail.identity.toCmd", ["-c", "sendemail.work.toCmd={evil}", "send-email", "-1"], control=False),
    inj("imap.tunnel", ["-c", "imap.tunnel={evil}", "imap-send"], control=False),
    inj("instaweb.httpd", ["-c", "instaweb.httpd={evil}", "instaweb"], control=False),
    inj("--exec-path=", ["--exec-path={root}/evilexec", "fetch"], _evil_in("evilexec/git-upload-pack"),
        pushes=False),  # the program's `git` is this wrapper again: not on the exec-path
    inj("alias-sets-program", ["st2"], _setting_alias),
    # git submodule foreach
    inj("submodule-foreach", ["submodule", "foreach", "{evil}"], _submodule),
    inj("submodule-quiet-foreach", ["submodule", "--quiet", "foreach", "{evil}"], _submodule),
    inj("submodule-foreach-via--C", ["-C", "work", "submodule", "foreach", "--recursive", "{evil}"], _submodule,
        cwd="."),
    inj("submodule--helper-foreach", ["submodule--helper", "foreach", "{evil}"], _submodule),
    inj("alias-submodule-foreach", ["sf"], _submodule, _foreach_alias),
    # the environment
    inj("GIT_CONFIG_COUNT", ["status"],
        env={"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "{evil}"}),
    inj("GIT_CONFIG_COUNT-second-entry", ["ls-remote", SSH_URL],
        env={"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "user.name", "GIT_CONFIG_VALUE_0": "x",
             "GIT_CONFIG_KEY_1": "Core.SSHCommand", "GIT_CONFIG_VALUE_1": "{evil}"}),
    inj("GIT_CONFIG_COUNT-bogus", ["status"],
        env={"GIT_CONFIG_COUNT": "1x", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "{evil}"},
        control=False),  # git stops too
    inj("GIT_CONFIG_PARAMETERS", ["status"], env={"GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='{evil}'"}),
    inj("GIT_CONFIG_PARAMETERS-old-style", ["status"], env={"GIT_CONFIG_PARAMETERS": "'core.fsmonitor={evil}'"}),
    inj("GIT_CONFIG_PARAMETERS-alias", ["zz"], env={"GIT_CONFIG_PARAMETERS": "'user.name'='x' 'alias.zz'='!{evil}'"}),
    inj("GIT_CONFIG_PARAMETERS-include", ["status"], _evil_config,
        env={"GIT_CONFIG_PARAMETERS": "'include.path'='{root}/evil.gitconfig'"}),
    inj("GIT_SSH_COMMAND", ["ls-remote", SSH_URL], env={"GIT_SSH_COMMAND": "{evil}"}),
    inj("GIT_SSH", ["ls-remote", SSH_URL], env={"GIT_SSH": "{evil}"}),
    inj("GIT_PROXY_COMMAND", ["ls-remote", "git://example.invalid/r.git"], env={"GIT_PROXY_COMMAND": "{evil}"}),
    inj("GIT_EXTERNAL_DIFF", ["diff"], _changed_readme, env={"GIT_EXTERNAL_DIFF": "{evil}"}),
    inj("GIT_EXEC_PATH", ["fetch"], _evil_in("evilexec/git-upload-pack"), env={"GIT_EXEC_PATH": "{root}/evilexec"},
        pushes=False),
    inj("GIT_CONFIG_GLOBAL", ["status"], _evil_config, env={"GIT_CONFIG_GLOBAL": "{root}/evil.gitconfig"}),
    inj("GIT_CONFIG_SYSTEM", ["status"], _evil_config,
        env={"GIT_CONFIG_SYSTEM": "{root}/evil.gitconfig", "GIT_CONFIG_NOSYSTEM": None}),
    inj("GIT_TEMPLATE_DIR", ["clone", "-q", "{remote}", "{root}/clone2"], _evil_in("tpl/hooks/post-checkout"),
        env={"GIT_TEMPLATE_DIR": "{root}/tpl"}),
    inj("GIT_ALLOW_PROTOCOL", ["ls-remote", "ext::{evil}"], env={"GIT_ALLOW_PROTOCOL": "file:ext"}),
]


@pytest.mark.parametrize("case", INJECTIONS)
def test_git_refuses_settings_that_run_a_program(sandbox: Sandbox, case: Injection) -> None:
    sandbox.commit_ahead()
    argv, env = arm(sandbox, case)
    before = sandbox.remote_refs()
    sandbox.clear_calls()

    result = sandbox.git(*argv, cwd=sandbox.root / case.cwd, env=env, stdin=case.stdin, tty=case.tty)

    assert_refused(result)
    assert not (sandbox.root / "pwned").exists(), "the injected program ran"
    assert sandbox.remote_refs() == before
    others = [c for c in sandbox.calls() if not is_guard_query(c)]
    assert others == [], f"the real git ran: {others}"


@pytest.mark.parametrize("case", [c for c in INJECTIONS if c.values[0].control])
def test_control_real_git_runs_the_injected_program(sandbox: Sandbox, case: Injection) -> None:
    sandbox.commit_ahead()
    argv, env = arm(sandbox, case)

    result = sandbox.real_git(*argv, cwd=sandbox.root / case.cwd, env=env, stdin=case.stdin, tty=case.tty)

    assert (sandbox.root / "pwned").exists(), f"the program did not run: {result}"
    if case.pushes:
        assert "refs/heads/pwned" in sandbox.remote_refs(), "the program's push did not land"


def test_git_refusal_names_the_setting(sandbox: Sandbox) -> None:
    assert_refused(sandbox.git("-c", "core.sshCommand=x", "fetch"), "`git -c core.sshCommand=x`", "core.sshCommand",
                   "a program git runs finds the real git first on PATH")
    assert_refused(sandbox.git("--config-env=core.hooksPath=HOME", "status"), "`git --config-env=core.hooksPath=HOME`",
                   "pre-push hook")
    assert_refused(sandbox.git("-c", "include.path=/dev/null", "status"), "another config file")
    assert_refused(sandbox.git("status", env={"GIT_CONFIG_PARAMETERS": "'diff.x.textconv'='x'"}),
                   "`diff.x.textconv` set in the environment", "GIT_CONFIG_PARAMETERS")
    assert_refused(sandbox.git("status", env={"GIT_CONFIG_COUNT": "z"}), "cannot read")
    assert_refused(sandbox.git("fetch", env={"GIT_SSH_COMMAND": "ssh -i key"}), "`GIT_SSH_COMMAND` in the environment",
                   "~/.ssh/config")
    assert_refused(sandbox.git("status", env={"GIT_CONFIG_GLOBAL": "/dev/null"}), "`GIT_CONFIG_GLOBAL`", "core.hooksPath")
    assert_refused(sandbox.git("--exec-path=/tmp", "status"), "`git --exec-path=/tmp`", "from /tmp instead of")
    assert_refused(sandbox.git("submodule", "foreach", "true"), "`git submodule foreach`", "every submodule")
    # a control character the agent typed is shown as '?', never sent to the terminal
    shown = sandbox.git("-c", "core.pager=\x1b]0;title\x07", "log")
    assert_refused(shown, "core.pager=?]0;title?")
    assert "\x1b" not in shown.stderr and "\x07" not in shown.stderr


# Settings and environment that run nothing (or only what the user configured) keep working.
HARMLESS = [
    inj("-c-user.name", ["-c", "user.name=x", "commit", "-q", "--allow-empty", "-m", "x"]),
    inj("-c-color.ui", ["-c", "color.ui=never", "status"]),
    inj("-c-core.pager-cat", ["-c", "core.pager=cat", "log", "-1"], tty=True),
    inj("-c-core.pager-empty", ["-c", "core.pager=", "log", "-1"], tty=True),
    inj("-c-core.pager-less-options", ["-c", "core.pager=less -FRX", "log", "-1"]),
    inj("-c-pager.log-false", ["-c", "pager.log=false", "log", "-1"], tty=True),
    inj("-c-pager.log-bare", ["-c", "pager.log", "log", "-1"]),
    inj("-c-core.editor-true", ["-c", "core.editor=true", "commit", "-q", "--amend", "--allow-empty"]),
    inj("-c-sequence.editor-colon", ["-c", "sequence.editor=:", "rebase", "-q", "-i", "HEAD~1"]),
    inj("-c-credential.helper-reset", ["-c", "credential.helper=", "fetch", "-q"]),
    inj("-c-credential.url.helper-reset", ["-c", "credential.https://example.invalid.helper=", "status"]),
    inj("-c-core.fsmonitor-false", ["-c", "core.fsmonitor=false", "status"]),
    inj("-c-protocol.file.allow", ["-c", "protocol.file.allow=always", "fetch", "-q"]),
    inj("-c-protocol.ext.allow-never", ["-c", "protocol.ext.allow=never", "status"]),
    inj("-c-ssh.variant", ["-c", "ssh.variant=ssh", "status"]),
    inj("-c-http.proxy", ["-c", "http.proxy=http://127.0.0.1:9", "status"]),
    inj("-c-diff.tool", ["-c", "diff.tool=vimdiff", "status"]),
    inj("-c-safe.directory", ["-c", "safe.directory=*", "status"]),
    inj("--config-env-user.name", ["--config-env=user.name=NAME", "commit", "-q", "--allow-empty", "-m", "x"],
        env={"NAME": "x"}),
    inj("--config-env-core.pager-cat", ["--config-env", "core.pager=PAGER_CMD", "log", "-1"], env={"PAGER_CMD": "cat"},
        tty=True),
    inj("--exec-path-own", ["--exec-path={execpath}", "status"]),
    inj("GIT_EXEC_PATH-own", ["status"], env={"GIT_EXEC_PATH": "{execpath}"}),
    inj("GIT_CONFIG_COUNT-user.name", ["commit", "-q", "--allow-empty", "-m", "x"],
        env={"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "user.name", "GIT_CONFIG_VALUE_0": "x"}),
    inj("GIT_CONFIG_COUNT-0", ["status"], env={"GIT_CONFIG_COUNT": "0"}),
    inj("GIT_CONFIG_PARAMETERS-safe", ["status"],
        env={"GIT_CONFIG_PARAMETERS": "'user.name'='x' 'color.ui'='never' 'core.pager'='cat'"}),
    inj("GIT_CONFIG_SYSTEM-dev-null", ["status"], env={"GIT_CONFIG_SYSTEM": "/dev/null", "GIT_CONFIG_NOSYSTEM": None}),
    inj("GIT_ALLOW_PROTOCOL-safe", ["fetch", "-q"], env={"GIT_ALLOW_PROTOCOL": "file:https:ssh"}),
    inj("session-editors-and-pagers", ["status"],
        env={"GIT_EDITOR": "code --wait", "GIT_SEQUENCE_EDITOR": "sed -i s/pick/edit/", "GIT_PAGER": "delta",
             "GIT_ASKPASS": "/usr/lib/code/askpass.sh", "EDITOR": "vim", "PAGER": "less"}),
    inj("submodule-status", ["submodule", "status"], _submodule),
    inj("submodule-update", ["submodule", "update"], _submodule_behind),
    inj("submodule-update-checkout", ["-c", "submodule.sub.update=checkout", "submodule", "update"], _submodule_behind),
    inj("submodule-quiet-sync", ["submodule", "--quiet", "sync"], _submodule),
]


@pytest.mark.parametrize("case", HARMLESS)
def test_git_allows_harmless_settings(sandbox: Sandbox, case: Injection) -> None:
    sandbox.commit_ahead()
    argv, env = arm(sandbox, case)
    own_exec_path = sandbox.real("--exec-path").stdout.strip()
    argv = [a.replace("{execpath}", own_exec_path) for a in argv]
    env = {k: v and v.replace("{execpath}", own_exec_path) for k, v in env.items()}
    sandbox.clear_calls()

    result = sandbox.git(*argv, cwd=sandbox.root / case.cwd, env=env, stdin=case.stdin, tty=case.tty)

    assert result.returncode == 0, result.stderr
    assert BLOCKED not in result.stderr
    assert argv in sandbox.calls()


def test_git_dash_c_and_environment_config_reach_git(sandbox: Sandbox) -> None:
    no_author = {"GIT_AUTHOR_NAME": None}  # it would win over user.name
    assert sandbox.git("-c", "user.name=Dash C", "commit", "-q", "--allow-empty", "-m", "a", env=no_author).returncode == 0
    assert sandbox.real("log", "-1", "--format=%an").stdout.strip() == "Dash C"
    env = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "user.name", "GIT_CONFIG_VALUE_0": "Env Count",
           "GIT_AUTHOR_NAME": None}
    assert sandbox.git("commit", "-q", "--allow-empty", "-m", "b", env=env).returncode == 0
    assert sandbox.real("log", "-1", "--format=%an").stdout.strip() == "Env Count"
    env = {"GIT_CONFIG_PARAMETERS": "'user.name'='Env Params'", "GIT_AUTHOR_NAME": None}
    assert sandbox.git("commit", "-q", "--allow-empty", "-m", "c", env=env).returncode == 0
    assert sandbox.real("log", "-1", "--format=%an").stdout.strip() == "Env Params"


def test_git_user_global_editor_and_pager_work(sandbox: Sandbox) -> None:
    """The user's own ~/.gitconfig may name any editor or pager: only one-off settings are checked."""
    editor = write_exe(sandbox.root / "my-editor", "#!/bin/sh\necho 'written in my editor' >\"$1\"\n")
    pager_log = sandbox.root / "pager-ran"
    pager = write_exe(sandbox.root / "my-pager", f"#!/bin/sh\necho ran >>{pager_log}\nexec cat\n")
    sandbox.real("config", "--global", "core.editor", str(editor))
    sandbox.real("config", "--global", "core.pager", str(pager))
    no_pager_env = {"GIT_PAGER": None, "PAGER": None}

    commit = sandbox.git("commit", "--allow-empty")
    assert commit.returncode == 0, commit.stderr
    assert sandbox.real("log", "-1", "--format=%s").stdout.strip() == "written in my editor"

    log = sandbox.git("log", "-1", "--format=%s", env=no_pager_env, tty=True)
    assert log.returncode == 0, log.stderr
    assert "written in my editor" in log.stdout
    _changed_readme(sandbox)
    diff = sandbox.git("diff", env=no_pager_env, tty=True)
    assert diff.returncode == 0, diff.stderr
    assert "changed" in diff.stdout
    assert pager_log.read_text() == "ran\nran\n"


def test_git_session_editor_pager_and_askpass_work(sandbox: Sandbox) -> None:
    """GIT_EDITOR, GIT_SEQUENCE_EDITOR, GIT_PAGER and GIT_ASKPASS come from the session (editors,
    IDEs, agent harnesses) and are left alone."""
    editor = write_exe(sandbox.root / "ide-editor", "#!/bin/sh\necho 'from the IDE' >\"$1\"\n")
    assert sandbox.git("commit", "-q", "--allow-empty", env={"GIT_EDITOR": str(editor)}).returncode == 0
    assert sandbox.real("log", "-1", "--format=%s").stdout.strip() == "from the IDE"

    rebase = sandbox.git("rebase", "-q", "-i", "HEAD~1", env={"GIT_SEQUENCE_EDITOR": ":"})
    assert rebase.returncode == 0, rebase.stderr

    pager_log = sandbox.root / "pager-ran"
    pager = write_exe(sandbox.root / "ide-pager", f"#!/bin/sh\necho ran >>{pager_log}\nexec cat\n")
    log = sandbox.git("log", "-1", "--format=%s", env={"GIT_PAGER": str(pager)}, tty=True)
    assert log.returncode == 0 and "from the IDE" in log.stdout
    assert pager_log.read_text() == "ran\n"

    askpass = write_exe(sandbox.root / "ide-askpass", "#!/bin/sh\necho from-askpass\n")
    fill = sandbox.git("credential", "fill", env={"GIT_ASKPASS": str(askpass)}, stdin=CREDENTIAL_REQUEST)
    assert fill.returncode == 0, fill.stderr
    assert "password=from-askpass" in fill.stdout


def test_git_submodule_init_and_update_work(sandbox: Sandbox) -> None:
    _submodule(sandbox)
    clone = sandbox.root / "clone2"
    sandbox.real("clone", "-q", str(sandbox.work), str(clone), cwd=sandbox.root)
    init = sandbox.git("submodule", "init", cwd=clone)
    assert init.returncode == 0, init.stderr
    update = sandbox.git("-c", "protocol.file.allow=always", "submodule", "update", cwd=clone)
    assert update.returncode == 0, update.stderr
    assert (clone / "sub" / "README").read_text() == "hello\n"
    status = sandbox.git("submodule", "status", cwd=clone)
    assert status.returncode == 0 and " sub " in status.stdout



# ---------------------------------------------------------------------------------------------
# git: what keeps working


def test_git_status_log_and_remote_work(sandbox: Sandbox) -> None:
    status = sandbox.git("status")
    assert status.returncode == 0 and "On branch main" in status.stdout
    log = sandbox.git("log", "--oneline")
    assert log.returncode == 0 and "first" in log.stdout
    remote = sandbox.git("remote", "-v")
    assert remote.returncode == 0 and "origin" in remote.stdout and "(push)" in remote.stdout
    colour = sandbox.git("-c", "color.ui=never", "status")
    assert colour.returncode == 0 and "On branch main" in colour.stdout
    version = sandbox.git("--version")
    assert version.returncode == 0 and version.stdout.startswith("git version")
    assert sandbox.git("-v").stdout.startswith("git version")
    # the arguments reached the real git unchanged
    assert ["-c", "color.ui=never", "status"] in sandbox.calls()


def test_git_commit_through_dash_C(sandbox: Sandbox) -> None:
    before = sandbox.real("rev-parse", "HEAD").stdout.strip()
    result = sandbox.git("-C", "work", "commit", "--allow-empty", "-m", "x", cwd=sandbox.root)
    assert result.returncode == 0, result.stderr
    assert sandbox.real("rev-parse", "HEAD~1").stdout.strip() == before
    assert sandbox.real("log", "-1", "--format=%s").stdout.strip() == "x"


def test_git_fetch_and_pull_work(sandbox: Sandbox) -> None:
    upstream = sandbox.advance_remote()
    fetch = sandbox.git("fetch")
    assert fetch.returncode == 0, fetch.stderr
    assert sandbox.real("rev-parse", "origin/main").stdout.strip() == upstream
    upstream = sandbox.advance_remote()
    pull = sandbox.git("pull")
    assert pull.returncode == 0, pull.stderr
    assert sandbox.real("rev-parse", "HEAD").stdout.strip() == upstream


@pytest.mark.parametrize(
    "argv",
    [
        ["log", "--grep", "push", "--oneline"],
        ["commit", "--allow-empty", "-m", "push later"],
        ["remote", "add", "mirror", "../remote.git"],
        ["config", "alias.pp", "push"],  # configuring an alias is fine; running it is not
        ["ls-remote", "origin"],
        ["branch", "push"],
        ["-c", "core.editor=true", "status"],
        ["--no-pager", "log", "-1"],
        ["help", "-a"],
    ],
    ids=lambda a: " ".join(a),
)
def test_git_allows(sandbox: Sandbox, argv: list[str]) -> None:
    result = sandbox.git(*argv)
    assert result.returncode == 0, result.stderr
    assert BLOCKED not in result.stderr
    assert argv in sandbox.calls()


def test_git_harmless_aliases_work(sandbox: Sandbox) -> None:
    sandbox.real("config", "alias.st", "status")
    sandbox.real("config", "alias.lg", "log --oneline --grep='push me'")
    sandbox.real("config", "alias.shl", "!git log -1 --format=%s")
    for name in ("st", "lg", "shl"):
        result = sandbox.git(name)
        assert result.returncode == 0, (name, result.stderr)
        assert BLOCKED not in result.stderr
    assert "first" in sandbox.git("shl").stdout


def test_git_help_for_blocked_command_is_allowed(sandbox: Sandbox) -> None:
    # `git push --help` is `git help push`: nothing is pushed, the wrapper lets it through.
    result = sandbox.git("push", "--help")
    assert BLOCKED not in result.stderr
    assert ["push", "--help"] in sandbox.calls()


def test_git_unknown_command_without_autocorrect_reaches_git(sandbox: Sandbox) -> None:
    result = sandbox.git("psuh")
    assert result.returncode != 0
    assert BLOCKED not in result.stderr
    assert "not a git command" in result.stderr


def test_git_exit_code_and_stdin_pass_through(sandbox: Sandbox) -> None:
    result = sandbox.git("hash-object", "--stdin", stdin="hello\n")
    assert result.returncode == 0
    assert result.stdout.strip() == "ce013625030ba8dba906f756967f9e9ca394464a"
    missing = sandbox.git("rev-parse", "--verify", "no-such-ref")
    assert missing.returncode == 128


# ---------------------------------------------------------------------------------------------
# git: finding the real git


def test_git_override_env_is_used(sandbox: Sandbox, tmp_path: Path) -> None:
    marker = tmp_path / "override-ran"
    stub = write_exe(tmp_path / "stub-git", f"#!/bin/sh\necho \"$@\" >{marker}\n")
    result = sandbox.git("status", "--short", env={"AGENTBOX_REAL_GIT": str(stub)})
    assert result.returncode == 0
    assert marker.read_text().strip() == "status --short"
    assert sandbox.calls() == []


def test_git_skips_itself_through_symlinks_and_copies(sandbox: Sandbox) -> None:
    link = sandbox.root / "bin-link"
    link.symlink_to(sandbox.bin)
    copy_dir = sandbox.root / "bin-copy"
    install(WRAPPERS / "git", copy_dir / "git")
    linked_file_dir = sandbox.root / "bin-file-link"
    linked_file_dir.mkdir()
    (linked_file_dir / "git").symlink_to(sandbox.bin / "git")
    path = os.pathsep.join(
        [str(sandbox.bin), str(link), str(copy_dir), str(linked_file_dir), "", str(sandbox.realbin), sandbox.env["PATH"]]
    )
    result = sandbox.git("-C", str(sandbox.work), "status", env={"PATH": path}, cwd=sandbox.bin)
    assert result.returncode == 0, result.stderr
    assert ["-C", str(sandbox.work), "status"] in sandbox.calls()
    assert_refused(sandbox.git("push", env={"PATH": path}))


def test_git_without_a_real_git(sandbox: Sandbox, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "readlink"):
        (tools / tool).symlink_to(shutil.which(tool))
    result = sandbox.git("status", env={"PATH": os.pathsep.join([str(sandbox.bin), str(tools)])})
    assert result.returncode == 127
    assert "real git was not found" in result.stderr


def test_git_credential_helper_through_gh_guard_works(sandbox: Sandbox, tmp_path: Path) -> None:
    """agentbox's launch step sets credential.https://github.com.helper to `!gh auth git-credential`:
    git runs that through the gh guard, which must let it answer (else private fetches fail)."""
    stub = write_exe(tmp_path / "gh-real", "#!/bin/sh\ncat >/dev/null\nprintf 'username=x-access-token\\npassword=tok\\n'\n")
    sandbox.real("config", "--global", "credential.https://github.com.helper", "!gh auth git-credential")
    result = sandbox.git(
        "credential", "fill", env={"AGENTBOX_REAL_GH": str(stub)}, stdin="protocol=https\nhost=github.com\n\n"
    )
    assert result.returncode == 0, result.stderr
    assert "password=tok" in result.stdout


# ---------------------------------------------------------------------------------------------
# pre-push: the global hook stops the real git too


def test_pre_push_hook_stops_real_git(sandbox: Sandbox) -> None:
    sandbox.real("config", "--global", "core.hooksPath", str(sandbox.hooks))
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    result = sandbox.real("push", "origin", "main", check=False)
    assert_refused(result, "pre-push hook", "origin")
    assert sandbox.remote_refs() == before
    tag = sandbox.real("push", "origin", "HEAD:refs/tags/t1", check=False)
    assert_refused(tag)
    assert sandbox.remote_refs() == before


def test_pre_push_hook_stops_shell_alias_push(sandbox: Sandbox) -> None:
    # A shell alias git runs with its exec-path first on PATH (so not through the wrapper).
    sandbox.real("config", "--global", "core.hooksPath", str(sandbox.hooks))
    sandbox.real("config", "alias.sneaky", "!f() { git push origin main; }; f")
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    result = sandbox.real("sneaky", check=False)
    assert_refused(result, "pre-push hook")
    assert sandbox.remote_refs() == before


def test_pre_push_hook_is_skipped_by_no_verify_known_gap(sandbox: Sandbox) -> None:
    """Documented gap: `git push --no-verify` with the real git skips every hook."""
    sandbox.real("config", "--global", "core.hooksPath", str(sandbox.hooks))
    head = sandbox.commit_ahead()
    sandbox.real("push", "-q", "--no-verify", "origin", "main")
    assert sandbox.remote_main() == head


# ---------------------------------------------------------------------------------------------
# git.allowPush: session: `git push` goes through, and the pre-push hook keeps it to the VM's branches

SCOPE = "refs/heads/agentbox/vm1/"


@pytest.fixture
def scoped(sandbox: Sandbox) -> Sandbox:
    """The sandbox as launch.sh's --guards push-scoped leaves a guest: the namespace file, the global hooks."""
    home = Path(sandbox.env["HOME"])
    (home / ".config" / "agentbox").mkdir(parents=True)
    (home / ".config" / "agentbox" / "push-namespace").write_text(SCOPE + "\n")
    sandbox.real("config", "--global", "core.hooksPath", str(sandbox.hooks))
    return sandbox


def assert_scoped_refusal(result: subprocess.CompletedProcess, *refs: str) -> None:
    assert result.returncode != 0, result
    assert ("git.allowPush: session lets this VM push only to branches under agentbox/vm1/ (create one, or update "
            "one it created), never delete one or push another ref (pre-push hook):") in result.stderr
    for line in refs:
        assert f"agentbox:   {line}\n" in result.stderr, result.stderr
    assert "agentbox: push to a branch there instead: `git push origin HEAD:agentbox/vm1/NAME`." in result.stderr


def test_scoped_push_creates_and_updates_the_vms_branches(scoped: Sandbox) -> None:
    head = scoped.commit_ahead()
    result = scoped.git("push", "-q", "origin", f"HEAD:{SCOPE}work")
    assert result.returncode == 0, result.stderr
    assert scoped.remote_refs()[f"{SCOPE}work"] == head
    again = scoped.commit_ahead()
    result = scoped.git("push", "-q", "origin", f"HEAD:{SCOPE}work")
    assert result.returncode == 0, result.stderr
    assert scoped.remote_refs()[f"{SCOPE}work"] == again
    assert any(call[:1] == ["push"] for call in scoped.calls())  # through the wrapper to the real git


def test_scoped_push_anywhere_else_is_refused_whole_with_the_reason(scoped: Sandbox) -> None:
    scoped.commit_ahead()
    before = scoped.remote_refs()
    assert_scoped_refusal(scoped.git("push", "origin", "main"), f"refs/heads/main: outside {SCOPE}")
    tag = scoped.git("push", "origin", "HEAD:refs/tags/v1")
    assert_scoped_refusal(tag, f"refs/tags/v1: outside {SCOPE}")
    # one ref inside, one outside: nothing is pushed
    mixed = scoped.git("push", "origin", f"HEAD:{SCOPE}a", "HEAD:refs/heads/agentbox/vm2/b")
    assert_scoped_refusal(mixed, f"refs/heads/agentbox/vm2/b: outside {SCOPE}")
    assert f"{SCOPE}a" not in mixed.stderr.split("pre-push hook):")[1].split("push to a branch")[0]
    # the real binary (a shell alias, a script) meets the same hook
    assert_scoped_refusal(scoped.real_git("push", "origin", "main"), f"refs/heads/main: outside {SCOPE}")
    assert scoped.remote_refs() == before


def test_scoped_push_never_deletes(scoped: Sandbox) -> None:
    scoped.real("push", "-q", "--no-verify", "origin", f"HEAD:{SCOPE}old")
    before = scoped.remote_refs()
    for args in ((f":{SCOPE}old",), ("--delete", f"{SCOPE}old")):
        assert_scoped_refusal(scoped.git("push", "origin", *args), f"{SCOPE}old: a delete")
    assert scoped.remote_refs() == before


@pytest.mark.parametrize("content", ["refs/heads/\n", "refs/tags/agentbox/vm1/\n", "refs/heads/agentbox/vm1\n",
                                     "refs/heads/a b/\n", ""])
def test_a_namespace_file_that_names_no_branches_refuses_every_push(sandbox: Sandbox, content: str) -> None:
    home = Path(sandbox.env["HOME"])
    write_exe(home / ".config" / "agentbox" / "push-namespace", content)
    sandbox.real("config", "--global", "core.hooksPath", str(sandbox.hooks))
    sandbox.commit_ahead()
    before = sandbox.remote_refs()
    assert_refused(sandbox.git("push", "origin", "HEAD:refs/heads/agentbox/vm1/x"), "`git push`")
    assert_refused(sandbox.real_git("push", "origin", "HEAD:refs/heads/agentbox/vm1/x"), "pre-push hook")
    assert sandbox.remote_refs() == before


def test_scoped_mode_still_refuses_send_pack_and_says_what_is_allowed(scoped: Sandbox) -> None:
    before = scoped.remote_refs()
    result = scoped.git("send-pack", str(scoped.remote), "main")
    assert_refused(result, "`git send-pack`")
    assert "agentbox: `git push` to branches under agentbox/vm1/ is allowed (git.allowPush: session)." in result.stderr
    assert scoped.remote_refs() == before


def test_scoped_mode_lets_an_alias_push_reach_the_hook(scoped: Sandbox) -> None:
    scoped.real("config", "alias.up", "push origin HEAD:main")
    scoped.commit_ahead()
    before = scoped.remote_refs()
    assert_scoped_refusal(scoped.git("up"), f"refs/heads/main: outside {SCOPE}")
    assert scoped.remote_refs() == before


# ---------------------------------------------------------------------------------------------
# gh


@dataclass
class GhBox:
    root: Path
    env: dict[str, str]
    argv_file: Path
    stdin_file: Path

    def gh(self, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        self.argv_file.unlink(missing_ok=True)
        self.stdin_file.unlink(missing_ok=True)
        return subprocess.run(
            ["gh", *args], cwd=self.root, env={**self.env, **(env or {})}, capture_output=True, text=True,
            input=stdin, timeout=60,
        )

    def reached(self) -> list[str] | None:
        if not self.argv_file.exists():
            return None
        return [a.decode() for a in self.argv_file.read_bytes().split(b"\0")[:-1]]


@pytest.fixture
def ghbox(tmp_path: Path) -> GhBox:
    root = tmp_path / "gh"
    bin_dir = root / "bin"
    install(WRAPPERS / "gh", bin_dir / "gh")
    stub = write_exe(root / "stub" / "gh-real", GH_STUB)
    env = clean_env(tmp_path / "home")
    env["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", os.defpath)])
    env["AGENTBOX_REAL_GH"] = str(stub)
    env["GH_ARGV"] = str(root / "argv")
    env["GH_STDIN"] = str(root / "stdin")
    (root / "mutation.graphql").write_text(
        "# star a repository\nmutation Star($id: ID!) {\n  addStar(input: {starrableId: $id}) { clientMutationId }\n}\n"
    )
    (root / "query.graphql").write_text(
        '# no mutation here\nquery { viewer { login } search(query: "mutation testing", type: REPOSITORY, first: 1) '
        "{ repositoryCount } }\n"
    )
    (root / "body.json").write_text('{"query": "mutation {\\n addStar(input: {starrableId: \\"x\\"}) { clientMutationId } }"}')
    (root / "query-body.json").write_text('{"query": "query { viewer { login } }"}')
    return GhBox(root=root, env=env, argv_file=root / "argv", stdin_file=root / "stdin")


GH_ALLOWED = [
    [],
    ["--version"],
    ["version"],
    ["help"],
    ["help", "pr", "merge"],
    ["--help"],
    ["-h"],
    ["pr", "view", "1"],
    ["pr", "list", "-R", "o/r"],
    ["pr", "list", "--repo=o/r", "--state", "open"],
    ["pr", "-R", "o/r", "list"],
    ["-R", "o/r", "pr", "list"],
    ["pr", "checks", "1"],
    ["pr", "diff", "1"],
    ["pr", "status"],
    ["pr", "create", "--fill"],
    ["pr", "create", "--title", "merge me", "--body", "close #1"],
    ["issue", "list"],
    ["issue", "view", "1", "--comments"],
    ["issue", "status"],
    ["issue", "create", "--title", "t", "--body", "b"],
    ["issue", "comment", "1", "-b", "hi"],
    ["repo", "view", "o/r"],
    ["repo", "clone", "o/r"],
    ["repo", "list", "o"],
    ["search", "repos", "x"],
    ["search", "issues", "--repo", "o/r", "label:bug"],
    ["auth", "status"],
    ["auth", "status", "--hostname", "github.com"],
    ["auth", "status", "-h", "github.com", "-a"],
    ["auth", "git-credential", "get"],  # the credential helper agentbox configures for github.com
    ["api", "repos/o/r"],
    ["api", "repos/o/r", "--paginate", "--jq", ".[].name"],
    ["api", "-X", "GET", "-f", "per_page=5", "repos/o/r/issues"],
    ["api", "--method=get", "-F", "per_page=5", "repos/o/r/issues"],
    ["api", "-XGET", "--field", "state=open", "repos/o/r/issues"],
    ["api", "-X", "GET", "-f", "q=--method=POST", "repos/o/r/issues"],
    ["api", "-H", "Accept: application/vnd.github+json", "-i", "repos/o/r"],
    ["api", "-t", "{{.name}}", "repos/o/r"],
    ["api", "repos/o/r/pulls", "-q", ".[] | select(.state == \"POST\")"],
    ["api", "graphql", "-f", "query=query { viewer { login } }"],
    ["api", "graphql", "-F", "query=@query.graphql"],
    ["api", "graphql", "--raw-field", "query={ viewer { login } }", "-F", "first=5"],
    ["api", "graphql", "-f", 'query=query { search(query: "mutation", type: ISSUE, first: 1) { issueCount } }'],
    ["api", "graphql", "-f", "query=query { viewer { login } } # a mutation would be refused"],
    ["api", "graphql", "--paginate", "-f", "query=query($endCursor: String) { viewer { login } }"],
    ["api", "graphql", "--input", "query-body.json"],
    ["api", "--help"],
]


@pytest.mark.parametrize("argv", GH_ALLOWED, ids=lambda a: " ".join(a) or "(no args)")
def test_gh_allows(ghbox: GhBox, argv: list[str]) -> None:
    result = ghbox.gh(*argv)
    assert result.returncode == 0, result.stderr
    assert BLOCKED not in result.stderr
    assert ghbox.reached() == argv


GH_REFUSED = [
    ["api", "-X", "POST", "repos/o/r/issues"],
    ["api", "-XPOST", "repos/o/r/issues"],
    ["api", "-X=POST", "repos/o/r/issues"],
    ["api", "--method", "PATCH", "repos/o/r"],
    ["api", "--method=DELETE", "repos/o/r"],
    ["api", "-X", "post", "repos/o/r/issues"],
    ["api", "-X", "PUT", "repos/o/r/subscription"],
    ["api", "-iXPOST", "repos/o/r/issues"],
    ["api", "-f", "a=b", "repos/o/r/issues"],
    ["api", "-F", "a=1", "repos/o/r/issues"],
    ["api", "--field", "a=b", "repos/o/r/issues"],
    ["api", "--raw-field", "a=b", "repos/o/r/issues"],
    ["api", "--input", "body.json", "repos/o/r/issues"],
    ["api", "-fa=b", "repos/o/r/issues"],
    ["api", "-f=a=b", "repos/o/r/issues"],
    ["api", "--field=a=b", "repos/o/r/issues"],
    ["api", "--raw-field=title=x", "repos/o/r/issues"],
    ["api", "repos/o/r/issues", "-f", "title=x"],
    ["api", "-X", "GET", "-X", "POST", "repos/o/r/issues"],
    ["api", "-f", "title=--method", "-f", "x=GET", "repos/o/r/issues"],
    ["api", "--method", "DELETE", "repos/o/r", "--", "--method", "GET"],
    ["api", "--bogus-flag", "repos/o/r"],
    ["-X", "POST", "api", "repos/o/r/issues"],
    ["api", "graphql", "-f", "query=mutation { addStar(input: {starrableId: \"x\"}) { clientMutationId } }"],
    ["api", "graphql", "-f", "query=  # comment\nmutation{addStar(input:{starrableId:\"x\"}){clientMutationId}}"],
    ["api", "graphql", "-F", "query=@mutation.graphql"],
    ["api", "graphql", "-F", "query=@missing.graphql"],
    ["api", "graphql", "--raw-field", "query=mutation M { deleteIssue(input: {issueId: \"x\"}) { clientMutationId } }"],
    ["api", "graphql", "--field=query=mutation { x }"],
    ["api", "graphql", "-fquery=mutation { x }"],
    ["api", "graphql", "--input", "body.json"],
    ["api", "graphql", "--input", "missing.json"],
    ["api", "graphql", "-X", "DELETE", "-f", "query={ viewer { login } }"],
    ["pr", "merge", "1"],
    ["pr", "close", "1"],
    ["pr", "edit", "1", "--title", "x"],
    ["pr", "review", "1", "--approve"],
    ["pr", "comment", "1", "-b", "x"],
    ["pr", "checkout", "1"],
    ["pr", "--body", "view", "merge", "1"],
    ["pr", "merge", "--help"],
    ["repo", "delete", "o/r"],
    ["repo", "create", "x"],
    ["repo", "fork"],
    ["repo", "edit", "--visibility", "public"],
    ["release", "create", "v1"],
    ["issue", "close", "1"],
    ["issue", "edit", "1"],
    ["issue", "delete", "1"],
    ["issue", "comment", "1", "--edit-last", "-b", "x"],
    ["issue", "comment", "1", "--delete-last"],
    ["auth", "token"],
    ["auth", "login"],
    ["auth", "logout"],
    ["auth", "refresh"],
    ["auth", "setup-git"],
    ["auth", "status", "--show-token"],
    ["auth", "status", "-t"],
    ["auth", "status", "-at"],
    ["secret", "set", "X"],
    ["variable", "set", "X"],
    ["workflow", "run", "x"],
    ["run", "rerun", "1"],
    ["gist", "create", "f"],
    ["label", "create", "x"],
    ["alias", "set", "pm", "pr merge"],
    ["extension", "install", "o/gh-x"],
    ["pm", "1"],
    ["pr"],
]


@pytest.mark.parametrize("argv", GH_REFUSED, ids=lambda a: " ".join(a))
def test_gh_refuses(ghbox: GhBox, argv: list[str]) -> None:
    result = ghbox.gh(*argv)
    assert result.returncode == 1
    assert BLOCKED in result.stderr, result.stderr
    assert HOW_TO_ALLOW in result.stderr, result.stderr
    assert ghbox.reached() is None, "the real gh ran"


def test_gh_refusal_names_the_command(ghbox: GhBox) -> None:
    assert "`gh pr merge`" in ghbox.gh("pr", "merge", "1").stderr
    assert "`gh auth token`" in ghbox.gh("auth", "token").stderr
    assert "POST" in ghbox.gh("api", "-f", "a=b", "repos/o/r/issues").stderr
    assert "mutation" in ghbox.gh("api", "graphql", "-F", "query=@mutation.graphql").stderr
    assert "cannot read" in ghbox.gh("api", "graphql", "-F", "query=@missing.graphql").stderr


def test_gh_graphql_query_from_stdin(ghbox: GhBox) -> None:
    query = (ghbox.root / "query.graphql").read_text()
    result = ghbox.gh("api", "graphql", "-F", "query=@-", stdin=query)
    assert result.returncode == 0, result.stderr
    assert ghbox.reached() == ["api", "graphql", "-F", "query=@-"]
    assert ghbox.stdin_file.read_text() == query  # gh still gets the whole of stdin

    mutation = (ghbox.root / "mutation.graphql").read_text()
    refused = ghbox.gh("api", "graphql", "-F", "query=@-", stdin=mutation)
    assert refused.returncode == 1 and "mutation" in refused.stderr
    assert ghbox.reached() is None

    body = (ghbox.root / "body.json").read_text()
    refused = ghbox.gh("api", "graphql", "--input", "-", stdin=body)
    assert refused.returncode == 1
    assert ghbox.reached() is None


def test_gh_stdin_passes_through_untouched(ghbox: GhBox) -> None:
    result = ghbox.gh("issue", "create", "--title", "t", "--body-file", "-", stdin="line 1\nline 2\n")
    assert result.returncode == 0
    assert ghbox.stdin_file.read_text() == "line 1\nline 2\n"


def test_gh_found_on_path(ghbox: GhBox, tmp_path: Path) -> None:
    realbin = tmp_path / "realbin"
    install(Path(ghbox.env["AGENTBOX_REAL_GH"]), realbin / "gh")
    copy_dir = tmp_path / "gh-copy"
    install(WRAPPERS / "gh", copy_dir / "gh")
    env = {**ghbox.env, "PATH": os.pathsep.join([str(ghbox.root / "bin"), str(copy_dir), str(realbin), ghbox.env["PATH"]])}
    del env["AGENTBOX_REAL_GH"]
    result = subprocess.run(
        ["gh", "pr", "list"], cwd=ghbox.root, env=env, capture_output=True, text=True, input="", timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert ghbox.reached() == ["pr", "list"]
