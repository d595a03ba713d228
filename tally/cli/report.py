"""`tally report …`: reports over the sealed ledger (cost, idle, team statements, what it
refused).

A `--period` selects the postings booked into that month (see `ledger.read.reports`). Table output
is for people (money to cents); `-o csv` and `-o json` are for scripts (money to the micro-unit).
GPU-hours are shown to three places everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from ledger.errors import LedgerError
from ledger.periods import Period
from ledger.read.queries import DIMENSIONS
from ledger.read.reports import (
    CostReport,
    IdleReport,
    IdleSharing,
    ReportQueries,
    cost_report,
    gpu_hours,
    idle_report,
)
from ledger.read.statements import team_statement
from ledger.store.identity import recorded_zone
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_refused
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
from tally.language import _, reader
from tally.output import OutputFormat, render, shown_time

DEFAULT_CURRENCY = "USD"

idle_sharing_option = click.option(
    "--idle-sharing",
    type=click.Choice([s.value for s in IdleSharing]),
    default=IdleSharing.NONE.value,
    show_default=True,
    help="Share the cost of unallocated GPUs across rows: by GPU time (weighted) or equally.",
)


def parse_period(text: str | None) -> Period | None:
    """`--period` as a Period, or exit 2 naming the option."""
    if text is None:
        return None
    try:
        return Period.month(text)
    except ValueError as exc:
        fail(_("--period: {exc}").format(exc=exc), Exit.USAGE)


def ledger_currency(config_path: str | None) -> str:
    """The ledger currency from the config file when there is one, else USD."""
    if config_path and Path(config_path).is_file():
        return load_or_exit(config_path).ledger.currency
    return DEFAULT_CURRENCY


def _money(micros: int, fmt: OutputFormat) -> str:
    return format_micros(micros, 2 if fmt is OutputFormat.TABLE else 6)


def _hours(gpu_ms: int, fmt: OutputFormat) -> str:
    """GPU-hours to three places in every format (the report's published contract)."""
    del fmt
    return str(gpu_hours(gpu_ms, 3))


@click.group(cls=Group)
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
    help="Comma-separated dimensions: cost_centre, team, project, user, job_id, model, pool, "
    "gpu_uuid, node.",
)
@click.option(
    "--period", default=None, metavar="YYYY-MM", help="Only this month (of the ledger's time zone)."
)
@click.option(
    "--include-unallocated", is_flag=True, help="Add the unshared cost of unallocated GPUs."
)
@idle_sharing_option
@click.option(
    "--wide", is_flag=True, help="Add idle GPU-hours, idle waste, shared idle and total columns."
)
@output_option
def cost(
    config_path: str,
    data_dir: str | None,
    by: str,
    period: str | None,
    include_unallocated: bool,
    idle_sharing: str,
    wide: bool,
    output: str,
) -> None:
    """GPU-hours and cost grouped by team, project, user, job, cost centre, model or pool.

    Allocated-but-idle time stays in its owner's cost (see --wide for the waste); unallocated
    capacity is left out unless --include-unallocated, or shared with --idle-sharing.
    """
    dims = [d.strip() for d in by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown or not dims:
        fail(
            _("--by: unknown dimension {names}; choose from {choices}").format(
                names=", ".join(unknown) or "(none)", choices=", ".join(DIMENSIONS)
            ),
            Exit.USAGE,
        )
    if len(set(dims)) != len(dims):
        fail(_("--by: a dimension is repeated in {by!r}").format(by=by), Exit.USAGE)
    chosen = parse_period(period)
    sharing = IdleSharing(idle_sharing)
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        result = cost_report(
            ReportQueries(directory), dims, chosen, sharing, include_unallocated=include_unallocated
        )
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    if not result.lines and fmt is OutputFormat.TABLE:
        click.echo("no sealed usage in the ledger for this selection")
        return
    shared = sharing is not IdleSharing.NONE
    headers, table = _cost_table(result, fmt, shared, wide, include_unallocated)
    click.echo(render(headers, table, fmt))
    if fmt is OutputFormat.TABLE and result.unshared_micros and not include_unallocated:
        hint = "--include-unallocated" if shared else "--include-unallocated or --idle-sharing"
        click.echo(
            f"\nnot shown: {_money(result.unshared_micros, fmt)} of unallocated capacity"
            f"{' on pools no row used' if shared else ''} ({hint} to show it)"
        )


def _cost_table(
    result: CostReport, fmt: OutputFormat, shared: bool, wide: bool, unallocated: bool
) -> tuple[list[str], list[list[Any]]]:
    """Columns: dims, GPU-hours, cost; then idle waste (--wide), shared idle and total (when
    sharing), and whether the row is unallocated capacity (--include-unallocated)."""
    headers = [*result.dims, "gpu_hours", "cost"]
    if wide:
        headers += ["idle_gpu_hours", "idle_waste"]
    if shared or wide:
        headers += ["shared_idle", "total"]
    if unallocated:
        headers.append("unallocated")
    rows: list[list[Any]] = []
    for line in result.lines:
        keys = [("(unallocated)" if line.unallocated and k is None else k) for k in line.keys]
        row: list[Any] = [*keys, _hours(line.gpu_ms, fmt), _money(line.money_micros, fmt)]
        if wide:
            row += [_hours(line.idle_gpu_ms, fmt), _money(line.idle_waste_micros, fmt)]
        if shared or wide:
            row += [_money(line.shared_idle_micros, fmt), _money(line.total_micros, fmt)]
        if unallocated:
            row.append("yes" if line.unallocated else "no")
        rows.append(row)
    return headers, rows


@report.command()
@config_option
@data_dir_option
@click.option(
    "--period", default=None, metavar="YYYY-MM", help="Only this month (of the ledger's time zone)."
)
@click.option(
    "--by",
    type=click.Choice(["pool", "team", "both"]),
    default="both",
    show_default=True,
    help="Per pool and GPU model, per team, or both.",
)
@idle_sharing_option
@output_option
def idle(
    config_path: str,
    data_dir: str | None,
    period: str | None,
    by: str,
    idle_sharing: str,
    output: str,
) -> None:
    """Idle GPUs: unallocated capacity and allocated-but-idle waste, kept apart.

    Unallocated: GPU time nobody held (per pool and model; with --idle-sharing, each team's
    share of its cost). Allocated but idle: GPU time an owner held while the GPU stayed idle;
    it is charged to the owner and reported as waste.
    """
    chosen = parse_period(period)
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        result = idle_report(ReportQueries(directory), chosen, IdleSharing(idle_sharing))
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    if not result.pools and fmt is OutputFormat.TABLE:
        click.echo("no sealed usage in the ledger for this selection")
        return
    pool_headers, pool_rows = _idle_pool_table(result, fmt)
    team_headers, team_rows = _idle_team_table(result, fmt)
    if fmt is OutputFormat.TABLE:
        sections = []
        if by in ("pool", "both"):
            sections.append("By pool and GPU model\n" + render(pool_headers, pool_rows, fmt))
        if by in ("team", "both"):
            if result.sharing is IdleSharing.NONE:  # the share column is all zeros
                team_headers, team_rows = team_headers[:-1], [r[:-1] for r in team_rows]
            sections.append("By team\n" + render(team_headers, team_rows, fmt))
        click.echo("\n\n".join(sections))
        return
    # One flat table for scripts: `scope` says which kind of row it is.
    headers = [
        "scope",
        "pool",
        "model",
        "team",
        "allocated_gpu_hours",
        "idle_gpu_hours",
        "idle_waste",
        "unallocated_gpu_hours",
        "unallocated_cost",
        "shared_unallocated",
    ]
    rows: list[list[Any]] = []
    if by in ("pool", "both"):
        rows += [["pool", r[0], r[1], None, *r[2:], None] for r in pool_rows]
    if by in ("team", "both"):
        rows += [["team", None, None, r[0], r[1], r[2], r[3], None, None, r[4]] for r in team_rows]
    click.echo(render(headers, rows, fmt))


def _idle_pool_table(result: IdleReport, fmt: OutputFormat) -> tuple[list[str], list[list[Any]]]:
    headers = [
        "pool",
        "model",
        "allocated_gpu_hours",
        "idle_gpu_hours",
        "idle_waste",
        "unallocated_gpu_hours",
        "unallocated_cost",
    ]
    rows: list[list[Any]] = [
        [
            p.pool,
            p.model,
            _hours(p.allocated_gpu_ms, fmt),
            _hours(p.idle_gpu_ms, fmt),
            _money(p.idle_waste_micros, fmt),
            _hours(p.unallocated_gpu_ms, fmt),
            _money(p.unallocated_micros, fmt),
        ]
        for p in result.pools
    ]
    return headers, rows


def _idle_team_table(result: IdleReport, fmt: OutputFormat) -> tuple[list[str], list[list[Any]]]:
    headers = ["team", "allocated_gpu_hours", "idle_gpu_hours", "idle_waste", "shared_unallocated"]
    rows: list[list[Any]] = [
        [
            t.team,
            _hours(t.allocated_gpu_ms, fmt),
            _hours(t.idle_gpu_ms, fmt),
            _money(t.idle_waste_micros, fmt),
            _money(t.shared_unallocated_micros, fmt),
        ]
        for t in result.teams
    ]
    return headers, rows


@report.command()
@config_option
@data_dir_option
@click.option("--team", required=True, help="The team the statement is for.")
@click.option(
    "--period", required=True, metavar="YYYY-MM", help="The month (of the ledger's time zone)."
)
@idle_sharing_option
@output_option
def statement(
    config_path: str,
    data_dir: str | None,
    team: str,
    period: str,
    idle_sharing: str,
    output: str,
) -> None:
    """A team's statement for a month: cost by project and user, idle waste, budget."""
    chosen = parse_period(period)
    assert chosen is not None
    directory = resolve_ledger_dir(config_path, data_dir)
    currency = ledger_currency(config_path)
    try:
        result = team_statement(
            ReportQueries(directory), team, chosen, currency, IdleSharing(idle_sharing)
        )
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    if fmt is OutputFormat.JSON:
        click.echo(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode())
    elif fmt is OutputFormat.CSV:
        headers, rows = result.rows()
        click.echo(render(headers, rows, fmt))
    else:
        click.echo(result.render_text(reader()))


@report.command()
@config_option
@data_dir_option
@output_option
def refused(config_path: str, data_dir: str | None, output: str) -> None:
    """What the ledger refused: its dead letters by reason and topic, as of the last seal.

    A reason counts up to its first ': ' (the rest is each letter's own detail; -o json and
    csv add the newest letter's whole reason as `example`). `too late to deduplicate`: an event
    not seen before, older than what the ledger still remembers for its GPU or job, so it may
    have been applied already; it is never booked. Times are when the ledger recorded the
    first and the last letter: in the table on the ledger's clock (`ledger.timezone`), in JSON
    and CSV in UTC.
    """
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        groups = load_refused(directory / SEGMENTS_DIR)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    if not groups and fmt is OutputFormat.TABLE:
        click.echo("nothing refused in the sealed ledger")
        return
    zone = recorded_zone(directory)
    headers = ["reason", "topic", "letters", "first_recorded", "last_recorded"]
    rows: list[list[Any]] = [
        [
            g.reason,
            g.topic,
            g.letters,
            shown_time(g.first_recorded_us, fmt, zone),
            shown_time(g.last_recorded_us, fmt, zone),
        ]
        for g in groups
    ]
    if fmt is not OutputFormat.TABLE:
        headers.append("example")
        for row, group in zip(rows, groups, strict=True):
            row.append(group.example)
    click.echo(render(headers, rows, fmt))
