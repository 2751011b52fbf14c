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
    # The agent's user-level memory file in the guest, where agentbox keeps its description of the sandbox.
    memory_file: str | None = None


BUILTIN_AGENTS: dict[str, AgentSpec] = {
    "codex": AgentSpec(
        name="codex",
        binary="codex",
        default_args=("--dangerously-bypass-approvals-and-sandbox",),
        install="npm install -g @openai/codex",
        credentials=("~/.codex/auth.json",),
        summary="OpenAI Codex CLI",
        memory_file="~/.codex/AGENTS.md",
    ),
    "claude": AgentSpec(
        name="claude",
        binary="claude",
        default_args=("--dangerously-skip-permissions",),
        install="npm install -g @anthropic-ai/claude-code",
        credentials=("~/.claude/.credentials.json", "~/.claude.json"),
        summary="Anthropic Claude Code",
        memory_file="~/.claude/CLAUDE.md",
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
        memory_file="~/.gemini/GEMINI.md",
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
        # A steering file of its own: Kiro reads every file in ~/.kiro/steering.
        memory_file="~/.kiro/steering/agentbox.md",
    ),
}
