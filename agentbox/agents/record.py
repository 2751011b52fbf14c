"""The shape of an agent's record: everything agentbox knows about one agent, in one place.

A built-in agent's record lives in its own module (agents/claude.py, ...); agents/builtin.py gathers them.
Every other module reads its per-agent facts from the records. A record holds data and names only: where a
fact needs code to interpret it (a login file's format, a settings file's transform), the record names the
function, and the module that owns that kind of code keeps a table from name to function
(agents.logins.PARSERS, sync.transform.TRANSFORMS).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple


class LoginFormat(NamedTuple):
    """A login file agentbox can write back from the VM (agentbox.credentials.writeback)."""

    path: str  # relative to the home, as staged
    parser: str  # a name in agents.logins.PARSERS
    companion: str | None = None  # another staged file that names the account (relative to the home)
    companion_parser: str | None = None  # its name in agents.logins.COMPANION_PARSERS


class ApiKey(NamedTuple):
    """An API key of the agent's that the config's env may hold, as the credential broker keeps it."""

    variable: str
    kind: str  # the usual prefix of such a key, which the VM's placeholder carries
    hosts: tuple[str, ...]  # where its real value may go
    # where its service takes it: "HEADER SCHEME" ("authorization bearer"), "HEADER" (the whole value), "?PARAM"
    places: tuple[str, ...] = ("authorization bearer",)


class BrokerSpec(NamedTuple):
    """How the credential broker keeps the agent's login on the host (agentbox.credentials.broker.brokered): the VM gets
    a placeholder version of its login file and API keys, and the real values go only to these hosts."""

    format: str  # the login file's shape: a name in credentials.brokered.FORMATS
    login_file: str  # relative to the home
    login_command: str  # what logs it in on the host, for "log in on the host with ..."
    access_hosts: tuple[str, ...]  # where its access token may go
    token_endpoints: tuple[tuple[str, str], ...]  # (host, path) of its OAuth token requests, answered on the host
    api_keys: tuple[ApiKey, ...] = ()
    file_api_key_hosts: tuple[str, ...] = ()  # an API key kept in the login file itself may go there (Codex)
    access_places: tuple[str, ...] = ("authorization bearer",)  # where its services take the access token (ApiKey)
    # (host, "METHOD[,METHOD] PATH"): on a host that fronts more than the agent's API, the only requests its access
    # token goes with ("PATH*": any path under it); a host not named here takes it for any request
    access_routes: tuple[tuple[str, str], ...] = ()
    # Another file of its login the VM gets a version of without secrets (relative to the home), and that
    # version's maker: a name in credentials.brokered.COMPANIONS.
    companion: tuple[str, str] | None = None


class Settings(NamedTuple):
    """The agent's own settings that agentbox keeps in the VM: written into a new VM's home (vm.provisioning),
    and applied to the user's synced copy by the file's transform (sync.transform)."""

    path: str  # relative to the home
    values: dict[str, Any]
    syntax: str  # "json" or "toml" (a flat table of strings)
    forced: bool  # True: the values win over the user's (approvals off); False: only where the user set none
    why: str  # said in `agentbox sync --show` when a value is set


class Prompt(NamedTuple):
    """A question the agent asks once, which agentbox answers in advance so a launch starts straight away."""

    asks: str
    answered_by: str  # where agentbox answers it: a settings value, or launch.sh's function
    file: str  # the file the answer lands in, relative to the home (or absolute)


class AgentSpec(NamedTuple):
    name: str
    binary: str
    default_args: tuple[str, ...]  # the approvals-off flags the launch adds
    install: str | None = None
    # --model goes right after this argument when present (kiro: after `chat`), else first.
    model_after_arg: str | None = None
    credentials: tuple[str, ...] = ()
    summary: str = ""
    # The agent's name in words, as messages say it ("Claude Code").
    title: str = ""
    # The hosts it needs for its model API and its login (network.mode allowlist/offline; agents.NAME.endpoints
    # replaces them).
    endpoints: tuple[str, ...] = ()
    # The agent's own setup (agentbox.sync.agentsetup): its folder in the home, relative to it; what in it is
    # brought into the VM (a trailing / marks a folder); what `agentbox sync pull` may bring back; and
    # what no `sync.include` can bring (credentials, history, sessions, caches, logs, databases).
    folder: str | None = None
    sync_items: tuple[str, ...] = ()
    pull_folders: tuple[str, ...] = ()
    never_sync: tuple[str, ...] = ()
    # Files of its folder that are parsed and filtered on their way into the VM: (a pattern relative to the
    # folder, one * per path segment at most; a name in sync.transform.TRANSFORMS). Any other file: `text`.
    sync_transforms: tuple[tuple[str, str], ...] = ()
    settings: Settings | None = None
    # `agentbox NAME login` runs the binary with these arguments (None: the agent has no login command).
    # The OAuth callback of each listens on the VM's localhost, which Lima forwards to the host's.
    login: tuple[str, ...] | None = None
    login_hint: str = ""  # what to do in the agent, said before it starts
    # Of its credentials, the files that are a login by themselves (doctor); None: each of them is one.
    login_files: tuple[str, ...] | None = None
    login_env: tuple[str, ...] = ()  # variables of the config's env that log it in (an API key)
    login_via_gh: bool = False  # it falls back to the GitHub CLI's login, which agentbox brings into the VM
    login_formats: tuple[LoginFormat, ...] = ()  # the login files written back from the VM
    broker: BrokerSpec | None = None  # how the credential broker keeps its login on the host
    # Login files staged through a transform (the path relative to the home; a name in
    # sync.transform.LOGIN_TRANSFORMS): ~/.claude.json also holds Claude Code's user-scope MCP servers.
    login_transforms: tuple[tuple[str, str], ...] = ()
    # Host paths that live elsewhere in the Linux guest (a host prefix, its guest prefix).
    guest_paths: tuple[tuple[str, str], ...] = ()
    one_time_prompts: tuple[Prompt, ...] = ()
    # For an agent that reads a leading bare word as its sub-command and options before it as its TUI's
    # (opencode): the sub-commands that take default_args and --model right after them. Other
    # sub-commands get neither. None: the arguments always come first.
    flag_subcommands: tuple[str, ...] | None = None
    # The agent's user-level memory file in the guest, where agentbox keeps its description of the sandbox.
    memory_file: str | None = None
    # Its non-interactive form for `agentbox run` (the prompt follows them as the last argument). A leading
    # bare word is a sub-command that the default arguments and --model follow (`codex exec`, `opencode run`).
    task_args: tuple[str, ...] = ()
    # The agent's own way back into its last conversation in this folder (`agentbox attach` on a session
    # whose agent exited says `agentbox NAME <resume>`); None when it has none.
    resume: tuple[str, ...] | None = None
    # Its own update path in the VM (`agentbox update-agents`); None: its install command again, which fetches
    # the latest release (kiro's installer).
    update: str | None = None
    # The workspace files that steer this agent (its project instructions, settings with hooks, commands, MCP
    # servers), relative to the workspace; a trailing / marks a folder (everything in it). What a session or
    # task changes there is held until the user approves it (agentbox.review.instructions).
    instruction_files: tuple[str, ...] = ()
    # The workspace files this agent, run on the host in the project, executes or starts programs from (hooks,
    # status-line commands, MCP servers, plugins; a trailing / marks a folder, listed one level): the tripwire
    # watches them (agentbox.review.tripwire).
    host_run_files: tuple[str, ...] = ()
    # The names of its instruction files in any folder of the workspace (a CLAUDE.md in src/ steers Claude Code
    # working there): the quarantine looks for them in every folder (agentbox.review.instructionscan's bounds).
    instruction_names: tuple[str, ...] = ()
    # Of those, the names whose files import other files with `@path` lines (agentbox.review.instructionimports):
    # what an approved one imports is held like an instruction file.
    instruction_imports: tuple[str, ...] = ()
    # The fields this agent leaves empty on purpose: field name -> why (tests/test_agent_records.py checks that
    # every other field is set).
    none: Mapping[str, str] = MappingProxyType({})


# Whatever the agent: never brought into the VM by sync.include.
NEVER_SYNC = ("history*", "*.log", "log", "logs", "cache", "caches", "*.sqlite*", "*.db", "*.db-*", "tmp",
              "sessions", "*credentials*", "auth.json", "oauth_creds.json")
