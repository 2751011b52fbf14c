"""`agentbox <agent> login`: the agent's own login in its VM, and its login made the host's: through the credential
broker, inside the login window this command opens (agentbox.credentials.loginwindow), asking before a login of
another account replaces the host's; without the broker, agentbox.credentials.writeback hands it back.
"""

from __future__ import annotations

import click

from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.agents.logins import FORMATS
from agentbox.cli.commands.ending import on_terminal
from agentbox.config.load import Config
from agentbox.credentials import loginwindow, writeback
from agentbox.credentials.broker import brokered
from agentbox.credentials.loginfiles import guest_path_for
from agentbox.errors import StateError
from agentbox.progress import note
from agentbox.safetext import visible
from agentbox.session import brokersetup, launch
from agentbox.session.prepare import Ask
from agentbox.tasks.activity import ProjectActivity
from agentbox.vm.lifecycle import VmControl


def login_agent(control: VmControl, name: str, args: list[str]) -> int:
    """`agentbox NAME login [ARGS]`: the agent's own login command in its VM; afterwards the login is the host's too.

    The agent's OAuth callback listens on the VM's localhost, which Lima forwards to the same port of the
    host's; the VM has no browser, so the page's address is printed (launch.sh's BROWSER) for the user to open.
    """
    agent = control.config.agent(name)
    control.config.require_workspace()
    spec = BUILTIN_AGENTS.get(name)
    binary = visible(agent.binary)
    if spec is None or spec.login is None:
        raise StateError(
            f"agentbox does not know how {name} logs in",
            hint=f"Run `agentbox {name} shell` and log in with {binary}'s own command there; the login stays in "
            "the VM.",
        )
    hint = f": {spec.login_hint}" if spec.login_hint else ""
    note(f"logging in to {spec.summary} in the VM {agent.vm_name}{hint}")
    note("open the address it shows in a browser on this computer: Lima forwards the VM's localhost ports here, "
         "so the login page's redirect reaches it")
    if not any(guest_path_for(path)[2:] in FORMATS for path in agent.credentials):
        note(f"{spec.summary} keeps its login where agentbox does not copy it back, so the login stays in the VM")
    window = _open_login_window(control.config, agent.vm_name, name)
    try:
        ask = Ask(agent, login=True, busy=ProjectActivity.of(control.config))
        code = launch.run(control, ask, launch.Command([agent.binary, *spec.login, *args]))
    except BaseException:  # Ctrl-C, an error: the window closes, and nobody is asked about a login made meanwhile
        if window is not None:
            window.close()
            _drop_pending(agent.vm_name, name, "the command ended before agentbox could ask")
        raise
    if window is not None:
        _settle_login(control.config, agent.vm_name, name, window.close())
    return code


def _open_login_window(config: Config, vm_name: str, name: str) -> loginwindow.Window | None:
    """With the credential broker, a login from the VM reaches the host's file only through the broker, which
    accepts one only inside this window (agentbox.credentials.loginwindow); None when the broker does not keep
    this agent's login."""
    if not brokersetup.wanted(config) or brokered.file_login(vm_name, config, name) is None:
        return None
    return loginwindow.arm(vm_name, name)


def _settle_login(config: Config, vm_name: str, name: str, used: loginwindow.Used | None) -> None:
    """After the agent's login: say whose login the host now has; a login of another account than the host's
    waits for the user's yes (on a terminal) before it replaces the host's."""
    login = brokered.file_login(vm_name, config, name)
    pending = loginwindow.pending(vm_name, name)
    if login is None:
        return
    where = writeback.home_relative(login.file.path)
    if pending is None:
        if used is not None:
            note(f"{where}: the host is now logged in to {login.title} as {_account(used.account)} (the login made "
                 "in the VM: the credential broker keeps it on the host, the VM holds placeholders)")
        return
    new, old = _account(pending.new), _account(pending.old)
    try:
        if not on_terminal():
            note(f"{where}: the {login.title} login made in the VM ({new}) was not saved: the host is logged in as "
                 f"{old}, and agentbox replaces the host's login of another account only when you say yes on a "
                 f"terminal. The host's login is kept (the VM goes on with it); run `agentbox {name} login` on a "
                 "terminal to replace it")
            return
        if not click.confirm(f"Replace the host's {login.title} login ({old}) with {new}?", default=False, err=True):
            note(f"{where}: the host's {login.title} login ({old}) is kept and the login made in the VM ({new}) "
                 f"discarded; the VM goes on with the host's login")
            return
        backup = login.replace_with(pending.response, pending.at)
        was = f"; the previous file is {writeback.home_relative(backup)}" if backup is not None else ""
        note(f"{where}: the host is now logged in to {login.title} as {new} (was {old}){was}")
    finally:
        loginwindow.discard(vm_name, name)


def _drop_pending(vm_name: str, name: str, why: str) -> None:
    pending = loginwindow.pending(vm_name, name)
    loginwindow.discard(vm_name, name)
    if pending is not None:
        note(f"the login made in the VM ({_account(pending.new)}) was discarded: {why}; the host's login is kept "
             f"(`agentbox {name} login` logs in again)")


def _account(shown: str | None) -> str:
    return visible(shown) if shown else "an account agentbox cannot tell"
