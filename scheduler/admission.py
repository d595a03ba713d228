"""Phases 3 and 5 of a cycle: nominate the heads, and admit them one by one.

Nominate (3): a head whose team or queue is unknown, or that no flavor could ever hold (model,
pool, size, single-node size, more than its largest NVLink domain or rail where it requires
one, more than the team's quota plus all it may borrow, or only models its queue forbids),
waits at once with that reason; every other
head becomes a `Nomination` with its effective priority (the job's, else its queue's) and its
candidate flavors — the team's quota flavors that match the accepted models (those its queue
permits) and pool (every matching flavor of the fleet when quotas are not enforced), cheapest
first when the policy is price-aware (`scheduler.model_choice`), else in quota order.

Admit (5): a nomination is admitted in the first candidate flavor where, in this order,
1. quota allows it (`scheduler.quota`): within nominal, or borrowing within the team's
   borrowing limit from unused lendable quota of its cohort — only for preemptible queues;
2. enough GPUs of the flavor are free (all of them: gangs are all-or-nothing; on one node
   when the job may not span nodes), placed by topology (`scheduler.topology`): a job whose
   required topology cannot be met now waits with `topology_unmet`;
3. the budget covers the hold (`scheduler.budget`); if not, the job waits with
   `budget_exhausted`, or, where its queue says `run_preemptible`, runs with no hold as a
   preemptible over-budget borrower.
The checks are per flavor, exactly as for a job of one model; a job with a choice of flavors
gets a placement note saying why the chosen one (`model_choice.placement_note`).
Admission takes the GPUs in the cycle's `Workspace`, so later jobs see them taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.fractional import share_parent
from ledger.job_events import JobSpec, WaitReason
from ledger.topology import TopologyNeed
from scheduler.budget import BudgetCheck, check_budget
from scheduler.fractional import accepts, place_share, share_allowed, share_loads, share_of
from scheduler.model import (
    NO_HOLD,
    Flavor,
    GpuRef,
    Holds,
    OverBudget,
    PendingJob,
    Policy,
    RunningJob,
)
from scheduler.model_choice import (
    cheapest_first,
    clip,
    forbidden_detail,
    placement_note,
    split_by_queue,
)
from scheduler.ordering import Nomination
from scheduler.placement import place
from scheduler.quota import (
    UNITS,
    QuotaCheck,
    QuotaOutcome,
    UsageOf,
    check_quota,
    cohort_totals,
    gpus_of,
    over,
    spare,
    units_of,
)
from scheduler.running_index import Ranked, victim_key
from scheduler.snapshot import ClusterSnapshot
from scheduler.topology import REQUIRED, largest_group, place_gang, unmet_detail


@dataclass(frozen=True, slots=True)
class Verdict:
    """A head that waits, and why."""

    job: PendingJob
    reason: WaitReason
    detail: str = ""


class Workspace:
    """One cycle's scratch: the snapshot plus the decisions made so far in this cycle.

    It is created by a cycle, changed only by it, and never escapes it: the snapshot it reads
    is never modified (free-GPU maps are copied the first time a flavor is touched).
    """

    __slots__ = (
        "_cohorts",
        "_free",
        "_holds",
        "_loads",
        "_totals",
        "_usage",
        "_victims",
        "removed",
        "snap",
    )

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap
        self._usage: dict[tuple[str, Flavor], int] = {}
        self._free: dict[Flavor, dict[str, tuple[str, ...]]] = {}
        self._totals: dict[Flavor, int] = {}
        self._holds: dict[str, Holds] = {}
        self._cohorts: dict[tuple[str, Flavor], list[int]] = {}  # [Σ over, Σ spare], kept current
        self._loads: dict[Flavor, dict[str, tuple[str, int]]] = {}  # GPUs running shares
        self._victims: dict[tuple[str, Flavor], list[Ranked]] = {}
        self.removed: set[str] = set()

    def used(self, team: str, flavor: Flavor) -> int:
        key = (team, flavor)
        found = self._usage.get(key)
        return self.snap.usage.get(key, 0) if found is None else found

    def cohort_totals(self, cohort: str, flavor: Flavor) -> tuple[int, int]:
        key = (cohort, flavor)
        found = self._cohorts.get(key)
        if found is None:
            found = self._cohorts[key] = list(
                cohort_totals(self.snap.quotas, cohort, flavor, self.usage_in(flavor))
            )
        return found[0], found[1]

    def _set_used(self, team: str, flavor: Flavor, units: int) -> None:
        before = self.used(team, flavor)
        self._usage[(team, flavor)] = units
        book = self.snap.quotas
        cohort = book.cohort_of(team)
        totals = None if cohort is None else self._cohorts.get((cohort, flavor))
        q = book.quota.get((team, flavor))
        if totals is not None and q is not None:
            totals[0] += over(q, units) - over(q, before)
            totals[1] += spare(q, units) - spare(q, before)

    def usage_in(self, flavor: Flavor) -> UsageOf:
        """`used` for one flavor, as the quota checks take it."""
        return lambda team: self.used(team, flavor)

    def free_nodes(self, flavor: Flavor) -> Mapping[str, tuple[str, ...]]:
        found = self._free.get(flavor)
        return self.snap.free_in(flavor).by_node if found is None else found

    def free_total(self, flavor: Flavor) -> int:
        found = self._totals.get(flavor)
        return self.snap.free_in(flavor).total if found is None else found

    def holds(self, team: str) -> Holds:
        found = self._holds.get(team)
        return self.snap.holds.get(team, NO_HOLD) if found is None else found

    def _writable_free(self, flavor: Flavor) -> dict[str, tuple[str, ...]]:
        found = self._free.get(flavor)
        if found is None:
            found = self._free[flavor] = dict(self.snap.free_in(flavor).by_node)
        return found

    def take(
        self,
        team: str,
        flavor: Flavor,
        gpus: tuple[GpuRef, ...],
        hold: Holds,
        share: int | None = None,
    ) -> None:
        """Count `gpus` as the team's (a share job's one GPU: its share of a GPU, which takes
        that GPU out of the free ones if it was free)."""
        whole = gpus if share is None else self._share_of(flavor, gpus, share)
        free = self._writable_free(flavor)
        for node in {g.node for g in whole}:
            taken = {g.uuid for g in whole if g.node == node}
            left = tuple(u for u in free[node] if u not in taken)
            if left:
                free[node] = left
            else:
                del free[node]
        self._totals[flavor] = self.free_total(flavor) - len(whole)
        units = share if share is not None else len(gpus) * UNITS
        self._set_used(team, flavor, self.used(team, flavor) + units)
        if hold != NO_HOLD:
            self._holds[team] = self.holds(team) + hold

    def release(self, job: RunningJob) -> None:
        """Free a preempted job's GPUs. Its hold stays open for the rest of the cycle: the
        usage it covers is not settled into the balance yet."""
        share = job.spec.gpu_share
        whole = job.gpus if share is None else self._share_of(job.flavor, job.gpus, -share)
        free = self._writable_free(job.flavor)
        for gpu in whole:
            free[gpu.node] = (*free.get(gpu.node, ()), gpu.uuid)
        self._totals[job.flavor] = self.free_total(job.flavor) + len(whole)
        units = units_of(job.spec)
        self._set_used(job.team, job.flavor, self.used(job.team, job.flavor) - units)
        self.removed.add(job.job_id)

    def share_loads(self, flavor: Flavor) -> dict[str, tuple[str, int]]:
        """The GPUs of `flavor` running shares: GPU → (node, per-mille held), this cycle's
        decisions included."""
        found = self._loads.get(flavor)
        if found is None:
            found = self._loads[flavor] = share_loads(self.snap.running_jobs(), flavor)
        return found

    def _share_of(self, flavor: Flavor, keys: tuple[GpuRef, ...], delta: int) -> list[GpuRef]:
        """Add `delta` per-mille to the GPUs of share `keys`: the whole GPUs that this takes
        from the free ones (delta > 0) or gives back to them (the last share gone)."""
        loads = self.share_loads(flavor)
        changed: list[GpuRef] = []
        for key in keys:
            gpu = share_parent(key.uuid)
            if gpu is None:
                continue
            before = loads.get(gpu, (key.node, 0))[1]
            after = before + delta
            if after > 0:
                loads[gpu] = (key.node, after)
            else:
                loads.pop(gpu, None)
            if (before == 0) != (after <= 0):
                changed.append(GpuRef(gpu, key.node))
        return changed

    def running_of(self, team: str, flavor: Flavor) -> list[RunningJob]:
        """The team's running jobs in a flavor, less those preempted in this cycle."""
        jobs = self.snap.running.get((team, flavor), ())
        return [j for j in jobs if j.job_id not in self.removed]

    def victims_of(self, team: str, flavor: Flavor) -> Sequence[Ranked]:
        """The team's preemptible running jobs in a flavor, each with its `victim_key`, in
        that order — including those preempted in this cycle (`removed`)."""
        key = (team, flavor)
        indexed = self.snap.victims
        if indexed is not None:
            return indexed.get(key, ())
        found = self._victims.get(key)
        if found is None:
            jobs = self.snap.running.get(key, ())
            found = self._victims[key] = sorted((victim_key(j), j) for j in jobs if j.preemptible)
        return found


