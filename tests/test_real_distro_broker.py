"""The real agent CLIs with the broker's placeholder logins, through agentbox's real broker (issue 26, "Tests").

Each CLI runs in the real-distribution tier's Debian userspace (tests/test_real_distro.py: its cached debootstrap
tarball and nodejs.org-shaped Node) as an unprivileged user. The test writes host login files holding
real-looking values into the test's own home, asks `agentbox.credentials.broker.brokered.prepare_request` for what the
VM gets (placeholder files and variables, Secrets, token endpoints), makes the VM's CA (`agentbox.net.certauthority`),
installs it in the userspace's system store as provision/launch/broker.sh does (update-ca-certificates, and
NODE_EXTRA_CA_CERTS / SSL_CERT_FILE / REQUESTS_CA_BUNDLE at the bundle), and starts agentbox's proxy with that
Brokering. The CLI's HTTPS_PROXY is the proxy; the broker's upstream is tests/fake_upstream.py standing for every
credential host. Only credential hosts are allowed: anything else the CLIs try (telemetry, updates) is refused,
so nothing leaves the machine.

What each test asserts: the CLI starts with no login prompt, its request reaches the fake upstream with the REAL
value where the VM sent a placeholder (the header the upstream saw), and no real value is ever in the guest.

The CLIs are installed with npm inside the userspace into a prefix cached beside the tier's userspace (keyed by
the versions; shared with the measuring harness of branch i26-clis). gh is Debian's package, in the image.

Run: python3 -m pytest -n 0 -m realdistro tests/test_real_distro_broker.py -s   (as root; -s prints what each
CLI sent and said)
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentbox import paths
from agentbox.credentials.broker import brokered
from agentbox.credentials.tokens import Upstream
from agentbox.net import certauthority
from agentbox.net import proxy as netproxy
from agentbox.net.broker import PLACEHOLDER_MARK, Brokering
from tests.fake_upstream import FakeUpstream, Request, Response, json_response
from tests.test_real_distro import (
    ARCH,
    HOST_NODE_EXTRA_CA_CERTS,
    NODE_VERSION,
    Machine,
    cache_dir,
    cache_lock,
    network_problem,
    node_dist,
    require_tier,
    rootfs_tarball,
    run,
    unavailable,
)

pytestmark = [pytest.mark.realdistro, pytest.mark.xdist_group("realdistro"), pytest.mark.timeout(900)]

# The versions examined (docs/design/broker.md names them); a new version is a new cache folder.
PACKAGES = ("@anthropic-ai/claude-code@2.1.332", "@openai/codex@0.171.0", "@google/gemini-cli@0.61.0")
CLIS = "/opt/agentbox-clis"  # the npm prefix inside the userspace
USER, UID = "agent", 1000
GUEST_HOME = f"/home/{USER}"
GUEST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # agentbox.staginglayout.GUEST_CA_BUNDLE
GUEST_CA = "/usr/local/share/ca-certificates/agentbox-broker.crt"
VM = "agentbox-realclis"
RUN_SECONDS = 60
PUSH_HINT = "sync.remoteWrite: true in the project's agentbox.yml (then agentbox trust)"
LOGIN_PROMPTS = ("Please run /login", "Invalid API key", "codex login", "Please set an Auth method",
                 "Waiting for authentication", "gh auth login", "Not logged in", "Manual authorization is required")


def real(prefix: str = "", size: int = 32) -> str:
    """A real-looking secret: what the host's login holds (never a placeholder)."""
    return prefix + secrets.token_urlsafe(size).replace("-", "x").replace("_", "y")


def jwt(claims: dict[str, Any]) -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    return ".".join([part(b'{"alg":"RS256","typ":"JWT","kid":"real-key-1"}'),
                     part(json.dumps(claims, separators=(",", ":")).encode()), part(secrets.token_bytes(64))])


# -- the userspace ---------------------------------------------------------------------------------------------


