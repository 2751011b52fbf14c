"""Anthropic's Claude Code: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec, ApiKey, BrokerSpec, LoginFormat, Prompt, Settings

# Approvals off (the VM is the sandbox). Claude Code asks once before its first bypass-permissions run unless
# skipDangerousModePermissionPrompt is set.
SETTINGS = {"permissions": {"defaultMode": "bypassPermissions"}, "skipDangerousModePermissionPrompt": True}

RECORD = AgentSpec(
    name="claude",
    binary="claude",
    default_args=("--dangerously-skip-permissions",),
    install="npm install -g @anthropic-ai/claude-code",
    update="npm install -g @anthropic-ai/claude-code@latest",
    credentials=("~/.claude/.credentials.json", "~/.claude.json"),
    summary="Anthropic Claude Code",
    title="Claude Code",
    endpoints=("api.anthropic.com", "console.anthropic.com", "statsig.anthropic.com", "claude.ai", "*.claude.ai",
               "platform.claude.com"),
    folder=".claude",
    sync_items=("CLAUDE.md", "settings.json", "skills/", "agents/", "commands/", "output-styles/", "plugins/"),
    pull_folders=("skills", "agents", "commands"),
    never_sync=("projects", "todos", "shell-snapshots", "statsig", "ide", "debug", "file-history", "session-env",
                "telemetry", "paste-cache", "settings.local.json"),
    sync_transforms=(("settings.json", "claude_settings"),),
    settings=Settings(".claude/settings.json", SETTINGS, "json", forced=True,
                      why="approvals are off in the VM (the VM is the sandbox)"),
    # Its callback listens on a random free port; the page it opens also offers a code to paste.
    login=("auth", "login"),
    login_formats=(LoginFormat(".claude/.credentials.json", "claude", ".claude.json", "claude_account"),),
    broker=BrokerSpec(
        format="claude_oauth", login_file=".claude/.credentials.json", login_command="claude auth login",
        access_hosts=("api.anthropic.com",),
        # console.anthropic.com's: older versions
        token_endpoints=(("platform.claude.com", "/v1/oauth/token"), ("console.anthropic.com", "/v1/oauth/token")),
        api_keys=(ApiKey("ANTHROPIC_API_KEY", "sk-ant-api03-", ("api.anthropic.com",), ("x-api-key",)),
                  ApiKey("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-", ("api.anthropic.com",))),
        companion=(".claude.json", "claude_json"),
    ),
    login_transforms=((".claude.json", "claude_json"),),
    one_time_prompts=(
        Prompt("the bypass-permissions confirmation before its first run",
               "settings: skipDangerousModePermissionPrompt", ".claude/settings.json"),
        Prompt("the folder-trust question, the auto-mode nudge, and the onboarding when a login is there",
               "launch.sh: mark_claude_onboarded", ".claude.json"),
    ),
    memory_file="~/.claude/CLAUDE.md",
    instruction_files=("CLAUDE.md", "CLAUDE.local.md", ".claude/"),
    host_run_files=(".claude/settings.json", ".claude/settings.local.json", ".mcp.json", ".claude/hooks/"),
    # it loads a subfolder's CLAUDE.md / CLAUDE.local.md when it works there; either may `@import` files
    instruction_names=("CLAUDE.md", "CLAUDE.local.md"),
    instruction_imports=("CLAUDE.md", "CLAUDE.local.md"),
    task_args=("-p",),  # --print: answer the prompt and exit
    resume=("--continue",),
    none={
        "model_after_arg": "--model goes first",
        "login_hint": "`claude auth login` says what to do itself",
        "login_files": "each of its credentials is a login by itself",
        "login_env": "doctor checks its login files only (not a CLAUDE_CODE_OAUTH_TOKEN in the env)",
        "guest_paths": "its files have the same paths on macOS, Linux and in the VM",
        "flag_subcommands": "its arguments always come first",
    },
)
