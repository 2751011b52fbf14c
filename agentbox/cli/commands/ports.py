"""Port commands: `agentbox port GUEST [HOST]` forwards one port on demand, `agentbox ports` lists them all."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from agentbox import tables
from agentbox.cli.commands.common import vm_control, vm_name
from agentbox.errors import AgentboxError, StateError
from agentbox.progress import note, say
from agentbox.safetext import visible
from agentbox.vm import forwards, lifecycle
from agentbox.vm.lima import RUNNING, host_port_in_use, stop_port_forward

if TYPE_CHECKING:
    from agentbox.vm.forwards import Holders

PORT = click.IntRange(1, 65535)


@click.command("port")
@click.argument("guest_port", type=PORT, required=False)
@click.argument("host_port", type=PORT, required=False)
@click.option("--stop", "stop_port", type=PORT, metavar="HOST_PORT", help="End the forward on this host port.")
@click.pass_context
def port_command(ctx: click.Context, guest_port: int | None, host_port: int | None, stop_port: int | None) -> None:
    """Forward a VM port to the host's 127.0.0.1; print its URL.

    Lima forwards every port a program in the VM listens on to the same host port by itself. This is
    for a port Lima could not forward (another VM or program has that host port) or one you want
    elsewhere: `agentbox port 3000 3001` makes the VM's port 3000 http://127.0.0.1:3001/. The forward
    lasts until the VM stops or `agentbox port --stop 3001`.
    """
    if (guest_port is None) == (stop_port is None) or (stop_port is not None and host_port is not None):
        raise click.UsageError("give GUEST_PORT [HOST_PORT], or --stop HOST_PORT")
    control = vm_control(ctx, acts=False)
    name = vm_name(control)
    instances = control.lima.instances()
    instance = instances.get(name)
    if instance is None:
        raise StateError(f"the VM {name} does not exist, so it has no port to forward",
                         hint="`agentbox start` creates and starts it.")
    lifecycle.check_ownership(instance, control.config)
    if stop_port is not None:
        _stop(name, stop_port)
        return
    assert guest_port is not None
    if instance.status != RUNNING:
        raise StateError(f"the VM {name} is {instance.status.lower() or 'not running'}, so its ports cannot be "
                         "forwarded", hint="`agentbox start` starts it.")
    host_port = host_port or guest_port
    holders = forwards.Holders(instances, instance)
    url = f"http://127.0.0.1:{host_port}/"
    own = holders.on_demand.get(name, [])
    if any(item.guest_port == guest_port and item.host_port == host_port for item in own):
        note(f"agentbox port already forwards 127.0.0.1:{host_port} to port {guest_port} of {name}")
        click.echo(url)
        return
    lima_forwards = holders.forwards.get(name, [])
    if any(f.forwarded and f.guest_port == guest_port and f.host_port == host_port for f in lima_forwards):
        note(f"Lima already forwards port {guest_port} of {name} to 127.0.0.1:{host_port}")
        click.echo(url)
        return
    _check_free(holders, name, guest_port, host_port)
    if not any(f.guest_port == guest_port for f in lima_forwards):
        note(f"Lima has not seen a program listen on port {guest_port} in {name} yet; the URL works once one does")
    pid = control.lima.forward_port(instance, guest_port, host_port, forwards.log_path(name, host_port))
    forwards.save_on_demand(name, [*own, forwards.OnDemand(name, pid, guest_port, host_port)])
    say(f"forwarding 127.0.0.1:{host_port} to port {guest_port} of {name} until it stops "
        f"(`agentbox port --stop {host_port}` ends it sooner)")
    click.echo(url)


def _check_free(holders: Holders, name: str, guest_port: int, host_port: int) -> None:
    """Refuse a host port another VM, agentbox port, this VM's Lima forward or a host program has."""
    taken = None
    holder = holders.vm_holder(host_port, name)
    if holder is not None:
        taken = holder.text(host_port, name)
    elif any(f.forwarded and f.host_port == host_port for f in holders.forwards.get(name, [])):
        guest = next(f.guest_port for f in holders.forwards[name] if f.forwarded and f.host_port == host_port)
        taken = f"Lima forwards port {guest} of {name} there"
    elif host_port_in_use(host_port):
        taken = forwards.Holder("host").text(host_port, name)
    if taken is None:
        return
    free = holders.free_port_near(host_port, name)
    raise AgentboxError(
        f"127.0.0.1:{host_port} is taken: {taken}",
        hint=f"`agentbox port {guest_port} {free}` forwards it to 127.0.0.1:{free} instead." if free else None,
    )


def _stop(name: str, host_port: int) -> None:
    own = forwards.on_demand(name)
    ending = [item for item in own if item.host_port == host_port]
    if not ending:
        current = ", ".join(str(item.host_port) for item in own) or "none"
        raise AgentboxError(f"agentbox port has no forward of {name} on host port {host_port}",
                            hint=f"Its forwards of {name} are on host ports: {current} (`agentbox ports` lists all).")
    for item in ending:
        stop_port_forward(item.pid, item.guest_port, item.host_port)
    forwards.save_on_demand(name, [item for item in own if item.host_port != host_port])
    say(f"stopped forwarding 127.0.0.1:{host_port} to port {ending[0].guest_port} of {name}")


@click.command("ports")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.pass_context
def ports_command(ctx: click.Context, as_json: bool) -> None:
    """List the ports the running VMs forward to the host.

    Every running agentbox VM's forwarded ports (Lima's and `agentbox port`'s), and the ones Lima
    could not forward, with who has that host port.
    """
    control = vm_control(ctx, needs_config=False)
    instances = control.lima.instances()
    holders = forwards.Holders(instances)
    rows = [row for instance in sorted(holders.running, key=lambda i: i.name) if lifecycle.is_agentbox_vm(instance)
            for row in holders.rows(instance)]
    if as_json:
        click.echo(json.dumps([row.to_json() for row in rows]))
        return
    if not rows:
        running = any(lifecycle.is_agentbox_vm(instance) for instance in holders.running)
        say("the running agentbox VMs forward no ports" if running else "no agentbox VM is running")
        return
    table: list[tuple[str, ...]] = [("HOST", "VM", "GUEST", "BY", "STATE")]
    for row in rows:
        holder = row.held_by or forwards.Holder("free")
        state = "forwarded" if row.forwarded else f"NOT forwarded: {holder.text(row.host_port, row.vm)}"
        table.append(tuple(visible(cell) for cell in (row.host_addr, row.vm, row.guest_addr, row.via, state)))
    tables.echo(table)
