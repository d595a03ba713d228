"""The state's index of running jobs per (team, flavor), kept so that a snapshot costs only
what changed since the last one.

Per (team, flavor) it keeps
- the running jobs in order of admission (a job whose record changes, e.g. on `JobStarted`,
  moves to the end), as `ClusterSnapshot.running` shows them;
- the preemptible ones in preemption's preference order (`victim_key`), each with its key, as
  `ClusterSnapshot.victims` shows them — sorted as jobs come and go, never per cycle.
Each group's tuples are built once and reused by every snapshot until the group changes, so
a snapshot of 10,000 running jobs copies only the groups a cycle touched.
"""

from __future__ import annotations

import bisect

from scheduler.model import Flavor, RunningJob

Group = tuple[str, Flavor]
VictimKey = tuple[bool, int, int, int, str]
Ranked = tuple[VictimKey, RunningJob]


def victim_key(job: RunningJob) -> VictimKey:
    """Preemption's preference among a group's jobs, lowest first: over-budget borrowers, then
    the lowest priority, then the most recently started, then the most recently submitted,
    then the job id (so the order is total)."""
    return (not job.over_budget, job.priority, -job.since_us, -job.spec.submit_us, job.job_id)


class RunningIndex:
    """Running jobs per (team, flavor), in admission order and in victim order."""

    __slots__ = ("_by", "_ranked", "_ranked_view", "_view")

    def __init__(self) -> None:
        self._by: dict[Group, dict[str, RunningJob]] = {}
        self._ranked: dict[Group, list[Ranked]] = {}
        self._view: dict[Group, tuple[RunningJob, ...]] = {}
        self._ranked_view: dict[Group, tuple[Ranked, ...]] = {}

    def put(self, job: RunningJob, before: RunningJob | None) -> None:
        """Add `job`, or replace `before` (the same job's previous record) with it."""
        group = (job.team, job.flavor)
        jobs = self._by.setdefault(group, {})
        if before is not None:
            jobs.pop(before.job_id, None)  # the group keeps its place; the job moves to the end
            self._unrank(before)
        jobs[job.job_id] = job
        self._view.pop(group, None)
        if job.preemptible:
            bisect.insort(self._ranked.setdefault(group, []), (victim_key(job), job))
            self._ranked_view.pop(group, None)

    def remove(self, job: RunningJob) -> None:
        group = (job.team, job.flavor)
        jobs = self._by.get(group)
        if jobs is not None and jobs.pop(job.job_id, None) is not None:
            if not jobs:
                del self._by[group]
            self._view.pop(group, None)
        self._unrank(job)

    def _unrank(self, job: RunningJob) -> None:
        group = (job.team, job.flavor)
        ranked = self._ranked.get(group)
        if job.preemptible and ranked:
            key = victim_key(job)
            at = bisect.bisect_left(ranked, (key,))
            if at < len(ranked) and ranked[at][0] == key:
                del ranked[at]
                if not ranked:
                    del self._ranked[group]
                self._ranked_view.pop(group, None)

    def running(self) -> dict[Group, tuple[RunningJob, ...]]:
        """Every group's jobs in admission order (groups in order of first admission)."""
        cache = self._view
        view: dict[Group, tuple[RunningJob, ...]] = {}
        for group, jobs in self._by.items():
            found = cache.get(group)
            if found is None:
                found = cache[group] = tuple(jobs.values())
            view[group] = found
        return view

    def victims(self) -> dict[Group, tuple[Ranked, ...]]:
        """Every group's preemptible jobs with their keys, in `victim_key` order."""
        cache = self._ranked_view
        view: dict[Group, tuple[Ranked, ...]] = {}
        for group, ranked in self._ranked.items():
            found = cache.get(group)
            if found is None:
                found = cache[group] = tuple(ranked)
            view[group] = found
        return view
