"""`tally audit`: the audit trail of the sealed ledger (who changed what, when, from where),
filtered by actor, kind and time, as a table, JSON or CSV; with the sealed ledger on an object
store, the trail and the identity alone (`tally.cli.side_state`). `tally ledger verify` checks
its hash chain."""

from __future__ import annotations

from datetime import UTC, tzinfo
from typing import Any

import click
import orjson

from ledger.audit import AuditFilter, AuditRecord, select
from ledger.store.identity import IDENTITY_NAME
from ledger.store.side_files import AUDIT_PATH
from tally.cli.admin import parse_effective
from tally.cli.help import Command
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    output_option,
)
from tally.cli.side_state import read_side
from tally.language import _
from tally.output import OutputFormat, render, shown_time

TABLE_COLUMNS = ("seq", "time", "kind", "actor", "role", "client", "subject", "before", "after")
COLUMNS = (
    "seq",
    "time",
    "time_us",
    "kind",
    "actor",
    "role",
    "client",
    "subject",
    "reason",
    "before",
    "after",
    "event_id",
    "record_hash",
)


def _time_option(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_effective(text)
    except (ValueError, OverflowError):
        fail(
            _("{name}: {text!r} is not `now`, microseconds or an ISO-8601 time").format(
                name=name, text=text
            ),
            Exit.USAGE,
        )


def _row(record: AuditRecord, fmt: OutputFormat, zone: tzinfo = UTC) -> list[Any]:
    e = record.entry
    values: dict[str, Any] = {
        "seq": record.seq,
        "time": shown_time(e.time_us, fmt, zone),
        "time_us": e.time_us,
        "kind": e.kind,
        "actor": e.actor,
        "role": e.role,
        "client": e.client,
        "subject": e.subject,
        "reason": e.reason,
        "before": e.before,
        "after": e.after,
        "event_id": e.event_id,
        "record_hash": record.record_hash,
    }
    if fmt is OutputFormat.JSON:  # what changed, as objects rather than JSON text
        for name in ("before", "after"):
            text = values[name]
            values[name] = None if text is None else orjson.loads(text)
    elif fmt is OutputFormat.TABLE:
        values["before"] = values["before"] or "-"
        values["after"] = values["after"] or "-"
    columns = TABLE_COLUMNS if fmt is OutputFormat.TABLE else COLUMNS
    return [values[c] for c in columns]


@click.command(cls=Command)
@config_option
@data_dir_option
@click.option("--actor", default=None, help="Only this actor's actions (e.g. alice, team:ml).")
@click.option(
    "--kind", default=None, help="Only this kind (admin.price_set) or family (admin, job)."
)
@click.option("--since", default=None, help="From this time on: ISO-8601 (UTC if no zone) or µs.")
@click.option("--until", default=None, help="Before this time: ISO-8601 (UTC if no zone) or µs.")
@output_option
def audit(
    config_path: str,
    data_dir: str | None,
    actor: str | None,
    kind: str | None,
    since: str | None,
    until: str | None,
    output: str,
) -> None:
    """Who changed what: every state-changing action the ledger recorded, oldest first.

    Admin events (grants, prices, teams, quotas, adjustments, reversals, closes) with the value
    before and after, and job submissions and cancellations with the API token that made them
    and the caller's address. As of the last seal; `tally ledger verify` checks the trail's
    hash chain. Times: in the table on the ledger's clock (`ledger.timezone`, ISO 8601 with its
    offset), in JSON and CSV in UTC. Exit 4 when there is no ledger."""
    side = read_side(config_path, data_dir, [AUDIT_PATH, IDENTITY_NAME])
    where = AuditFilter(actor, kind, _time_option("--since", since), _time_option("--until", until))
    records = select(side.audit(), where)
    fmt = OutputFormat(output)
    if not records and fmt is OutputFormat.TABLE:
        click.echo("no audit records match")
        return
    columns = TABLE_COLUMNS if fmt is OutputFormat.TABLE else COLUMNS
    zone = side.zone()
    click.echo(render(list(columns), [_row(r, fmt, zone) for r in records], fmt))
