"""The applied admin log and what it adds up to: `AppliedAdmin` (an event and its outcome), its
dict form for the log file, and `AdminView` (prices, teams, quotas, one-off budgets, recurring
budget policies and the allowances they granted, closed periods, standing GPU cordons, the
request projection: every quota and budget request with its status, `ledger.admin.requests`,
and a global shard's newest `ShardsSealedThrough`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.admin.codec import admin_envelope_from_dict, admin_envelope_to_dict
from ledger.admin.events import (
    AdminEnvelope,
    BudgetAllowanceGranted,
    BudgetGranted,
    BudgetPolicySet,
    GpuCordoned,
    GpuUncordoned,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    TeamDefined,
)
from ledger.admin.recurring import AppliedPolicy, PolicyKey
from ledger.admin.request_events import REQUEST_CLASSES
from ledger.admin.requests import REFUSED_OUTCOME, RequestState, fold_request, refused_step
from ledger.admin.sealed_events import ShardsSealedThrough
from ledger.errors import EventError
from ledger.pricing import Price, PriceBook
from ledger.units import Unit

# The outcome a global shard logs a reversal with whose target it does not hold: the samples
# shard holding it posts the reversal (`ledger.ingest.admin`; `verify` reports one no shard
# posted, `ledger.store.union_verify`).
ELSEWHERE_OUTCOME = "posted by the shard holding its target"


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
    policies: Mapping[PolicyKey, tuple[AppliedPolicy, ...]] = field(default_factory=dict)
    allowances: Mapping[tuple[str, Unit, str], BudgetAllowanceGranted] = field(default_factory=dict)
    latest_allowance: Mapping[PolicyKey, BudgetAllowanceGranted] = field(default_factory=dict)
    cordons: Mapping[str, GpuCordoned] = field(default_factory=dict)  # standing, by target
    requests: Mapping[str, RequestState] = field(default_factory=dict)  # by request id
    # the applied `ShardsSealedThrough` with the newest watermark (a global shard's only)
    sealed: ShardsSealedThrough | None = None

    @classmethod
    def from_log(cls, entries: Iterable[AppliedAdmin]) -> AdminView:
        prices: list[PriceSet] = []
        teams: dict[str, TeamDefined] = {}
        quotas: dict[QuotaKey, QuotaSet] = {}
        budgets: dict[BudgetKey, int] = {}
        closed: set[str] = set()
        policies: dict[PolicyKey, list[AppliedPolicy]] = {}
        allowances: dict[tuple[str, Unit, str], BudgetAllowanceGranted] = {}
        latest: dict[PolicyKey, BudgetAllowanceGranted] = {}
        cordons: dict[str, GpuCordoned] = {}
        requests: dict[str, RequestState] = {}
        sealed: ShardsSealedThrough | None = None
        for entry in entries:
            if entry.outcome != "applied":
                step = entry.envelope.data
                if entry.outcome.startswith(REFUSED_OUTCOME) and isinstance(step, REQUEST_CLASSES):
                    refused_step(requests, step, entry.outcome.removeprefix(REFUSED_OUTCOME))
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
            elif isinstance(event, BudgetPolicySet):
                applied = AppliedPolicy(entry.envelope.id, event)
                policies.setdefault((event.team, event.unit), []).append(applied)
            elif isinstance(event, BudgetAllowanceGranted):
                allowances[(event.team, event.unit, event.period)] = event
                now = latest.get((event.team, event.unit))
                if now is None or event.period > now.period:
                    latest[(event.team, event.unit)] = event
            elif isinstance(event, GpuCordoned):
                cordons[event.target] = event
            elif isinstance(event, GpuUncordoned):
                cordons.pop(event.target, None)
            elif isinstance(event, REQUEST_CLASSES):
                fold_request(requests, event)  # applied: the fold let it through
            elif isinstance(event, ShardsSealedThrough):
                sealed = event  # applied only when newer than every one before it
        return cls(
            tuple(prices),
            teams,
            quotas,
            budgets,
            frozenset(closed),
            {key: tuple(chain) for key, chain in policies.items()},
            allowances,
            latest,
            cordons,
            requests,
            sealed,
        )

    def policy(self, team: str, unit: Unit) -> BudgetPolicySet | None:
        """The policy for (team, unit) applied last, whatever its start."""
        chain = self.policies.get((team, unit))
        return chain[-1].policy if chain else None

    def price_book(self, default: PriceBook) -> PriceBook:
        """`default` plus every applied price; an applied price wins a tie with the default,
        a later one a tie with an earlier one. Energy prices come from `default` only."""
        applied = tuple(
            Price(p.model, p.micros_per_gpu_hour, p.effective_us, p.pool)
            for p in reversed(self.prices)
        )
        return PriceBook(applied + default.prices, default.energy)

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
