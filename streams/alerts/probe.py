"""`tally alerts test`: a recognisable test alert sent to one sink now, outside the queues and
the delivery log, with the outcome reported (`SendResult`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import requests

from ledger.alerts import Alert, AlertKind
from streams.alerts.payloads import request_for
from streams.alerts.settings import SinkKind, SinkSettings
from streams.alerts.webhook import Attempt, post_json

TEST_SUBJECT = "tally-test"


def sample_alert(now_us: int | None = None) -> Alert:
    """A recognisable alert for `tally alerts test` (its id is unique per call)."""
    now = now_us if now_us is not None else time.time_ns() // 1_000
    return Alert(
        id=f"tally-test-{now}",
        kind=AlertKind.DETECTED,
        subject=TEST_SUBJECT,
        gpu_uuid="GPU-TEST",
        node="test-node",
        pool="test-pool",
        model="Test GPU",
        team="test-team",
        project="test-project",
        user="test-user",
        job="test-job",
        since_us=now - 30 * 60_000_000,
        at_us=now,
        waste_gpu_ms=30 * 60_000,
        waste_micros=1_500_000,
    )


@dataclass(frozen=True, slots=True)
class SendResult:
    """How a test send to one sink went (`attempts`: the tries it took)."""

    sink: str
    kind: SinkKind
    ok: bool
    detail: str
    attempts: int


def send_test(
    sink: SinkSettings,
    currency: str = "USD",
    session: requests.Session | None = None,
    attempts: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> SendResult:
    """Send a test alert to one sink now (with up to `attempts` tries); for Alertmanager also
    its resolution, so nothing is left firing."""
    http = session or requests.Session()
    alert = sample_alert()
    delay = sink.backoff_initial_s
    tries = min(attempts, sink.max_attempts)
    outcome = Attempt(False, True, "not tried")
    used = 0
    for used in range(1, tries + 1):
        url, body = request_for(sink, [alert], currency)
        outcome = post_json(http, url, body, sink.timeout_s, sink.headers, sink.kind)
        if outcome.ok or not outcome.retry or used == tries:
            break
        sleep(delay)
        delay = min(delay * 2, sink.backoff_max_s)
    if outcome.ok and sink.kind is SinkKind.ALERTMANAGER:
        resolved = replace(alert, kind=AlertKind.RESOLVED, id=alert.id + "-resolved")
        url, body = request_for(sink, [resolved], currency)
        post_json(http, url, body, sink.timeout_s, sink.headers)
    return SendResult(sink.name, sink.kind, outcome.ok, outcome.detail, used)
