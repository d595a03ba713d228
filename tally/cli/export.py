"""`tally export …`: chargeback exports of the sealed ledger for finance tools."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ledger.errors import LedgerError
from ledger.read.focus import ExportFormat, FocusContext, export_focus
from ledger.read.reports import ReportQueries, gpu_hours
from ledger.units import format_micros
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    output_option,
    resolve_ledger_dir,
)
from tally.cli.report import ledger_currency, parse_period
from tally.output import OutputFormat, render


@click.group()
def export() -> None:
    """Chargeback exports of the sealed ledger."""


@export.command()
@config_option
@data_dir_option
@click.option("--period", required=True, metavar="YYYY-MM", help="The billing period (month).")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="File to write (replaced atomically).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice([f.value for f in ExportFormat]),
    default=None,
    help="File format [default: from the --out suffix, else csv].",
)
@click.option(
    "--billing-account-id", default="tally", show_default=True, help="FOCUS BillingAccountId."
)
@click.option(
    "--billing-account-name",
    default="Tally GPU fleet",
    show_default=True,
    help="FOCUS BillingAccountName.",
)
@click.option(
    "--issuer",
    default="Tally",
    show_default=True,
    help="FOCUS InvoiceIssuerName, ProviderName and PublisherName.",
)
@output_option
def focus(
    config_path: str,
    data_dir: str | None,
    period: str,
    out: str,
    fmt: str | None,
    billing_account_id: str,
    billing_account_name: str,
    issuer: str,
    output: str,
) -> None:
    """FOCUS 1.2 cost and usage rows of one month, as CSV or Parquet.

    One row per account (team/project or unallocated capacity), user, job, GPU and hour;
    corrections appear as Adjustment or Credit rows, late usage as ChargeClass Correction.
    BilledCost sums exactly to the ledger's cost for the month.
    """
    chosen = parse_period(period)
    assert chosen is not None
    target = Path(out)
    if not target.parent.is_dir():
        fail(f"--out: the directory {target.parent} does not exist", Exit.USAGE)
    if fmt is None:
        fmt = "parquet" if target.suffix.lower() in (".parquet", ".pq") else "csv"
    try:
        context = FocusContext(
            currency=ledger_currency(config_path),
            billing_account_id=billing_account_id,
            billing_account_name=billing_account_name,
            invoice_issuer_name=issuer,
            provider_name=issuer,
            publisher_name=issuer,
        )
    except ValueError as exc:
        fail(str(exc), Exit.USAGE)
    directory = resolve_ledger_dir(config_path, data_dir)
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None and sys.stderr.isatty() and total > 0:
            bar = click.progressbar(length=total, label="writing FOCUS rows", file=sys.stderr)
            bar.__enter__()
        if bar is not None:
            bar.update(done - bar.pos)

    if sys.stderr.isatty():
        click.echo(f"building the FOCUS rows of {chosen.label} …", err=True)
    try:
        result = export_focus(
            ReportQueries(directory), chosen, target, ExportFormat(fmt), context, progress
        )
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    except OSError as exc:
        fail(f"cannot write {target}: {exc}", Exit.USAGE)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    out_fmt = OutputFormat(output)
    if out_fmt is OutputFormat.TABLE:
        click.echo(
            f"wrote {result.rows} FOCUS rows for {result.period} to {result.path} "
            f"({result.format}): BilledCost {format_micros(result.billed_micros, 6)} "
            f"{context.currency}, {gpu_hours(result.gpu_ms)} GPU-hours"
        )
        return
    headers = ["period", "path", "format", "rows", "billed_cost", "currency", "gpu_hours"]
    row = [
        result.period,
        str(result.path),
        str(result.format),
        result.rows,
        format_micros(result.billed_micros, 6),
        context.currency,
        str(gpu_hours(result.gpu_ms, 6)),
    ]
    click.echo(render(headers, [row], out_fmt))
