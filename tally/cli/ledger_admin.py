"""`tally ledger adjust` and `tally ledger close`: the ledger's own admin events (an adjusting
transaction or the reversal of one, a period's close), checked by the admin codec as the worker
will read them and sent to the `admin` topic like `tally admin apply`'s (`tally.cli.admin`)."""

from __future__ import annotations

from decimal import Decimal

import click
import duckdb

from ledger.admin import (
    AdjustmentRecorded,
    AdminEvent,
    PeriodClosed,
    admin_event_from_dict,
    admin_event_to_dict,
)
from ledger.errors import EventError, LedgerError
from ledger.invalid import Invalid
from ledger.periods import Period
from ledger.read.queries import find_sealed_transaction
from ledger.units import MS_PER_HOUR, Unit, parse_micros
from tally.cli.admin import (
    actor_option,
    default_actor,
    dry_run_option,
    echo_events,
    effective_option,
    now_us,
    parse_effective,
    send_admin_events,
)
from tally.cli.admin_state import read_admin_state
from tally.cli.caller import admin_token_option, as_caller
from tally.cli.help import Command
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    resolve_ledger_dir,
    said,
)
from tally.language import _
from tally.output import OutputFormat

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


@click.command(cls=Command)
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
    if reverse_txn is None:  # the ledger to adjust must exist (read: its head, not its segments)
        read_admin_state(config_path, data_dir)
    echo_events([event], OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    (sent,) = send_admin_events(config, bootstrap, [event])
    click.echo(_("sent {sent} to {admin}").format(sent=sent, admin=config.topics.admin), err=True)


@click.command(cls=Command)
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
    applied = read_admin_state(config_path, data_dir)
    month = Period.month(period, applied.zone)  # ends at the ledger's midnight
    view = applied.view
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
