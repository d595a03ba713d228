"""Planning admin changes: `plan_admin` is the diff behind `tally admin apply` (desired state
minus the applied state, so applying the same file twice emits nothing the second time), and
`describe` says what one admin event does in a line.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.admin.events import (
    DEFAULT_ADJUSTMENTS,
    AdjustmentRecorded,
    AdminEvent,
    BudgetAllowanceGranted,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    GpuCordoned,
    GpuUncordoned,
    PriceSet,
    QuotaSet,
    TeamDefined,
)
from ledger.admin.request_events import (
    RequestApproved,
    RequestExpired,
    RequestOpened,
    RequestRejected,
)
from ledger.admin.requests import change_text
from ledger.admin.sealed_events import ShardsSealedThrough
from ledger.admin.view import AdminView
from ledger.units import Unit


@dataclass(frozen=True, slots=True)
class TeamSpec:
    team: str
    cost_centre: str
    projects: tuple[str, ...]
    users: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PriceSpec:
    """A configured price; `effective_us` 0 means "the price as of now" rather than a date."""

    model: str
    pool: str | None
    micros_per_gpu_hour: int
    effective_us: int = 0


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    team: str
    pool: str
    model: str
    nominal_gpus: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """A team's total budget of `unit` for `period`."""

    team: str
    period: str
    unit: Unit
    total: int


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A team's recurring budget of `unit`: `amount` every month or quarter (see
    `ledger.admin.recurring`); `start` None means from the month it is applied in."""

    team: str
    unit: Unit
    amount: int
    every: Cadence = Cadence.MONTH
    start: str | None = None
    end: str | None = None
    carry_over: CarryOver = CarryOver.NONE
    carry_limit: int | None = None

    @property
    def terms(self) -> tuple[int, Cadence, str | None, str | None, CarryOver, int | None]:
        return (self.amount, self.every, self.start, self.end, self.carry_over, self.carry_limit)


@dataclass(frozen=True, slots=True)
class DesiredState:
    teams: tuple[TeamSpec, ...] = ()
    prices: tuple[PriceSpec, ...] = ()
    quotas: tuple[QuotaSpec, ...] = ()
    budgets: tuple[BudgetSpec, ...] = ()
    policies: tuple[PolicySpec, ...] = ()


@dataclass(frozen=True, slots=True)
class AdminPlan:
    """The events that bring the ledger's admin state to the desired one, and what cannot."""

    events: tuple[AdminEvent, ...]
    notes: tuple[str, ...] = ()


def plan_admin(
    desired: DesiredState, view: AdminView, actor: str, reason: str, effective_us: int
) -> AdminPlan:
    """The diff of `desired` against `view`. Nothing is revoked because it is missing from the
    desired state; a price without a date changes from `effective_us` on, never retroactively;
    a budget changes by a grant of the difference, checked against the total it was computed
    from (`expected_total`), so planning twice before the first plan is applied cannot grant
    twice. A recurring budget (`PolicySpec`) is set again when its terms differ from the policy
    applied last for its team and unit; it is never ended because the file no longer names it
    (give it an `end` instead)."""
    meta = (actor, reason, effective_us)
    events: list[AdminEvent] = []
    notes: list[str] = []
    for team in desired.teams:
        defined = TeamDefined(team.team, team.cost_centre, team.projects, team.users, *meta)
        now = view.teams.get(team.team)
        if now is None or now.definition != defined.definition:
            events.append(defined)
    for price in desired.prices:
        if price.effective_us:
            exact = PriceSet(
                price.model,
                price.pool,
                price.micros_per_gpu_hour,
                actor,
                reason,
                price.effective_us,
            )
            if not any(
                (p.model, p.pool, p.micros_per_gpu_hour, p.effective_us)
                == (exact.model, exact.pool, exact.micros_per_gpu_hour, exact.effective_us)
                for p in view.prices
            ):
                events.append(exact)
            continue
        # An undated price is compared with the applied price it set, not with dated ones.
        ignore = {
            (q.micros_per_gpu_hour, q.effective_us)
            for q in desired.prices
            if (q.model, q.pool) == (price.model, price.pool) and q.effective_us
        }
        latest = view.latest_price(price.model, price.pool, ignore)
        if latest is None:
            events.append(
                PriceSet(price.model, price.pool, price.micros_per_gpu_hour, actor, reason, 0)
            )
        elif latest.micros_per_gpu_hour != price.micros_per_gpu_hour:
            events.append(PriceSet(price.model, price.pool, price.micros_per_gpu_hour, *meta))
    for quota in desired.quotas:
        wanted = (quota.nominal_gpus, quota.borrowing_limit, quota.lending_limit)
        now_q = view.quotas.get((quota.team, quota.pool, quota.model))
        if now_q is None or now_q.limits != wanted:
            events.append(QuotaSet(quota.team, quota.pool, quota.model, *wanted, *meta))
    for budget in desired.budgets:
        applied = view.budgets.get((budget.team, budget.period, budget.unit), 0)
        if budget.total == applied:
            continue
        if budget.period in view.closed:
            notes.append(
                f"budget {budget.team} {budget.period} {budget.unit}: the period is closed; "
                f"it stays at {applied}"
            )
            continue
        events.append(
            BudgetGranted(
                budget.team,
                budget.period,
                budget.unit,
                budget.total - applied,
                *meta,
                expected_total=applied,
            )
        )
    for spec in desired.policies:
        now_p = view.policy(spec.team, spec.unit)
        if now_p is None or now_p.terms != spec.terms:
            events.append(BudgetPolicySet(spec.team, spec.unit, *spec.terms, *meta))
    return AdminPlan(tuple(events), tuple(notes))


