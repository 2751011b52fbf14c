"""`agentbox ca`: show the extra CA certificates the VM gets, and add some from the macOS System keychain."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentbox import paths
from agentbox.cli.commands.common import load_config
from agentbox.config import cacerts, load, trust
from agentbox.errors import AgentboxError

if TYPE_CHECKING:
    from agentbox.config.cacerts import Certificate, Source
    from agentbox.config.load import Config

MAX_LISTED = 20  # subjects shown per file: a whole CA bundle would fill the screen
RECREATE_NOTE = (
    "The VM gets CA certificates when it is created: run `agentbox start --recreate` to apply them to an existing VM."
)
HOW_TO_ADD = (
    "To add one, put `caCert: /path/to.pem` in agentbox.yml (this project) or in {global_file} (every project),\n"
    "or on macOS run `agentbox ca add` to pick certificates from the System keychain."
)


@click.group("ca")
def ca_group() -> None:
    """Show or add extra CA certificates for the VM."""


@ca_group.command("ls")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"sources": [{"origin", "configFile", "path", "used", "trusted", "exists", "error", '
                   '"count", "certificates": [{"subject", "expires", "expired"}]}]}.')
@click.pass_context
def ls_command(ctx: click.Context, as_json: bool) -> None:
    """Show the configured CA certificate files and what they hold."""
    config = load_config(ctx)
    sources = cacerts.sources(config)
    if as_json:
        click.echo(json.dumps({"sources": [_source_record(source, config) for source in sources]}, indent=2,
                              ensure_ascii=False))
        return
    if not sources:
        click.echo("No CA certificates are configured: the VM trusts only the Ubuntu defaults.")
        click.echo(HOW_TO_ADD.format(global_file=paths.global_config_file()))
        return
    for source in sources:
        _show_source(source, config)
    click.echo(RECREATE_NOTE)


def _untrusted(config_file: Path, config: Config) -> bool:
    return bool(trust.risky_keys(config)) and not trust.is_trusted(config)


def _source_record(source: Source, config: Config) -> dict[str, Any]:
    """One source as `ca ls` shows it; `trusted` is null for a file whose trust does not matter (not the local
    config's), `certificates` empty when openssl cannot describe them (`count` still says how many)."""
    found = cacerts.inspect_file(source.path)
    local = source.origin == "local" and source.config_file is not None
    certificates = []
    for pem in found.pems[:MAX_LISTED]:
        described = cacerts.details(pem)
        if described is None:
            continue
        subject, not_after = described
        expires = cacerts.iso_time(not_after) if not_after else None
        certificates.append({"subject": subject, "expires": expires,
                             "expired": cacerts.expired(not_after) if not_after else False})
    return {
        "origin": source.origin,
        "configFile": str(source.config_file) if source.config_file is not None else None,
        "path": str(source.path),
        "used": source.used,
        "trusted": (not _untrusted(source.config_file, config)) if local and source.config_file else None,
        "exists": found.exists,
        "error": found.error or (None if not found.exists or found.pems else "it holds no PEM certificate"),
        "count": len(found.pems),
        "certificates": certificates,
    }


def _show_source(source: Source, config: Config) -> None:
    if source.config_file is None:
        title = f"NODE_EXTRA_CA_CERTS on the host (the VM gets these too): {source.path}"
    else:
        title = f"caCert in the {source.origin} config ({source.config_file}): {source.path}"
    if not source.used:
        title += "\n  not used here: the local config's caCert overrides it"
    click.echo(title)
    if source.origin == "local" and source.config_file is not None and _untrusted(source.config_file, config):
        click.echo("  the file is not trusted: launches refuse it until you run `agentbox trust`")
    found = cacerts.inspect_file(source.path)
    if not found.exists:
        click.echo("  the file does not exist" + (": creating the VM fails until you fix it" if source.used else ""))
    elif found.error:
        click.echo(f"  cannot read it: {found.error}")
    elif not found.pems:
        click.echo("  it holds no PEM certificate (-----BEGIN CERTIFICATE-----); agentbox refuses it")
    else:
        count = len(found.pems)
        embedded = cacerts.embedding(source.path, found.pems)
        if embedded.whole_store or len(embedded.kept) < count:
            click.echo(f"  {embedded.whole_store + ': ' if embedded.whole_store else ''}"
                       f"{cacerts.embedding_summary(embedded)}")
        else:
            click.echo(f"  {count} certificate{'s' if count != 1 else ''}")
        subjects = [cacerts.describe(pem) for pem in found.pems[:MAX_LISTED]]
        if not any(subjects):
            return  # no openssl: the count is all there is to show
        for number, subject in enumerate(subjects, 1):
            click.echo(f"    {number}. {subject or '(openssl could not read it)'}")
        if count > MAX_LISTED:
            click.echo(f"    ... and {count - MAX_LISTED} more")


@ca_group.command("add")
@click.option("--global", "is_global", is_flag=True, help="Use them in every project (the global config).")
@click.option("--all", "take_all", is_flag=True, help="Add every listed certificate without asking.")
@click.option("--select", "selection", metavar="1,3", help="Add the certificates with these numbers without asking.")
@click.pass_context
def add_command(ctx: click.Context, is_global: bool, take_all: bool, selection: str | None) -> None:
    """Add certificates from the macOS System keychain.

    Writes the chosen certificates to agentbox-ca.pem in the workspace (with --global:
    ~/.config/agentbox/ca-certificates.pem) and points `caCert` at that file.
    """
    if sys.platform != "darwin":
        raise AgentboxError(
            "agentbox ca add reads the macOS System keychain; on Linux put your PEM file's path in `caCert:`",
            hint="For example `caCert: /usr/local/share/ca-certificates/company.pem` in agentbox.yml; "
            "`agentbox ca ls` shows what is configured.",
        )
    if take_all and selection is not None:
        raise click.UsageError("use either --all or --select, not both")
    config = load_config(ctx)
    pem_path, config_file = _targets(config, is_global)
    if not is_global:  # checked before anything is written, so a refusal leaves nothing half-done
        for target in (pem_path, config_file, config.require_workspace() / ".gitignore"):
            cacerts.refuse_symlink(target)
    candidates = [c for c in cacerts.keychain_certificates() if not cacerts.is_apple(c)]
    if not candidates:
        raise AgentboxError(
            f"the System keychain ({cacerts.SYSTEM_KEYCHAIN}) holds no certificates besides Apple's own",
            hint="Add your organisation's root certificate in Keychain Access, "
            "or put its PEM file's path in `caCert:`.",
        )
    chosen = _choose(candidates, take_all, selection)
    if not chosen:
        click.echo("Cancelled; nothing was written.", err=True)
        return
    cacerts.write_pem_file(pem_path, chosen)
    previous = cacerts.set_ca_cert(config_file, pem_path, "global" if is_global else "local")
    count = len(chosen)
    click.echo(f"Wrote {count} certificate{'s' if count != 1 else ''} to {pem_path}")
    click.echo(
        f"Set caCert in {config_file}" + (f" (it was {previous})" if previous and previous != str(pem_path) else "")
    )
    if not is_global and cacerts.ensure_gitignored(config.require_workspace()):
        click.echo(f"Added {cacerts.LOCAL_PEM_NAME} to {config.require_workspace() / '.gitignore'}")
    if is_global and config.origins.get("caCert", "").startswith("local"):
        click.echo(
            f"Note: this project's {config.local_file} sets its own caCert ({config.ca_cert}), "
            "which wins over the global one here."
        )
    if not is_global:
        _note_trust(ctx)
    click.echo(RECREATE_NOTE)


def _note_trust(ctx: click.Context) -> None:
    """A local caCert needs `agentbox trust`; agentbox never trusts a project file on its own."""
    edited = load.load(ctx.obj["cwd"])
    if edited.local_file is not None and trust.risky_keys(edited) and not trust.is_trusted(edited):
        click.echo(
            f"{edited.local_file} now needs your trust before launches use it (a local caCert adds certificate "
            "authorities the VM trusts): check it with `agentbox trust --show`, then run `agentbox trust`."
        )


def _targets(config: Config, is_global: bool) -> tuple[Path, Path]:
    """Where the PEM file and the config file to edit are."""
    if is_global:
        config_file = paths.global_config_file()
        if config.global_file is None:
            _refuse_unused(config_file, config)
        return config_file.parent / cacerts.GLOBAL_PEM_NAME, config_file
    workspace = config.require_workspace()
    config_file = config.local_file or workspace / paths.LOCAL_CONFIG_NAME
    if config.local_file is None:
        _refuse_unused(config_file, config)
    return workspace / cacerts.LOCAL_PEM_NAME, config_file


def _refuse_unused(config_file: Path, config: Config) -> None:
    """A config file that exists but that agentbox ignores (wrong owner, writable by others) is not edited."""
    if os.path.lexists(config_file):
        reason = next((notice for notice in config.notices if str(config_file) in notice), "agentbox does not use it")
        raise AgentboxError(
            f"{config_file} exists but is not used: {reason}", hint="Fix that first, then run this again."
        )


def _choose(candidates: list[Certificate], take_all: bool, selection: str | None) -> list[Certificate]:
    if take_all:
        return candidates
    if selection is not None:
        picked = cacerts.parse_selection(selection, len(candidates))
        if not picked:
            _show_list(candidates)
            raise click.BadParameter(
                f"{selection!r}: give numbers from 1 to {len(candidates)}, separated by commas", param_hint="--select"
            )
        return [candidates[i] for i in picked]
    _show_list(candidates)
    if not _interactive():
        raise AgentboxError(
            "there is no terminal to ask on which certificates to add",
            hint="Run again with --all, or with --select and the numbers above (for example --select 1,3).",
        )
    return _ask(candidates)


def _ask(candidates: list[Certificate]) -> list[Certificate]:
    while True:
        answer = click.prompt(
            "Add which? Numbers like 1,3; Enter = all; q = cancel", default="", show_default=False, err=True
        )
        if answer.strip().lower() in ("q", "quit"):
            return []
        picked = cacerts.parse_selection(answer, len(candidates))
        if picked:
            return [candidates[i] for i in picked]
        click.echo(f"Please give numbers from 1 to {len(candidates)}, separated by commas.", err=True)


def _show_list(candidates: list[Certificate]) -> None:
    click.echo("Certificates in the System keychain (Apple's own left out):", err=True)
    width = len(str(len(candidates)))
    for number, certificate in enumerate(candidates, 1):
        name = certificate.label or cacerts.describe(certificate.pem) or "(a certificate without a name)"
        click.echo(f"  {number:>{width}}. {name}", err=True)


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()
