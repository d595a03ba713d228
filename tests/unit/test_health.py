"""Liveness and readiness decided from status snapshots (`tally.health`), and served over real
HTTP beside `/metrics` (`tally.health_http`)."""

from __future__ import annotations

import asyncio

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter

from collectors.metrics import CollectorMetrics
from streams.progress import ConsumerProgress
from tally.health import (
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
from tally.health_http import Heartbeat, Probes, start_server
from tally.health_sources import WorkerHealth, alerts_probes, collector_probes

CAUGHT_UP = WorkerStatus(incarnation_known=True, fetch_error=None, partitions=4, lag=0)


@pytest.mark.parametrize(
    ("status", "failed"),
    [
        pytest.param(CAUGHT_UP, (), id="caught-up"),
        pytest.param(WorkerStatus(True, None, 4, 100), (), id="behind-within-the-limit"),
        pytest.param(WorkerStatus(True, None, 4, 101), ("lag",), id="behind-over-the-limit"),
        pytest.param(WorkerStatus(True, None, 4, None), ("lag",), id="lag-unknown"),
        pytest.param(WorkerStatus(True, None, 0, None), ("assigned", "lag"), id="no-partition"),
        pytest.param(
            WorkerStatus(False, None, 0, None),
            ("broker", "assigned", "lag"),
            id="starting",
        ),
        pytest.param(
            WorkerStatus(True, "KafkaConnectionError: gone", 4, 0), ("broker",), id="fetch-failed"
        ),
        pytest.param(WorkerStatus(True, None, 4, 0, 29.0), (), id="answered-recently"),
        pytest.param(WorkerStatus(True, None, 4, 0, 31.0), ("broker",), id="fetches-unanswered"),
    ],
)
def test_worker_readiness(status, failed):
    verdict = worker_readiness(status, max_lag=100)
    assert verdict.failed() == failed
    assert verdict.ok is (failed == ())


@pytest.mark.parametrize(
    ("status", "failed"),
    [
        pytest.param(SchedulerStatus(True, True, None), (), id="ready"),
        pytest.param(
            SchedulerStatus(False, False, None), ("broker", "replayed", "api"), id="replaying"
        ),
        pytest.param(SchedulerStatus(True, False, None), ("api",), id="api-not-yet"),
        pytest.param(
            SchedulerStatus(True, True, "reading balances: timeout"), ("broker",), id="feed-failed"
        ),
    ],
)
def test_scheduler_readiness(status, failed):
    assert scheduler_readiness(status).failed() == failed


@pytest.mark.parametrize(
    ("status", "failed"),
    [
        pytest.param(CollectorStatus(True, 0), (), id="connected-spool-empty"),
        pytest.param(CollectorStatus(True, 3), ("spool",), id="replaying-the-spool"),
        pytest.param(CollectorStatus(False, 0), ("broker",), id="disconnected"),
        pytest.param(CollectorStatus(False, 9), ("broker", "spool"), id="outage"),
    ],
)
def test_collector_readiness(status, failed):
    assert collector_readiness(status).failed() == failed


@pytest.mark.parametrize(
    ("status", "failed"),
    [
        pytest.param(AlertsStatus(True, 8, None), (), id="assigned"),
        pytest.param(AlertsStatus(False, 0, None), ("broker", "assigned"), id="not-started"),
        pytest.param(AlertsStatus(True, 0, None), ("assigned",), id="waiting-for-assignment"),
        pytest.param(AlertsStatus(True, 8, "KafkaError"), ("broker",), id="fetch-failed"),
        pytest.param(AlertsStatus(True, 8, None, 45.0), ("broker",), id="fetches-unanswered"),
    ],
)
def test_alerts_readiness(status, failed):
    assert alerts_readiness(status).failed() == failed


@pytest.mark.parametrize(
    ("status", "ok", "detail"),
    [
        pytest.param(Liveness(0.5, 100.0), True, "ticked 0.5 s ago", id="ticking"),
        pytest.param(Liveness(None, 3.0), True, "starting", id="starting"),
        pytest.param(Liveness(None, 31.0), False, "has not ticked in 31.0 s", id="never-ticked"),
        pytest.param(Liveness(31.0, 100.0), False, "last ticked 31.0 s ago", id="stalled"),
        pytest.param(Liveness(0.5, 100.0, "disk full"), False, "ticked", id="fatal"),
    ],
)
def test_liveness(status, ok, detail):
    verdict = liveness(status, stall_s=30.0)
    assert verdict.ok is ok
    assert detail in verdict.checks[0][1].detail


def test_a_verdict_body_names_every_check():
    body = worker_readiness(WorkerStatus(True, None, 0, None), 10).body("ready", "not_ready")
    assert body["status"] == "not_ready"
    assert body["checks"]["broker"] == {"ok": True, "detail": "connected"}
    assert body["checks"]["assigned"]["ok"] is False
    assert worker_readiness(CAUGHT_UP, 10).body("ready", "not_ready")["status"] == "ready"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_ages_with_its_clock_and_runs_in_a_loop():
    clock = _Clock()
    beat = Heartbeat(clock=clock)
    assert beat.age() is None
    beat.tick()
    clock.now += 7
    assert beat.age() == 7 and beat.up() == 7

    async def run_briefly() -> float | None:
        real = Heartbeat(interval_s=0.01)
        task = asyncio.create_task(real.run())
        await asyncio.sleep(0.05)
        task.cancel()
        return real.age()

    age = asyncio.run(run_briefly())
    assert age is not None and age < 1


# ---------------------------------------------------------------------------- over HTTP


@pytest.fixture
def serve():
    servers = []

    def start(registry: CollectorRegistry, probes: Probes | None) -> str:
        server, _ = start_server(registry, "127.0.0.1", 0, probes)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_health_endpoints_answer_beside_metrics(serve):
    registry = CollectorRegistry()
    Counter("tally_test_things", "Things.", registry=registry).inc(3)
    state = {"ready": False}

    def ready() -> Verdict:
        return collector_readiness(CollectorStatus(state["ready"], 0))

    url = serve(registry, Probes(lambda: liveness(Liveness(0.1, 5.0)), ready))
    assert "tally_test_things_total 3.0" in requests.get(f"{url}/metrics", timeout=5).text
    live = requests.get(f"{url}/healthz", timeout=5)
    assert live.status_code == 200
    assert live.headers["Content-Type"] == "application/json"
    assert live.json()["status"] == "alive"
    not_ready = requests.get(f"{url}/readyz", timeout=5)
    assert not_ready.status_code == 503
    assert not_ready.json() == {
        "status": "not_ready",
        "checks": {
            "broker": {"ok": False, "detail": "not connected yet"},
            "spool": {"ok": True, "detail": "empty"},
        },
    }
    state["ready"] = True
    ready_now = requests.get(f"{url}/readyz", timeout=5)
    assert ready_now.status_code == 200 and ready_now.json()["status"] == "ready"


def test_a_probe_that_raises_answers_503_and_the_server_goes_on(serve):
    def broken() -> Verdict:
        raise RuntimeError("snapshot torn")

    url = serve(CollectorRegistry(), Probes(broken, broken))
    answer = requests.get(f"{url}/healthz", timeout=5)
    assert answer.status_code == 503
    assert answer.json()["checks"]["probe"]["detail"] == "RuntimeError: snapshot torn"
    assert requests.get(f"{url}/metrics", timeout=5).status_code == 200


def test_without_probes_only_metrics_are_served(serve):
    url = serve(CollectorRegistry(), None)
    assert requests.get(f"{url}/readyz", timeout=5).headers["Content-Type"].startswith("text/")


def test_collector_probes_read_its_metrics(serve):
    metrics = CollectorMetrics()
    url = serve(metrics.registry, collector_probes(metrics, Heartbeat()))
    assert requests.get(f"{url}/readyz", timeout=5).status_code == 503
    metrics.broker_up.set(1)
    metrics.spool_records.set(2)
    body = requests.get(f"{url}/readyz", timeout=5).json()
    assert body["checks"]["spool"] == {"ok": False, "detail": "2 messages wait to be replayed"}
    metrics.spool_records.set(0)
    assert requests.get(f"{url}/readyz", timeout=5).status_code == 200


def test_alerts_probes_follow_the_consumer_progress():
    progress = ConsumerProgress()
    probes = alerts_probes(progress, Heartbeat())
    assert not probes.ready().ok
    progress.started, progress.partitions = True, 8
    assert probes.ready().ok
    progress.failed(ConnectionError("broker gone"))
    assert probes.ready().failed() == ("broker",)
    assert probes.live().ok  # starting: not ticked yet, within the grace


def test_worker_health_before_the_worker_exists_is_not_ready():
    health = WorkerHealth(max_lag=10)
    assert health.ready().failed() == ("broker", "assigned", "lag")
    assert health.live().ok
