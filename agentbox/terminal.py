"""Put the terminal back in a readable state after a program in the VM had it.

Whatever ran in the VM wrote straight to the user's terminal, and may have left it in a state that hides or
garbles what agentbox prints next: concealed or same-colour text, the alternate screen, a scroll region, a
hidden cursor, the line-drawing charset, insert or origin mode. `restore` undoes those modes one by one,
and nothing else: unlike `reset` it neither clears the screen nor moves the cursor, so the program's last
output stays where it was and what agentbox prints next goes below it. Only a terminal gets the bytes; a pipe or
file never does.

Origin mode is the one mode that may survive: DECRC brings back the origin mode DECSC saved with the cursor, and
turning it off homes the cursor. When a program left it on, it stays on, but over the whole screen (the scroll
region is reset), where it addresses the same cells as off; keeping the cursor in place matters more.
"""

from __future__ import annotations

import os
import sys

ESC = "\x1b"
CSI = ESC + "["
ST = ESC + "\\"

# Each entry undoes one mode; the order matters where noted.
RESTORE = "".join((
    CSI + "?1047l",  # leave the alternate screen; 1049l would also move the cursor to a position saved long ago
    CSI + "?2026l",  # synchronized output off: a terminal would otherwise hold back what follows
    CSI + "?5l",  # screen-wide reverse video off
    CSI + "?69l",  # left and right margins off (their mode, which also resets them)
    CSI + "<99u",  # kitty keyboard protocol: pop every pushed mode (ignored where unknown)
    CSI + ">4m",  # xterm's modifyOtherKeys back to its default (before SGR 0, in case it is read as SGR)
    CSI + "0m",  # attributes: concealed, reverse, blinking, colours
    ESC + "]104" + ST,  # the palette, and the default foreground, background and cursor colours (OSC 10-12)
    ESC + "]110" + ST,
    ESC + "]111" + ST,
    ESC + "]112" + ST,
    ESC + "(B",  # G0 is ASCII again (ESC ( 0 draws letters as line pieces)
    ESC + ")B",  # and G1
    "\x0f",  # shift in: G0 in use (after SO, G1 was)
    CSI + "4l",  # insert mode off
    CSI + "20l",  # line feed is a line feed (newline mode off)
    CSI + "?7h",  # autowrap on
    # Origin mode off and the whole screen as the scroll region: each of the two homes the cursor, so they go
    # between a save and a restore of it (after SGR 0 and the charsets, which the save keeps too).
    ESC + "7" + CSI + "?6l" + CSI + "r" + ESC + "8",
    CSI + "?25h",  # cursor visible
    CSI + "?1l",  # cursor keys in normal mode
    ESC + ">",  # keypad in numeric mode
    CSI + "?1000l" + CSI + "?1002l" + CSI + "?1003l" + CSI + "?1005l" + CSI + "?1006l" + CSI + "?1015l",  # no mouse
    CSI + "?1004l",  # no focus reports
    CSI + "?2004l",  # bracketed paste off: a shell that wants it turns it on again at its prompt
))


def restore() -> None:
    """Write RESTORE to stdout and stderr where they are terminals (once per terminal); never raises."""
    seen: list[os.stat_result] = []
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            fd = stream.fileno()
            if not os.isatty(fd):
                continue
            status = os.fstat(fd)
            if any(os.path.samestat(status, other) for other in seen):
                continue
            seen.append(status)
            os.write(fd, RESTORE.encode())
        except (OSError, ValueError, AttributeError):
            continue  # no descriptor (a test's capture) or a closed terminal: nothing to restore