def _install_clis(machine: Machine) -> None:
    key = "-".join(p.rsplit("@", 1)[1] for p in PACKAGES) + f"-node{NODE_VERSION}"
    prefix = cache_dir() / "placeholder-clis" / key
    machine.binds.append((prefix, Path(CLIS), True))
    if (prefix / ".complete").exists():
        return
    prefix.mkdir(parents=True, exist_ok=True)
    npm_cache = cache_dir() / "npm-cache-root"
    npm_cache.mkdir(exist_ok=True)
    machine.binds.append((npm_cache, Path("/root/.npm"), True))
    extra = []  # a host behind a TLS-inspecting proxy (see HOST_NODE_EXTRA_CA_CERTS in the tier)
    if HOST_NODE_EXTRA_CA_CERTS and Path(HOST_NODE_EXTRA_CA_CERTS).is_file():
        shutil.copyfile(HOST_NODE_EXTRA_CA_CERTS, machine.path("/etc/agentbox-test-host-ca.pem"))
        extra = ["env", "NODE_EXTRA_CA_CERTS=/etc/agentbox-test-host-ca.pem"]
    install = [*extra, "/usr/local/bin/npm", "install", "-g", "--prefix", CLIS, "--no-audit", "--no-fund", *PACKAGES]
    for attempt in (1, 2):
        machine.run(install, timeout=1500)
        # npm leaves out an optional dependency it failed to fetch without failing (Codex's program is one, per
        # platform): each CLI must start before the cache counts as complete.
        broken = [name for name in ("claude", "codex", "gemini")
                  if machine.run([f"{CLIS}/bin/{name}", "--version"], check=False, timeout=120).returncode != 0]
        if not broken:
            break
        if attempt == 2:
            raise AssertionError(f"after two installs these CLIs do not start: {', '.join(broken)}")
    (prefix / ".complete").write_text(" ".join(PACKAGES) + "\n")
    machine.binds.pop()


def _clis_cached() -> bool:
    return any((cache_dir() / "placeholder-clis").glob("*/.complete"))


@pytest.fixture(scope="module")
def userspace(tmp_path_factory: pytest.TempPathFactory) -> Machine:
    require_tier("openssl", "setpriv")
    with cache_lock():
        problem = None if _clis_cached() else network_problem()
        if problem:
            unavailable(problem)
        tarball, dist = rootfs_tarball(), node_dist()
    root = tmp_path_factory.mktemp("brokered-clis") / "root"
    root.mkdir()
    run(["tar", "-C", str(root), "--numeric-owner", "-a", "-xf", str(tarball)])
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    top = f"node-{NODE_VERSION}-linux-{ARCH[1]}"
    run(["tar", "-C", str(root / "usr" / "local"), "--strip-components=1", "-xJf",
         str(dist / NODE_VERSION / f"{top}.tar.xz"), f"{top}/bin", f"{top}/lib"])
    machine = Machine(root)
    machine.run(["useradd", "--create-home", "--home-dir", GUEST_HOME, "--uid", str(UID), "--user-group", "--shell",
                 "/bin/bash", USER])
    with cache_lock():
        _install_clis(machine)
    return machine


# -- the broker ------------------------------------------------------------------------------------------------


@dataclass
class Broker:
    upstream: FakeUpstream
    prepared: brokered.Prepared
    proxy: netproxy.RunningProxy
    authority: certauthority.BrokerCA
    log: Path

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


UPSTREAM_HOSTS = ["api.anthropic.com", "platform.claude.com", "console.anthropic.com", "chatgpt.com",
                  "api.openai.com", "auth.openai.com", "oauth2.googleapis.com", "cloudcode-pa.googleapis.com",
                  "www.googleapis.com", "generativelanguage.googleapis.com", "github.com", "api.github.com"]


@contextmanager
def broker(tmp_path: Path, request: brokered.Request, routes: Callable[[FakeUpstream], None],
           allow_push: bool = False) -> Iterator[Broker]:
    """agentbox's broker for `request` (the host's logins in this test's HOME), its upstream the fake one."""
    with FakeUpstream(tmp_path / "upstream", UPSTREAM_HOSTS) as upstream:
        routes(upstream)
        address: Callable[[str, int], tuple[str, int]] = lambda host, port: upstream.address  # noqa: E731
        prepared = brokered.prepare_request(VM, request, Upstream(upstream.client_context(), address))
        authority = certauthority.ensure(VM, sorted(prepared.hosts))
        brokering = Brokering(
            leaves={host: certauthority.server_context(authority.leaf(host)) for host in prepared.hosts},
            secrets=tuple(prepared.secrets), endpoints=dict(prepared.endpoints), allow_push=allow_push,
            push_hint=PUSH_HINT,
            upstream_context=upstream.client_context(), upstream_address=address)
        # Only the credential hosts: whatever else a CLI tries is refused, never reaches the internet.
        policy = netproxy.Policy(allow=sorted(prepared.hosts), resolver=lambda host, port: [upstream.address[0]],
                                 allow_lan=True)
        log = tmp_path / "proxy.jsonl"
        with netproxy.start(policy, log, broker=brokering) as running:
            yield Broker(upstream, prepared, running, authority, log)


