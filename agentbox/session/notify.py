"""Desktop notifications on the host: `osascript` on macOS, `notify-send` on Linux when it is installed, nothing
when neither is there. Used when a detached session needs the user (agentbox.session.attention) and when a
background task ends.

The title and body may quote what the VM wrote: they are made visible (safetext), cut short, and handed
over as arguments, never as code: osascript gets them as `argv` of a fixed script, notify-send after `--`
with its markup characters escaped.
"""

from __future__ import annotations

import subprocess
import sys

from agentbox import hosttools
from agentbox.safetext import visible

TITLE_LIMIT = 100
BODY_LIMIT = 300
TIMEOUT_SEC = 5
APPLESCRIPT = ("on run argv", "display notification (item 2 of argv) with title (item 1 of argv)", "end run")


def notify(title: str, body: str, platform: str | None = None) -> bool:
    """Show a desktop notification; True when a notifier took it. Never raises, never waits more than 5 s."""
    argv = command(title, body, platform or sys.platform)
    if argv is None:
        return False
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=TIMEOUT_SEC, env=hosttools.environ())
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def command(title: str, body: str, platform: str) -> list[str] | None:
    """The notifier's argv for this platform, or None when the host has none."""
    title, body = _short(title, TITLE_LIMIT), _short(body, BODY_LIMIT)
    if platform == "darwin":
        osascript = hosttools.which("osascript")
        if osascript is None:
            return None
        script = [part for line in APPLESCRIPT for part in ("-e", line)]
        return [osascript, *script, title, body]
    notify_send = hosttools.which("notify-send")
    if notify_send is None:
        return None
    return [notify_send, "--app-name=agentbox", "--", title, _markup_escaped(body)]


def _short(text: str, limit: int) -> str:
    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _markup_escaped(text: str) -> str:
    """notify-send's body may be read as markup by the notification server."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