# ---------------------------------------------------------------------------- nominate


def _never_fits(snap: ClusterSnapshot, flavor: Flavor, spec: JobSpec) -> bool:
    gpus, fleet = spec.gpus, snap.fleet
    if gpus > fleet.capacity.get(flavor, 0):
        return True
    if not spec.span_nodes and gpus > fleet.largest_node.get(flavor, 0):
        return True
    if spec.topology in REQUIRED:
        assert spec.topology is not None
        nodes = (n for n in fleet.nodes.values() if n.flavor == flavor)
        return gpus > largest_group(nodes, spec.topology, fleet.where)
    return False


def nominate(
    snap: ClusterSnapshot, heads: Iterable[PendingJob], policy: Policy
) -> tuple[list[Nomination], list[Verdict]]:
    """Phase 3: turn heads into nominations, or into immediate verdicts."""
    nominations: list[Nomination] = []
    verdicts: list[Verdict] = []
    book = snap.quotas
    for job in heads:
        spec = job.spec
        queue = snap.queues.get(spec.queue)
        if queue is None:
            verdicts.append(Verdict(job, WaitReason.UNKNOWN_QUEUE, f"no queue {spec.queue!r}"))
            continue
        if policy.enforce_quota and spec.team not in book.teams:
            verdicts.append(Verdict(job, WaitReason.UNKNOWN_QUEUE, f"no team {spec.team!r}"))
            continue
        if spec.gpu_share is not None and not share_allowed(queue):
            detail = f"queue {queue.name} ({queue.queue_class.value}) does not take GPU shares"
            verdicts.append(Verdict(job, WaitReason.NO_MATCHING_GPUS, detail))
            continue
        accepted = spec.accepted_models
        kept, dropped = split_by_queue(accepted, queue)
        if accepted and not kept:
            verdicts.append(
                Verdict(job, WaitReason.NO_MATCHING_GPUS, forbidden_detail(dropped, queue))
            )
            continue
        universe = book.flavors_of(spec.team) if policy.enforce_quota else snap.fleet.flavors
        candidates = tuple(
            f
            for f in universe
            if accepts(spec, f.model, kept, queue) and (spec.pool is None or f.pool == spec.pool)
        )
        may_borrow = policy.borrowing and queue.may_borrow
        flavors = tuple(
            f
            for f in candidates
            if not _never_fits(snap, f, spec)
            and (
                not policy.enforce_quota or book.ceiling(spec.team, f, may_borrow) >= units_of(spec)
            )
        )
        if not flavors:
            verdicts.append(
                Verdict(
                    job,
                    WaitReason.NO_MATCHING_GPUS,
                    _no_match_detail(spec, kept, candidates),
                )
            )
            continue
        if policy.price_aware and len(flavors) > 1:
            flavors = cheapest_first(flavors, snap.prices, snap.now_us)
        priority = queue.priority if spec.priority is None else spec.priority
        borrows = False
        if policy.enforce_quota:
            q = book.quota[(spec.team, flavors[0])]
            borrows = snap.used(spec.team, flavors[0]) + units_of(spec) > q.nominal * UNITS
        nominations.append(Nomination(job, queue, priority, flavors, borrows, dropped))
    return nominations, verdicts


