"""`tally report …`: reports over the sealed ledger."""

from __future__ import annotations

import click

from ledger.errors import LedgerError
from ledger.periods import Period
from ledger.queries import DIMENSIONS, LedgerQueries
from ledger.units import format_micros
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    output_option,
    resolve_data_dir,
)
from tally.output import OutputFormat, render


@click.group()
def report() -> None:
    """Reports over the sealed ledger."""


@report.command()
@config_option
@data_dir_option
@click.option(
    "--by",
    "by",
    default="team",
    show_default=True,
    help=f"Comma-separated dimensions: {', '.join(DIMENSIONS)}.",
)
@click.option("--period", default=None, metavar="YYYY-MM", help="Only this month (UTC).")
@click.option("--include-unallocated", is_flag=True, help="Add the cost of unallocated GPUs.")
@output_option
def cost(
    config_path: str,
    data_dir: str | None,
    by: str,
    period: str | None,
    include_unallocated: bool,
    output: str,
) -> None:
    """GPU-hours and cost grouped by team, project, user, job, model or pool."""
    dims = [d.strip() for d in by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown or not dims:
        fail(
            f"--by: unknown dimension {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(DIMENSIONS)}",
            Exit.USAGE,
        )
    try:
        chosen = Period.month(period) if period else None
    except ValueError as exc:
        fail(f"--period: {exc}", Exit.USAGE)
    directory = resolve_data_dir(config_path, data_dir)
    try:
        rows = LedgerQueries(directory).cost_by(dims, chosen, include_unallocated)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    headers = [*dims, "gpu_hours", "cost"]
    table = [
        [
            *r.keys,
            f"{r.gpu_ms / 3_600_000:.3f}",
            format_micros(r.money_micros, 6 if fmt is not OutputFormat.TABLE else 2),
        ]
        for r in rows
    ]
    if not table and fmt is OutputFormat.TABLE:
        click.echo("no sealed usage in the ledger for this selection")
        return
    click.echo(render(headers, table, fmt))


# ---------------------------------------------------------------------------------- config