def host_file(relative: str, doc: Any) -> Path:
    path = paths.home() / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    path.chmod(0o600)
    return path


# -- running a CLI ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int | None  # None: still running after RUN_SECONDS (killed)
    output: str
    files: dict[str, str]  # the guest's login files after the run
    guest_home: Path

    def report(self, title: str, seen: list[Request]) -> str:
        lines = [f"===== {title}: exit {self.code}"]
        for request in seen:
            shown = [f"{k}: {v[:100]}" for k, v in request.raw_headers
                     if k.lower() in ("authorization", "x-api-key", "x-goog-api-key", "chatgpt-account-id",
                                      "user-agent", "content-type", "upgrade", "anthropic-beta")]
            lines.append(f"{request.method} https://{request.host}{request.path}\n  " + "\n  ".join(shown)
                         + (f"\n  body: {request.body[:300]!r}" if request.body else ""))
        lines += ["--- output (tail)", self.output[-3000:]]
        return "\n".join(lines)


def run_cli(machine: Machine, running: Broker, argv: list[str], extra_files: dict[str, str] | None = None,
            env: dict[str, str] | None = None, seconds: float = RUN_SECONDS) -> Outcome:
    """argv as the user in a fresh home holding the placeholder files (and `extra_files`), trusting the VM's CA
    from the system store, through the broker."""
    shutil.copyfile(running.authority.cert, machine.path(GUEST_CA))
    machine.run(["update-ca-certificates", "--fresh"], timeout=120)
    assert running.authority.cert_pem().strip().splitlines()[1] in machine.path(GUEST_BUNDLE).read_text()
    home = machine.path(GUEST_HOME)
    shutil.rmtree(home)
    home.mkdir(mode=0o700)
    files = dict(running.prepared.files)
    files.update({relative: text.encode() for relative, text in (extra_files or {}).items()})
    for relative, data in files.items():
        target = home / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o600)
    machine.run(["chown", "-R", f"{USER}:{USER}", GUEST_HOME])
    proxy = f"http://127.0.0.1:{running.proxy.port}"
    variables = {"HOME": GUEST_HOME, "USER": USER, "PATH": f"{CLIS}/bin:/usr/local/bin:/usr/bin:/bin",
                 "TERM": "dumb", "CI": "1", "HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy,
                 "http_proxy": proxy, "NO_PROXY": "", "NODE_EXTRA_CA_CERTS": GUEST_BUNDLE,
                 "SSL_CERT_FILE": GUEST_BUNDLE, "REQUESTS_CA_BUNDLE": GUEST_BUNDLE,
                 **running.prepared.env, **(env or {})}
    command = ["env", "-i", *(f"{k}={v}" for k, v in variables.items()), "sh", "-c",
               f"cd {GUEST_HOME} && exec \"$@\" </dev/null", "sh", *argv]
    full = machine.command(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups", *command])
    process = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={"R": str(machine.root), "PATH": os.environ["PATH"]}, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=seconds)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        code = None
    after = {relative: (home / relative).read_text(errors="replace") for relative in files
             if (home / relative).is_file()}
    return Outcome(code, output, after, home)


def assert_no_real_value_in_the_guest(outcome: Outcome, *reals: str) -> None:
    for path in outcome.guest_home.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 << 20:
            data = path.read_bytes()
            for value in reals:
                assert value.encode() not in data, f"a real credential is in the guest's {path}"


def assert_started(outcome: Outcome, title: str, seen: list[Request]) -> None:
    print(outcome.report(title, seen))
    prompts = [p for p in LOGIN_PROMPTS if p in outcome.output]
    assert not prompts, (prompts, outcome.output[-2000:])


def headers_seen(upstream: FakeUpstream, host: str, name: str) -> list[str]:
    return [value for request in upstream.requests_to(host) for key, value in request.raw_headers
            if key.lower() == name]


# -- the GitHub CLI ----------------------------------------------------------------------------------------------


GH_REAL = "gho_" + "R" * 4 + secrets.token_hex(16)


def gh_host_login() -> None:
    host_file(".config/gh/hosts.yml", f"github.com:\n    users:\n        octocat:\n            oauth_token: {GH_REAL}\n"
              f"    git_protocol: https\n    oauth_token: {GH_REAL}\n    user: octocat\n")


