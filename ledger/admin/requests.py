"""Requests for quota and budget changes, and their approval: what the four request events of
the `admin` topic (`RequestOpened`, `RequestApproved`, `RequestRejected`, `RequestExpired`,
defined in `request_events`) do — the request projection (`RequestState`, `fold_request`), the
approval policy (`ApprovalPolicy`, `approvers_for`, `verdict`), an approval's effect (`effect`)
and the alert each step raises (`request_alert`), or its refusal (`refused_step`,
`refusal_alert`: the ledger's reason, shown as the status `refused`). Pure.

A request is keyed on the topic by its id (`request_id`, derived from its content), and so is
every later step, so one partition holds a request's whole history in order. The writer of a
`RequestOpened` records the roles that may approve it (`approvers`, from the configured policy at
that moment) and when it expires (`expires_us`): the ledger checks an approval against what the
request recorded, never against today's configuration, so a rebuild decides the same.

An approval's effect is the admin event the change needs (`effect`): a `BudgetGranted` or a
`QuotaSet`, the approver its actor and role, the request named in its reason. The ledger's admin
fold applies it in the approval's place (`ledger.ingest.admin`), exactly once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

import orjson

from ledger.admin.codec import admin_envelope
from ledger.admin.events import AdminEnvelope, BudgetGranted, QuotaSet
from ledger.admin.request_events import (
    RequestApproved,
    RequestEvent,
    RequestExpired,
    RequestKind,
    RequestOpened,
    RequestRejected,
    RequestStatus,
)
from ledger.fleet_alerts import FleetKind, RequestAlert
from ledger.roles import Role
from ledger.units import Unit

REQUESTS_SOURCE = "tally://ledger/requests"  # the source of the effects approvals make
REFUSED = "refused"  # a status readers show (`RequestState.shown_at`), never a step's
REFUSED_OUTCOME = "refused: "  # an admin log entry's outcome, then the reason
HOUR_US = 3_600_000_000


def request_id(team: str, kind: RequestKind, actor: str, reason: str, opened_us: int) -> str:
    """`req-` and 16 hex digits derived from who asked what for which team when."""
    text = orjson.dumps([team, kind.value, actor, reason, opened_us])
    return "req-" + hashlib.blake2b(text, digest_size=8).hexdigest()


# ---------------------------------------------------------------------------- the policy


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """`approvals:` in the configuration. A money budget increase above `finance_over`
    (micro-units; None: no such threshold) needs finance; any other budget change (at or
    below it, in GPU-hours, a decrease) finance or an admin approves. A quota that raises the
    borrowing limit (or makes it unlimited) needs an admin when `admin_for_borrowing`; any
    other quota change an admin or an operator approves. Requests expire `expire_after_us`
    after they are opened."""

    finance_over: int | None = None
    admin_for_borrowing: bool = True
    expire_after_us: int = 72 * HOUR_US


def approvers_for(
    policy: ApprovalPolicy,
    opened: RequestOpened,
    current_borrowing: int | None = 0,
) -> tuple[str, ...]:
    """The roles that may approve `opened` under `policy`; `current_borrowing`: the team's
    borrowing limit for the pool and model now (None: unlimited; 0 when it has no quota)."""
    if opened.kind is RequestKind.BUDGET:
        over = policy.finance_over
        big = over is not None and opened.unit is Unit.MONEY and (opened.amount or 0) > over
        return (Role.FINANCE.value,) if big else (Role.ADMIN.value, Role.FINANCE.value)
    if policy.admin_for_borrowing and _raises_borrowing(current_borrowing, opened.borrowing_limit):
        return (Role.ADMIN.value,)
    return (Role.ADMIN.value, Role.OPERATOR.value)


def _raises_borrowing(now: int | None, asked: int | None) -> bool:
    if now is None:  # already unlimited
        return False
    return asked is None or asked > now


class Verdict(Enum):
    """May this approver decide this request?"""

    ALLOWED = "allowed"
    NEEDS_FINANCE = "needs finance"
    NEEDS_ADMIN = "needs an admin"
    REFUSED = "refused"  # the requester itself, or a role that approves nothing


def verdict(opened: RequestOpened, approver: str, role: Role | None) -> Verdict:
    """Whether `approver` (acting as `role`; None: the local operator, as the admin) may
    approve or reject `opened`. Nobody decides their own request."""
    if approver == opened.actor:
        return Verdict.REFUSED
    acting = role or Role.ADMIN
    if acting.value in opened.approvers:
        return Verdict.ALLOWED
    if acting not in (Role.ADMIN, Role.FINANCE, Role.OPERATOR):
        return Verdict.REFUSED
    if Role.ADMIN.value not in opened.approvers:  # only finance
        return Verdict.NEEDS_FINANCE
    return Verdict.NEEDS_ADMIN


# ---------------------------------------------------------------------------- the projection


@dataclass(frozen=True, slots=True)
class RequestState:
    """A request as its applied events leave it: `status`, and for a decided one who decided,
    as what, when, with which comment; `effect` is the id of the admin event an approval made."""

    opened: RequestOpened
    status: RequestStatus = RequestStatus.OPEN
    decided_by: str | None = None
    decided_role: str | None = None
    decided_us: int | None = None
    comment: str | None = None
    effect: str | None = None
    refused: str | None = None  # the ledger's reason for refusing the latest decision step

    @property
    def request_id(self) -> str:
        return self.opened.request_id

    def shown_at(self, now_us: int) -> str:
        """The status readers show at `now_us`: `status_at`'s, or `refused` while the latest
        decision step was refused by the ledger (the request stays open: another may decide)."""
        status = self.status_at(now_us)
        if self.refused is not None and status is RequestStatus.OPEN:
            return REFUSED
        return status.value

    def status_at(self, now_us: int) -> RequestStatus:
        """The status a reader shows at `now_us`: an open request past its expiry is expired,
        whether or not its `RequestExpired` has been written yet."""
        if self.status is RequestStatus.OPEN and now_us >= self.opened.expires_us:
            return RequestStatus.EXPIRED
        return self.status


def refusal(states: Mapping[str, RequestState], event: RequestEvent) -> str | None:
    """Why `event` cannot apply to the requests as they stand, or None."""
    if isinstance(event, RequestOpened):
        if event.request_id in states:
            return f"request {event.request_id} is already open"
        if event.expires_us <= event.effective_us:
            return "expires_us: a request must expire after it is opened"
        return None
    state = states.get(event.request_id)
    if state is None:
        return f"no request {event.request_id}"
    if state.status is not RequestStatus.OPEN:
        return f"request {event.request_id} is {state.status}, not open"
    expired = event.effective_us >= state.opened.expires_us
    if isinstance(event, RequestExpired):
        return None if expired else f"request {event.request_id} expires later"
    if expired:
        return f"request {event.request_id} expired before it was decided"
    allowed = verdict(state.opened, event.actor, event.role)
    if allowed is not Verdict.ALLOWED:
        who = event.role or Role.ADMIN
        return (
            f"{event.actor} ({who}) may not decide request {event.request_id}: {allowed.value}"
            f" (approvers: {', '.join(state.opened.approvers)}; never the requester)"
        )
    return None


def advance(
    states: Mapping[str, RequestState], event: RequestEvent, effect: str | None = None
) -> RequestState:
    """The state `event` (which `refusal` let through) leaves its request in."""
    if isinstance(event, RequestOpened):
        return RequestState(event)
    state = states[event.request_id]
    status = {
        RequestApproved: RequestStatus.APPROVED,
        RequestRejected: RequestStatus.REJECTED,
        RequestExpired: RequestStatus.EXPIRED,
    }[type(event)]
    return replace(
        state,
        status=status,
        decided_by=event.actor,
        decided_role=(event.role or Role.ADMIN).value,
        decided_us=event.effective_us,
        comment=event.reason,
        effect=effect,
        refused=None,
    )


def refused_step(
    states: dict[str, RequestState], event: RequestEvent, reason: str
) -> RequestState | None:
    """Record in `states` (in place) that the ledger refused decision step `event` for
    `reason`; the request's state, or None when `event` opens a request or names none that is
    open (a step on a decided request changes nothing a reader could have believed)."""
    state = states.get(event.request_id)
    if state is None or isinstance(event, RequestOpened) or state.status is not RequestStatus.OPEN:
        return None
    states[event.request_id] = replace(state, refused=reason)
    return states[event.request_id]


def effect(opened: RequestOpened, approval: RequestApproved) -> BudgetGranted | QuotaSet:
    """The admin event an approval makes: what `tally admin apply` would write for the change,
    the approver its actor and role, the request in its reason."""
    reason = f"request {opened.request_id} approved: {approval.reason}"[:2048]
    if opened.kind is RequestKind.BUDGET:
        assert opened.period and opened.unit and opened.amount is not None
        return BudgetGranted(
            team=opened.team,
            period=opened.period,
            unit=opened.unit,
            amount=opened.amount,
            actor=approval.actor,
            reason=reason,
            effective_us=approval.effective_us,
            role=approval.role,
        )
    assert opened.pool and opened.model and opened.nominal_gpus is not None
    return QuotaSet(
        team=opened.team,
        pool=opened.pool,
        model=opened.model,
        nominal_gpus=opened.nominal_gpus,
        borrowing_limit=opened.borrowing_limit,
        lending_limit=opened.lending_limit,
        actor=approval.actor,
        reason=reason,
        effective_us=approval.effective_us,
        role=approval.role,
    )


def request_states(opened: RequestOpened) -> tuple[dict[str, object], dict[str, object]]:
    """An audit entry's before / after of an opened request."""
    change: dict[str, object] = {"kind": opened.kind.value, "team": opened.team}
    if opened.kind is RequestKind.BUDGET:
        unit = None if opened.unit is None else opened.unit.value
        change |= {"period": opened.period, "unit": unit, "amount": opened.amount}
    else:
        change |= {
            "pool": opened.pool,
            "model": opened.model,
            "nominal_gpus": opened.nominal_gpus,
            "borrowing_limit": opened.borrowing_limit,
            "lending_limit": opened.lending_limit,
        }
    return {"status": None}, {
        **change,
        "status": RequestStatus.OPEN.value,
        "approvers": list(opened.approvers),
        "expires_us": opened.expires_us,
    }


