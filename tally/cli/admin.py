"""`tally admin …`: turn configuration changes into admin events; and `tally report balances`.

Admin commands never touch the ledger themselves: they read what the worker has applied (the
admin log beside the segments; with `ledger.segments_url`, that file alone from the object
store: `tally.cli.admin_state`), decide which events to send, and put them on the admin topic,
where the worker applies them exactly once. Helpers here (times, actors, sending) are shared
with `tally ledger adjust` and `tally ledger close`.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import click

from ledger.admin import AdminEvent, AdminView, admin_envelope, describe, encode_admin, plan_admin
from ledger.balances import account_team, budget_statuses
from ledger.errors import LedgerError
from ledger.periods import Period
from ledger.read.balances import sealed_balances
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_admin_log
from ledger.units import Unit, format_micros
from streams.kafka import BrokerError
from tally.cli.admin_state import read_admin_state
from tally.cli.caller import admin_token_option, as_caller
from tally.cli.help import Command, Group
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    data_dir_option,
    fail,
    kafka_or_exit,
    load_or_exit,
    output_option,
    resolve_ledger_dir,
    said,
    warn_topic_drift,
)
from tally.cli.report import report as report_group
from tally.components import NoBrokerError, bootstrap_servers, desired_admin_state
from tally.config import TallyConfig
from tally.language import _
from tally.output import OutputFormat, render

SEND_TIMEOUT_S = 30.0


def now_us() -> int:
    return time.time_ns() // 1_000


def parse_effective(text: str) -> int:
    """`now`, integer microseconds since the epoch, or an ISO-8601 time (UTC if no zone)."""
    if text == "now":
        return now_us()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(
            _("--effective: {text!r} is not `now`, microseconds or an ISO-8601 time").format(
                text=text
            ),
            Exit.USAGE,
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def default_actor() -> str:
    try:
        return os.environ.get("TALLY_ACTOR") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


actor_option = click.option(
    "--actor", default=None, help="Who makes the change (default: $TALLY_ACTOR, else your login)."
)
effective_option = click.option(
    "--effective",
    default="now",
    show_default=True,
    metavar="now|ISO-8601|µs",
    help="When the change takes effect.",
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print the events that would be sent; send nothing."
)


def send_admin_events(
    config: TallyConfig, bootstrap: str | None, events: Sequence[AdminEvent]
) -> list[str]:
    """Put `events` on the admin topic, in order, each keyed by its entity; their ids."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from streams.topics import ensure_topic_specs

    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    kafka = kafka_or_exit(config)
    specs = [spec for spec in config.topics.specs() if spec.name == config.topics.admin]
    envelopes = [admin_envelope(e) for e in events]
    topic = config.topics.admin

    async def send() -> None:
        report = await ensure_topic_specs(servers[0], specs, kafka.security)
        warn_topic_drift(report.drift)
        producer = AIOKafkaProducer(
            bootstrap_servers=",".join(servers),
            client_id=config.broker.client_id,
            acks="all",
            request_timeout_ms=10_000,
            **kafka.security,
        )
        try:
            await producer.start()
            for envelope in envelopes:
                key, value = encode_admin(envelope)
                await producer.send_and_wait(topic, value, key=key)
        except (KafkaError, OSError) as exc:
            raise BrokerError(
                "could not send to {topic} on {bootstrap}: {problem}",
                topic=topic,
                bootstrap=servers[0],
                problem=exc,
            ) from exc
        finally:
            await producer.stop()

    try:
        asyncio.run(asyncio.wait_for(send(), SEND_TIMEOUT_S))
    except (BrokerError, TimeoutError) as exc:
        late = _("the broker did not answer in {seconds}s").format(seconds=f"{SEND_TIMEOUT_S:.0f}")
        fail(said(exc) or late, Exit.BROKER)
    return [e.id for e in envelopes]


def echo_events(events: Sequence[AdminEvent], fmt: OutputFormat) -> None:
    rows = [[e.KIND.value.rsplit(".", 1)[-1], e.entity, describe(e)] for e in events]
    click.echo(render(["event", "entity", "change"], rows, fmt))


@click.group(cls=Group)
def admin() -> None:
    """Change teams, prices, quotas and budgets through admin events."""


