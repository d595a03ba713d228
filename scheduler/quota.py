"""Quotas, cohorts and borrowing: who may hold how many GPUs of a flavor.

Quotas are whole GPUs (config, `Quota`); usage and requests are counted in per-mille of a GPU
(`UNITS` = `ledger.fractional.SHARE_UNITS` per GPU, `units_of`): a whole-GPU job (or a MIG
instance, in its MIG flavor) is 1000 per GPU, a GPU share its per-mille, so a team running four
quarter-GPU shares uses one GPU of its quota. Every quantity below is in those units, the
quotas scaled by `UNITS`. `gpus_of` rounds units up to whole GPUs where a count of GPUs is
reported (`JobAdmitted.borrowed_gpus`).

Per flavor, with U a team's usage, N its nominal quota, B its borrowing limit and L its
lending limit (None: no limit / all of it):

- over(t)  = max(0, U − N)                what the team borrows;
- spare(t) = min(L, max(0, N − U))        what the team can lend now;
- a team holds at most N + B;
- lending invariant, per (cohort, flavor): Σ over ≤ Σ spare — everything borrowed comes out of
  members' unused quota, and no member lends more than its lending limit.

A team without a cohort never borrows. A team with no quota for a flavor cannot use it.
Admitting a job within the team's nominal quota may break the lending invariant (its quota was
lent); that is the case preemption reclaims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ledger.fractional import SHARE_UNITS
from ledger.job_events import JobSpec
from scheduler.errors import ConfigError
from scheduler.model import Flavor, Quota, Team

UsageOf = Callable[[str], int]  # team → what it holds in the flavor being checked, in units
UNITS = SHARE_UNITS  # quota units per GPU: usage is counted in per-mille of a GPU


def units_of(spec: JobSpec) -> int:
    """What a job counts against its team's quota, in units: its share, else its GPUs."""
    return spec.gpu_share if spec.gpu_share is not None else spec.gpus * UNITS