def effect_envelope(opened: RequestOpened, approval: RequestApproved) -> AdminEnvelope:
    """The approval's effect in its envelope (source `REQUESTS_SOURCE`): its id derives from
    the request and the approval, so a rebuild makes the same one."""
    return admin_envelope(effect(opened, approval), REQUESTS_SOURCE)


def fold_request(
    states: dict[str, RequestState], event: RequestEvent
) -> tuple[AdminEnvelope | None, str | None]:
    """Apply one request event to `states` (in place): the effect envelope an approval makes,
    or why the event is refused (then `states` is unchanged)."""
    problem = refusal(states, event)
    if problem is not None:
        return None, problem
    made = None
    if isinstance(event, RequestApproved):
        made = effect_envelope(states[event.request_id].opened, event)
    key = event.request_id
    states[key] = advance(states, event, None if made is None else made.id)
    return made, None


def change_text(opened: RequestOpened) -> str:
    """What a request asks, in one line of the ledger's integers."""
    if opened.kind is RequestKind.BUDGET:
        unit = "" if opened.unit is None else opened.unit.value
        return f"budget {opened.period} {unit} {opened.amount or 0:+d}"
    limits = [
        "unlimited" if v is None else str(v) for v in (opened.borrowing_limit, opened.lending_limit)
    ]
    return (
        f"quota {opened.pool}/{opened.model} {opened.nominal_gpus} GPUs "
        f"(borrowing {limits[0]}, lending {limits[1]})"
    )