def gh_routes(upstream: FakeUpstream) -> None:
    upstream.route("GET", "/user", host="api.github.com", authorization=f"token {GH_REAL}",
                   json_body={"login": "octocat-from-the-fake-upstream", "id": 1})
    upstream.route("POST", "/repos/o/r/issues", host="api.github.com", status=201,
                   json_body={"number": 1, "title": "created"})


def test_gh_api_user_goes_through_the_broker_with_the_host_s_real_token(userspace: Machine, tmp_path: Path) -> None:
    gh_host_login()
    with broker(tmp_path, brokered.Request({}, True, {}), gh_routes) as running:
        placeholder = running.prepared.files[".config/gh/hosts.yml"].decode()
        assert PLACEHOLDER_MARK in placeholder and GH_REAL not in placeholder
        outcome = run_cli(userspace, running, ["gh", "api", "user"], seconds=45)
        seen = running.upstream.requests
        assert_started(outcome, "gh api user", seen)
        assert outcome.code == 0, outcome.output
        assert json.loads(outcome.output)["login"] == "octocat-from-the-fake-upstream"
        assert headers_seen(running.upstream, "api.github.com", "authorization") == [f"token {GH_REAL}"]
        assert_no_real_value_in_the_guest(outcome, GH_REAL)


def test_gh_api_post_is_refused_by_the_broker_and_never_reaches_github(userspace: Machine, tmp_path: Path) -> None:
    gh_host_login()
    with broker(tmp_path, brokered.Request({}, True, {}), gh_routes) as running:
        outcome = run_cli(userspace, running, ["gh", "api", "-X", "POST", "repos/o/r/issues", "-f", "title=t"],
                          seconds=45)
        assert_started(outcome, "gh api -X POST", running.upstream.requests)
        assert outcome.code != 0
        # gh shows the broker's message as its error (the JSON body also goes to stdout)
        assert (f"gh: agentbox credential broker: a write through GitHub's API (POST /repos/o/r/issues) is refused: "
                f"the VM's GitHub access is read-only (allowed by {PUSH_HINT}) (HTTP 403)") in outcome.output
        assert [r.path for r in running.upstream.requests] == []


def test_gh_api_post_reaches_github_when_the_broker_allows_writes(userspace: Machine, tmp_path: Path) -> None:
    gh_host_login()
    with broker(tmp_path, brokered.Request({}, True, {}), gh_routes, allow_push=True) as running:
        outcome = run_cli(userspace, running, ["gh", "api", "-X", "POST", "repos/o/r/issues", "-f", "title=t"],
                          seconds=45)
        assert_started(outcome, "gh api -X POST (writes allowed)", running.upstream.requests)
        assert outcome.code == 0, outcome.output
        assert json.loads(outcome.output)["title"] == "created"
        assert headers_seen(running.upstream, "api.github.com", "authorization") == [f"token {GH_REAL}"]


# -- Claude Code -------------------------------------------------------------------------------------------------


CLAUDE_ACCOUNT = {"accountUuid": "5b1f0c1e-0000-4000-8000-00000000a001", "emailAddress": "me@example.com",
                  "organizationUuid": "5b1f0c1e-0000-4000-8000-00000000a002"}
ANSWER = "hello from the fake upstream"


