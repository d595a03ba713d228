"""The dispatcher: fans alerts out to every sink, deduplicated by (sink, alert id).

`submit` records each fresh copy `queued` in the delivery log (durably: the caller may commit the
topic offset once it returns) and offers it to the sink's worker without waiting; delivery
happens in the workers' threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import requests

from ledger.fleet_alerts import AnyAlert
from streams.alerts.delivery_log import Delivery, DeliveryLog, DeliveryState
from streams.alerts.settings import SinkSettings
from streams.alerts.sinks import DeliveryMetrics, NoMetrics, SinkWorker


class AlertDispatcher:
    """Fans alerts out to every sink: dedupe by (sink, alert id), record, queue, never wait."""

    def __init__(
        self,
        sinks: Iterable[SinkSettings],
        data_dir: Path | str,
        currency: str = "USD",
        metrics: DeliveryMetrics | None = None,
        session_factory: Callable[[], requests.Session] = requests.Session,
    ) -> None:
        self.metrics: DeliveryMetrics = metrics or NoMetrics()
        self.log = DeliveryLog(data_dir)
        self.workers = [
            SinkWorker(s, self.log, currency, self.metrics, session_factory()) for s in sinks
        ]
        self.duplicates = 0

    def start(self) -> AlertDispatcher:
        for worker in self.workers:
            worker.start()
        return self

    def submit(self, alerts: Iterable[AnyAlert]) -> int:
        """Queue `alerts` for every sink that has not seen them; how many copies were queued.

        Returns once the copies are durably recorded as queued (so the caller may commit the
        topic offset); delivery happens in the background.
        """
        fresh: list[tuple[SinkWorker, AnyAlert]] = []
        for alert in alerts:
            for worker in self.workers:
                if self.log.known(worker.name, alert.id) or any(
                    w is worker and a.id == alert.id for w, a in fresh
                ):
                    self.duplicates += 1
                    continue
                fresh.append((worker, alert))
        self.log.record(Delivery(w.name, a, DeliveryState.QUEUED) for w, a in fresh)
        for worker, alert in fresh:
            worker.offer(alert)
        return len(fresh)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty and nothing is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(w.idle() for w in self.workers):
                return True
            time.sleep(0.02)
        return all(w.idle() for w in self.workers)

    def health(self) -> dict[str, dict[str, Any]]:
        return {
            w.name: {
                "up": w.up,
                "queued": w.queue.qsize(),
                "consecutive_failures": w.consecutive_failures,
                "last_error": w.last_error,
            }
            for w in self.workers
        }

    def stop(self, timeout_s: float = 5.0) -> None:
        for worker in self.workers:
            worker.stop(timeout_s)
            worker.session.close()  # made here by `session_factory`: its pooled sockets too
        self.log.close()
