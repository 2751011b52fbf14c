"""Kiro CLI: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec

RECORD = AgentSpec(
    name="kiro",
    binary="kiro-cli",
    default_args=("chat", "--trust-all-tools"),
    install="curl -fsSL https://cli.kiro.dev/install | bash",
    model_after_arg="chat",
    # macOS keeps it under Application Support; both land in ~/.local/share/kiro-cli in the VM.
    credentials=("~/Library/Application Support/kiro-cli/data.sqlite3", "~/.local/share/kiro-cli/data.sqlite3"),
    summary="Kiro CLI",
    title="Kiro",
    endpoints=("*.kiro.dev", "q.us-east-1.amazonaws.com", "codewhisperer.us-east-1.amazonaws.com",
               "oidc.us-east-1.amazonaws.com"),
    folder=".kiro",
    sync_items=("steering/", "agents/", "prompts/", "settings/mcp.json"),
    pull_folders=("agents", "prompts"),
    sync_transforms=(("settings/mcp.json", "mcp_file"), ("agents/*.json", "kiro_agent")),
    login=("login",),
    guest_paths=(("~/Library/Application Support/kiro-cli/", "~/.local/share/kiro-cli/"),),
    # A steering file of its own: Kiro reads every file in ~/.kiro/steering.
    memory_file="~/.kiro/steering/agentbox.md",
    instruction_files=(".kiro/",),
    host_run_files=(".kiro/settings/mcp.json", ".kiro/hooks/"),
    task_args=("--no-interactive",),  # after `chat --trust-all-tools`
    resume=("--resume",),
    none={
        "instruction_names": "it reads its steering from the workspace's .kiro/ only (listed)",
        "instruction_imports": "its steering files have no import syntax",
        "update": "its installer fetches the latest release: `agentbox update-agents` runs it again",
        "never_sync": "its folder holds no credentials, history or caches beyond what NEVER_SYNC names",
        "settings": "--trust-all-tools turns approvals off; agentbox writes no settings of its own",
        "login_hint": "`kiro-cli login` says what to do itself",
        "login_files": "its one login (a database) is a login by itself",
        "login_env": "doctor checks only its login file",
        "broker": "its login is a SQLite database the broker cannot read yet: staged",
        "login_formats": "its login is a SQLite database, which only travels host -> VM",
        "login_transforms": "its login file is copied as it is",
        "one_time_prompts": "none known",
        "flag_subcommands": "its arguments always come first (`chat` is one of its default arguments)",
    },
)
