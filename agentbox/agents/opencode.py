"""OpenCode: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec

RECORD = AgentSpec(
    name="opencode",
    binary="opencode",
    # --auto: "auto-approve permissions that are not explicitly denied"; the TUI and `opencode run` take it.
    default_args=("--auto",),
    install="npm install -g opencode-ai",
    update="npm install -g opencode-ai@latest",
    credentials=("~/.local/share/opencode/auth.json",),
    summary="OpenCode",
    title="OpenCode",
    endpoints=("opencode.ai", "*.opencode.ai", "models.dev"),
    # `opencode --auto run x` would start the TUI in a folder named `run`: options follow `run`.
    flag_subcommands=("run",),
    login=("auth", "login"),
    memory_file="~/.config/opencode/AGENTS.md",  # its global rules
    instruction_files=("AGENTS.md", "opencode.json", "opencode.jsonc", ".opencode/"),
    host_run_files=("opencode.json", "opencode.jsonc", ".opencode/opencode.json", ".opencode/opencode.jsonc",
                    ".opencode/plugins/", ".opencode/plugin/"),
    instruction_names=("AGENTS.md",),  # read from the folders up from where it works
    task_args=("run",),  # opencode run --auto PROMPT
    resume=("--continue",),
    none={
        "instruction_imports": "AGENTS.md has no import syntax (opencode.json's instructions not followed)",
        "model_after_arg": "--model goes first (after `run` for `opencode run`: flag_subcommands)",
        "folder": "its setup is not synced into the VM (not built yet)",
        "sync_items": "its setup is not synced (no folder)",
        "pull_folders": "its setup is not synced (no folder)",
        "never_sync": "its setup is not synced (no folder)",
        "sync_transforms": "its setup is not synced (no folder)",
        "settings": "--auto turns approvals off; agentbox writes no settings of its own",
        "login_hint": "`opencode auth login` says what to do itself",
        "login_files": "its one credential file is its login",
        "login_env": "doctor checks only its login file",
        "broker": "its auth.json format is not brokered yet: staged",
        "login_formats": "its auth.json only travels host -> VM (no format agentbox reads)",
        "login_transforms": "its login file is copied as it is",
        "guest_paths": "its files have the same paths on Linux and in the VM",
        "one_time_prompts": "none known",
    },
)
