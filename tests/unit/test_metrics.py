"""The Prometheus metrics: ledger gauges from the seeded ledger, the worker and alert helpers,
the sections each process serves, the `/metrics` endpoint over HTTP, the `metrics:` config
section, and a port already in use (a clear error and exit code 2 from `tally worker`,
`tally scheduler run` and `tally up`, before anything else starts)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ledger.read import rollups
from ledger.read.reports import ReportQueries
from streams.worker import WorkerObserver
from tally.cli import cli
from tally.config import ConfigError, parse_config
from tally.metrics import (
    LedgerCollector,
    MetricsPortError,
    TallyMetrics,
    free_port,
    metrics_url,
    serve_metrics,
)
from tests.conftest import child_env, tally_command, write_config
from tests.unit.test_dashboard_seed import END_US, seeded  # noqa: F401 (fixture)
from tests.unit.test_scheduler_service_support import config_data


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


def _families(metrics: TallyMetrics) -> set[str]:
    return {m.name for m in metrics.registry.collect()}


def test_each_process_serves_only_its_own_sections(tmp_path):
    worker = TallyMetrics(tmp_path / "empty", sections=("worker",))
    observer: WorkerObserver = worker  # the worker's port, implemented by the metrics
    observer.observe_batch(3, 12, 0.01)
    scheduler = TallyMetrics(sections=("scheduler",))
    scheduler.admitted("dev", 1)
    scheduler.observe_batch(1, 1, 0.1)  # a section left out still takes observations, unseen
    assert {"tally_worker_batch_messages", "tally_idle_gpus", "tally_ledger_segments"} <= (
        _families(worker)
    )
    assert not {f for f in _families(worker) if f.startswith(("tally_scheduler", "tally_alert"))}
    assert {f for f in _families(scheduler)} == {
        "tally_scheduler_queue_length",
        "tally_scheduler_admissions",
        "tally_scheduler_preemptions",
        "tally_scheduler_undeliverable",
    }
    assert _value(worker, "tally_worker_batch_postings_sum") == 12
    with pytest.raises(ValueError, match="unknown metrics sections: ledger"):
        TallyMetrics(sections=("ledger",))


def test_metrics_config_defaults_and_validation(tmp_path):
    config = parse_config(config_data(tmp_path), "t.yaml")
    m = config.metrics
    assert (m.enabled, m.host, m.worker_port, m.scheduler_port) == (True, "127.0.0.1", 9464, 9465)
    data = config_data(tmp_path) | {"metrics": {"worker_port": 9500, "scheduler_port": 9500}}
    with pytest.raises(ConfigError, match="worker_port and scheduler_port must differ"):
        parse_config(data, "t.yaml")
    zeros = config_data(tmp_path) | {"metrics": {"worker_port": 0, "scheduler_port": 0}}
    assert parse_config(zeros, "t.yaml").metrics.worker_port == 0
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        parse_config(config_data(tmp_path) | {"metrics": {"port": 1}}, "t.yaml")


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_is_a_clear_error(taken):
    with pytest.raises(MetricsPortError) as caught:
        serve_metrics(TallyMetrics(), "127.0.0.1", taken)
    assert (
        str(caught.value)
        == f"cannot serve metrics on 127.0.0.1:{taken}: the port is already in use"
    )
    assert isinstance(caught.value, OSError)
    with pytest.raises(MetricsPortError, match="already in use"):
        free_port("127.0.0.1", taken)
    port = free_port("127.0.0.1", 0)
    assert port > 0 and free_port("127.0.0.1", port) == port  # released: usable again
    assert metrics_url("::1", 9464) == "http://[::1]:9464/metrics"


def _config_file(tmp_path: Path, **metrics: object) -> Path:
    return write_config(tmp_path / "tally.yaml", config_data(tmp_path) | {"metrics": metrics})


def test_tally_worker_exits_2_without_a_traceback_when_its_port_is_taken(tmp_path, taken):
    path = _config_file(tmp_path, worker_port=taken)
    done = subprocess.run(
        tally_command("worker", "--config", str(path)),
        check=False,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert f"error: cannot serve metrics on 127.0.0.1:{taken}: the port is already in use" in (
        done.stderr
    )
    assert "metrics.worker_port or --metrics-port" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_scheduler_and_up_exit_2_when_a_metrics_port_is_taken(tmp_path, taken):
    path = _config_file(tmp_path, scheduler_port=taken)
    result = CliRunner().invoke(cli, ["scheduler", "run", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert f"cannot serve metrics on 127.0.0.1:{taken}: the port is already in use" in (
        result.stderr
    )
    # `tally up` checks both ports before it starts the broker or any child
    result = CliRunner().invoke(cli, ["up", "--config", str(path), "--no-dashboard"])
    assert result.exit_code == 2, result.output
    assert "already in use" in result.stderr and "metrics:" in result.stderr
    assert not (tmp_path / "run").exists()
    # --metrics-port overrides the config, even one with metrics disabled
    path = _config_file(tmp_path, enabled=False)
    result = CliRunner().invoke(
        cli, ["scheduler", "run", "--config", str(path), "--metrics-port", str(taken)]
    )
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{taken}: the port is already in use" in result.stderr
