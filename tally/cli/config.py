"""`tally config …`: configuration files."""

from __future__ import annotations

import click

from tally.cli.help import Group
from tally.cli.options import (
    load_or_exit,
)


@click.group(cls=Group)
def config() -> None:
    """Configuration files."""


@config.command()
@click.argument("path", type=click.Path(dir_okay=False))
def check(path: str) -> None:
    """Validate a configuration file; print what is wrong, field by field."""
    cfg = load_or_exit(path)
    gpus = sum(p.nodes * p.gpus_per_node for p in cfg.fleet.pools)
    click.echo(
        f"{path}: OK ({len(cfg.organisation.teams())} teams, {gpus} simulated GPUs, "
        f"{len(cfg.prices)} prices, broker {cfg.broker.mode})"
    )
