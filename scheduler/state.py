"""The scheduler's state: a projection of the `jobs` topic, plus config, balances and metered
usage. It is the one mutable thing in the scheduler; it applies events and hands out snapshots.

The fleet (the GPUs new placements may use) is set with `set_fleet`, from the inventory the
collectors report (`scheduler.inventory`); a GPU an event names that the fleet does not (a
replayed assignment, a GPU gone stale) is still held and released as the events say.

It owns the backlogs (one per (team, queue), in order of priority then submit time; a job
told it can never run — no matching GPUs, unknown queue or team — is parked outside its backlog
so it cannot hide the jobs behind it from the heads phase, until `unpark`), the
running jobs, who holds each GPU, the free GPUs indexed by flavor and node, the GPUs held per
(team, flavor), the open holds per team, the latest balance per team, and the decayed metered
usage per team. Replaying the same events gives the same state.

Invariants (a violating event raises `StateError` and changes nothing):
- a GPU is held by at most one job; only its holder releases it. A GPU running shares
  (`ledger.fractional.share_key`) is held by `SHARED` until its last share is released, and
  each share by its job;
- a job is pending, running, or done — never two of these; a duplicate `JobSubmitted` is
  ignored, an admission of a job that is not pending is refused;
- the quota units held per (team, flavor) (`scheduler.quota.units_of`: per-mille of a GPU, a
  share its own) equal those of the GPUs and shares assigned and not released.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from ledger.fractional import share_parent
from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    WaitReason,
)
from ledger.pricing import PriceBook
from scheduler.errors import ConfigError, StateError
from scheduler.fairshare import DEFAULT_HALF_LIFE_US, DecayedUsage, accrue, usage_now
from scheduler.frozen_copy import replaced
from scheduler.model import (
    NO_HOLD,
    Balance,
    Flavor,
    GpuRef,
    Holds,
    Node,
    PendingJob,
    Queue,
    RunningJob,
    Team,
)
from scheduler.quota import UNITS, QuotaBook
from scheduler.running_index import RunningIndex
from scheduler.snapshot import ClusterSnapshot, Fleet, FreeGpus, heads

BacklogKey = tuple[int, int, str]  # (−priority, submit time, job id)
PARKED = frozenset((WaitReason.NO_MATCHING_GPUS, WaitReason.UNKNOWN_QUEUE))


SHARED = "(shares)"  # the holder of a GPU that runs share jobs


class SchedulerState:
    """Pending and running jobs, GPU holders and usage counters, kept by applying events."""

    def __init__(
        self,
        queues: Iterable[Queue],
        teams: Iterable[Team],
        nodes: Iterable[Node],
        *,
        prices: PriceBook | None = None,
        half_life_us: int = DEFAULT_HALF_LIFE_US,
    ) -> None:
        by_name: dict[str, Queue] = {}
        for queue in queues:
            if queue.name in by_name:
                raise ConfigError(f"queue {queue.name} is configured twice")
            by_name[queue.name] = queue
        self.queues: Mapping[str, Queue] = MappingProxyType(by_name)
        if half_life_us <= 0:
            raise ConfigError("fair share: the half-life must be positive")
        self.quotas = QuotaBook.of(teams)
        self.prices = prices
        self.half_life_us = half_life_us
        self._home: dict[str, tuple[str, Flavor]] = {}  # every GPU known: its node and flavor
        self._known: Counter[Flavor] = Counter()  # GPUs of `_home` per flavor, kept with it
        self._placeable: frozenset[str] = frozenset()
        self._held_as: dict[str, tuple[str, Flavor]] = {}  # a held GPU: where it was assigned
        self._held_units: dict[str, int] = {}  # a held GPU or share: its quota units
        self._free: dict[Flavor, dict[str, tuple[str, ...]]] = {}
        self._free_total: dict[Flavor, int] = {}
        self._holder: dict[str, str] = {}  # a GPU running shares: held by `SHARED`
        self._shared: dict[str, int] = {}  # GPU → how many share jobs run on it
        self._usage: dict[tuple[str, Flavor], int] = {}
        self._backlogs: dict[tuple[str, str], list[BacklogKey]] = {}
        self._pending: dict[str, PendingJob] = {}
        self._running: dict[str, RunningJob] = {}
        self._running_by = RunningIndex()
        self._done: set[str] = set()
        self._parked: set[str] = set()  # pending, but out of the backlogs: they can never run
        self._holds: dict[str, Holds] = {}
        self._balances: dict[str, Balance] = {}
        self._metered: dict[str, DecayedUsage] = {}
        self._preemptible: dict[Flavor, Counter[int]] = {}  # priorities of preemptible jobs
        self._over_budget: dict[Flavor, int] = {}
        self.fleet = Fleet.of(())
        self.set_fleet(nodes)

    def set_fleet(self, nodes: Iterable[Node]) -> None:
        """The GPUs new placements may use from now on (the inventory's placeable GPUs, or a
        fixed fleet). A GPU a job holds stays held; released, it is free again only if it is
        placeable then. Parked jobs get another look."""
        fleet = Fleet.of(nodes)
        free: dict[Flavor, dict[str, tuple[str, ...]]] = {}
        totals: dict[Flavor, int] = {}
        for node in fleet.nodes.values():
            for uuid in node.gpu_uuids:
                self._set_home(uuid, (node.name, node.flavor))
            idle = tuple(sorted(u for u in node.gpu_uuids if u not in self._holder))
            per_node = free.setdefault(node.flavor, {})
            if idle:
                per_node[node.name] = idle
            totals[node.flavor] = totals.get(node.flavor, 0) + len(idle)
        self.fleet = fleet
        self._placeable = frozenset(u for n in fleet.nodes.values() for u in n.gpu_uuids)
        self._free, self._free_total = free, totals
        self.unpark()

    def known_flavors(self) -> frozenset[Flavor]:
        """The (pool, model) of every GPU ever known, placeable now or not."""
        return frozenset(flavor for flavor, count in self._known.items() if count)

    def _set_home(self, uuid: str, home: tuple[str, Flavor]) -> None:
        before = self._home.get(uuid)
        if before is not None:
            self._known[before[1]] -= 1
        self._home[uuid] = home
        self._known[home[1]] += 1

    # ------------------------------------------------------------------ queries

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def running_count(self) -> int:
        return len(self._running)

    def pending_job(self, job_id: str) -> PendingJob | None:
        return self._pending.get(job_id)

    def running_job(self, job_id: str) -> RunningJob | None:
        return self._running.get(job_id)

    def running_jobs(self) -> tuple[RunningJob, ...]:
        return tuple(self._running.values())

    def pending_jobs(self) -> tuple[PendingJob, ...]:
        return tuple(self._pending.values())

    def holder(self, gpu_uuid: str) -> str | None:
        return self._holder.get(gpu_uuid)

    def used(self, team: str, flavor: Flavor) -> int:
        return self._usage.get((team, flavor), 0)

    def placeable(self, gpu_uuid: str) -> bool:
        """Whether new placements may use the GPU now."""
        return gpu_uuid in self._placeable

    def free_total(self, flavor: Flavor) -> int:
        return self._free_total.get(flavor, 0)

    def open_holds(self, team: str) -> Holds:
        return self._holds.get(team, NO_HOLD)

    def balance(self, team: str) -> Balance | None:
        return self._balances.get(team)

    def is_done(self, job_id: str) -> bool:
        return job_id in self._done

    # ------------------------------------------------------------------ inputs besides events

    def set_balance(self, balance: Balance) -> None:
        """The latest balance of a team, as the `balances` topic reports it."""
        self._balances[balance.team] = balance

    def meter(self, team: str, gpu_ms: int, at_us: int) -> None:
        """Metered usage of a team (GPU-ms, from the ledger) for fair share."""
        current = self._metered.get(team, DecayedUsage(0, at_us))
        self._metered[team] = accrue(current, gpu_ms, at_us, self.half_life_us)

    # ------------------------------------------------------------------ snapshot

    def snapshot(self, now_us: int, heads_per_queue: int = 8) -> ClusterSnapshot:
        """Phases 1 and 2: the heads of every backlog and an immutable picture of the rest."""
        pending = self._pending
        picked = heads(
            (
                [pending[key[2]] for key in backlog[:heads_per_queue]]
                for backlog in self._backlogs.values()
            ),
            heads_per_queue,
        )
        return ClusterSnapshot(
            now_us=now_us,
            queues=self.queues,
            quotas=self.quotas,
            fleet=self.fleet,
            free={f: FreeGpus(dict(nodes), self._free_total[f]) for f, nodes in self._free.items()},
            usage=dict(self._usage),
            running=self._running_by.running(),
            victims=self._running_by.victims(),
            heads=picked,
            balances=dict(self._balances),
            holds=dict(self._holds),
            fair_share=usage_now(self._metered, now_us, self.half_life_us),
            prices=self.prices,
            pending=len(pending),
            lowest_preemptible={f: min(c) for f, c in self._preemptible.items() if c},
            over_budget_running={f: n for f, n in self._over_budget.items() if n},
        )

    # ------------------------------------------------------------------ events

    def apply_all(self, events: Iterable[JobEvent]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: JobEvent) -> None:
        if isinstance(event, GpuAssigned):
            self._assign(event)
        elif isinstance(event, GpuReleased):
            self._release(event)
        elif isinstance(event, JobSubmitted):
            spec = event.spec
            known = spec.job_id in self._pending or spec.job_id in self._running
            if not known and spec.job_id not in self._done:
                self._enqueue(PendingJob(spec))
        elif isinstance(event, JobWaiting):
            job = self._pending.get(event.job_id)
            if job is not None:
                self._pending[event.job_id] = replaced(job, last_wait=event.reason)
                if event.reason in PARKED and event.job_id not in self._parked:
                    self._unlist(job)
                    self._parked.add(event.job_id)
        elif isinstance(event, JobAdmitted):
            self._admit(event)
        elif isinstance(event, JobStarted):
            running = self._running.get(event.job_id)
            if running is not None:
                self._set_running(replaced(running, started_us=event.time_us))
        elif isinstance(event, JobPreempted):
            running = self._end(event.job_id)
            if running is not None:
                self._enqueue(PendingJob(running.spec, running.attempt, WaitReason.PREEMPTED))
        elif isinstance(event, JobReclaimed | JobFinished):
            if self._end(event.job_id) is not None:
                self._done.add(event.job_id)
        elif isinstance(event, JobFailed):
            self._fail(event)

    def _enqueue(self, job: PendingJob) -> None:
        spec = job.spec
        self._pending[spec.job_id] = job
        bisect.insort(self._backlogs.setdefault((spec.team, spec.queue), []), self._key(job))

    def _key(self, job: PendingJob) -> BacklogKey:
        spec = job.spec
        priority = spec.priority
        if priority is None:
            queue = self.queues.get(spec.queue)
            priority = 0 if queue is None else queue.priority
        return (-priority, spec.submit_us, spec.job_id)

    def _dequeue(self, job_id: str) -> PendingJob:
        job = self._pending.pop(job_id)
        if job_id in self._parked:
            self._parked.discard(job_id)
        else:
            self._unlist(job)
        return job

    def _unlist(self, job: PendingJob) -> None:
        backlog = self._backlogs[(job.spec.team, job.spec.queue)]
        del backlog[bisect.bisect_left(backlog, self._key(job))]

    def set_quotas(self, teams: Iterable[Team]) -> None:
        """Admit against these teams' quotas from now on (`scheduler.applied_quotas`); parked
        jobs get another look."""
        self.quotas = QuotaBook.of(teams)
        self.unpark()

    def unpark(self) -> None:
        """Give parked jobs another look (after the fleet, queues or quotas changed)."""
        for job_id in sorted(self._parked):
            job = self._pending[job_id] = replaced(self._pending[job_id], last_wait=None)
            bisect.insort(
                self._backlogs.setdefault((job.spec.team, job.spec.queue), []), self._key(job)
            )
        self._parked.clear()

    def _set_running(self, job: RunningJob) -> None:
        before = self._running.get(job.job_id)
        self._running[job.job_id] = job
        self._running_by.put(job, before)

    def _end(self, job_id: str) -> RunningJob | None:
        job = self._running.pop(job_id, None)
        if job is None:
            return None
        self._running_by.remove(job)
        if job.hold != NO_HOLD:
            self._holds[job.team] = self._holds.get(job.team, NO_HOLD) - job.hold
        self._count_preemptible(job, -1)
        return job

    def _count_preemptible(self, job: RunningJob, delta: int) -> None:
        if job.over_budget:
            self._over_budget[job.flavor] = self._over_budget.get(job.flavor, 0) + delta
        elif job.preemptible:
            priorities = self._preemptible.setdefault(job.flavor, Counter())
            priorities[job.priority] += delta
            if not priorities[job.priority]:
                del priorities[job.priority]

    def _admit(self, event: JobAdmitted) -> None:
        if event.job_id not in self._pending:
            raise StateError(f"job {event.job_id} admitted but it is not pending")
        job = self._dequeue(event.job_id)
        hold = Holds(event.hold_micros, event.hold_gpu_ms)
        running = RunningJob(
            spec=job.spec,
            flavor=Flavor(event.pool, event.model),
            gpus=tuple(GpuRef(u, n) for u, n in zip(event.gpu_uuids, event.nodes, strict=True)),
            priority=event.priority,
            preemptible=event.preemptible,
            admitted_us=event.time_us,
            attempt=event.attempt,
            borrowed=event.borrowed_gpus,
            hold=hold,
            over_budget=event.over_budget,
        )
        self._set_running(running)
        self._count_preemptible(running, +1)
        if hold != NO_HOLD:
            self._holds[job.spec.team] = self._holds.get(job.spec.team, NO_HOLD) + hold

    def _fail(self, event: JobFailed) -> None:
        running = self._end(event.job_id)
        if running is not None:
            job = PendingJob(running.spec, running.attempt)
        elif event.job_id in self._pending:
            job = self._dequeue(event.job_id)
        else:
            return
        if event.retry:
            self._enqueue(PendingJob(job.spec, job.attempt + 1, WaitReason.RETRYING))
        else:
            self._done.add(event.job_id)

    def _assign(self, event: GpuAssigned) -> None:
        uuid = event.gpu_uuid
        holder = self._holder.get(uuid)
        if holder is not None:
            raise StateError(f"GPU {uuid} assigned to {event.job_id}, held by {holder}")
        # A GPU the inventory has not (yet) named, e.g. while the jobs topic is replayed, is
        # where the event says it is.
        home = self._home.get(uuid)
        if home is None:
            home = (event.node, Flavor(event.pool, event.model))
            self._set_home(uuid, home)
        node, flavor = home
        parent = share_parent(uuid)
        if parent is not None:
            self._share(parent, event, +1)
        self._unfree(uuid, node, flavor)
        self._holder[uuid] = event.job_id
        self._held_as[uuid] = home
        units = UNITS if parent is None or event.share is None else event.share
        self._held_units[uuid] = units
        key = (event.team, flavor)
        self._usage[key] = self._usage.get(key, 0) + units

    def _unfree(self, uuid: str, node: str, flavor: Flavor) -> None:
        free = self._free.get(flavor, {})
        if uuid in free.get(node, ()):
            free[node] = tuple(u for u in free[node] if u != uuid)
            if not free[node]:
                del free[node]
            self._free_total[flavor] -= 1

    def _refree(self, uuid: str) -> None:
        if uuid in self._placeable:
            node, home_flavor = self._home[uuid]
            free = self._free.setdefault(home_flavor, {})
            free[node] = tuple(sorted((*free.get(node, ()), uuid)))
            self._free_total[home_flavor] = self._free_total.get(home_flavor, 0) + 1

    def _share(self, gpu: str, event: GpuAssigned | GpuReleased, delta: int) -> None:
        """One more or one less share job on `gpu`: the first takes the whole GPU out of the
        free GPUs (held by `SHARED`), the last gives it back."""
        count = self._shared.get(gpu, 0)
        if count == 0 and delta > 0:
            holder = self._holder.get(gpu)
            if holder is not None:
                raise StateError(f"GPU {gpu}: share for {event.job_id}, held whole by {holder}")
            node, flavor = self._home.setdefault(gpu, (event.node, Flavor(event.pool, event.model)))
            self._unfree(gpu, node, flavor)
            self._holder[gpu] = SHARED
        count += delta
        if count > 0:
            self._shared[gpu] = count
            return
        self._shared.pop(gpu, None)
        if self._holder.get(gpu) == SHARED:
            del self._holder[gpu]
            self._refree(gpu)

    def _release(self, event: GpuReleased) -> None:
        uuid = event.gpu_uuid
        holder = self._holder.get(uuid)
        if holder != event.job_id:
            raise StateError(f"GPU {uuid} released by {event.job_id}, held by {holder or 'nobody'}")
        del self._holder[uuid]
        _, flavor = self._held_as.pop(uuid)
        self._refree(uuid)
        parent = share_parent(uuid)
        if parent is not None:
            self._home.pop(uuid, None)
            self._share(parent, event, -1)
        key = (event.team, flavor)
        left = self._usage[key] - self._held_units.pop(uuid, UNITS)
        if left:
            self._usage[key] = left
        else:
            del self._usage[key]
