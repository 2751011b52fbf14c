"""OpenAI's Codex CLI: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec, ApiKey, BrokerSpec, LoginFormat, Settings

SETTINGS = {"approval_policy": "never", "sandbox_mode": "danger-full-access"}  # approvals off

RECORD = AgentSpec(
    name="codex",
    binary="codex",
    default_args=("--dangerously-bypass-approvals-and-sandbox",),
    install="npm install -g @openai/codex",
    update="npm install -g @openai/codex@latest",
    credentials=("~/.codex/auth.json",),
    summary="OpenAI Codex CLI",
    title="Codex",
    endpoints=("api.openai.com", "auth.openai.com", "chatgpt.com", "*.chatgpt.com"),
    folder=".codex",
    sync_items=("config.toml", "AGENTS.md", "prompts/", "skills/"),
    pull_folders=("skills", "prompts"),
    never_sync=("archived_sessions", "shell_snapshots", "version.json", "models_cache.json"),
    sync_transforms=(("config.toml", "codex_config"),),
    settings=Settings(".codex/config.toml", SETTINGS, "toml", forced=True,
                      why="approvals are off in the VM (the VM is the sandbox)"),
    # Its callback listens on port 1455; `codex login --device-auth` needs no callback at all.
    login=("login",),
    login_formats=(LoginFormat(".codex/auth.json", "codex"),),
    broker=BrokerSpec(
        format="codex_auth", login_file=".codex/auth.json", login_command="codex login",
        access_hosts=("chatgpt.com", "api.openai.com"),
        token_endpoints=(("auth.openai.com", "/oauth/token"),),
        api_keys=(ApiKey("OPENAI_API_KEY", "sk-", ("api.openai.com",)),),
        file_api_key_hosts=("api.openai.com",),  # auth.json's OPENAI_API_KEY
        # chatgpt.com is all of ChatGPT (conversations, memories, the account): the token goes only to Codex's
        # backend (codex-rs: model-provider-info, backend-client, the TUI's voice, account settings).
        access_routes=(("chatgpt.com", "GET,POST /backend-api/codex/*"),
                       ("chatgpt.com", "GET,POST /backend-api/wham/*"),
                       ("chatgpt.com", "POST /backend-api/transcribe"),
                       ("chatgpt.com", "GET /backend-api/accounts/*")),
    ),
    memory_file="~/.codex/AGENTS.md",
    instruction_files=("AGENTS.md", "AGENTS.override.md", ".codex/"),
    host_run_files=(".codex/config.toml",),
    # read in every folder from the project's root down to where it works
    instruction_names=("AGENTS.md", "AGENTS.override.md"),
    task_args=("exec",),  # codex exec [OPTIONS] PROMPT
    resume=("resume", "--last"),
    none={
        "instruction_imports": "AGENTS.md has no import syntax",
        "model_after_arg": "--model goes first",
        "login_hint": "`codex login` says what to do itself",
        "login_files": "its one credential file is its login",
        "login_env": "doctor checks only its login file",
        "login_transforms": "its login file is copied as it is",
        "guest_paths": "its files have the same paths on macOS, Linux and in the VM",
        "one_time_prompts": "approvals are off through its flag and settings; it asks nothing else once",
        "flag_subcommands": "its arguments always come first",
    },
)