@admin.command("apply")
@click.argument("config_file", type=click.Path(dir_okay=False))
@bootstrap_option
@data_dir_option
@actor_option
@click.option("--reason", default=None, help="Why (default: `tally admin apply <file>`).")
@effective_option
@click.option(
    "--initial",
    is_flag=True,
    help="The first apply, before the worker has created the ledger: plan against an empty "
    "ledger when the data directory holds none yet (without it, no ledger is exit 4).",
)
@dry_run_option
@output_option
@admin_token_option
def apply_config(
    config_file: str,
    bootstrap: str | None,
    data_dir: str | None,
    actor: str | None,
    reason: str | None,
    effective: str,
    initial: bool,
    dry_run: bool,
    output: str,
    token: str | None,
) -> None:
    """Send the admin events that bring the ledger to CONFIG_FILE's teams, prices, quotas and
    budgets. Only differences are sent: applying the same file again sends nothing. Nothing is
    revoked because the file no longer names it; a budget changes by a grant of the difference."""
    config = load_or_exit(config_file)
    state = read_admin_state(config_file, data_dir, missing_ok=initial)
    if not state.found:  # --initial, and no ledger yet: an empty one
        click.secho(
            _("note: no ledger at {directory} yet: planning against an empty one").format(
                directory=state.where
            ),
            fg="yellow",
            err=True,
        )
    plan = plan_admin(
        desired_admin_state(config),
        state.view,
        actor or default_actor(),
        reason or f"tally admin apply {Path(config_file).name}",
        parse_effective(effective),
    )
    events = as_caller(config, token, plan.events)
    fmt = OutputFormat(output)
    for note in plan.notes:
        click.secho(_("note: {note}").format(note=note), fg="yellow", err=True)
    if not plan.events:
        if fmt is OutputFormat.TABLE:
            click.echo("nothing to change: the ledger already has this configuration")
        else:
            echo_events((), fmt)
        return
    echo_events(events, fmt)
    if dry_run:
        click.echo(_("dry run: {count} event(s) not sent").format(count=len(events)), err=True)
        return
    send_admin_events(config, bootstrap, events)
    click.echo(
        _("sent {count} event(s) to {admin}").format(count=len(events), admin=config.topics.admin),
        err=True,
    )


# ---------------------------------------------------------------------------------- balances


def _amount(value: int, unit: str, fmt: OutputFormat) -> str | int:
    if fmt is not OutputFormat.TABLE:
        return value
    if unit == Unit.MONEY:
        return format_micros(value, 2)
    if unit == Unit.GPU_MS:
        return f"{value / 3_600_000:.3f}"
    return value


def _unit_header(unit: str, fmt: OutputFormat) -> str:
    if fmt is not OutputFormat.TABLE:
        return unit
    labels: dict[str, str] = {Unit.MONEY.value: "money", Unit.GPU_MS.value: "gpu_hours"}
    return labels.get(unit, unit)


@click.command(cls=Command, name="balances")
@config_option
@data_dir_option
@click.option("--team", default=None, help="Only this team's accounts (consumer, budget, hold).")
@click.option("--period", default=None, metavar="YYYY-MM", help="Only this period.")
@click.option(
    "--budgets",
    is_flag=True,
    help="Budgets instead of accounts: granted (of which a recurring budget's allowance and "
    "carry-over) − consumed − open holds (default: current period).",
)
@output_option
def balances(
    config_path: str,
    data_dir: str | None,
    team: str | None,
    period: str | None,
    budgets: bool,
    output: str,
) -> None:
    """Balances per account, unit and period (the fold of the sealed ledger), or budgets.

    Amounts are exact integers (micro-units, GPU-ms) in JSON and CSV; the table shows money
    and GPU-hours."""
    if period is not None:
        try:
            period = Period.month(period).label
        except ValueError as exc:
            fail(_("--period: {exc}").format(exc=exc), Exit.USAGE)
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        rows = sealed_balances(directory)
        applied = AdminView.from_log(load_admin_log(Path(directory) / SEGMENTS_DIR))
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    if budgets:
        statuses = [s for s in budget_statuses(rows, period) if team in (None, s.team)]
        headers = [
            "team",
            "period",
            "unit",
            "granted",
            "allowance",
            "carried",
            "consumed",
            "open_holds",
            "remaining",
        ]
        table: list[list[str | int]] = []
        for s in statuses:
            for line in s.lines:
                record = applied.allowances.get((s.team, Unit(line.unit), s.period))
                recurring = (record.allowance, record.carried) if record else (0, 0)
                amounts = (line.granted, *recurring, line.consumed, line.open_holds)
                table.append(
                    [
                        s.team,
                        s.period,
                        _unit_header(line.unit, fmt),
                        *(_amount(v, line.unit, fmt) for v in (*amounts, line.remaining)),
                    ]
                )
    else:
        chosen = [
            r
            for r in rows
            if (team is None or account_team(r.account) == team)
            and (period is None or r.period == period)
        ]
        headers = ["account", "unit", "period", "balance"]
        table = [
            [r.account, _unit_header(r.unit, fmt), r.period, _amount(r.balance, r.unit, fmt)]
            for r in chosen
        ]
    if not table and fmt is OutputFormat.TABLE:
        click.echo("no sealed balances for this selection")
        return
    click.echo(render(headers, table, fmt))


report_group.add_command(balances)  # `tally report balances`