_ALERT_KINDS = {
    RequestOpened: FleetKind.REQUEST_OPENED,
    RequestApproved: FleetKind.REQUEST_APPROVED,
    RequestRejected: FleetKind.REQUEST_REJECTED,
    RequestExpired: FleetKind.REQUEST_EXPIRED,
}


def request_alert(event: RequestEvent, state: RequestState) -> RequestAlert:
    """The alert a step applied to `state` raises (once per request and step)."""
    return RequestAlert(
        kind=_ALERT_KINDS[type(event)],
        request_id=state.request_id,
        team=state.opened.team,
        change=change_text(state.opened),
        actor=event.actor,
        role=(event.role or Role.ADMIN).value,
        comment=event.reason,
        approvers=", ".join(state.opened.approvers),
        at_us=event.effective_us,
    )


def refusal_alert(event: RequestEvent, state: RequestState, step_id: str) -> RequestAlert:
    """The alert the ledger raises when it refuses decision step `event` (envelope id
    `step_id`) on `state`'s request: the reason is its comment (once per refused step)."""
    return replace(
        request_alert(event, state),
        kind=FleetKind.REQUEST_REFUSED,
        comment=state.refused or "",
        step=step_id,
    )


def new_request(
    policy: ApprovalPolicy,
    team: str,
    kind: RequestKind,
    actor: str,
    reason: str,
    now_us: int,
    role: Role | None,
    current: QuotaSet | None = None,
    **change: object,
) -> RequestOpened:
    """The `RequestOpened` for `change` (`period`, `unit`, `amount`; or `pool`, `model`,
    `nominal_gpus`, `borrowing_limit`, `lending_limit`), with its id, the approvers `policy`
    names (`current`: the team's applied quota for the pool and model, if any) and its expiry."""
    opened = RequestOpened(
        request_id(team, kind, actor, reason, now_us),
        team,
        kind,
        (),
        now_us + policy.expire_after_us,
        actor,
        reason,
        now_us,
        role=role,
        **change,  # type: ignore[arg-type]
    )
    borrowing = 0 if current is None else current.borrowing_limit
    return replace(opened, approvers=approvers_for(policy, opened, borrowing))