def gpus_of(units: int) -> int:
    """Units as whole GPUs, rounded up."""
    return -(-units // UNITS)


@dataclass(frozen=True, slots=True)
class QuotaBook:
    """The teams' quotas, indexed for the checks a cycle makes. Built once from config."""

    teams: Mapping[str, Team]
    quota: Mapping[tuple[str, Flavor], Quota]
    members: Mapping[tuple[str, Flavor], tuple[str, ...]]  # (cohort, flavor) → teams
    _ceilings: dict[tuple[str, Flavor, bool], int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of(cls, teams: Iterable[Team]) -> QuotaBook:
        by_name: dict[str, Team] = {}
        quota: dict[tuple[str, Flavor], Quota] = {}
        members: dict[tuple[str, Flavor], list[str]] = {}
        for team in teams:
            if team.name in by_name:
                raise ConfigError(f"team {team.name} is configured twice")
            by_name[team.name] = team
            for q in team.quotas:
                quota[(team.name, q.flavor)] = q
                if team.cohort is not None:
                    members.setdefault((team.cohort, q.flavor), []).append(team.name)
        return cls(by_name, quota, {k: tuple(v) for k, v in members.items()})

    def ceiling(self, team: str, flavor: Flavor, may_borrow: bool) -> int:
        """The most of `flavor` the team could ever hold, in units: its nominal, plus what it
        may borrow (its borrowing limit, at most what the rest of its cohort may lend)."""
        key = (team, flavor, may_borrow)
        found = self._ceilings.get(key)
        if found is not None:
            return found
        q = self.quota.get((team, flavor))
        cohort = self.cohort_of(team)
        if q is None:
            found = 0
        elif not may_borrow or cohort is None:
            found = q.nominal
        else:
            lendable = sum(
                self.quota[(m, flavor)].lendable
                for m in self.members.get((cohort, flavor), ())
                if m != team
            )
            limit = lendable if q.borrowing_limit is None else min(q.borrowing_limit, lendable)
            found = q.nominal + limit
        found *= UNITS
        self._ceilings[key] = found
        return found

    def flavors_of(self, team: str) -> tuple[Flavor, ...]:
        found = self.teams.get(team)
        return () if found is None else tuple(q.flavor for q in found.quotas)

    def cohort_of(self, team: str) -> str | None:
        found = self.teams.get(team)
        return None if found is None else found.cohort

    def weight_of(self, team: str) -> int:
        found = self.teams.get(team)
        return 1 if found is None else found.fair_share_weight


def over(q: Quota, used: int) -> int:
    """What a team using `used` units borrows, in units."""
    return max(0, used - q.nominal * UNITS)


def spare(q: Quota, used: int) -> int:
    """What a team using `used` units can lend now, in units."""
    return min(q.lendable * UNITS, max(0, q.nominal * UNITS - used))


class QuotaOutcome(StrEnum):
    FITS = "fits"  # within nominal, or borrowing within every limit
    NO_QUOTA = "no_quota"  # the team has no quota for this flavor
    NOT_ALLOWED = "not_allowed"  # needs borrowing, which this job, team or policy cannot do
    BORROWING_LIMIT = "borrowing_limit"  # would exceed nominal + borrowing limit
    COHORT_EXHAUSTED = "cohort_exhausted"  # the cohort has not enough unused lendable quota
    RECLAIM = "reclaim"  # within nominal, but part of that quota is lent: reclaim first


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    outcome: QuotaOutcome
    borrowed: int = 0  # units of this job above the team's nominal
    deficit: int = 0  # for RECLAIM and COHORT_EXHAUSTED: Σ over − Σ spare after admission (units)

    @property
    def fits(self) -> bool:
        return self.outcome is QuotaOutcome.FITS


def cohort_totals(book: QuotaBook, cohort: str, flavor: Flavor, used: UsageOf) -> tuple[int, int]:
    """(Σ over, Σ spare) of the cohort's members in `flavor`, in units; invariant: Σ over ≤
    Σ spare."""
    borrowed = lendable = 0
    for member in book.members.get((cohort, flavor), ()):
        q = book.quota[(member, flavor)]
        u = used(member)
        borrowed += over(q, u)
        lendable += spare(q, u)
    return borrowed, lendable


def check_quota(
    book: QuotaBook,
    team: str,
    flavor: Flavor,
    units: int,
    used: UsageOf,
    may_borrow: bool,
    totals: tuple[int, int] | None = None,
) -> QuotaCheck:
    """May `team` take `units` more of `flavor` (`units_of` a job), given what every team holds
    (`used`, in units)?

    `totals` is the cohort's `cohort_totals` in `flavor`, for callers that keep it.
    """
    q = book.quota.get((team, flavor))
    if q is None:
        return QuotaCheck(QuotaOutcome.NO_QUOTA)
    u = used(team)
    after = u + units
    cohort = book.cohort_of(team)
    borrowed = over(q, after) - over(q, u)
    if borrowed > 0:
        if not may_borrow or cohort is None:
            return QuotaCheck(QuotaOutcome.NOT_ALLOWED, borrowed)
        limit = q.borrowing_limit
        if limit is not None and after - q.nominal * UNITS > limit * UNITS:
            return QuotaCheck(QuotaOutcome.BORROWING_LIMIT, borrowed)
    if cohort is None:
        return QuotaCheck(QuotaOutcome.FITS)
    borrowed_now, lendable_now = totals or cohort_totals(book, cohort, flavor, used)
    before = borrowed_now - lendable_now
    delta = (over(q, after) - over(q, u)) - (spare(q, after) - spare(q, u))
    deficit = before + delta
    if deficit <= 0:
        return QuotaCheck(QuotaOutcome.FITS, borrowed)
    if borrowed > 0:
        return QuotaCheck(QuotaOutcome.COHORT_EXHAUSTED, borrowed, deficit)
    return QuotaCheck(QuotaOutcome.RECLAIM, 0, deficit)
