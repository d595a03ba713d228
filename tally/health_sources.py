"""The probes each long-running process serves at `/healthz` and `/readyz`: where its status
snapshot comes from (the worker, the scheduler service's status, the collector's metrics, the
alerts consumer's progress) and which pure decision (`tally.health`) judges it.

Every probe reads plain attributes the process's own loop sets; nothing here blocks or touches
the broker, so a probe answers at once from the HTTP server's threads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from tally.health import (
    DEFAULT_MAX_LAG,
    DEFAULT_STALL_S,
    AlertsStatus,
    CollectorStatus,
    Liveness,
    SchedulerStatus,
    Verdict,
    WorkerStatus,
    alerts_readiness,
    collector_readiness,
    liveness,
    scheduler_readiness,
    worker_readiness,
)
from tally.health_http import Heartbeat, Probes

if TYPE_CHECKING:
    from collectors.metrics import CollectorMetrics
    from scheduler.service import ServiceStatus
    from streams.progress import ConsumerProgress


class _Worker(Protocol):  # `streams.worker.LedgerWorker`, without importing Faust here
    @property
    def ticked_at(self) -> float | None: ...

    @property
    def incarnation_known(self) -> bool: ...

    @property
    def samples_progress(self) -> ConsumerProgress: ...


class WorkerHealth:
    """The worker's probes; the worker is attached once built (the endpoint starts first, and
    answers 'starting' until then)."""

    def __init__(
        self,
        max_lag: int = DEFAULT_MAX_LAG,
        stall_s: float = DEFAULT_STALL_S,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.max_lag = max_lag
        self.stall_s = stall_s
        self.heartbeat = heartbeat or Heartbeat()
        self.worker: _Worker | None = None

    def attach(self, worker: _Worker) -> None:
        self.worker = worker

    def live(self) -> Verdict:
        ticked = None if self.worker is None else self.worker.ticked_at
        if ticked is not None:
            self.heartbeat.last = ticked
        return liveness(Liveness(self.heartbeat.age(), self.heartbeat.up()), self.stall_s)

    def ready(self) -> Verdict:
        worker = self.worker
        if worker is None:
            return worker_readiness(WorkerStatus(False, None, 0, None), self.max_lag)
        progress = worker.samples_progress
        return worker_readiness(
            WorkerStatus(
                worker.incarnation_known,
                progress.fetch_error,
                progress.partitions,
                progress.lag,
                _age(progress.answered_at),
            ),
            self.max_lag,
        )

    def probes(self) -> Probes:
        return Probes(self.live, self.ready)


def _age(at: float | None) -> float | None:
    return None if at is None else max(0.0, time.time() - at)


def _live(heartbeat: Heartbeat, stall_s: float) -> Verdict:
    return liveness(Liveness(heartbeat.age(), heartbeat.up()), stall_s)


def scheduler_probes(
    status: ServiceStatus, heartbeat: Heartbeat, stall_s: float = DEFAULT_STALL_S
) -> Probes:
    def ready() -> Verdict:
        return scheduler_readiness(
            SchedulerStatus(status.replayed, status.serving, status.feed_error)
        )

    return Probes(lambda: _live(heartbeat, stall_s), ready)


def collector_probes(
    metrics: CollectorMetrics, heartbeat: Heartbeat, stall_s: float = DEFAULT_STALL_S
) -> Probes:
    def ready() -> Verdict:
        return collector_readiness(
            CollectorStatus(metrics.value("broker_up") == 1, int(metrics.value("spool_records")))
        )

    return Probes(lambda: _live(heartbeat, stall_s), ready)


def alerts_probes(
    progress: ConsumerProgress, heartbeat: Heartbeat, stall_s: float = DEFAULT_STALL_S
) -> Probes:
    def ready() -> Verdict:
        return alerts_readiness(
            AlertsStatus(
                progress.started,
                progress.partitions,
                progress.fetch_error,
                _age(progress.answered_at),
            )
        )

    return Probes(lambda: _live(heartbeat, stall_s), ready)
