"""Admin events: the vocabulary of the `admin` topic, its strict codec, and their ledger effects.

Budgets, prices, teams, quotas, adjustments and period closes are events like any other, so the
configuration's history is itself in the ledger. Every event carries who (`actor`), why
(`reason`) and from when (`effective_us`).

Invariants:
- every dataclass here is frozen and slotted and holds tuples, never lists;
- an envelope's `id` is derived from its content (type, entity, data and effective time) with
  `ledger.events.event_id`, so a resend is the same event; its `subject` is the entity it is
  keyed by on the topic (team, model, account or transaction, period);
- decoding is strict (unknown or missing fields, a float, bool or string where an integer
  belongs, an unknown unit, an invalid name or period are errors) and never raises: bad input
  becomes a `DeadLetter`; it goes through the generic codec (`ledger.envelope`), `ADMIN` being
  this family;
- effects are pure: `grant_transaction`, `adjustment_transaction` and `reversal_transaction`
  return balanced transactions; nothing is ever updated or deleted, a correction is a new
  transaction;
- `plan_admin` is the diff behind `tally admin apply`: desired state minus the applied state,
  so applying the same file twice emits nothing the second time.

Schemas of admin event data (every `tally.admin.*` type):
- v1 (current): the fields of the event's dataclass, as `admin_event_to_dict` writes them;
- v0: the first `tally admin` named who acted `by` (not `actor`) and recorded no `reason`;
  `admin_v0_to_v1` upcasts it (`actor` ← `by`, `reason` ← `V0_REASON`). An upcast event's id
  is the one its v1 form derives.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

import orjson

from ledger.accounts import (
    AccountKind,
    account_kind,
    budget_account,
    funding_account,
)
from ledger.envelope import (
    REGISTRY,
    DeadLetter,
    Envelope,
    Family,
    decode,
    decode_envelope,
    event_id,
    family_to_dict,
)
from ledger.errors import EventError
from ledger.events import MAX_TIME_US
from ledger.periods import Period
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import Price, PriceBook
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
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_UNITS = frozenset(u.value for u in Unit)


class AdminKind(StrEnum):
    """The `type` attribute of every event on the `admin` topic."""

    BUDGET_GRANTED = "tally.admin.budget_granted"
    PRICE_SET = "tally.admin.price_set"
    TEAM_DEFINED = "tally.admin.team_defined"
    QUOTA_SET = "tally.admin.quota_set"
    ADJUSTMENT_RECORDED = "tally.admin.adjustment_recorded"
    PERIOD_CLOSED = "tally.admin.period_closed"


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

    @property
    def entity(self) -> str:
        return self.team


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

    @property
    def entity(self) -> str:
        return self.period


AdminEvent = BudgetGranted | PriceSet | TeamDefined | QuotaSet | AdjustmentRecorded | PeriodClosed
EVENT_CLASSES: Mapping[AdminKind, type[AdminEvent]] = {
    cls.KIND: cls
    for cls in (BudgetGranted, PriceSet, TeamDefined, QuotaSet, AdjustmentRecorded, PeriodClosed)
}
CURRENT_ADMIN_SCHEMA = 1
V0_REASON = "(recorded by admin schema 0, which kept no reason)"

AdminEnvelope = Envelope[AdminEvent]  # `time_us` is the effective time, `subject` the entity


# ---------------------------------------------------------------------------- encoding


def admin_event_to_dict(event: AdminEvent) -> dict[str, Any]:
    """The JSON object of an event's data (enums as their values, tuples as arrays)."""
    out: dict[str, Any] = {}
    for name, _, _ in _FIELDS[event.KIND]:
        value = getattr(event, name)
        out[name] = value.value if isinstance(value, StrEnum) else value
    return out


def _digest(data: Mapping[str, Any]) -> str:
    canonical = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