def claude_host_login(access: str, refresh: str, expires_in: float) -> Path:
    host_file(".claude.json", {"hasCompletedOnboarding": True, "oauthAccount": CLAUDE_ACCOUNT})
    return host_file(".claude/.credentials.json", {"claudeAiOauth": {
        "accessToken": access, "refreshToken": refresh, "expiresAt": int((time.time() + expires_in) * 1000),
        "scopes": ["user:inference", "user:profile", "user:sessions:claude_code"], "subscriptionType": "max"}})


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def claude_routes(access: str, refreshed: dict[str, str] | None = None) -> Callable[[FakeUpstream], None]:
    """api.anthropic.com answering only `access` (a profile, and one streamed message saying ANSWER);
    platform.claude.com's token endpoint answering `refreshed`'s tokens."""
    def routes(upstream: FakeUpstream) -> None:
        bearer = f"Bearer {access}"
        upstream.route("GET", "/api/oauth/profile", host="api.anthropic.com", authorization=bearer, json_body={
            "account": {"uuid": CLAUDE_ACCOUNT["accountUuid"], "email": CLAUDE_ACCOUNT["emailAddress"],
                        "has_claude_max": True, "has_claude_pro": False},
            "organization": {"uuid": CLAUDE_ACCOUNT["organizationUuid"], "organization_type": "claude_max",
                             "rate_limit_tier": "default_claude_max_20x"}})

        def messages(request: Request) -> Response:
            if request.headers.get("authorization") != bearer:
                return json_response({"type": "error", "error": {"type": "authentication_error",
                                                                 "message": "invalid x-api-key"}}, 401)
            model = json.loads(request.body).get("model", "claude-sonnet-4-5")
            if not json.loads(request.body).get("stream"):
                return json_response({"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                                      "content": [{"type": "text", "text": ANSWER}], "stop_reason": "end_turn",
                                      "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 5}})
            return Response(200, _sse(
                {"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant",
                                                      "model": model, "content": [], "stop_reason": None,
                                                      "stop_sequence": None,
                                                      "usage": {"input_tokens": 1, "output_tokens": 1}}},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}},
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": {"output_tokens": 5}},
                {"type": "message_stop"}), "text/event-stream", {"Cache-Control": "no-cache"})

        upstream.route("POST", "/v1/messages", host="api.anthropic.com", handler=messages)
        if refreshed is not None:
            upstream.route("POST", "/v1/oauth/token", host="platform.claude.com", json_body={
                "token_type": "Bearer", "access_token": refreshed["access"], "refresh_token": refreshed["refresh"],
                "expires_in": 28800, "scope": "user:inference user:profile user:sessions:claude_code"})
    return routes


CLAUDE_REQUEST = brokered.Request({"claude": ("~/.claude/.credentials.json", "~/.claude.json")}, False, {})


def test_claude_code_answers_through_the_broker_with_the_host_s_real_token(userspace: Machine,
                                                                           tmp_path: Path) -> None:
    access, refresh = real("sk-ant-oat01-"), real("sk-ant-ort01-")
    claude_host_login(access, refresh, expires_in=3600)
    with broker(tmp_path, CLAUDE_REQUEST, claude_routes(access)) as running:
        outcome = run_cli(userspace, running, ["claude", "-p", "say hi"])
        seen = running.upstream.requests
        assert_started(outcome, "claude -p (oauth)", seen)
        bearers = headers_seen(running.upstream, "api.anthropic.com", "authorization")
        assert bearers and set(bearers) == {f"Bearer {access}"}, bearers
        assert any(r.path.startswith("/v1/messages") for r in running.upstream.requests_to("api.anthropic.com"))
        assert ANSWER in outcome.output and outcome.code == 0
        assert_no_real_value_in_the_guest(outcome, access, refresh)


def test_claude_code_s_expired_login_is_refreshed_on_the_host_by_the_broker(userspace: Machine,
                                                                             tmp_path: Path) -> None:
    access, refresh = real("sk-ant-oat01-"), real("sk-ant-ort01-")
    new = {"access": real("sk-ant-oat01-"), "refresh": real("sk-ant-ort01-")}
    login = claude_host_login(access, refresh, expires_in=-600)
    with broker(tmp_path, CLAUDE_REQUEST, claude_routes(new["access"], refreshed=new)) as running:
        vm_before = json.loads(running.prepared.files[".claude/.credentials.json"])["claudeAiOauth"]
        assert vm_before["expiresAt"] < time.time() * 1000  # the VM sees the host's expiry: Claude Code refreshes
        outcome = run_cli(userspace, running, ["claude", "-p", "say hi"])
        assert_started(outcome, "claude -p (expired)", running.upstream.requests)
        # the broker sent the host's real refresh token to the token endpoint (Claude Code sent its placeholder)
        refreshes = running.upstream.requests_to("platform.claude.com")
        assert [(r.method, r.path) for r in refreshes] == [("POST", "/v1/oauth/token")]
        assert refreshes[0].json()["refresh_token"] == refresh
        assert refreshes[0].json()["grant_type"] == "refresh_token"
        # the host file holds the new real tokens ...
        host = json.loads(login.read_text())["claudeAiOauth"]
        assert (host["accessToken"], host["refreshToken"]) == (new["access"], new["refresh"])
        assert host["expiresAt"] > time.time() * 1000
        # ... the API got the new real token, and Claude Code answered
        assert set(headers_seen(running.upstream, "api.anthropic.com", "authorization")) == {
            f"Bearer {new['access']}"}
        assert ANSWER in outcome.output and outcome.code == 0
        # the VM's file holds only placeholders (Claude Code rewrote it from the broker's answer)
        vm = json.loads(outcome.files[".claude/.credentials.json"])["claudeAiOauth"]
        assert PLACEHOLDER_MARK in vm["accessToken"] and PLACEHOLDER_MARK in vm["refreshToken"], vm
        assert vm["expiresAt"] > time.time() * 1000
        assert_no_real_value_in_the_guest(outcome, access, refresh, new["access"], new["refresh"])


