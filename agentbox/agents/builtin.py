"""The agents agentbox knows how to run: built-in ones and the ones a config defines."""

from typing import NamedTuple


class AgentSpec(NamedTuple):
    name: str
    binary: str
    default_args: tuple[str, ...]
    install: str | None = None
    # --model goes right after this argument when present (kiro: after `chat`), else first.
    model_after_arg: str | None = None
    credentials: tuple[str, ...] = ()
    summary: str = ""
    # The agent's own setup (agentbox.sync.stage): its folder in the home, relative to it; what in it is
    # brought into the VM (a trailing / marks a folder); what `agentbox sync pull` may bring back; and
    # what no `sync.include` can bring (credentials, history, sessions, caches, logs, databases).
    folder: str | None = None
    sync_items: tuple[str, ...] = ()
    pull_folders: tuple[str, ...] = ()
    never_sync: tuple[str, ...] = ()
    # `agentbox NAME login` runs the binary with these arguments (None: the agent has no login command).
    # The OAuth callback of each listens on the VM's localhost, which Lima forwards to the host's.
    login: tuple[str, ...] | None = None
    login_hint: str = ""  # what to do in the agent, said before it starts
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


# The settings that turn each agent's approvals off (the VM is the sandbox): a new VM gets them
# (agentbox.vm.provisioning) and the user's synced settings keep them (agentbox.sync.transform).
CLAUDE_SETTINGS = {"permissions": {"defaultMode": "bypassPermissions"}, "skipDangerousModePermissionPrompt": True}
CODEX_SETTINGS = {"approval_policy": "never", "sandbox_mode": "danger-full-access"}
GEMINI_SETTINGS = {"security": {"auth": {"selectedType": "oauth-personal"}}}  # the login type a new VM asks for

# Whatever the agent: never brought into the VM by sync.include.
NEVER_SYNC = ("history*", "*.log", "log", "logs", "cache", "caches", "*.sqlite*", "*.db", "*.db-*", "tmp",
              "sessions", "*credentials*", "auth.json", "oauth_creds.json")


