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
    # For an agent that reads a leading bare word as its sub-command and options before it as its TUI's
    # (opencode): the sub-commands that take default_args and --model right after them. Other
    # sub-commands get neither. None: the arguments always come first.
    flag_subcommands: tuple[str, ...] | None = None


BUILTIN_AGENTS: dict[str, AgentSpec] = {
    "codex": AgentSpec(
        name="codex",
        binary="codex",
        default_args=("--dangerously-bypass-approvals-and-sandbox",),
        install="npm install -g @openai/codex",
        credentials=("~/.codex/auth.json",),
        summary="OpenAI Codex CLI",
    ),
    "claude": AgentSpec(
        name="claude",
        binary="claude",
        default_args=("--dangerously-skip-permissions",),
        install="npm install -g @anthropic-ai/claude-code",
        credentials=("~/.claude/.credentials.json", "~/.claude.json"),
        summary="Anthropic Claude Code",
    ),
    "gemini": AgentSpec(
        name="gemini",
        binary="gemini",
        default_args=("--approval-mode=yolo", "--no-sandbox"),
        install="npm install -g @google/gemini-cli",
        credentials=(
            "~/.gemini/oauth_creds.json",
            "~/.gemini/google_accounts.json",
            "~/.gemini/google_account_id",
            "~/.gemini/installation_id",
            "~/.gemini/state.json",
        ),
        summary="Google Gemini CLI",
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
    ),
    "opencode": AgentSpec(
        name="opencode",
        binary="opencode",
        # --auto: "auto-approve permissions that are not explicitly denied"; the TUI and `opencode run` take it.
        default_args=("--auto",),
        install="npm install -g opencode-ai",
        credentials=("~/.local/share/opencode/auth.json",),
        summary="OpenCode",
        # `opencode --auto run x` would start the TUI in a folder named `run`: options follow `run`.
        flag_subcommands=("run",),
    ),
    "copilot": AgentSpec(
        name="copilot",
        binary="copilot",
        # --allow-all = --allow-all-tools --allow-all-paths --allow-all-urls.
        default_args=("--allow-all",),
        install="npm install -g @github/copilot",
        # Holds the token only where the host has no keychain (macOS keeps it in the Keychain); in the VM
        # Copilot CLI also takes GH_TOKEN or the GitHub CLI's login, which agentbox brings along.
        credentials=("~/.copilot/config.json",),
        summary="GitHub Copilot CLI",
    ),
}
