"""`tally request …`: ask for a quota or budget change, approve or reject one, expire the stale
ones, and list them (`ledger.admin.requests`).

Like `tally admin`, these commands never touch the ledger: they read the requests the worker
has applied (the admin log beside the segments; with `ledger.segments_url`, that file alone
from the object store: `tally.cli.admin_state`), check what they can (the caller's role and
team, the request's approvers, never one's own request), and put one admin event on the admin
topic; the ledger checks it again and, for an approval, applies the grant or quota itself.
`list` and `show` print when a request was opened, expires and was decided: in a table on the
ledger's clock (`ledger.timezone`, ISO 8601 with its offset), in JSON and CSV in UTC.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from typing import Any

import click

from ledger.admin import AdminEvent, AdminView
from ledger.admin.request_events import (
    RequestApproved,
    RequestExpired,
    RequestKind,
    RequestRejected,
    RequestStatus,
)
from ledger.admin.requests import (
    REFUSED,
    RequestState,
    Verdict,
    change_text,
    new_request,
    verdict,
)
from ledger.roles import Action, Caller, Decision, Role, decide
from ledger.units import Unit, parse_micros
from tally.cli.admin import (
    actor_option,
    default_actor,
    dry_run_option,
    echo_events,
    now_us,
    send_admin_events,
)
from tally.cli.admin_state import read_admin_state
from tally.cli.caller import admin_token_option, token_caller
from tally.cli.help import Group
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    output_option,
)
from tally.config import TallyConfig
from tally.language import _
from tally.output import OutputFormat, render, shown_time

COLUMNS = ("request", "team", "status", "change", "requested_by", "opened", "expires", "decided_by")
DETAIL = (*COLUMNS, "decided", "approvers", "reason", "comment", "effect", "refused_reason")


def _caller(config: TallyConfig, token: str | None) -> Caller | None:
    return token_caller(config, token) if token else None


def _check(caller: Caller | None, action: Action, team: str | None) -> None:
    """Exit 2 (nothing sent or shown) when the caller may not do `action` for `team`."""
    if caller is None:  # the local operator, as the admin
        return
    answer = decide(caller, action, team)
    if answer is Decision.FORBIDDEN:
        fail(
            _("refused for {name}: role {role} may not {action}").format(
                name=caller.name, role=caller.role, action=action
            ),
            Exit.USAGE,
        )
    if answer is Decision.HIDDEN:
        fail(
            _("refused for {name}: team {team} is not yours").format(name=caller.name, team=team),
            Exit.USAGE,
        )


def _send(config: TallyConfig, bootstrap: str | None, event: AdminEvent, dry_run: bool) -> None:
    echo_events([event], OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    (sent,) = send_admin_events(config, bootstrap, [event])
    click.echo(_("sent {sent} to {admin}").format(sent=sent, admin=config.topics.admin), err=True)


def request_row(
    state: RequestState, now: int, fmt: OutputFormat = OutputFormat.JSON, zone: tzinfo = UTC
) -> dict[str, Any]:
    """A request as `list` and `show` print it in `fmt`: its times on `zone`'s clock in a table,
    in UTC in JSON and CSV (`tally.output.shown_time`)."""
    o = state.opened
    decided = state.decided_us
    return {
        "request": o.request_id,
        "team": o.team,
        "status": state.shown_at(now),
        "change": change_text(o),
        "requested_by": o.actor,
        "opened": shown_time(o.effective_us, fmt, zone),
        "expires": shown_time(o.expires_us, fmt, zone),
        "decided_by": state.decided_by or "-",
        "decided": "-" if decided is None else shown_time(decided, fmt, zone),
        "approvers": ", ".join(o.approvers),
        "reason": o.reason,
        "comment": state.comment or "-",
        "effect": state.effect or "-",
        "refused_reason": (state.refused if state.shown_at(now) == REFUSED else None) or "-",
    }


@click.group(cls=Group)
def request() -> None:
    """Ask for quota and budget changes; approve, reject and list them."""


_common = [config_option, bootstrap_option, data_dir_option, actor_option, dry_run_option]


def _opening(func: Any) -> Any:
    for option in reversed(
        [
            *_common,
            click.option("--team", required=True, help="The team the change is for."),
            click.option("--reason", required=True, help="Why the team needs it."),
            admin_token_option,
        ]
    ):
        func = option(func)
    return func


def _open(
    config_path: str,
    data_dir: str | None,
    team: str,
    kind: RequestKind,
    actor: str | None,
    reason: str,
    token: str | None,
    current: Any = None,
    **change: Any,
) -> tuple[TallyConfig, AdminEvent]:
    config = load_or_exit(config_path)
    caller = _caller(config, token)
    _check(caller, Action.REQUEST_OPEN, team)
    view = read_admin_state(config_path, data_dir).view
    if team not in view.teams and team not in {t.name for t in config.organisation.teams()}:
        fail(_("unknown team {team!r}").format(team=team), Exit.USAGE)
    if kind is RequestKind.QUOTA:
        current = view.quotas.get((team, change["pool"], change["model"]))
    event = new_request(
        config.approvals.policy(),
        team,
        kind,
        actor or default_actor(),
        reason,
        now_us(),
        None if caller is None else caller.role,
        current,
        **change,
    )
    return config, event


@request.command("budget")
@_opening
@click.option("--period", required=True, help="The month (YYYY-MM).")
@click.option("--money", default=None, help="Money to add (negative: to give back), e.g. 1500.00.")
@click.option("--gpu-hours", default=None, type=int, help="GPU-hours to add (or give back).")
def budget(
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    actor: str | None,
    dry_run: bool,
    team: str,
    reason: str,
    token: str | None,
    period: str,
    money: str | None,
    gpu_hours: int | None,
) -> None:
    """Ask for more (or less) budget for TEAM in PERIOD, in money or GPU-hours."""
    if (money is None) == (gpu_hours is None):
        fail(_("give exactly one of --money and --gpu-hours"), Exit.USAGE)
    try:
        unit, amount = (
            (Unit.MONEY, parse_micros(money))
            if money is not None
            else (Unit.GPU_MS, (gpu_hours or 0) * 3_600_000)
        )
    except ValueError as exc:
        fail(_("--money: {exc}").format(exc=exc), Exit.USAGE)
    if amount == 0:
        fail(_("a change of zero changes nothing"), Exit.USAGE)
    config, event = _open(
        config_path,
        data_dir,
        team,
        RequestKind.BUDGET,
        actor,
        reason,
        token,
        period=period,
        unit=unit,
        amount=amount,
    )
    _send(config, bootstrap, event, dry_run)


def _limit(text: str | None) -> int | None:
    if text is None or text == "unlimited":
        return None
    if not text.isdigit():
        fail(
            _("a limit is a number of GPUs or `unlimited`, not {text!r}").format(text=text),
            Exit.USAGE,
        )
    return int(text)


@request.command("quota")
@_opening
@click.option("--pool", required=True)
@click.option("--model", required=True)
@click.option("--gpus", required=True, type=click.IntRange(0, 1_000_000), help="Nominal GPUs.")
@click.option("--borrowing-limit", default="unlimited", show_default=True, metavar="N|unlimited")
@click.option("--lending-limit", default="unlimited", show_default=True, metavar="N|unlimited")
def quota(
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    actor: str | None,
    dry_run: bool,
    team: str,
    reason: str,
    token: str | None,
    pool: str,
    model: str,
    gpus: int,
    borrowing_limit: str,
    lending_limit: str,
) -> None:
    """Ask for TEAM's whole quota of MODEL GPUs in POOL (as `quotas:` writes it)."""
    config, event = _open(
        config_path,
        data_dir,
        team,
        RequestKind.QUOTA,
        actor,
        reason,
        token,
        pool=pool,
        model=model,
        nominal_gpus=gpus,
        borrowing_limit=_limit(borrowing_limit),
        lending_limit=_limit(lending_limit),
    )
    _send(config, bootstrap, event, dry_run)