BUILTIN_AGENTS: dict[str, AgentSpec] = {
    "codex": AgentSpec(
        name="codex",
        binary="codex",
        default_args=("--dangerously-bypass-approvals-and-sandbox",),
        install="npm install -g @openai/codex",
        update="npm install -g @openai/codex@latest",
        credentials=("~/.codex/auth.json",),
        summary="OpenAI Codex CLI",
        folder=".codex",
        sync_items=("config.toml", "AGENTS.md", "prompts/", "skills/"),
        pull_folders=("skills", "prompts"),
        never_sync=("archived_sessions", "shell_snapshots", "version.json", "models_cache.json"),
        # Its callback listens on port 1455; `codex login --device-auth` needs no callback at all.
        login=("login",),
        memory_file="~/.codex/AGENTS.md",
        task_args=("exec",),  # codex exec [OPTIONS] PROMPT
        resume=("resume", "--last"),
    ),
    "claude": AgentSpec(
        name="claude",
        binary="claude",
        default_args=("--dangerously-skip-permissions",),
        install="npm install -g @anthropic-ai/claude-code",
        update="npm install -g @anthropic-ai/claude-code@latest",
        credentials=("~/.claude/.credentials.json", "~/.claude.json"),
        summary="Anthropic Claude Code",
        folder=".claude",
        sync_items=("CLAUDE.md", "settings.json", "skills/", "agents/", "commands/", "output-styles/", "plugins/"),
        pull_folders=("skills", "agents", "commands"),
        never_sync=("projects", "todos", "shell-snapshots", "statsig", "ide", "debug", "file-history", "session-env",
                    "telemetry", "paste-cache", "settings.local.json"),
        # Its callback listens on a random free port; the page it opens also offers a code to paste.
        login=("auth", "login"),
        memory_file="~/.claude/CLAUDE.md",
        task_args=("-p",),  # --print: answer the prompt and exit
        resume=("--continue",),
    ),
    "gemini": AgentSpec(
        name="gemini",
        binary="gemini",
        default_args=("--approval-mode=yolo", "--no-sandbox"),
        install="npm install -g @google/gemini-cli",
        update="npm install -g @google/gemini-cli@latest",
        credentials=(
            "~/.gemini/oauth_creds.json",
            "~/.gemini/google_accounts.json",
            "~/.gemini/google_account_id",
            "~/.gemini/installation_id",
            "~/.gemini/state.json",
        ),
        summary="Google Gemini CLI",
        folder=".gemini",
        sync_items=("settings.json", "GEMINI.md", "commands/", "extensions/"),
        pull_folders=("commands",),
        never_sync=("google_accounts.json", "google_account_id", "installation_id", "state.json",
                    "trustedFolders.json"),
        # No login command: the CLI asks how to log in when it has no login (/auth switches it), and its
        # callback listens on a random free port (NO_BROWSER=true: a code to paste instead).
        login=(),
        login_hint="choose \"Login with Google\" (or type /auth), then /quit once it says you are logged in",
        memory_file="~/.gemini/GEMINI.md",
        task_args=("-p",),  # --prompt: non-interactive
        resume=("--resume", "latest"),
    ),
    "kiro": AgentSpec(
        name="kiro",
        binary="kiro-cli",
        default_args=("chat", "--trust-all-tools"),
        install="curl -fsSL https://cli.kiro.dev/install | bash",
        model_after_arg="chat",
        # macOS keeps it under Application Support; both land in ~/.local/share/kiro-cli in the VM.
        credentials=("~/Library/Application Support/kiro-cli/data.sqlite3", "~/.local/share/kiro-cli/data.sqlite3"),
        summary="Kiro CLI",
        folder=".kiro",
        sync_items=("steering/", "agents/", "prompts/", "settings/mcp.json"),
        pull_folders=("agents", "prompts"),
        login=("login",),
        # A steering file of its own: Kiro reads every file in ~/.kiro/steering.
        memory_file="~/.kiro/steering/agentbox.md",
        task_args=("--no-interactive",),  # after `chat --trust-all-tools`
        resume=("--resume",),
    ),
    "opencode": AgentSpec(
        name="opencode",
        binary="opencode",
        # --auto: "auto-approve permissions that are not explicitly denied"; the TUI and `opencode run` take it.
        default_args=("--auto",),
        install="npm install -g opencode-ai",
        update="npm install -g opencode-ai@latest",
        credentials=("~/.local/share/opencode/auth.json",),
        summary="OpenCode",
        # `opencode --auto run x` would start the TUI in a folder named `run`: options follow `run`.
        flag_subcommands=("run",),
        login=("auth", "login"),
        memory_file="~/.config/opencode/AGENTS.md",  # its global rules
        task_args=("run",),  # opencode run --auto PROMPT
        resume=("--continue",),
    ),
    "copilot": AgentSpec(
        name="copilot",
        binary="copilot",
        # --allow-all = --allow-all-tools --allow-all-paths --allow-all-urls.
        default_args=("--allow-all",),
        install="npm install -g @github/copilot",
        update="npm install -g @github/copilot@latest",
        # Holds the token only where the host has no keychain (macOS keeps it in the Keychain); in the VM
        # Copilot CLI also takes GH_TOKEN or the GitHub CLI's login, which agentbox brings along.
        credentials=("~/.copilot/config.json",),
        summary="GitHub Copilot CLI",
        # A device flow (a code to enter at github.com), typed in its TUI: no callback port at all.
        login=(),
        login_hint="type /login and enter the code it shows at the address it gives, then /exit",
        memory_file="~/.copilot/copilot-instructions.md",  # its user-level instructions
        task_args=("-p",),  # --prompt: non-interactive
        resume=("--continue",),
    ),
}


MODEL_FLAGS = ("--model", "-m")


def model_after(name: str, default_args: tuple[str, ...]) -> int | None:
    """Where --model goes: first, or right after the agent's anchor argument (kiro's `chat`).

    None when the anchor is missing (custom kiro args without `chat`): like the previous agentbox,
    no model is added then, since kiro's other subcommands take no --model.
    """
    spec = BUILTIN_AGENTS.get(name)
    anchor = spec.model_after_arg if spec else None
    if anchor is None:
        return 0
    return default_args.index(anchor) + 1 if anchor in default_args else None


def flag_subcommands(name: str) -> tuple[str, ...] | None:
    spec = BUILTIN_AGENTS.get(name)
    return spec.flag_subcommands if spec else None


def agent_argv(
    binary: str,
    default_args: list[str],
    user_args: list[str],
    model: str | None,
    after: int | None,
    subcommands: tuple[str, ...] | None = None,
) -> list[str]:
    """binary, default args (with --model at `after`), user args. With `subcommands` (see
    AgentSpec.flag_subcommands) a leading bare word is a sub-command: the default args and the model
    follow it when it is one of them, and are left out for any other."""
    lead: list[str] = []
    rest = list(user_args)
    if subcommands is not None and rest and not rest[0].startswith("-"):
        if rest[0] not in subcommands:
            return [binary, *rest]
        lead, rest = rest[:1], rest[1:]
    args = [*default_args, *rest]
    if model and after is not None and not any(a in MODEL_FLAGS or a.startswith("--model=") for a in rest):
        args[after:after] = ["--model", model]
    return [binary, *lead, *args]
