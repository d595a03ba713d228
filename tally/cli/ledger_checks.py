"""`tally ledger verify` and `tally ledger rebuild`: the two checks of a ledger, each exiting 1
when it finds a problem or a difference. `verify` reads the sealed ledger
(`ledger.store.verify`); `rebuild` replays the raw-event archive, or the same messages fetched
again from the broker, into a fresh ledger and compares it with the live one
(`ledger.store.rebuild`)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import click
import duckdb
import orjson

from ledger.errors import LedgerError
from ledger.ingest import InputTopics
from ledger.store.identity import recorded_zone
from ledger.store.layout import ARCHIVE_DIR, HOT_DB_NAME, SEGMENTS_DIR
from ledger.store.rebuild import (
    Difference,
    MessageKey,
    RebuildReport,
    ReplaySettings,
    archive_batch_count,
    archive_batches,
    batches_from_messages,
)
from ledger.store.segments import Manifest
from ledger.store.union_rebuild import Member, members, named_report, rebuild_members
from ledger.store.union_rules import SHARDS_PREFIX
from ledger.store.verify import VerifyReport, verify_ledger
from streams.kafka import BrokerError
from tally.cli.help import Command
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


@click.command(cls=Command)
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
    for name in (SEGMENTS_DIR, ARCHIVE_DIR, SHARDS_PREFIX):  # shards: a union's, shard by shard
        shutil.rmtree(into / name, ignore_errors=True)
    for path in into.glob(f"{HOT_DB_NAME}*"):
        path.unlink(missing_ok=True)


_DIFF_HEADERS = ("kind", "subject", "unit", "period", "live", "rebuilt", "note")


@click.command(cls=Command)
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
    postings per account, unit and period, balances, closed-period checksums. A sharded
    ledger's union is rebuilt shard by shard, each from its own archive with its writer's role;
    a difference names its shard.

    Exits 1 when anything differs, 0 when the two are identical."""
    config = load_or_exit(config_path)
    live = require_ledger(Path(data_dir) if data_dir else reader_directory(config))
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
    reports: list[tuple[Member, RebuildReport]] = []
    try:
        total = sum(archive_batch_count(m.live)[0] for m in members(live, target))
        if sys.stderr.isatty() and total:
            bar = click.progressbar(length=total, label="replaying batches", file=sys.stderr)
            bar.__enter__()

        def refetched(member: Member) -> tuple[Any, list[Difference]]:
            found: list[Difference] = []  # filled as the replay reads the batches
            fetched = _refetched(config, bootstrap, member.live)
            return batches_from_messages(archive_batches(member.live), fetched, found), found

        reports.extend(
            rebuild_members(
                live,
                target,
                partial(_replay_settings, config),
                refetched if source == "topics" else None,
                bar.update if bar is not None else None,
            )
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
    _rebuild_output(reports, source, target, keep, created, output)


def _replay_settings(config: TallyConfig, live: Path) -> ReplaySettings:
    """The replay of `live`: the configuration's prices and rules, in the live ledger's own time
    zone (whatever the configuration says now: a rebuild books into the months the live writer
    did); `rebuild_members` sets its shard's role."""
    return replace(replay_settings(config), zone=recorded_zone(live))


def _refetched(config: TallyConfig, bootstrap: str | None, live: Path) -> Any:
    """The archived messages of `live` fetched again from the broker, or exit 3."""
    try:
        servers = bootstrap_servers(config, bootstrap)
        kafka = kafka_or_exit(config)
        _got, fetched = fetch_from_topics(servers[0], live, kafka.security)
    except (NoBrokerError, BrokerError) as exc:
        fail(said(exc), Exit.BROKER)
    return fetched


def _rebuild_output(
    reports: list[tuple[Member, RebuildReport]],
    source: str,
    target: Path,
    keep: bool,
    created: bool,
    output: str,
) -> None:
    """Print what the rebuild found and exit: 0 identical, 1 any difference."""
    report = named_report(reports, target)
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
                    "shards": {
                        m.shard: {
                            "batches": r.batches,
                            "messages": r.messages,
                            "identical": r.identical,
                        }
                        for m, r in reports
                        if m.shard
                    },
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    elif output == OutputFormat.CSV:
        click.echo(render(_DIFF_HEADERS, rows, OutputFormat.CSV))
    else:
        shards = [m.shard for m, _r in reports if m.shard]
        click.echo(
            f"replayed {report.batches} batches ({report.messages} messages) from {source}"
            + (f", shard by shard: {', '.join(shards)}" if shards else "")
        )
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