def admin_envelope(event: AdminEvent, source: str = ADMIN_SOURCE) -> AdminEnvelope:
    """Wrap an event in its envelope with its content-derived id."""
    data = admin_event_to_dict(event)
    subject = event.entity
    return Envelope(
        id=event_id(source, f"{event.KIND}/{subject}/{_digest(data)}", event.effective_us),
        type=event.KIND,
        source=source,
        subject=subject,
        time_us=event.effective_us,
        schema=CURRENT_ADMIN_SCHEMA,
        data=event,
    )


def admin_envelope_to_dict(envelope: AdminEnvelope) -> dict[str, Any]:
    return family_to_dict(ADMIN, envelope)


def encode_admin(envelope: AdminEnvelope) -> tuple[bytes, bytes]:
    """(key, value) of the admin-topic message: keyed by the event's entity."""
    return envelope.subject.encode(), orjson.dumps(family_to_dict(ADMIN, envelope))


# ---------------------------------------------------------------------------- decoding

Decoder = Callable[[str, Any], Any]


def _text(max_len: int) -> Decoder:
    def decode(name: str, value: Any) -> str:
        if type(value) is not str or not value.strip():
            raise EventError(f"{name}: expected a non-empty string")
        if len(value) > max_len:
            raise EventError(f"{name}: longer than {max_len} characters")
        return value

    return decode


def _name(name: str, value: Any) -> str:
    if type(value) is not str or not _NAME.match(value):
        raise EventError(
            f"{name}: expected a name of letters, digits, '.', '_' and '-' (at most 64)"
        )
    return value


