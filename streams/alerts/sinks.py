"""Sink workers: one per webhook, each with its own bounded queue and delivery thread, so a
webhook that is down never blocks the stream or the other sinks.

A worker delivers one alert at a time, retrying with exponential backoff (`SinkSettings`), and
records the outcome in the delivery log: `sent` after a 2xx answer, `dropped` as `rejected`
(a 4xx other than 408/425/429), `gave_up` (after `max_attempts`) or `queue_full` (offered
while its queue was full). A worker whose latest try failed reports itself down (`up`). An
Alertmanager worker re-posts the alerts still firing every `resend_interval_s`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

import requests

from ledger.fleet_alerts import AnyAlert
from streams.alerts.delivery_log import Delivery, DeliveryLog, DeliveryState, DropReason
from streams.alerts.payloads import request_for
from streams.alerts.settings import SinkKind, SinkSettings
from streams.alerts.webhook import Attempt, post_json

log = logging.getLogger("tally.alerts")


class DeliveryMetrics(Protocol):
    """What the delivery machinery reports (`tally.metrics.TallyMetrics` implements it)."""

    def alert_delivered(self, sink: str, kind: str) -> None: ...
    def alert_failed(self, sink: str) -> None: ...
    def alert_dropped(self, sink: str, reason: str) -> None: ...
    def alert_queue(self, sink: str, length: int) -> None: ...
    def alert_sink_up(self, sink: str, up: bool) -> None: ...


class NoMetrics:
    """Reports nothing (the default when no metrics are wanted)."""

    def alert_delivered(self, sink: str, kind: str) -> None:
        pass

    def alert_failed(self, sink: str) -> None:
        pass

    def alert_dropped(self, sink: str, reason: str) -> None:
        pass

    def alert_queue(self, sink: str, length: int) -> None:
        pass

    def alert_sink_up(self, sink: str, up: bool) -> None:
        pass


class SinkWorker:
    """One webhook: a bounded queue and a thread that delivers from it, one alert at a time."""

    def __init__(
        self,
        settings: SinkSettings,
        delivery_log: DeliveryLog,
        currency: str,
        metrics: DeliveryMetrics,
        session: requests.Session | None = None,
    ) -> None:
        self.settings = settings
        self.log = delivery_log
        self.currency = currency
        self.metrics = metrics
        self.session = session or requests.Session()
        self.queue: queue.Queue[AnyAlert] = queue.Queue(maxsize=settings.queue_size)
        self.up = True
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"alerts-{settings.name}", daemon=True
        )
        self._last_resend = time.monotonic()

    @property
    def name(self) -> str:
        return self.settings.name

    def start(self) -> SinkWorker:
        for alert in self.log.pending(self.name):  # queued before a restart
            if not self.offer(alert):
                break
        self._thread.start()
        return self

    def offer(self, alert: AnyAlert) -> bool:
        """Queue `alert` without waiting; on a full queue drop it (recorded, logged, counted)."""
        try:
            self.queue.put_nowait(alert)
        except queue.Full:
            self.log.record([Delivery(self.name, alert, DeliveryState.DROPPED, "queue_full")])
            self.metrics.alert_dropped(self.name, DropReason.QUEUE_FULL)
            log.error(
                "alert sink %s: queue full (%d), dropped alert %s (%s)",
                self.name,
                self.settings.queue_size,
                alert.id,
                alert.kind.value,
            )
            return False
        self.metrics.alert_queue(self.name, self.queue.qsize())
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                alert = self.queue.get(timeout=0.2)
            except queue.Empty:
                self._maybe_resend()
                continue
            try:
                self._deliver(alert)
            finally:
                self.queue.task_done()
                self.metrics.alert_queue(self.name, self.queue.qsize())

    def _deliver(self, alert: AnyAlert) -> None:
        delay = self.settings.backoff_initial_s
        for attempt in range(1, self.settings.max_attempts + 1):
            url, body = request_for(self.settings, [alert], self.currency)  # signed per try
            outcome = post_json(
                self.session,
                url,
                body,
                self.settings.timeout_s,
                self.settings.headers,
                self.settings.kind,
            )
            self._note(outcome)
            if outcome.ok:
                self.log.record([Delivery(self.name, alert, DeliveryState.SENT)])
                self.metrics.alert_delivered(self.name, alert.kind.value)
                return
            log.warning(
                "alert sink %s: try %d/%d of alert %s failed: %s",
                self.name,
                attempt,
                self.settings.max_attempts,
                alert.id,
                outcome.detail,
            )
            if not outcome.retry:
                self._drop(alert, DropReason.REJECTED, outcome.detail)
                return
            if attempt == self.settings.max_attempts:
                break
            if self._stop.wait(delay):
                return  # stopping: the alert stays queued in the log for the next start
            delay = min(delay * 2, self.settings.backoff_max_s)
        self._drop(alert, DropReason.GAVE_UP, self.last_error or "")

    def _drop(self, alert: AnyAlert, reason: DropReason, detail: str) -> None:
        self.log.record([Delivery(self.name, alert, DeliveryState.DROPPED, reason.value)])
        self.metrics.alert_dropped(self.name, reason)
        log.error(
            "alert sink %s: dropped alert %s (%s) — %s: %s",
            self.name,
            alert.id,
            alert.kind.value,
            reason.value,
            detail,
        )

    def _note(self, outcome: Attempt) -> None:
        if outcome.ok:
            self.consecutive_failures = 0
            self.last_error = None
            self.up = True
        else:
            self.consecutive_failures += 1
            self.last_error = outcome.detail
            self.up = False
            self.metrics.alert_failed(self.name)
        self.metrics.alert_sink_up(self.name, self.up)

    def _maybe_resend(self) -> None:
        interval = self.settings.resend_interval_s
        if self.settings.kind is not SinkKind.ALERTMANAGER or interval <= 0:
            return
        if time.monotonic() - self._last_resend < interval:
            return
        self._last_resend = time.monotonic()
        firing = self.log.firing(self.name)
        if not firing:
            return
        url, body = request_for(self.settings, firing, self.currency)
        outcome = post_json(self.session, url, body, self.settings.timeout_s, self.settings.headers)
        self._note(outcome)
        if not outcome.ok:
            log.warning(
                "alert sink %s: re-sending firing alerts failed: %s", self.name, outcome.detail
            )

    def idle(self) -> bool:
        return self.queue.unfinished_tasks == 0

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