# -- Codex -------------------------------------------------------------------------------------------------------


CODEX_ACCOUNT = "3f9a1c2e-0000-4000-8000-0000000000aa"


def codex_host_login() -> tuple[Path, str, str]:
    now = int(time.time())
    auth = {"https://api.openai.com/auth": {"chatgpt_account_id": CODEX_ACCOUNT, "chatgpt_plan_type": "pro",
                                            "chatgpt_user_id": "user-real"}}
    id_token = jwt({"iss": "https://auth.openai.com", "sub": "auth0|real", "email": "me@example.com",
                    "aud": ["app_EMoamEEZ73f0CkXaXp7hrann"], "exp": now + 3600, "iat": now, **auth})
    access = jwt({"iss": "https://auth.openai.com", "sub": "auth0|real", "exp": now + 864000, "iat": now,
                  "aud": ["https://api.openai.com/v1"], "scp": ["openid", "email", "offline_access"], **auth})
    refresh = real("rt_")
    path = host_file(".codex/auth.json", {"OPENAI_API_KEY": None, "last_refresh": time.strftime(
        "%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()), "tokens": {"id_token": id_token, "access_token": access,
                                                                 "refresh_token": refresh,
                                                                 "account_id": CODEX_ACCOUNT}})
    return path, access, refresh


def codex_routes(access: str) -> Callable[[FakeUpstream], None]:
    """chatgpt.com answering only `access`: the account check Codex routes its workspace by, and the Responses
    API over HTTPS (SSE) saying ANSWER. A WebSocket upgrade gets a 404 (the fake upstream speaks no WebSocket)."""
    def routes(upstream: FakeUpstream) -> None:
        bearer = f"Bearer {access}"
        upstream.route("GET", "/backend-api/wham/accounts/check", host="chatgpt.com", authorization=bearer,
                       json_body={"accounts": [{"id": CODEX_ACCOUNT, "workspace_backend_origin": "https://chatgpt.com",
                                                "account_routing_override": "NO_CONSTRAINT", "plan_type": "pro"}]})

        def responses(request: Request) -> Response:
            if request.headers.get("authorization") != bearer:
                return json_response({"error": {"message": "unauthorized"}}, 401)
            item = {"type": "message", "role": "assistant", "id": "msg_fake",
                    "content": [{"type": "output_text", "text": ANSWER}]}
            usage = {"input_tokens": 1, "input_tokens_details": None, "output_tokens": 5,
                     "output_tokens_details": None, "total_tokens": 6}
            events = [{"type": "response.created", "response": {"id": "resp_fake"}},
                      {"type": "response.output_item.done", "item": item},
                      {"type": "response.completed", "response": {"id": "resp_fake", "usage": usage}}]
            return Response(200, b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events),
                            "text/event-stream")

        upstream.route("POST", "/backend-api/codex/responses", host="chatgpt.com", handler=responses)
    return routes


def test_codex_exec_reaches_chatgpt_through_the_broker_with_the_host_s_real_token(userspace: Machine,
                                                                                 tmp_path: Path) -> None:
    _, access, refresh = codex_host_login()
    with broker(tmp_path, brokered.Request({"codex": ("~/.codex/auth.json",)}, False, {}),
                codex_routes(access)) as running:
        outcome = run_cli(userspace, running, ["codex", "exec", "--skip-git-repo-check", "say hi"])
        assert_started(outcome, "codex exec (chatgpt)", running.upstream.requests)
        bearers = headers_seen(running.upstream, "chatgpt.com", "authorization")
        assert bearers and set(bearers) == {f"Bearer {access}"}, bearers
        # it tries the Responses WebSocket first (the upgrade reaches the upstream with the real token; the fake
        # one answers 404), then falls back to HTTPS and prints the answer
        upgrades = [r for r in running.upstream.requests_to("chatgpt.com")
                    if r.method == "GET" and r.path == "/backend-api/codex/responses"]
        assert upgrades and all(r.headers.get("upgrade", "").lower() == "websocket" for r in upgrades)
        assert ANSWER in outcome.output and outcome.code == 0
        assert_no_real_value_in_the_guest(outcome, access, refresh)


