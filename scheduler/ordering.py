"""Phase 4 of a cycle, order: which nominated job is looked at first.

Keys, lowest first:
- FIFO: submit time, then job id (priority, quota and usage are ignored);
- REQUESTED_SHARE (Kueue-like): higher priority, then jobs that stay within their team's
  nominal quota before jobs that borrow, then the team's share requested now —
  (GPUs the team holds + GPUs the job asks) / weight — then submit time, then job id;
- METERED_FAIR_SHARE (Tally): higher priority, then non-borrowing before borrowing, then the
  team's decayed metered usage / weight, then submit time, then job id.

A requeued job keeps its submit time, so preemption never costs it its place by age.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ledger.job_events import JobSpec
from scheduler.fairshare import standing
from scheduler.model import Flavor, Ordering, PendingJob, Queue
from scheduler.quota import units_of
from scheduler.snapshot import ClusterSnapshot

OrderKey = tuple[int, int, int, int, str]


@dataclass(frozen=True, slots=True)
class Nomination:
    """A head that may be admitted: its queue, effective priority and candidate flavors
    (in preference order), whether it would borrow in its first flavor, and the models it
    named that its queue does not allow."""

    job: PendingJob
    queue: Queue
    priority: int
    flavors: tuple[Flavor, ...]
    borrows: bool
    dropped: tuple[str, ...] = ()

    @property
    def spec(self) -> JobSpec:
        return self.job.spec


def team_allocations(usage: Mapping[tuple[str, Flavor], int]) -> dict[str, int]:
    """What each team holds over all flavors, in quota units (`scheduler.quota.units_of`)."""
    totals: dict[str, int] = {}
    for (team, _), gpus in usage.items():
        totals[team] = totals.get(team, 0) + gpus
    return totals


def order_key(
    n: Nomination,
    ordering: Ordering,
    snapshot: ClusterSnapshot,
    allocated: Mapping[str, int],
) -> OrderKey:
    spec = n.job.spec
    if ordering is Ordering.FIFO:
        return (0, 0, 0, spec.submit_us, spec.job_id)
    weight = snapshot.quotas.weight_of(spec.team)
    if ordering is Ordering.REQUESTED_SHARE:
        share = standing(allocated.get(spec.team, 0) + units_of(spec), weight)
    else:
        share = standing(snapshot.fair_share.get(spec.team, 0), weight)
    return (-n.priority, int(n.borrows), share, spec.submit_us, spec.job_id)


def order(
    nominations: Iterable[Nomination], ordering: Ordering, snapshot: ClusterSnapshot
) -> tuple[Nomination, ...]:
    """Phase 4: the nominations in the order admission looks at them."""
    allocated = team_allocations(snapshot.usage) if ordering is Ordering.REQUESTED_SHARE else {}
    return tuple(sorted(nominations, key=lambda n: order_key(n, ordering, snapshot, allocated)))