def _decide(
    approve: bool,
    request_id: str,
    comment: str,
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    actor: str | None,
    dry_run: bool,
    token: str | None,
) -> None:
    config = load_or_exit(config_path)
    caller = _caller(config, token)
    _check(caller, Action.REQUEST_DECIDE, None)
    state = _find(read_admin_state(config_path, data_dir).view, request_id)
    now, who = now_us(), actor or default_actor()
    if state.status_at(now) is not RequestStatus.OPEN:
        fail(
            _("request {request_id} is {status}, not open").format(
                request_id=request_id, status=state.status_at(now)
            ),
            Exit.USAGE,
        )
    role = None if caller is None else caller.role
    answer = verdict(state.opened, who, role)
    if answer is not Verdict.ALLOWED:
        fail(
            _(
                "{who} ({role}) may not decide request {request_id}: {value} "
                "(approvers: {approvers}; never the requester)"
            ).format(
                who=who,
                role=role or Role.ADMIN,
                request_id=request_id,
                value=answer.value,
                approvers=", ".join(state.opened.approvers),
            ),
            Exit.USAGE,
        )
    kind = RequestApproved if approve else RequestRejected
    _send(config, bootstrap, kind(request_id, who, comment, now, role), dry_run)


def _find(view: AdminView, request_id: str) -> RequestState:
    state = view.requests.get(request_id)
    if state is None:
        fail(
            _("no request {request_id} (as of the last seal)").format(request_id=request_id),
            Exit.USAGE,
        )
    return state