# -- Gemini CLI --------------------------------------------------------------------------------------------------


def gemini_host_login(expires_in: float) -> tuple[Path, str, str]:
    access, refresh = real("ya29.a0", 96), real("1//0g", 64)
    id_token = jwt({"iss": "https://accounts.google.com", "sub": "100000000000000000001", "email": "me@example.com",
                    "aud": "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com",
                    "exp": int(time.time()) + 3600})
    path = host_file(".gemini/oauth_creds.json", {
        "access_token": access, "refresh_token": refresh, "token_type": "Bearer", "id_token": id_token,
        "scope": "https://www.googleapis.com/auth/cloud-platform openid "
                 "https://www.googleapis.com/auth/userinfo.email https://www.googleapis.com/auth/userinfo.profile",
        "expiry_date": int((time.time() + expires_in) * 1000)})
    return path, access, refresh


def gemini_routes(access: str) -> Callable[[FakeUpstream], None]:
    """Google answering only `access`: tokeninfo (Gemini CLI validates its token first), Code Assist's
    loadCodeAssist and one streamed answer saying ANSWER."""
    def routes(upstream: FakeUpstream) -> None:
        bearer = f"Bearer {access}"
        upstream.route("POST", "/tokeninfo", host="oauth2.googleapis.com", authorization=bearer, json_body={
            "azp": "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com",
            "aud": "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com",
            "sub": "100000000000000000001", "scope": "https://www.googleapis.com/auth/cloud-platform openid",
            "exp": str(int(time.time()) + 3000), "expires_in": "3000", "email": "me@example.com",
            "email_verified": "true", "access_type": "offline"})
        upstream.route("POST", "/v1internal:loadCodeAssist", host="cloudcode-pa.googleapis.com", authorization=bearer,
                       json_body={"currentTier": {"id": "standard-tier", "name": "Gemini Code Assist"},
                                  "allowedTiers": [{"id": "standard-tier", "isDefault": True}],
                                  "cloudaicompanionProject": "real-project-123"})

        def stream(request: Request) -> Response:
            if request.headers.get("authorization") != bearer:
                return json_response({"error": {"code": 401, "status": "UNAUTHENTICATED"}}, 401)
            chunk = {"response": {"candidates": [{"content": {"role": "model", "parts": [{"text": ANSWER}]},
                                                  "finishReason": "STOP", "index": 0}],
                                  "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 5,
                                                    "totalTokenCount": 6}}, "traceId": "fake"}
            return Response(200, f"data: {json.dumps(chunk)}\r\n\r\n".encode(), "text/event-stream")

        upstream.route("POST", "/v1internal:streamGenerateContent", host="cloudcode-pa.googleapis.com",
                       handler=stream)
    return routes


GEMINI_SETTINGS = {".gemini/settings.json": json.dumps({"security": {"auth": {"selectedType": "oauth-personal"}}})}


def test_gemini_cli_reaches_code_assist_through_the_broker_with_the_host_s_real_token(userspace: Machine,
                                                                                     tmp_path: Path) -> None:
    _, access, refresh = gemini_host_login(expires_in=3600)
    with broker(tmp_path, brokered.Request({"gemini": ("~/.gemini/oauth_creds.json",)}, False, {}),
                gemini_routes(access)) as running:
        outcome = run_cli(userspace, running, ["gemini", "-p", "say hi"], extra_files=GEMINI_SETTINGS,
                          env={"GEMINI_CLI_TRUST_WORKSPACE": "true"})
        assert_started(outcome, "gemini -p (oauth)", running.upstream.requests)
        # its token check first, then Code Assist: each with the host's real token
        first = running.upstream.requests[0]
        assert (first.host, first.path, first.headers["authorization"]) == (
            "oauth2.googleapis.com", "/tokeninfo", f"Bearer {access}")
        bearers = headers_seen(running.upstream, "cloudcode-pa.googleapis.com", "authorization")
        assert bearers and set(bearers) == {f"Bearer {access}"}, bearers
        assert ANSWER in outcome.output and outcome.code == 0
        assert_no_real_value_in_the_guest(outcome, access, refresh)
