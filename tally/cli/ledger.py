"""`tally ledger …`: inspect and maintain the ledger."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import duckdb
import orjson

from ledger.admin import (
    AdjustmentRecorded,
    AdminEvent,
    PeriodClosed,
    admin_event_from_dict,
    admin_event_to_dict,
)
from ledger.errors import EventError, LedgerError
from ledger.ingest import InputTopics
from ledger.invalid import Invalid
from ledger.periods import Period
from ledger.read.queries import find_sealed_transaction
from ledger.store.identity import recorded_zone
from ledger.store.layout import ARCHIVE_DIR, HOT_DB_NAME, SEGMENTS_DIR
from ledger.store.rebuild import (
    Difference,
    MessageKey,
    ReplaySettings,
    archive_batch_count,
    archive_batches,
    batches_from_messages,
)
from ledger.store.rebuild import rebuild as rebuild_ledger
from ledger.store.segments import Manifest
from ledger.store.verify import VerifyReport, verify_ledger
from ledger.units import MS_PER_HOUR, Unit, parse_micros
from streams.kafka import BrokerError
from tally.cli.admin import (
    actor_option,
    applied_admin,
    default_actor,
    dry_run_option,
    echo_events,
    effective_option,
    now_us,
    parse_effective,
    send_admin_events,
)
from tally.cli.caller import admin_token_option, as_caller
from tally.cli.help import Group
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    data_dir_option,
    fail,
    kafka_or_exit,
    load_or_exit,
    output_option,
    reader_directory,
    require_ledger,
    resolve_ledger_dir,
    said,
)
from tally.components import NoBrokerError, bootstrap_servers
from tally.config import TallyConfig
from tally.language import _
from tally.output import OutputFormat, render


@click.group(cls=Group)
def ledger() -> None:
    """Inspect and maintain the ledger."""


@ledger.command()
@config_option
@data_dir_option
@output_option
def verify(config_path: str, data_dir: str | None, output: str) -> None:
    """Check zero-sum, segment integrity, closed-period checksums, that no offset range is
    missing or doubled, in the segments or in the raw-event archive, and the audit trail's hash
    chain (the first broken record is named).

    A damaged file is named with its damage (missing, checksum mismatch and why, a manifest cut
    short at a byte); segment files no manifest lists are notes, which do not fail the check.
    `-o json` and `-o csv` give the same summary for scripts (in CSV one row; its `problems`
    and `notes` columns join them with "; "). A sharded ledger (several workers' shards on one
    object store) is checked shard by shard and as their union: each shard's problems name
    it, and `-o json` adds each shard's own summary under `shards`."""
    directory = resolve_ledger_dir(config_path, data_dir)
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
    summary = _verify_summary(report)
    if output == OutputFormat.JSON:
        if report.shards:
            summary["shards"] = {name: _verify_summary(r) for name, r in report.shards}
        click.echo(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    elif output == OutputFormat.CSV:
        row = [
            "true" if report.ok else "false",
            *list(summary.values())[1:-2],
            "; ".join(report.problems),
            "; ".join(report.notes),
        ]
        click.echo(render(list(summary), [row], OutputFormat.CSV))
    else:
        click.echo(
            f"{report.segments} segments, {report.rows} postings, "
            f"{report.transactions} transactions, {report.closed_periods} closed periods, "
            f"{report.archived_messages} archived messages in {report.archive_segments} "
            f"archive segments, {report.audit_records} audit records checked"
        )
        for problem in report.problems:
            click.secho(f"problem: {problem}", fg="red")
        for note in report.notes:
            click.echo(f"note: {note}")
        click.echo("ledger OK" if report.ok else f"{len(report.problems)} problem(s) found")
    sys.exit(int(Exit.OK if report.ok else Exit.CHECK_FAILED))


def _verify_summary(report: VerifyReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "segments": report.segments,
        "rows": report.rows,
        "transactions": report.transactions,
        "closed_periods": report.closed_periods,
        "archive_segments": report.archive_segments,
        "archived_messages": report.archived_messages,
        "audit_records": report.audit_records,
        "problems": list(report.problems),
        "notes": list(report.notes),
    }


@ledger.command()
@config_option
@data_dir_option
def seal(config_path: str, data_dir: str | None) -> None:
    """Seal committed rows into Parquet segments now (the worker must not be running)."""
    from ledger.store.hot import DuckDBStore
    from ledger.store.published import PublishedStore
    from tally.segments_config import publisher

    directory = resolve_ledger_dir(config_path, data_dir, replica=False)
    ledger_config = load_or_exit(config_path).ledger if data_dir is None else None
    try:
        to = (
            None
            if ledger_config is None
            else publisher(directory, ledger_config.segments_url, ledger_config.object_store)
        )
        with DuckDBStore(directory) if to is None else PublishedStore(directory, to) as store:
            result = store.seal()
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    click.echo(f"sealed {len(result.sealed)} segments, compacted into {len(result.compacted)}")


ADJUST_UNITS = ("money", "money_micros", "gpu_hours", "gpu_ms", "energy_mj")


def parse_amount(text: str, unit: str) -> tuple[Unit, int]:
    """`--amount` in `--unit` as an exact integer amount of a ledger unit.

    money: decimal currency ("-12.50"); gpu_hours: decimal hours (whole GPU-ms);
    money_micros, gpu_ms, energy_mj: integers.
    """
    try:
        if unit == "money":
            return Unit.MONEY, parse_micros(text)
        if unit == "gpu_hours":
            ms = Decimal(text) * MS_PER_HOUR
            if not ms.is_finite() or ms != ms.to_integral_value():
                raise Invalid("not a whole number of GPU-milliseconds")
            return Unit.GPU_MS, int(ms)
        if not text.lstrip("-").isdigit():
            raise Invalid("expected an integer")
        return Unit(unit), int(text)
    except (ValueError, ArithmeticError) as exc:
        fail(
            _("--amount {text!r} in {unit}: {exc}").format(text=text, unit=unit, exc=said(exc)),
            Exit.USAGE,
        )


def _checked(event: AdminEvent) -> AdminEvent:
    """`event` as the worker will read it: every codec rule applied, or exit 2."""
    try:
        return admin_event_from_dict(event.KIND, admin_event_to_dict(event))
    except EventError as exc:
        fail(str(exc), Exit.USAGE)


@ledger.command()
@config_option
@bootstrap_option
@data_dir_option
@click.option("--account", default=None, help="The account to adjust, e.g. consumer:vision/det.")
@click.option("--amount", default=None, help="Signed amount; positive debits the account.")
@click.option("--unit", type=click.Choice(ADJUST_UNITS), default=None, help="Unit of --amount.")
@click.option("--period", default=None, metavar="YYYY-MM", help="The period it is for.")
@click.option(
    "--against",
    "counter_account",
    default=None,
    help="Counter-account (default: adjustments:manual).",
)
@click.option("--team", default=None, help="Team dimension (default: from a consumer account).")
@click.option("--project", default=None, help="Project dimension.")
@click.option("--user", default=None, help="User dimension.")
@click.option("--job", "job_id", default=None, help="Job dimension.")
@click.option(
    "--reverse", "reverse_txn", default=None, metavar="TXN", help="Reverse a transaction."
)
@click.option("--reason", required=True, help="Why; recorded with the transaction.")
@actor_option
@effective_option
@dry_run_option
@admin_token_option
def adjust(
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    account: str | None,
    amount: str | None,
    unit: str | None,
    period: str | None,
    counter_account: str | None,
    team: str | None,
    project: str | None,
    user: str | None,
    job_id: str | None,
    reverse_txn: str | None,
    reason: str,
    actor: str | None,
    effective: str,
    dry_run: bool,
    token: str | None,
) -> None:
    """Record an adjusting transaction, or (--reverse TXN) the exact negation of one.

    Nothing is updated or deleted. An adjustment for a closed period is booked into the next
    open one; so is the reversal of a transaction booked into a closed period."""
    config = load_or_exit(config_path)
    who = actor or default_actor()
    when = parse_effective(effective)
    event: AdminEvent
    if reverse_txn is not None:
        given = [
            name
            for name, value in (
                ("--account", account),
                ("--amount", amount),
                ("--unit", unit),
                ("--period", period),
                ("--against", counter_account),
            )
            if value is not None
        ]
        if given:
            fail(_("--reverse takes no {names}").format(names=", ".join(given)), Exit.USAGE)
        directory = resolve_ledger_dir(config_path, data_dir)
        try:
            original = find_sealed_transaction(directory, reverse_txn)
        except (LedgerError, duckdb.Error) as exc:
            fail(str(exc), Exit.LEDGER)
        if original is None:
            fail(
                _("no sealed transaction {reverse_txn} (is it sealed yet?)").format(
                    reverse_txn=reverse_txn
                ),
                Exit.USAGE,
            )
        event = AdjustmentRecorded.reversal(reverse_txn, who, reason, when)
    else:
        missing = [
            name
            for name, value in (
                ("--account", account),
                ("--amount", amount),
                ("--unit", unit),
                ("--period", period),
            )
            if value is None
        ]
        if missing:
            fail(
                _("an adjustment needs {names} (or --reverse TXN)").format(
                    names=", ".join(missing)
                ),
                Exit.USAGE,
            )
        assert amount is not None and unit is not None
        ledger_unit, value = parse_amount(amount, unit)
        event = AdjustmentRecorded(
            account,
            ledger_unit,
            value,
            period,
            who,
            reason,
            when,
            counter_account=counter_account,
            team=team,
            project=project,
            user=user,
            job_id=job_id,
        )
    (event,) = as_caller(config, token, [_checked(event)])
    resolve_ledger_dir(config_path, data_dir)  # the ledger to adjust must exist
    echo_events([event], OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    (sent,) = send_admin_events(config, bootstrap, [event])
    click.echo(_("sent {sent} to {admin}").format(sent=sent, admin=config.topics.admin), err=True)


@ledger.command()
@click.argument("period")
@config_option
@bootstrap_option
@data_dir_option
@click.option("--reason", default=None, help="Why (default: month-end close).")
@actor_option
@click.option("--force", is_flag=True, help="Close a period that has not ended yet.")
@dry_run_option
@admin_token_option
def close(
    period: str,
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    reason: str | None,
    actor: str | None,
    force: bool,
    dry_run: bool,
    token: str | None,
) -> None:
    """Close PERIOD (YYYY-MM): afterwards nothing posts into it, late usage is booked into the
    next open period, and `tally ledger verify` checks the period's checksum."""
    try:
        Period.month(period)
    except ValueError as exc:
        fail(str(exc), Exit.USAGE)
    config = load_or_exit(config_path)
    ledger_dir = resolve_ledger_dir(config_path, data_dir)
    month = Period.month(period, recorded_zone(ledger_dir))  # ends at the ledger's midnight
    view = applied_admin(ledger_dir)
    if month.label in view.closed:
        click.echo(f"{month.label} is already closed")
        return
    now = now_us()
    if month.end_us > now and not force:
        fail(
            _("{label} has not ended yet; pass --force to close it anyway").format(
                label=month.label
            ),
            Exit.USAGE,
        )
    event = _checked(
        PeriodClosed(month.label, actor or default_actor(), reason or "month-end close", now)
    )
    (event,) = as_caller(config, token, [event])
    echo_events([event], OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    (sent,) = send_admin_events(config, bootstrap, [event])
    click.echo(_("sent {sent} to {admin}").format(sent=sent, admin=config.topics.admin), err=True)


# ---------------------------------------------------------------------------------- reports


# ---------------------------------------------------------------------------------- rebuild


def replay_settings(config: TallyConfig) -> ReplaySettings:
    """What the worker folds with, from the configuration (see `tally.components`)."""
    return ReplaySettings(
        prices=config.price_book(),
        cost_centres=config.organisation.cost_centre_of(),
        idle_policy=config.idle.policy(),
        inputs=InputTopics(
            admin=config.topics.admin,
            jobs=config.topics.jobs,
            inventory=config.topics.inventory_reports,
        ),
    )


def fetch_from_topics(
    bootstrap: str, data_dir: Path, options: Mapping[str, Any] | None = None
) -> tuple[str, dict[MessageKey, tuple[bytes | None, bytes | None]]]:
    """The broker's incarnation, and the messages it still holds of every archived range of
    that incarnation (the archive's manifest says which). `options`: the clients' security
    keywords (SASL, TLS)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from streams.kafka import fetch_cluster_id

    async def fetch() -> tuple[str, dict[MessageKey, tuple[bytes | None, bytes | None]]]:
        incarnation = await fetch_cluster_id(bootstrap, options=options)
        wanted: dict[tuple[str, int], tuple[int, int]] = {}
        for seg in Manifest(data_dir / ARCHIVE_DIR).load():
            if seg.incarnation == incarnation:
                key = (seg.topic, seg.partition)
                lo, hi = wanted.get(key, (seg.first_offset, seg.last_offset))
                wanted[key] = (min(lo, seg.first_offset), max(hi, seg.last_offset))
        found: dict[MessageKey, tuple[bytes | None, bytes | None]] = {}
        if not wanted:
            return incarnation, found
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **(options or {}),
        )
        await consumer.start()
        try:
            for (topic, partition), (first, last) in sorted(wanted.items()):
                tp = TopicPartition(topic, partition)
                consumer.assign([tp])
                consumer.seek(tp, first)
                done = False
                while not done:
                    batch = await consumer.getmany(tp, timeout_ms=2000, max_records=5000)
                    records = batch.get(tp, [])
                    if not records:
                        break  # the broker holds no more of this range
                    for record in records:
                        if record.offset > last:
                            done = True
                            break
                        found[(incarnation, topic, partition, record.offset)] = (
                            record.key,
                            record.value,
                        )
                    done = done or records[-1].offset >= last
        finally:
            await consumer.stop()
        return incarnation, found

    return asyncio.run(fetch())


def _discard(into: Path, created: bool) -> None:
    """Remove the rebuilt ledger: the whole directory if the rebuild made it."""
    if created:
        shutil.rmtree(into, ignore_errors=True)
        return
    for name in (SEGMENTS_DIR, ARCHIVE_DIR):
        shutil.rmtree(into / name, ignore_errors=True)
    for path in into.glob(f"{HOT_DB_NAME}*"):
        path.unlink(missing_ok=True)


_DIFF_HEADERS = ("kind", "subject", "unit", "period", "live", "rebuilt", "note")


@ledger.command()
@config_option
@bootstrap_option
@data_dir_option
@click.option(
    "--from",
    "source",
    type=click.Choice(["archive", "topics"]),
    default="archive",
    show_default=True,
    help="Replay the raw-event archive, or the same messages fetched again from the broker.",
)
@click.option(
    "--into",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to build the fresh ledger (default: a temporary directory).",
)
@click.option("--keep", is_flag=True, help="Keep the rebuilt ledger afterwards.")
@output_option
def rebuild(
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    source: str,
    into: str | None,
    keep: bool,
    output: str,
) -> None:
    """Replay the archived events into a fresh ledger and compare it with the live sealed one:
    postings per account, unit and period, balances, closed-period checksums.

    Exits 1 when anything differs, 0 when the two are identical."""
    config = load_or_exit(config_path)
    live = require_ledger(Path(data_dir) if data_dir else reader_directory(config))
    from streams.shards import role_of  # a shard's directory replays as its writer folded

    # The live ledger's own time zone, whatever the configuration says now: a rebuild books into
    # the months the live writer did.
    settings = replace(replay_settings(config), zone=recorded_zone(live), role=role_of(live))
    if into is not None and Path(into).exists() and any(Path(into).iterdir()):
        fail(
            _("--into {into}: not an empty directory (a rebuild needs a fresh one)").format(
                into=into
            ),
            Exit.USAGE,
        )
    target = Path(into) if into else Path(tempfile.mkdtemp(prefix="tally-rebuild-"))
    created = into is None or not target.exists()
    bar: Any = None
    try:
        total, _batches = archive_batch_count(live)
        batches: Any = archive_batches(live)
        found: list[Difference] = []
        if source == "topics":
            try:
                servers = bootstrap_servers(config, bootstrap)
                kafka = kafka_or_exit(config)
                _got, fetched = fetch_from_topics(servers[0], live, kafka.security)
            except (NoBrokerError, BrokerError) as exc:
                fail(said(exc), Exit.BROKER)
            batches = batches_from_messages(batches, fetched, found)
        if sys.stderr.isatty() and total:
            bar = click.progressbar(length=total, label="replaying batches", file=sys.stderr)
            bar.__enter__()
        report = rebuild_ledger(
            live,
            target,
            settings,
            batches,
            progress=bar.update if bar is not None else None,
            source_differences=found,
        )
    except (LedgerError, duckdb.Error) as exc:
        if not keep:
            _discard(target, created)
        fail(str(exc), Exit.LEDGER)
    except KeyboardInterrupt:
        if not keep:
            _discard(target, created)
        fail(_("interrupted"), Exit.INTERRUPTED)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if not keep:
        _discard(target, created)
    rows = [
        (d.kind.value, d.subject, d.unit, d.period, d.live, d.rebuilt, d.note)
        for d in report.differences
    ]
    if output == OutputFormat.JSON:
        click.echo(
            orjson.dumps(
                {
                    "identical": report.identical,
                    "source": source,
                    "batches": report.batches,
                    "messages": report.messages,
                    "rebuilt": str(target) if keep else None,
                    "differences": [dict(zip(_DIFF_HEADERS, r, strict=True)) for r in rows],
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    elif output == OutputFormat.CSV:
        click.echo(render(_DIFF_HEADERS, rows, OutputFormat.CSV))
    else:
        click.echo(f"replayed {report.batches} batches ({report.messages} messages) from {source}")
        if rows:
            click.echo(render(_DIFF_HEADERS, rows, OutputFormat.TABLE))
        if keep:
            click.echo(f"rebuilt ledger kept in {target}")
        click.echo(
            "rebuilt ledger is identical to the live one"
            if report.identical
            else f"{len(rows)} difference(s) found"
        )
    sys.exit(int(Exit.OK if report.identical else Exit.CHECK_FAILED))
