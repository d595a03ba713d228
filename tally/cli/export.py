"""`tally export …`: chargeback exports of the sealed ledger for finance tools."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ledger.errors import LedgerError
from ledger.pricing import PriceBook
from ledger.read.focus import ExportFormat, FocusContext, export_focus
from ledger.read.focus_versions import FocusVersion
from ledger.read.reports import ReportQueries, gpu_hours
from ledger.units import format_micros
from tally.cli.help import Group
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    output_option,
    resolve_ledger_dir,
)
from tally.cli.report import ledger_currency, parse_period
from tally.language import _
from tally.output import OutputFormat, render


@click.group(cls=Group)
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
@click.option(
    "--focus-version",
    "focus_version",
    type=click.Choice([v.value for v in FocusVersion]),
    default=FocusVersion.V1_2.value,
    show_default=True,
    help="FOCUS version of the columns (1.0 for tools that ingest only 1.0).",
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
    focus_version: str,
    output: str,
) -> None:
    """FOCUS 1.2 (or 1.0) cost and usage rows of one month, as CSV or Parquet.

    One row per account (team/project or unallocated capacity), user, job, GPU, price and
    hour, with energy in rows of its own; ledger corrections appear as Adjustment rows, late
    usage as ChargeClass Correction. Unit prices come from the configuration's price book and
    the applied price changes. BilledCost sums exactly to the ledger's cost for the month.
    """
    chosen = parse_period(period)
    assert chosen is not None
    target = Path(out)
    if not target.parent.is_dir():
        fail(
            _("--out: the directory {parent} does not exist").format(parent=target.parent),
            Exit.USAGE,
        )
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
    prices = _configured_prices(config_path)
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
        click.echo(_("building the FOCUS rows of {label} …").format(label=chosen.label), err=True)
    try:
        result = export_focus(
            ReportQueries(directory),
            chosen,
            target,
            ExportFormat(fmt),
            context,
            progress,
            prices,
            FocusVersion(focus_version),
        )
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    except OSError as exc:
        fail(_("cannot write {target}: {exc}").format(target=target, exc=exc), Exit.USAGE)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    out_fmt = OutputFormat(output)
    if out_fmt is OutputFormat.TABLE:
        click.echo(
            f"wrote {result.rows} FOCUS {result.version} rows for {result.period} to {result.path} "
            f"({result.format}): BilledCost {format_micros(result.billed_micros, 6)} "
            f"{context.currency}, {gpu_hours(result.gpu_ms)} GPU-hours"
        )
        return
    headers = [
        "period", "path", "format", "focus_version", "rows", "billed_cost", "currency", "gpu_hours"
    ]  # fmt: skip
    row = [
        result.period,
        str(result.path),
        str(result.format),
        str(result.version),
        result.rows,
        format_micros(result.billed_micros, 6),
        context.currency,
        str(gpu_hours(result.gpu_ms, 6)),
    ]
    click.echo(render(headers, [row], out_fmt))


def _configured_prices(config_path: str | None) -> PriceBook | None:
    """The configuration's price book when there is a configuration file."""
    if config_path and Path(config_path).is_file():
        return load_or_exit(config_path).price_book()
    return None
