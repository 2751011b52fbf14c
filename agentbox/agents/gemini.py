"""Google's Gemini CLI: everything agentbox knows about it."""

from agentbox.agents.record import AgentSpec, ApiKey, BrokerSpec, LoginFormat, Prompt, Settings

# Gemini CLI takes yolo only from the command line; its settings only choose the login type a new VM asks for.
SETTINGS = {"security": {"auth": {"selectedType": "oauth-personal"}}}

RECORD = AgentSpec(
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
    title="Gemini CLI",
    endpoints=("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com", "oauth2.googleapis.com",
               "www.googleapis.com", "accounts.google.com"),
    folder=".gemini",
    sync_items=("settings.json", "GEMINI.md", "commands/", "extensions/"),
    pull_folders=("commands",),
    never_sync=("google_accounts.json", "google_account_id", "installation_id", "state.json",
                "trustedFolders.json"),
    sync_transforms=(("settings.json", "gemini_settings"), ("extensions/*/gemini-extension.json", "mcp_file")),
    settings=Settings(".gemini/settings.json", SETTINGS, "json", forced=False, why="the login type a new VM gets"),
    # No login command: the CLI asks how to log in when it has no login (/auth switches it), and its
    # callback listens on a random free port (NO_BROWSER=true: a code to paste instead).
    login=(),
    login_hint="choose \"Login with Google\" (or type /auth), then /quit once it says you are logged in",
    # The files it keeps beside its login (installation_id, state.json, google_accounts.json) are copied along
    # but are no login by themselves.
    login_files=("~/.gemini/oauth_creds.json",),
    login_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    login_formats=(LoginFormat(".gemini/oauth_creds.json", "gemini"),),
    broker=BrokerSpec(
        format="gemini_oauth", login_file=".gemini/oauth_creds.json",
        login_command='gemini (choose "Login with Google")',
        # Gemini CLI checks its token first at oauth2.googleapis.com/tokeninfo, then asks www.googleapis.com
        # for the user.
        access_hosts=("cloudcode-pa.googleapis.com", "oauth2.googleapis.com", "www.googleapis.com"),
        token_endpoints=(("oauth2.googleapis.com", "/token"),),
        # The Gemini API takes a key in x-goog-api-key (its SDK), in ?key= (documented; the voice WebSocket), and
        # with GEMINI_API_KEY_AUTH_MECHANISM=bearer in Authorization too.
        api_keys=(ApiKey("GEMINI_API_KEY", "AIza", ("generativelanguage.googleapis.com",),
                         ("x-goog-api-key", "?key", "authorization bearer")),
                  ApiKey("GOOGLE_API_KEY", "AIza", ("generativelanguage.googleapis.com",),
                         ("x-goog-api-key", "?key", "authorization bearer"))),
        # www.googleapis.com fronts Compute, Storage, BigQuery...; oauth2.googleapis.com revokes tokens: the token
        # goes only where Gemini CLI sends it (google-auth-library's getTokenInfo, fetchAndCacheUserInfo).
        access_routes=(("oauth2.googleapis.com", "POST /tokeninfo"), ("www.googleapis.com", "GET /oauth2/v2/userinfo")),
    ),
    one_time_prompts=(
        # It resets --approval-mode=yolo to "default" in a folder it does not trust.
        Prompt("whether to trust the workspace folder", "launch.sh: trust_workspace_for_gemini",
               ".gemini/trustedFolders.json"),
    ),
    memory_file="~/.gemini/GEMINI.md",
    instruction_files=("GEMINI.md", ".gemini/"),
    host_run_files=(".gemini/settings.json",),
    # it loads every GEMINI.md below the folder it starts in; a GEMINI.md may `@import` files
    instruction_names=("GEMINI.md",),
    instruction_imports=("GEMINI.md",),
    task_args=("-p",),  # --prompt: non-interactive
    resume=("--resume", "latest"),
    none={
        "model_after_arg": "--model goes first",
        "login_transforms": "its login files are copied as they are",
        "guest_paths": "its files have the same paths on macOS, Linux and in the VM",
        "flag_subcommands": "its arguments always come first",
    },
)