def _no_match_detail(spec: JobSpec, models: tuple[str, ...], candidates: tuple[Flavor, ...]) -> str:
    what = "GPU(s)" if spec.mig_profile is None else f"MIG instance(s) {spec.mig_profile}"
    wanted = f"{spec.gpus} {what} of model {'|'.join(models) or 'any'} in pool {spec.pool or 'any'}"
    if not candidates:
        return f"{wanted}: no such GPUs in the team's quota or the fleet"
    where = ", ".join(str(f) for f in candidates)
    together = "" if spec.span_nodes else " on one node"
    if spec.topology in REQUIRED:
        together += f" in one {'NVLink domain' if spec.topology is TopologyNeed.NVLINK else 'rail'}"
    return (
        f"{wanted}{together}: more than the fleet, or the team's quota "
        f"with all it may borrow, can ever hold ({where})"
    )


# ---------------------------------------------------------------------------- admit


@dataclass(frozen=True, slots=True)
class Fit:
    """Where and how a nomination is admitted."""

    flavor: Flavor
    gpus: tuple[GpuRef, ...]
    borrowed: int
    hold: Holds
    over_budget: bool
    note: str = ""  # why this flavor, for a job that had a choice (`JobAdmitted.placement`)


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a nomination did not fit, and the flavors where preemption might make room
    (the quota check there; the budget already covers the job); `tried`: every flavor with
    why it did not admit the job."""

    reason: WaitReason
    detail: str
    preemptible_in: tuple[tuple[Flavor, QuotaCheck], ...] = ()
    tried: tuple[tuple[Flavor, WaitReason], ...] = ()


_QUOTA_REASON = {
    QuotaOutcome.NO_QUOTA: (WaitReason.QUOTA_EXHAUSTED, "the team has no quota for {f}"),
    QuotaOutcome.NOT_ALLOWED: (
        WaitReason.QUOTA_EXHAUSTED,
        "nominal quota for {f} in use and this job may not borrow",
    ),
    QuotaOutcome.BORROWING_LIMIT: (
        WaitReason.QUOTA_EXHAUSTED,
        "nominal quota for {f} in use and the borrowing limit reached",
    ),
    QuotaOutcome.COHORT_EXHAUSTED: (
        WaitReason.COHORT_EXHAUSTED,
        "no unused lendable quota for {f} left in the cohort",
    ),
    QuotaOutcome.RECLAIM: (
        WaitReason.QUOTA_LENT,
        "the team's nominal quota for {f} is lent to the cohort and must be reclaimed",
    ),
}


_PREEMPTION_HELPS = frozenset(
    (
        WaitReason.NO_CAPACITY,
        WaitReason.QUOTA_EXHAUSTED,
        WaitReason.COHORT_EXHAUSTED,
        WaitReason.QUOTA_LENT,
    )
)


def fits_capacity(free: Mapping[str, tuple[str, ...]], total: int, gpus: int, span: bool) -> bool:
    if total < gpus:
        return False
    return span or any(len(u) >= gpus for u in free.values())


def evaluate(n: Nomination, ws: Workspace, policy: Policy) -> Fit | Blocked:
    """Phase 5 for one nomination: a `Fit` in the first flavor that admits it, else why not."""
    snap = ws.snap
    spec = n.spec
    team = spec.team
    may_borrow = policy.borrowing and n.queue.may_borrow
    cohort = snap.quotas.cohort_of(team)
    balance = snap.balances.get(team)
    first: tuple[WaitReason, str] | None = None
    options: list[tuple[Flavor, QuotaCheck]] = []
    tried: list[tuple[Flavor, WaitReason]] = []
    for flavor in n.flavors:
        blocked: tuple[WaitReason, str] | None = None
        quota = QuotaCheck(QuotaOutcome.FITS)
        if policy.enforce_quota:
            totals = None if cohort is None else ws.cohort_totals(cohort, flavor)
            quota = check_quota(
                snap.quotas, team, flavor, units_of(spec), ws.usage_in(flavor), may_borrow, totals
            )
            if not quota.fits:
                reason, text = _QUOTA_REASON[quota.outcome]
                blocked = (reason, text.format(f=flavor))
        free = ws.free_nodes(flavor)
        total = ws.free_total(flavor)
        sharing = spec.gpu_share is not None
        if not (blocked or sharing or fits_capacity(free, total, spec.gpus, spec.span_nodes)):
            blocked = (
                WaitReason.NO_CAPACITY,
                f"{spec.gpus} GPU(s) of {flavor} wanted, {total} free"
                + ("" if spec.span_nodes else " (on one node)"),
            )
        budget: BudgetCheck = check_budget(
            spec, flavor, balance, ws.holds(team), snap.prices, snap.now_us
        )
        over_budget = False
        if not budget.fits:
            if not budget.priced:
                blocked = blocked or (WaitReason.NO_PRICE, budget.detail)
            elif n.queue.over_budget is OverBudget.RUN_PREEMPTIBLE:
                over_budget = True
            else:
                blocked = (WaitReason.BUDGET_EXHAUSTED, budget.detail)
        if blocked is None:
            where = snap.fleet.where
            if sharing:
                gpus = place_share(spec, ws.share_loads(flavor), free)
            else:
                gpus = place_gang(free, spec.gpus, spec.span_nodes, spec.topology, where)
            if gpus is not None:
                hold = NO_HOLD if over_budget else budget.hold
                note = placement_note(
                    flavor, n.flavors, tried, snap.prices, snap.now_us, n.dropped, n.queue
                )
                return Fit(flavor, gpus, gpus_of(quota.borrowed), hold, over_budget, note)
            blocked = (WaitReason.NO_CAPACITY, f"no placement for {spec.gpus} GPU(s) of {flavor}")
            if sharing:
                blocked = (WaitReason.NO_CAPACITY, f"no GPU of {flavor} has {share_of(spec)} free")
            if spec.topology is not None and place(free, spec.gpus, spec.span_nodes) is not None:
                detail = unmet_detail(free, spec.gpus, spec.topology, where, flavor)
                blocked = (WaitReason.TOPOLOGY, detail)
        if blocked[0] in _PREEMPTION_HELPS and budget.fits:
            options.append((flavor, quota))
        tried.append((flavor, blocked[0]))
        first = first or blocked
    assert first is not None  # a nomination has at least one flavor
    detail = first[1]
    if len(n.flavors) > 1:
        others = "; ".join(f"{f}: {why.value}" for f, why in tried[1:])
        detail += f" (then {others})"
    if n.dropped:
        detail += f"; {forbidden_detail(n.dropped, n.queue)}"
    options_in = tuple(options) if policy.preemption else ()
    return Blocked(first[0], clip(detail), options_in, tuple(tried))
