"""The Prometheus metrics: ledger gauges from the seeded ledger, the worker and alert helpers,
and the `/metrics` endpoint over HTTP."""

from __future__ import annotations

import requests
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ledger import rollups
from ledger.reports import ReportQueries
from tally.metrics import LedgerCollector, TallyMetrics, serve_metrics
from tests.unit.test_dashboard_seed import END_US, seeded  # noqa: F401 (fixture)


def _value(metrics: TallyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_idle_gpus_and_lag_come_from_the_newest_sealed_data(seeded):  # noqa: F811
    metrics = TallyMetrics(seeded)
    assert metrics.ledger is not None
    metrics.ledger.clock = lambda: END_US / 1e6 + 90
    queries = ReportQueries(seeded)
    now = rollups.fleet_now(queries)
    queries.close()
    assert (
        _value(metrics, "tally_idle_gpus", kind="allocated_idle")
        == now.count(rollups.GpuState.ALLOCATED_IDLE)
        == 1
    )
    assert _value(metrics, "tally_idle_gpus", kind="unallocated") == 1
    assert _value(metrics, "tally_gpus_reporting") == 6
    assert _value(metrics, "tally_ledger_lag_seconds") == 90
    assert _value(metrics, "tally_ledger_newest_sealed_timestamp_seconds") == END_US / 1e6
    assert _value(metrics, "tally_ledger_segments") == len(ReportQueries(seeded).segments())


def test_an_empty_ledger_has_no_lag_and_no_idle_gpus(tmp_path):
    metrics = TallyMetrics(tmp_path / "empty")
    assert _value(metrics, "tally_idle_gpus", kind="unallocated") == 0
    assert _value(metrics, "tally_ledger_lag_seconds") is None


def test_the_ledger_scan_is_cached_per_ledger_version(seeded, monkeypatch):  # noqa: F811
    collector = LedgerCollector(seeded)
    calls = []
    real = rollups.fleet_now

    def counting(q, *args):
        calls.append(1)
        return real(q, *args)

    monkeypatch.setattr("tally.metrics.fleet_now", counting)
    list(collector.collect())
    list(collector.collect())
    assert len(calls) == 1


def test_worker_scheduler_and_alert_helpers():
    metrics = TallyMetrics()
    metrics.observe_batch(messages=200, postings=800, commit_seconds=0.02)
    metrics.observe_batch(messages=10, postings=40, commit_seconds=0.5)
    metrics.worker_error("decode")
    metrics.dead_letter(3)
    metrics.admitted("default")
    metrics.preempted("default", 2)
    metrics.scheduler_queue_length("default", 7)
    metrics.alert_delivered("ops", "tally.idle.detected")
    metrics.alert_failed("ops")
    metrics.alert_dropped("ops", "gave_up")
    metrics.alert_queue("ops", 4)
    metrics.alert_sink_up("ops", False)
    assert _value(metrics, "tally_worker_batch_messages_count") == 2
    assert _value(metrics, "tally_worker_batch_postings_sum") == 840
    assert _value(metrics, "tally_worker_commit_seconds_bucket", le="0.025") == 1
    assert _value(metrics, "tally_worker_errors_total", kind="decode") == 1
    assert _value(metrics, "tally_worker_dead_letters_total") == 3
    assert _value(metrics, "tally_scheduler_admissions_total", queue="default") == 1
    assert _value(metrics, "tally_scheduler_preemptions_total", queue="default") == 2
    assert _value(metrics, "tally_scheduler_queue_length", queue="default") == 7
    assert _value(metrics, "tally_alert_deliveries_total", sink="ops", kind="tally.idle.detected")
    assert _value(metrics, "tally_alert_delivery_failures_total", sink="ops") == 1
    assert _value(metrics, "tally_alert_drops_total", sink="ops", reason="gave_up") == 1
    assert _value(metrics, "tally_alert_queue_length", sink="ops") == 4
    assert _value(metrics, "tally_alert_sink_up", sink="ops") == 0


def test_metrics_endpoint_serves_its_own_registry(seeded):  # noqa: F811
    metrics = TallyMetrics(seeded)
    metrics.observe_batch(5, 20, 0.01)
    server, _ = serve_metrics(metrics, "127.0.0.1", 0)
    try:
        response = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
    finally:
        server.shutdown()
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert {
        "tally_idle_gpus",
        "tally_ledger_lag_seconds",
        "tally_worker_batch_messages",
        "tally_alert_deliveries",
        "tally_scheduler_admissions",
    } <= set(families)
    idle = {s.labels["kind"]: s.value for s in families["tally_idle_gpus"].samples}
    assert idle == {"allocated_idle": 1.0, "unallocated": 1.0}
    assert "python_gc_objects_collected" not in families  # not the process-global registry
    assert REGISTRY.get_sample_value("tally_worker_batch_messages_count") is None