def describe(event: AdminEvent) -> str:
    """One line saying what an event changes, for people."""
    if isinstance(event, BudgetGranted):
        return f"grant {event.amount:+d} {event.unit} to {event.team} for {event.period}"
    if isinstance(event, PriceSet):
        where = f" in pool {event.pool}" if event.pool else ""
        return f"price of {event.model}{where}: {event.micros_per_gpu_hour} µ/GPU-hour"
    if isinstance(event, TeamDefined):
        return f"team {event.team} in {event.cost_centre}: projects {', '.join(event.projects)}" + (
            f"; users {', '.join(event.users)}" if event.users else ""
        )
    if isinstance(event, QuotaSet):
        return (
            f"quota {event.team} {event.pool}/{event.model}: {event.nominal_gpus} GPUs "
            f"(borrow ≤ {_limit(event.borrowing_limit)}, lend ≤ {_limit(event.lending_limit)})"
        )
    if isinstance(event, AdjustmentRecorded):
        if event.reverses_txn:
            return f"reverse transaction {event.reverses_txn}"
        return (
            f"adjust {event.account} by {event.amount:+d} {event.unit} in {event.period} "
            f"against {event.counter_account or DEFAULT_ADJUSTMENTS}"
        )
    if isinstance(event, BudgetPolicySet):
        limit = "" if event.carry_limit is None else f" {event.carry_limit}"
        if event.carry_over is CarryOver.PERCENT:
            limit += "%"
        return (
            f"recurring budget {event.amount} {event.unit} every {event.every} for "
            f"{event.team} from {event.start or 'this month'}"
            + (f" to {event.end}" if event.end else "")
            + f", carry-over {event.carry_over}{limit}"
        )
    if isinstance(event, BudgetAllowanceGranted):
        return (
            f"allowance {event.allowance} + carried {event.carried} {event.unit} to "
            f"{event.team} for {event.period}"
        )
    if isinstance(event, GpuCordoned):
        return f"cordon {event.target}: {event.reason}"
    if isinstance(event, GpuUncordoned):
        return f"uncordon {event.target}: {event.reason}"
    if isinstance(event, RequestOpened):
        return f"request {change_text(event)} for {event.team}: {event.reason}"
    if isinstance(event, RequestApproved | RequestRejected | RequestExpired):
        step = event.KIND.value.removeprefix("tally.admin.request_")
        return f"{step} request {event.request_id}: {event.reason}"
    if isinstance(event, ShardsSealedThrough):
        return f"shards sealed through {event.through_us} µs: {event.reason}"
    return f"close {event.period}"


def _limit(value: int | None) -> str:
    return "∞" if value is None else str(value)
