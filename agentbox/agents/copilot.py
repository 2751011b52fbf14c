"""GitHub Copilot CLI: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec

RECORD = AgentSpec(
    name="copilot",
    binary="copilot",
    # --allow-all = --allow-all-tools --allow-all-paths --allow-all-urls.
    default_args=("--allow-all",),
    # npm skips an optional dependency it failed to fetch or unpack without failing, and Copilot CLI's
    # program is such a dependency (one package per platform): seen in CI, "added 2 packages" and then
    # "no platform package found". So the program must start, or the install runs once more.
    install=("npm install -g @github/copilot"
             " && { copilot --version >/dev/null 2>&1 || npm install -g @github/copilot; }"),
    update=("npm install -g @github/copilot@latest"
            " && { copilot --version >/dev/null 2>&1 || npm install -g @github/copilot@latest; }"),
    # Holds the token only where the host has no keychain (macOS keeps it in the Keychain); in the VM
    # Copilot CLI also takes GH_TOKEN or the GitHub CLI's login, which agentbox brings along.
    credentials=("~/.copilot/config.json",),
    summary="GitHub Copilot CLI",
    title="Copilot CLI",
    endpoints=("api.github.com", "github.com", "api.githubcopilot.com", "*.githubcopilot.com"),
    # A device flow (a code to enter at github.com), typed in its TUI: no callback port at all.
    login=(),
    login_hint="type /login and enter the code it shows at the address it gives, then /exit",
    login_env=("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"),
    login_via_gh=True,
    memory_file="~/.copilot/copilot-instructions.md",  # its user-level instructions
    instruction_files=("AGENTS.md", ".github/copilot-instructions.md", ".github/instructions/", ".github/agents/",
                       ".github/prompts/"),
    instruction_names=("AGENTS.md",),  # the nearest AGENTS.md up from where it works
    task_args=("-p",),  # --prompt: non-interactive
    resume=("--continue",),
    none={
        "host_run_files": "it starts nothing from a project's files: its MCP servers are in ~/.copilot",
        "instruction_imports": "its instruction files have no import syntax",
        "model_after_arg": "--model goes first",
        "folder": "its setup is not synced into the VM (not built yet)",
        "sync_items": "its setup is not synced (no folder)",
        "pull_folders": "its setup is not synced (no folder)",
        "never_sync": "its setup is not synced (no folder)",
        "sync_transforms": "its setup is not synced (no folder)",
        "settings": "--allow-all turns approvals off; agentbox writes no settings of its own",
        "login_files": "its one credential file is its login",
        "broker": "its config.json format is not brokered yet: staged",
        "login_formats": "its config.json only travels host -> VM (no format agentbox reads)",
        "login_transforms": "its login file is copied as it is",
        "guest_paths": "its files have the same paths on Linux and in the VM",
        "one_time_prompts": "none known",
        "flag_subcommands": "its arguments always come first",
    },
)
