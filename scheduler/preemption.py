"""Phase 6 of a cycle, preempt: stop running jobs so that a blocked job fits.

Who may be preempted, for a job J of team T in flavor F (only jobs running in F, and never a
job admitted from a non-preemptible queue):
- an over-budget borrower (it runs without a hold): by any job of its team or cohort that runs
  within budget;
- a job of a team in T's cohort that currently borrows in F (holds more than its nominal):
  by J if J stays within T's nominal quota (reclaim of lent quota, any priority), or if J has
  a higher priority. A team stops being a candidate the moment it no longer borrows, so a
  reclaim never takes quota a lender holds within its own nominal;
- a job of T itself with a lower priority than J;
- with quotas not enforced, any job with a lower priority than J.

GPU shares (`JobSpec.gpu_share`): a share job preempts and is preempted by the same rules;
stopping a share frees only that share, so a GPU is freed for a whole-GPU job only when every
share on it stops, and a share job fits once a GPU has room for its share
(`scheduler.fractional.freed_by`, `share_fits`).

Which of them: the FEWEST victims, then the lowest priority, then the most recently started
(then the most recently submitted).
`need` is a lower bound on the GPUs to free (the free-GPU shortfall, the quota deficit, the
excess over nominal + borrowing limit). The plan first tries the minimum number of victims that
could cover `need`, picking in preference order with a look-ahead that keeps the set
completable; if that set does not make J fit (nodes, quota dynamics, the topology J requires:
`scheduler.topology`), it falls back to adding
candidates in preference order until J fits and then drops every victim J fits without.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ledger.job_events import PreemptReason
from scheduler.admission import Workspace
from scheduler.fractional import freed_by, share_fits
from scheduler.model import Flavor, Policy, RunningJob
from scheduler.ordering import Nomination
from scheduler.quota import UNITS, QuotaCheck, QuotaOutcome, check_quota, gpus_of, units_of
from scheduler.running_index import Ranked, VictimKey
from scheduler.topology import REQUIRED, place_gang


@dataclass(frozen=True, slots=True)
class Victim:
    job: RunningJob
    reason: PreemptReason


class _Candidate(NamedTuple):
    """A job preemption may stop, by its preference key (a tuple: cheap to make and to sort,
    which matters when every running job of a cohort is a candidate)."""

    key: VictimKey
    job: RunningJob
    reason: PreemptReason
    borrower: bool  # eligible only while its team still borrows


class _Candidates:
    """Every candidate in preference order, as the index's (key, job) pairs: a `_Candidate` is
    made only for the pairs a plan looks at (a cohort's reclaim may offer thousands)."""

    __slots__ = ("labels", "ranked")

    def __init__(self, ranked: list[Ranked], labels: dict[str, tuple[PreemptReason, bool]]):
        self.ranked = ranked
        self.labels = labels  # per team: the reason and borrower flag of its jobs within budget

    def make(self, pair: Ranked) -> _Candidate:
        key, job = pair
        if job.over_budget:
            return _Candidate(key, job, PreemptReason.OVER_BUDGET, False)
        reason, borrower = self.labels[job.team]
        return _Candidate(key, job, reason, borrower)

    def __iter__(self) -> Iterator[_Candidate]:
        return map(self.make, self.ranked)


def _candidates(n: Nomination, flavor: Flavor, ws: Workspace, policy: Policy) -> _Candidates:
    book = ws.snap.quotas
    team = n.spec.team
    cohort = book.cohort_of(team)
    within_nominal = True
    teams: tuple[str, ...] = (team,)
    if not policy.enforce_quota:
        teams = tuple({t for t, f in ws.snap.running if f == flavor})
    else:
        nominal = book.quota[(team, flavor)].nominal * UNITS
        within_nominal = ws.used(team, flavor) + units_of(n.spec) <= nominal
        if cohort is not None:
            teams = book.members.get((cohort, flavor), teams)
    removed = ws.removed
    found: list[Ranked] = []
    labels: dict[str, tuple[PreemptReason, bool]] = {}
    for other in teams:
        own = not policy.enforce_quota or other == team
        borrowing = False
        if not own:
            q = book.quota[(other, flavor)]
            borrowing = ws.used(other, flavor) > q.nominal * UNITS
        ranked = ws.victims_of(other, flavor)
        # A team's jobs come in preference order, over-budget ones first, then by priority, so
        # its candidates are a prefix: all of them (a borrower whose quota J reclaims), or the
        # over-budget ones and then those of lower priority than J (its own team's, a
        # borrower's), or the over-budget ones only.
        if borrowing and within_nominal:
            labels[other] = (PreemptReason.RECLAIM_LENT_QUOTA, True)
            cut = len(ranked)
        else:
            labels[other] = (PreemptReason.HIGHER_PRIORITY, borrowing)
            lower = own or borrowing
            cut = 0
            for _, job in ranked:
                if not job.over_budget and not (lower and job.priority < n.priority):
                    break
                cut += 1
        if removed:  # preempted earlier in this cycle
            found.extend(p for p in ranked[:cut] if p[0][4] not in removed)
        else:
            found.extend(ranked[:cut])
    # preference (`victim_key`): over-budget first, then lowest priority, then most recently
    # started; the keys are unique (they end in the job id), so the order is total
    found.sort()
    return _Candidates(found, labels)


def _need(n: Nomination, flavor: Flavor, quota: QuotaCheck, ws: Workspace, policy: Policy) -> int:
    spec = n.spec
    if spec.span_nodes:
        phys = spec.gpus - ws.free_total(flavor)
    else:
        phys = spec.gpus - max((len(u) for u in ws.free_nodes(flavor).values()), default=0)
    quota_need = 0
    if policy.enforce_quota and not quota.fits:
        q = ws.snap.quotas.quota[(spec.team, flavor)]
        after = ws.used(spec.team, flavor) + units_of(spec)
        if quota.outcome is QuotaOutcome.NOT_ALLOWED:
            quota_need = gpus_of(after - q.nominal * UNITS)
        elif quota.outcome is QuotaOutcome.BORROWING_LIMIT:
            quota_need = gpus_of(after - (q.nominal + (q.borrowing_limit or 0)) * UNITS)
        else:
            quota_need = gpus_of(quota.deficit)
    return max(phys, quota_need, 0)


def _fits_after(
    n: Nomination, flavor: Flavor, victims: Sequence[_Candidate], ws: Workspace, policy: Policy
) -> bool:
    """Would `n` fit in `flavor` (capacity and quota) once `victims` are gone?"""
    spec = n.spec
    removed: Counter[str] = Counter()
    for v in victims:
        if v.borrower:  # a borrower is a victim only while its team still borrows
            q = ws.snap.quotas.quota[(v.job.team, flavor)]
            if ws.used(v.job.team, flavor) - removed[v.job.team] <= q.nominal * UNITS:
                return False
        removed[v.job.team] += units_of(v.job.spec)
    freed, loads = freed_by((v.job for v in victims), ws.share_loads(flavor))
    freed_on = Counter({node: len(uuids) for node, uuids in freed.items()})
    free = ws.free_nodes(flavor)
    total = ws.free_total(flavor) + sum(freed_on.values())
    if spec.gpu_share is not None:
        if not share_fits(spec.gpu_share, loads, total):
            return False
    elif spec.span_nodes:
        if total < spec.gpus:
            return False
    elif not any(
        len(free.get(node, ())) + freed_on[node] >= spec.gpus for node in set(free) | set(freed_on)
    ):
        return False
    if spec.topology in REQUIRED and not _meets_topology(n, flavor, victims, ws):
        return False
    if not policy.enforce_quota:
        return True
    check = check_quota(
        ws.snap.quotas,
        spec.team,
        flavor,
        units_of(spec),
        lambda t: ws.used(t, flavor) - removed[t],
        policy.borrowing and n.queue.may_borrow,
    )
    return check.fits


def _meets_topology(
    n: Nomination, flavor: Flavor, victims: Sequence[_Candidate], ws: Workspace
) -> bool:
    """Whether the GPUs free once `victims` are gone offer the topology `n` requires."""
    after = {node: list(uuids) for node, uuids in ws.free_nodes(flavor).items()}
    freed, _ = freed_by((v.job for v in victims), ws.share_loads(flavor))
    for node, uuids in freed.items():
        after.setdefault(node, []).extend(uuids)
    free = {node: tuple(sorted(uuids)) for node, uuids in after.items()}
    spec = n.spec
    where = ws.snap.fleet.where
    return place_gang(free, spec.gpus, spec.span_nodes, spec.topology, where) is not None


def _top_sum(sizes: Counter[int], count: int) -> int:
    total = 0
    for size in sorted(sizes, reverse=True):
        if count <= 0:
            break
        take = min(count, sizes[size])
        total += take * size
        count -= take
    return total


def _fewest(candidates: _Candidates, need: int) -> list[_Candidate] | None:
    """The minimum number of candidates whose GPUs cover `need`, chosen in preference order."""
    ranked = candidates.ranked
    sizes = sorted([len(job.gpus) for _, job in ranked], reverse=True)
    covered, k = 0, 0
    for size in sizes:
        if covered >= need:
            break
        covered += size
        k += 1
    if covered < need:
        return None
    remaining = Counter(sizes)
    picked: list[_Candidate] = []
    total = 0
    for pair in ranked:
        size = len(pair[1].gpus)
        remaining[size] -= 1
        if total + size + _top_sum(remaining, k - len(picked) - 1) >= need:
            picked.append(candidates.make(pair))
            total += size
            if len(picked) == k:
                break
    return picked


def worth_trying(n: Nomination, flavor: Flavor, ws: Workspace, policy: Policy) -> bool:
    """False when no job in `flavor` can be a candidate (a cheap test on snapshot summaries)."""
    snap = ws.snap
    if snap.lowest_preemptible is None or snap.over_budget_running is None:
        return True
    if snap.over_budget_running.get(flavor, 0):
        return True
    lowest = snap.lowest_preemptible.get(flavor)
    if lowest is None:
        return False
    if lowest < n.priority:
        return True
    if not policy.enforce_quota:
        return False
    team = n.spec.team
    cohort = snap.quotas.cohort_of(team)
    q = snap.quotas.quota.get((team, flavor))
    if cohort is None or q is None or ws.used(team, flavor) + units_of(n.spec) > q.nominal * UNITS:
        return False
    return ws.cohort_totals(cohort, flavor)[0] > 0  # someone borrows: reclaim may help


def plan_preemption(
    n: Nomination, flavor: Flavor, quota: QuotaCheck, ws: Workspace, policy: Policy
) -> tuple[Victim, ...] | None:
    """Victims that make `n` fit in `flavor`, or None when no preemption can."""
    if quota.outcome is QuotaOutcome.NO_QUOTA or not worth_trying(n, flavor, ws, policy):
        return None
    candidates = _candidates(n, flavor, ws, policy)
    if not candidates.ranked:
        return None
    need = _need(n, flavor, quota, ws, policy)
    fewest = _fewest(candidates, need)
    if fewest is not None and _fits_after(n, flavor, fewest, ws, policy):
        return tuple(Victim(c.job, c.reason) for c in fewest)
    picked: list[_Candidate] = []
    removed: Counter[str] = Counter()
    book = ws.snap.quotas
    for c in candidates:
        team = c.job.team
        if (
            c.borrower
            and ws.used(team, flavor) - removed[team] <= book.quota[(team, flavor)].nominal * UNITS
        ):
            continue  # its team no longer borrows
        picked.append(c)
        removed[team] += units_of(c.job.spec)
        if _fits_after(n, flavor, picked, ws, policy):
            break
    else:
        return None
    for c in reversed(picked[:-1]):  # drop every victim the job fits without
        trial = [p for p in picked if p is not c]
        if _fits_after(n, flavor, trial, ws, policy):
            picked = trial
    return tuple(Victim(c.job, c.reason) for c in picked)