def _integer(lo: int, hi: int) -> Decoder:
    def decode(name: str, value: Any) -> int:
        if type(value) is not int:
            raise EventError(f"{name}: expected an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise EventError(f"{name}: {value} is out of range [{lo}, {hi}]")
        return value

    return decode


def _period(name: str, value: Any) -> str:
    if type(value) is not str:
        raise EventError(f"{name}: expected a month such as 2026-11")
    try:
        return Period.month(value).label
    except ValueError as exc:
        raise EventError(f"{name}: {exc}") from exc


def _unit(name: str, value: Any) -> Unit:
    if type(value) is str and value in _UNITS:
        return Unit(value)
    raise EventError(f"{name}: unknown unit {value!r}; one of {', '.join(sorted(_UNITS))}")


def _account(name: str, value: Any) -> str:
    text = str(_text(256)(name, value))
    try:
        kind = account_kind(text)
    except ValueError:
        raise EventError(f"{name}: {text!r} is not an account of a known kind") from None
    if kind not in ADJUSTABLE:
        raise EventError(
            f"{name}: {kind} accounts are not adjusted by hand "
            "(budgets change by grants, holds by hold events)"
        )
    return text


def _names(name: str, value: Any) -> tuple[str, ...]:
    if type(value) is not list:
        raise EventError(f"{name}: expected an array")
    if len(value) > 10_000:
        raise EventError(f"{name}: more than 10000 items")
    return tuple(_name(name, v) for v in value)


def _optional(inner: Decoder) -> Decoder:
    def decode(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)

    return decode


_TIME = _integer(0, MAX_TIME_US)
_COUNT = _integer(0, 1_000_000)
_SIGNED = _integer(-MAX_AMOUNT, MAX_AMOUNT)
_META: tuple[tuple[str, Decoder, bool], ...] = (
    ("actor", _text(256), True),
    ("reason", _text(MAX_REASON), True),
    ("effective_us", _TIME, True),
)
# Per type: (field, decoder, required) in constructor order.
_FIELDS: Mapping[AdminKind, tuple[tuple[str, Decoder, bool], ...]] = {
    AdminKind.BUDGET_GRANTED: (
        ("team", _name, True),
        ("period", _period, True),
        ("unit", _unit, True),
        ("amount", _SIGNED, True),
        *_META,
        ("expected_total", _optional(_SIGNED), False),
    ),
    AdminKind.PRICE_SET: (
        ("model", _text(64), True),
        ("pool", _optional(_name), False),
        ("micros_per_gpu_hour", _integer(0, MAX_AMOUNT), True),
        *_META,
    ),
    AdminKind.TEAM_DEFINED: (
        ("team", _name, True),
        ("cost_centre", _name, True),
        ("projects", _names, True),
        ("users", _names, True),
        *_META,
    ),
    AdminKind.QUOTA_SET: (
        ("team", _name, True),
        ("pool", _name, True),
        ("model", _text(64), True),
        ("nominal_gpus", _COUNT, True),
        ("borrowing_limit", _optional(_COUNT), False),
        ("lending_limit", _optional(_COUNT), False),
        *_META,
    ),
    AdminKind.ADJUSTMENT_RECORDED: (
        ("account", _optional(_account), False),
        ("unit", _optional(_unit), False),
        ("amount", _SIGNED, True),
        ("period", _optional(_period), False),
        *_META,
        ("reverses_txn", _optional(_text(256)), False),
        ("counter_account", _optional(_account), False),
        ("team", _optional(_name), False),
        ("project", _optional(_name), False),
        ("user", _optional(_name), False),
        ("job_id", _optional(_text(256)), False),
    ),
    AdminKind.PERIOD_CLOSED: (("period", _period, True), *_META),
}


def validate_admin(event: AdminEvent) -> tuple[str, ...]:
    """Rules an event breaks beyond its field types, as readable messages."""
    problems: list[str] = []
    if isinstance(event, BudgetGranted):
        if event.unit not in BUDGET_UNITS:
            problems.append(f"unit: budgets are in {' or '.join(BUDGET_UNITS)}, not {event.unit}")
        if event.amount == 0:
            problems.append("amount: a grant of zero changes nothing")
    elif isinstance(event, AdjustmentRecorded):
        if event.reverses_txn is not None:
            extra = [
                name
                for name in ("account", "unit", "period", "counter_account", "team", "project")
                if getattr(event, name) is not None
            ]
            if extra or event.amount != 0:
                problems.append(
                    "a reversal names only the transaction it reverses, not "
                    + ", ".join(extra or ["an amount"])
                )
        else:
            for name in ("account", "unit", "period"):
                if getattr(event, name) is None:
                    problems.append(f"{name}: an adjustment needs one")
            if event.amount == 0:
                problems.append("amount: an adjustment of zero changes nothing")
            if event.account is not None and event.account == event.counter_account:
                problems.append("counter_account: must differ from the account")
    return tuple(problems)


def admin_event_from_dict(kind: AdminKind, data: Any) -> AdminEvent:
    """Decode and validate the data object of an event of `kind`; raises EventError."""
    if type(data) is not dict:
        raise EventError("data: expected an object")
    spec = _FIELDS[kind]
    unknown = data.keys() - {name for name, _, _ in spec}
    if unknown:
        raise EventError(f"data: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, read, required in spec:
        if name in data:
            kwargs[name] = read(f"data.{name}", data[name])
        elif required:
            raise EventError(f"data.{name}: missing")
        else:
            kwargs[name] = None
    event = EVENT_CLASSES[kind](**kwargs)
    problems = validate_admin(event)
    if problems:
        raise EventError("; ".join(problems))
    return event


def admin_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 admin data → v1: `by` becomes `actor`, and the missing `reason` is `V0_REASON`."""
    out = {k: v for k, v in data.items() if k != "by"}
    if "by" in data:
        out["actor"] = data["by"]
    out.setdefault("reason", V0_REASON)
    return out


ADMIN: Family[AdminEvent] = Family(
    name="admin",
    kinds={kind.value: kind for kind in AdminKind},
    to_data=admin_event_to_dict,
    from_data=admin_event_from_dict,
    wrap=admin_envelope,
    schema=CURRENT_ADMIN_SCHEMA,
    label="admin event type",
    subject_is="entity",
    time_is="effective_us",
)
REGISTRY.add(ADMIN, {(kind, 0): admin_v0_to_v1 for kind in AdminKind})


def admin_envelope_from_dict(obj: Any) -> AdminEnvelope:
    """Decode one envelope and check that its id, subject and time match its content."""
    return decode_envelope(obj, ADMIN)


def decode_admin_message(value: bytes | None) -> tuple[list[AdminEnvelope], list[DeadLetter]]:
    """Decode one admin-topic message (an envelope or an array of them). Never raises."""
    return decode(value, ADMIN)


# ---------------------------------------------------------------------------- effects


def _within(time_us: int, period: Period) -> int:
    """`time_us` if it lies in `period`, else the nearer edge of the period."""
    return min(max(time_us, period.start_us), period.end_us - 1)


def grant_transaction(envelope: AdminEnvelope, cost_centre: str | None) -> Transaction:
    """A budget grant: `budget:<team>` credited, `funding:<cost centre>` debited.

    The interval is the effective time, moved into the granted period when it lies outside,
    so a grant is never mistaken for a prior-period adjustment.
    """
    event = envelope.data
    assert isinstance(event, BudgetGranted)
    start = _within(event.effective_us, Period.month(event.period))
    team = event.team
    return Transaction(
        txn_id=envelope.id,
        kind=TransactionKind.BUDGET_GRANT,
        start_us=start,
        end_us=start + 1,
        gpu_uuid="",
        model="",
        pool="",
        node="",
        postings=(
            Posting(budget_account(team), event.unit, -event.amount, team, cost_centre=cost_centre),
            Posting(
                funding_account(cost_centre or DEFAULT_FUNDING),
                event.unit,
                event.amount,
                team,
                cost_centre=cost_centre,
            ),
        ),
        cause=(envelope.id,),
        period=event.period,
    )


def _dims_of(account: str) -> tuple[str | None, str | None]:
    """(team, project) named by a consumer account, else (None, None)."""
    kind, _, path = account.partition(":")
    if kind != AccountKind.CONSUMER:
        return None, None
    team, _, project = path.partition("/")
    return team or None, (project or None) if project != "-" else None


def adjustment_transaction(
    envelope: AdminEnvelope, booked_period: str, cost_centres: Mapping[str, str]
) -> Transaction:
    """`amount` on the account against its counter-account, booked into `booked_period`.

    The interval lies in the period the adjustment is for, so one booked into a later period
    (the intended one is closed) is recognisable as a prior-period adjustment.
    """
    event = envelope.data
    assert isinstance(event, AdjustmentRecorded)
    assert event.account is not None and event.unit is not None and event.period is not None
    start = _within(event.effective_us, Period.month(event.period))
    counter = event.counter_account or DEFAULT_ADJUSTMENTS
    team, project = _dims_of(event.account)
    team, project = event.team or team, event.project or project

    def posting(account: str, amount: int, team: str | None, project: str | None) -> Posting:
        assert event.unit is not None
        centre = cost_centres.get(team) if team else None
        return Posting(account, event.unit, amount, team, project, event.user, event.job_id, centre)

    counter_team, counter_project = _dims_of(counter)
    if counter_team is None:
        counter_team, counter_project = team, project
    return Transaction(
        txn_id=envelope.id,
        kind=TransactionKind.ADJUSTMENT,
        start_us=start,
        end_us=start + 1,
        gpu_uuid="",
        model="",
        pool="",
        node="",
        postings=(
            posting(event.account, event.amount, team, project),
            posting(counter, -event.amount, counter_team, counter_project),
        ),
        cause=(envelope.id,),
        period=booked_period,
    )


def reversal_transaction(
    envelope: AdminEnvelope, original: Transaction, booked_period: str
) -> Transaction:
    """The exact negation of `original` (same accounts, dimensions, GPU and interval), caused
    by the admin event and by the transaction it reverses."""
    return replace(
        original,
        txn_id=envelope.id,
        kind=TransactionKind.REVERSAL,
        postings=tuple(replace(p, amount=-p.amount) for p in original.postings),
        cause=(envelope.id, original.txn_id),
        period=booked_period,
    )


# ---------------------------------------------------------------------------- the applied log


@dataclass(frozen=True, slots=True)
class AppliedAdmin:
    """An admin event the ledger applied, and what it did (`applied`, or why it changed
    nothing, e.g. `unchanged: already closed`)."""

    envelope: AdminEnvelope
    outcome: str = "applied"


def applied_to_dict(entry: AppliedAdmin) -> dict[str, Any]:
    return {**admin_envelope_to_dict(entry.envelope), "outcome": entry.outcome}


def applied_from_dict(obj: Any) -> AppliedAdmin:
    if type(obj) is not dict:
        raise EventError("admin log entry: expected an object")
    outcome = obj.get("outcome")
    envelope = admin_envelope_from_dict({k: v for k, v in obj.items() if k != "outcome"})
    return AppliedAdmin(envelope, outcome if type(outcome) is str else "applied")


BudgetKey = tuple[str, str, Unit]  # (team, period, unit)
QuotaKey = tuple[str, str, str]  # (team, pool, model)


@dataclass(frozen=True, slots=True)
class AdminView:
    """The admin state the applied events add up to."""

    prices: tuple[PriceSet, ...] = ()
    teams: Mapping[str, TeamDefined] = field(default_factory=dict)
    quotas: Mapping[QuotaKey, QuotaSet] = field(default_factory=dict)
    budgets: Mapping[BudgetKey, int] = field(default_factory=dict)
    closed: frozenset[str] = frozenset()

    @classmethod
    def from_log(cls, entries: Iterable[AppliedAdmin]) -> AdminView:
        prices: list[PriceSet] = []
        teams: dict[str, TeamDefined] = {}
        quotas: dict[QuotaKey, QuotaSet] = {}
        budgets: dict[BudgetKey, int] = {}
        closed: set[str] = set()
        for entry in entries:
            if entry.outcome != "applied":
                continue
            event = entry.envelope.data
            if isinstance(event, PriceSet):
                prices.append(event)
            elif isinstance(event, TeamDefined):
                teams[event.team] = event
            elif isinstance(event, QuotaSet):
                quotas[(event.team, event.pool, event.model)] = event
            elif isinstance(event, BudgetGranted):
                key = (event.team, event.period, event.unit)
                budgets[key] = budgets.get(key, 0) + event.amount
            elif isinstance(event, PeriodClosed):
                closed.add(event.period)
        return cls(tuple(prices), teams, quotas, budgets, frozenset(closed))

    def price_book(self, default: PriceBook) -> PriceBook:
        """`default` plus every applied price; an applied price wins a tie with the default,
        a later one a tie with an earlier one."""
        applied = tuple(
            Price(p.model, p.micros_per_gpu_hour, p.effective_us, p.pool)
            for p in reversed(self.prices)
        )
        return PriceBook(applied + default.prices)

    def latest_price(
        self, model: str, pool: str | None, ignore: Collection[tuple[int, int]] = ()
    ) -> PriceSet | None:
        """The applied price of (model, pool) with the latest effective time, passing over the
        (price, effective time) pairs in `ignore`."""
        found: PriceSet | None = None
        for price in self.prices:
            if (price.model, price.pool) != (model, pool):
                continue
            if (price.micros_per_gpu_hour, price.effective_us) in ignore:
                continue
            if found is None or price.effective_us >= found.effective_us:
                found = price
        return found


# ---------------------------------------------------------------------------- planning


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
class DesiredState:
    teams: tuple[TeamSpec, ...] = ()
    prices: tuple[PriceSpec, ...] = ()
    quotas: tuple[QuotaSpec, ...] = ()
    budgets: tuple[BudgetSpec, ...] = ()


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
    twice."""
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
    return f"close {event.period}"


def _limit(value: int | None) -> str:
    return "∞" if value is None else str(value)