def _deciding(func: Any) -> Any:
    func = admin_token_option(func)
    func = click.option("--comment", required=True, help="Why, for the requester.")(func)
    for option in reversed(_common):
        func = option(func)
    return click.argument("request_id")(func)


@request.command("approve")
@_deciding
def approve(request_id: str, comment: str, **options: Any) -> None:
    """Approve REQUEST_ID: the ledger then applies its grant or quota, with you as actor."""
    _decide(True, request_id, comment, **options)


@request.command("reject")
@_deciding
def reject(request_id: str, comment: str, **options: Any) -> None:
    """Reject REQUEST_ID."""
    _decide(False, request_id, comment, **options)


@request.command("expire")
@config_option
@bootstrap_option
@data_dir_option
@actor_option
@dry_run_option
@admin_token_option
def expire(
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    actor: str | None,
    dry_run: bool,
    token: str | None,
) -> None:
    """Mark every open request past its expiry expired (run it from cron or a timer)."""
    config = load_or_exit(config_path)
    caller = _caller(config, token)
    _check(caller, Action.REQUEST_DECIDE, None)
    view = read_admin_state(config_path, data_dir).view
    now, who = now_us(), actor or default_actor()
    role = None if caller is None else caller.role
    events: list[AdminEvent] = [
        RequestExpired(rid, who, "expired unanswered", now, role)
        for rid, state in sorted(view.requests.items())
        if state.status is RequestStatus.OPEN and now >= state.opened.expires_us
    ]
    if not events:
        click.echo("no open request has expired")
        return
    echo_events(events, OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    sent = send_admin_events(config, bootstrap, events)
    click.echo(
        _("sent {count} to {admin}").format(count=len(sent), admin=config.topics.admin), err=True
    )


def _visible(caller: Caller | None, view: AdminView) -> list[RequestState]:
    if caller is None:
        return list(view.requests.values())
    return [
        s
        for s in view.requests.values()
        if decide(caller, Action.REQUEST_READ, s.opened.team) is Decision.ALLOWED
    ]


@request.command("list")
@config_option
@data_dir_option
@click.option("--team", default=None, help="Only this team's requests.")
@click.option(
    "--status", type=click.Choice([*(s.value for s in RequestStatus), REFUSED]), default=None
)
@output_option
@admin_token_option
def list_requests(
    config_path: str,
    data_dir: str | None,
    team: str | None,
    status: str | None,
    output: str,
    token: str | None,
) -> None:
    """Quota and budget requests, oldest first, as of the last seal (exit 4: no ledger)."""
    applied = read_admin_state(config_path, data_dir)
    caller = _caller(load_or_exit(config_path), token) if token else None
    _check(caller, Action.REQUEST_READ, team)
    now, fmt = now_us(), OutputFormat(output)
    rows = [
        request_row(s, now, fmt, applied.zone)
        for s in sorted(_visible(caller, applied.view), key=_opened_order)
        if (team is None or s.opened.team == team) and (status is None or s.shown_at(now) == status)
    ]
    if not rows and fmt is OutputFormat.TABLE:
        click.echo("no requests match")
        return
    columns = COLUMNS if fmt is OutputFormat.TABLE else DETAIL
    click.echo(render(list(columns), [[r[c] for c in columns] for r in rows], fmt))


def _opened_order(state: RequestState) -> tuple[int, str]:
    return state.opened.effective_us, state.request_id


@request.command("show")
@click.argument("request_id")
@config_option
@data_dir_option
@output_option
@admin_token_option
def show(
    request_id: str, config_path: str, data_dir: str | None, output: str, token: str | None
) -> None:
    """One request with its approvers, reason, decision and the admin event it made."""
    applied = read_admin_state(config_path, data_dir)
    caller = _caller(load_or_exit(config_path), token) if token else None
    state = _find(applied.view, request_id)
    if caller is not None and decide(caller, Action.REQUEST_READ, state.opened.team) is not (
        Decision.ALLOWED
    ):
        fail(
            _("no request {request_id} (as of the last seal)").format(request_id=request_id),
            Exit.USAGE,
        )
    fmt = OutputFormat(output)
    row = request_row(state, now_us(), fmt, applied.zone)
    click.echo(render(list(DETAIL), [[row[c] for c in DETAIL]], fmt))
