"""The vocabulary of the `admin` topic: the admin event types (budgets, recurring budget
policies, prices, teams, quotas, adjustments, period closes, GPU cordons; the request events
come from `request_events`), the allowance records
the ledger derives from policies, their kinds, the `AdminEvent` union and envelope, and the
limits and account rules every admin event obeys.

Every dataclass here is frozen and slotted and holds tuples, never lists; every event carries who
(`actor`), why (`reason`) and from when (`effective_us`), and may carry the role its writer acted
in (`role`, checked against `ledger.roles` through `ACTION_OF`; None: the local operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from ledger.accounts import AccountKind
from ledger.admin.kinds import AdminKind
from ledger.admin.request_events import (
    RequestApproved,
    RequestExpired,
    RequestOpened,
    RequestRejected,
)
from ledger.admin.sealed_events import ShardsSealedThrough
from ledger.envelope import Envelope
from ledger.postings import TransactionKind
from ledger.roles import Action, Role
from ledger.units import Unit

ADMIN_SOURCE = "tally://admin"
DEFAULT_FUNDING = "org"  # the funding account of teams with no known cost centre
DEFAULT_ADJUSTMENTS = f"{AccountKind.ADJUSTMENTS}:manual"
MAX_AMOUNT = 1 << 62
MAX_REASON = 2048
BUDGET_UNITS = (Unit.MONEY, Unit.GPU_MS)
# Accounts an adjustment may touch. Budgets change by grants, holds by hold events.
ADJUSTABLE = frozenset(
    {AccountKind.CONSUMER, AccountKind.CAPACITY, AccountKind.UNALLOCATED, AccountKind.ADJUSTMENTS}
)
REVERSIBLE = frozenset(
    {TransactionKind.USAGE, TransactionKind.ADJUSTMENT, TransactionKind.REVERSAL}
)


class Cadence(StrEnum):
    """How often a recurring budget renews: every month, or every calendar quarter."""

    MONTH = "month"
    QUARTER = "quarter"


class CarryOver(StrEnum):
    """What a recurring budget carries into a new allowance period of the previous period's
    unspent remainder: nothing, all of it, at most `carry_limit` percent of the allowance, or
    at most `carry_limit` (in the budget's unit)."""

    NONE = "none"
    ALL = "all"
    PERCENT = "percent"
    AMOUNT = "amount"


@dataclass(frozen=True, slots=True)
class BudgetGranted:
    """`amount` (signed: a negative grant takes budget back) of `unit` for `team` in `period`.

    `expected_total`, when set, is the team's total grant for (period, unit) the grant was
    computed against; if the ledger's total differs the grant is stale and refused.
    """

    KIND: ClassVar[AdminKind] = AdminKind.BUDGET_GRANTED
    team: str
    period: str
    unit: Unit
    amount: int
    actor: str
    reason: str
    effective_us: int
    expected_total: int | None = None
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.team


@dataclass(frozen=True, slots=True)
class BudgetPolicySet:
    """A recurring budget: `amount` of `unit` for `team` every month or quarter (`every`), from
    month `start` (None: the month the policy is set in) to month `end` (inclusive; None: no
    end), with a carry-over rule. It replaces, from its start, every policy set before it for
    (team, unit); the ledger turns it into grants (`ledger.admin.recurring`)."""

    KIND: ClassVar[AdminKind] = AdminKind.BUDGET_POLICY_SET
    team: str
    unit: Unit
    amount: int
    every: Cadence
    start: str | None
    end: str | None
    carry_over: CarryOver
    carry_limit: int | None
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.team

    @property
    def terms(self) -> tuple[int, Cadence, str | None, str | None, CarryOver, int | None]:
        """What the policy says, for "has it changed?"."""
        return (self.amount, self.every, self.start, self.end, self.carry_over, self.carry_limit)


@dataclass(frozen=True, slots=True)
class BudgetAllowanceGranted:
    """The ledger's record of what a recurring budget granted `team` for `period`: `allowance`
    (the policy's amount at the start of an allowance period, else 0) and `carried` (of the
    previous month's `remainder`). Derived by the ledger, never accepted on the `admin` topic;
    `policy` is the id of the `BudgetPolicySet` in force, `every` its cadence."""

    KIND: ClassVar[AdminKind] = AdminKind.BUDGET_ALLOWANCE_GRANTED
    team: str
    unit: Unit
    period: str
    allowance: int
    carried: int
    remainder: int | None
    policy: str
    every: Cadence
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.team

    @property
    def granted(self) -> int:
        return self.allowance + self.carried


@dataclass(frozen=True, slots=True)
class PriceSet:
    """From `effective_us` on, one GPU-hour of `model` (in `pool`, or any) costs this much."""

    KIND: ClassVar[AdminKind] = AdminKind.PRICE_SET
    model: str
    pool: str | None
    micros_per_gpu_hour: int
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.model


@dataclass(frozen=True, slots=True)
class TeamDefined:
    """A team, its cost centre, projects and users (the whole definition, not a change)."""

    KIND: ClassVar[AdminKind] = AdminKind.TEAM_DEFINED
    team: str
    cost_centre: str
    projects: tuple[str, ...]
    users: tuple[str, ...]
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.team

    @property
    def definition(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What the event says about the team, order aside (for "has it changed?")."""
        return (self.cost_centre, tuple(sorted(self.projects)), tuple(sorted(self.users)))


@dataclass(frozen=True, slots=True)
class QuotaSet:
    """A team's quota of GPUs of `model` in `pool`; a limit of None means unlimited."""

    KIND: ClassVar[AdminKind] = AdminKind.QUOTA_SET
    team: str
    pool: str
    model: str
    nominal_gpus: int
    borrowing_limit: int | None
    lending_limit: int | None
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.team

    @property
    def limits(self) -> tuple[int, int | None, int | None]:
        return (self.nominal_gpus, self.borrowing_limit, self.lending_limit)


@dataclass(frozen=True, slots=True)
class AdjustmentRecorded:
    """A manual correction: either `amount` of `unit` on `account` in `period` (against
    `counter_account`, default `adjustments:manual`), or, with `reverses_txn`, the exact
    negation of that transaction (account, unit, amount and period are then empty)."""

    KIND: ClassVar[AdminKind] = AdminKind.ADJUSTMENT_RECORDED
    account: str | None
    unit: Unit | None
    amount: int
    period: str | None
    actor: str
    reason: str
    effective_us: int
    reverses_txn: str | None = None
    counter_account: str | None = None
    team: str | None = None
    project: str | None = None
    user: str | None = None
    job_id: str | None = None
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @classmethod
    def reversal(
        cls, txn_id: str, actor: str, reason: str, effective_us: int
    ) -> AdjustmentRecorded:
        return cls(None, None, 0, None, actor, reason, effective_us, reverses_txn=txn_id)

    @property
    def entity(self) -> str:
        return self.reverses_txn or self.account or "-"


@dataclass(frozen=True, slots=True)
class PeriodClosed:
    """From now on nothing posts into `period`; its checksum is recorded."""

    KIND: ClassVar[AdminKind] = AdminKind.PERIOD_CLOSED
    period: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.period


@dataclass(frozen=True, slots=True)
class GpuCordoned:
    """No new placements on `target` (a GPU UUID, or a node: all its GPUs, also those it
    reports later) until it is uncordoned; jobs running there keep running."""

    KIND: ClassVar[AdminKind] = AdminKind.GPU_CORDONED
    target: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.target


@dataclass(frozen=True, slots=True)
class GpuUncordoned:
    """`target` (a GPU UUID or a node) takes new placements again (if it is not unhealthy)."""

    KIND: ClassVar[AdminKind] = AdminKind.GPU_UNCORDONED
    target: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.target


AdminEvent = (
    BudgetGranted
    | PriceSet
    | TeamDefined
    | QuotaSet
    | AdjustmentRecorded
    | PeriodClosed
    | BudgetPolicySet
    | BudgetAllowanceGranted
    | GpuCordoned
    | GpuUncordoned
    | RequestOpened
    | RequestApproved
    | RequestRejected
    | RequestExpired
    | ShardsSealedThrough
)
EVENT_CLASSES: Mapping[AdminKind, type[AdminEvent]] = {
    cls.KIND: cls
    for cls in (
        BudgetGranted,
        PriceSet,
        TeamDefined,
        QuotaSet,
        AdjustmentRecorded,
        PeriodClosed,
        BudgetPolicySet,
        BudgetAllowanceGranted,
        GpuCordoned,
        GpuUncordoned,
        RequestOpened,
        RequestApproved,
        RequestRejected,
        RequestExpired,
        ShardsSealedThrough,
    )
}
# Which permission each event needs (`ledger.roles`); allowance records are the ledger's own.
ACTION_OF: Mapping[AdminKind, Action] = {
    AdminKind.BUDGET_GRANTED: Action.BUDGET_GRANT,
    AdminKind.BUDGET_POLICY_SET: Action.BUDGET_GRANT,
    AdminKind.PRICE_SET: Action.PRICE_SET,
    AdminKind.TEAM_DEFINED: Action.TEAM_DEFINE,
    AdminKind.QUOTA_SET: Action.QUOTA_SET,
    AdminKind.ADJUSTMENT_RECORDED: Action.LEDGER_ADJUST,
    AdminKind.PERIOD_CLOSED: Action.PERIOD_CLOSE,
    AdminKind.GPU_CORDONED: Action.GPU_CORDON,
    AdminKind.GPU_UNCORDONED: Action.GPU_CORDON,
    AdminKind.REQUEST_OPENED: Action.REQUEST_OPEN,
    AdminKind.REQUEST_APPROVED: Action.REQUEST_DECIDE,
    AdminKind.REQUEST_REJECTED: Action.REQUEST_DECIDE,
    AdminKind.REQUEST_EXPIRED: Action.REQUEST_DECIDE,
}
LEDGER_BUDGETS_SOURCE = "tally://ledger/budgets"  # the source of allowance records
LEDGER_ACTOR = "tally-ledger"
CURRENT_ADMIN_SCHEMA = 1
V0_REASON = "(recorded by admin schema 0, which kept no reason)"

AdminEnvelope = Envelope[AdminEvent]  # `time_us` is the effective time, `subject` the entity
