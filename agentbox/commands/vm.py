"""VM lifecycle commands: start, stop, restart, rm, status, ls, shell."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
