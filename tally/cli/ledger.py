"""`tally ledger …`: inspect and maintain the ledger."""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson

from ledger.errors import LedgerError
from ledger.verify import verify_ledger
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    output_option,
    resolve_data_dir,
)
from tally.output import OutputFormat


@click.group()
def ledger() -> None:
    """Inspect and maintain the ledger."""


@ledger.command()
@config_option
@data_dir_option
@output_option
def verify(config_path: str, data_dir: str | None, output: str) -> None:
    """Check zero-sum, segment integrity, and that no offset range is missing or doubled."""
    directory = resolve_data_dir(config_path, data_dir)
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None and sys.stderr.isatty() and total > 20:
            bar = click.progressbar(length=total, label="verifying segments", file=sys.stderr)
            bar.__enter__()
        if bar is not None:
            bar.update(1)

    report = verify_ledger(directory, progress)
    if bar is not None:
        bar.__exit__(None, None, None)
    if output == OutputFormat.JSON:
        click.echo(
            orjson.dumps(
                {
                    "ok": report.ok,
                    "segments": report.segments,
                    "rows": report.rows,
                    "transactions": report.transactions,
                    "problems": list(report.problems),
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    else:
        click.echo(
            f"{report.segments} segments, {report.rows} postings, "
            f"{report.transactions} transactions"
        )
        for problem in report.problems:
            click.secho(f"problem: {problem}", fg="red")
        click.echo("ledger OK" if report.ok else f"{len(report.problems)} problem(s) found")
    sys.exit(int(Exit.OK if report.ok else Exit.CHECK_FAILED))


@ledger.command()
@config_option
@data_dir_option
def seal(config_path: str, data_dir: str | None) -> None:
    """Seal committed rows into Parquet segments now (the worker must not be running)."""
    from ledger.store import LedgerStore

    directory = resolve_data_dir(config_path, data_dir)
    try:
        with LedgerStore(directory) as store:
            result = store.seal()
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    click.echo(f"sealed {len(result.sealed)} segments, compacted into {len(result.compacted)}")


# ---------------------------------------------------------------------------------- reports
