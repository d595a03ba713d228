"""Webhook delivery of idle-GPU alerts against real HTTP servers on 127.0.0.1: the Slack and
Alertmanager payloads, dedupe (also across a restart), resolve, retries with backoff, and a sink
that is down not holding up the others."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner

from ledger.alerts import (
    Alert,
    AlertKind,
    IdleAlert,
    ResolveReason,
    alert_to_dict,
    decode_alert,
    encode_alert,
)
from ledger.errors import EventError
from ledger.events import GpuHealth, HealthKind, Owner, SampleSource, encode_health
from streams.alerts.consumer import consume_alerts, read_alert
from streams.alerts.delivery_log import DeliveryLog, DeliveryState
from streams.alerts.dispatcher import AlertDispatcher
from streams.alerts.settings import SinkKind, SinkSettings
from tally.alerts_config import AlertSinkConfig
from tally.cli import cli
from tally.metrics import TallyMetrics
from tests.builders import T0_US, a_config_dict

MIN_US = 60_000_000


@dataclass
class Receiver:
    """A webhook on 127.0.0.1: records each POST, answers from `script` then `status`."""

    server: ThreadingHTTPServer
    posts: list[tuple[str, Any]] = field(default_factory=list)
    script: list[int] = field(default_factory=list)
    status: int = 200
    delay_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[tuple[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(self.posts) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.posts)


def _start_receiver() -> Receiver:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            status = receiver.script.pop(0) if receiver.script else receiver.status
            receiver.posts.append((self.path, json.loads(body)))
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"nope")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver


def _stop_receiver(receiver: Receiver) -> None:
    receiver.server.shutdown()  # stops serve_forever; its listening socket stays open until
    receiver.server.server_close()  # closed here (else: "unclosed socket" when collected)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = _start_receiver()
    yield r
    _stop_receiver(r)


@pytest.fixture
def second() -> Iterator[Receiver]:
    r = _start_receiver()
    yield r
    _stop_receiver(r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _detected(gpu: str = "GPU-H1", at_us: int = T0_US + 40 * MIN_US) -> Alert:
    idle = IdleAlert(
        kind=AlertKind.DETECTED,
        subject=gpu,
        gpu_uuid=gpu,
        node="node-h1",
        pool="h100",
        model="NVIDIA H100 80GB HBM3",
        owner=Owner("vision", "segmentation", "ada", "job-7"),
        since_us=T0_US,
        at_us=at_us,
        waste_gpu_ms=10 * 60_000,
        waste_micros=600_000,
    )
    return decode_alert(encode_alert(idle))


def _resolved(detected: Alert) -> Alert:
    idle = IdleAlert(
        kind=AlertKind.RESOLVED,
        subject=detected.subject,
        gpu_uuid=detected.gpu_uuid,
        node=detected.node,
        pool=detected.pool,
        model=detected.model,
        owner=Owner("vision", "segmentation", "ada", "job-7"),
        since_us=detected.since_us,
        at_us=detected.at_us + 30 * MIN_US,
        waste_gpu_ms=40 * 60_000,
        waste_micros=2_400_000,
        reason=ResolveReason.BUSY_AGAIN,
    )
    return decode_alert(encode_alert(idle))


def _sink(url: str, kind: SinkKind = SinkKind.SLACK, name: str = "ops", **kw: Any) -> SinkSettings:
    """A sink as the configuration gives it to delivery (fast retries for the tests)."""
    defaults: dict[str, Any] = {
        "timeout_s": 2.0,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.1,
        "resend_interval_s": 0,
    }
    return AlertSinkConfig(name=name, kind=kind, url=url, **(defaults | kw)).settings()


def _sample(metrics: TallyMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_an_alert_round_trips_through_the_topic_encoding():
    alert = _detected()
    assert alert.kind is AlertKind.DETECTED
    assert (alert.team, alert.project, alert.user, alert.job) == (
        "vision",
        "segmentation",
        "ada",
        "job-7",
    )
    assert decode_alert(json.dumps(alert_to_dict(alert))) == alert
    with pytest.raises(EventError, match="not an idle-GPU alert"):
        decode_alert(b'{"id": 1}')


def test_health_events_on_the_alerts_topic_are_skipped_quietly(caplog):
    health = GpuHealth(
        node="node-h1",
        gpu_uuid="GPU-H1",
        gpu_index=0,
        kind=HealthKind.GPU_LOST,
        detail="GPU 0 lost: GPU is lost",
        time_us=T0_US,
        source=SampleSource.NVML,
    )
    caplog.set_level(logging.DEBUG, logger="tally.alerts")
    assert read_alert(encode_health(health, source="nvml://node-h1"), "alerts[0]@3") is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "alerts[0]@3" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    "value", [None, b"", b"junk", b"[]", b'{"type": "tally.idle.detected", "data": {}}']
)
def test_malformed_messages_on_the_alerts_topic_are_logged_as_errors(value, caplog):
    caplog.set_level(logging.DEBUG, logger="tally.alerts")
    assert read_alert(value, "alerts[1]@9") is None
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "alerts[1]@9" in record.getMessage() and "not an idle-GPU alert" in record.getMessage()


def test_an_alert_on_the_alerts_topic_is_read(caplog):
    alert = _detected()
    assert read_alert(orjson.dumps(alert_to_dict(alert)), "alerts[0]@1") == alert
    assert not caplog.records


def test_sink_config_becomes_the_settings_delivery_runs_on():
    config = AlertSinkConfig(
        name="am", kind="alertmanager", url="http://am:9093/", headers={"X-Team": "ops"}
    )
    settings = config.settings()
    assert settings.kind is SinkKind.ALERTMANAGER
    assert settings.endpoint == "http://am:9093/api/v2/alerts"
    assert (settings.timeout_s, settings.max_attempts, settings.queue_size) == (5.0, 8, 1000)
    assert dict(settings.headers) == {"X-Team": "ops"}
    slack = AlertSinkConfig(name="chat", kind="slack", url="https://hooks.example/T/B")
    assert slack.settings().endpoint == "https://hooks.example/T/B"


def test_slack_payload_names_the_gpu_the_owner_and_the_waste(receiver, tmp_path):
    dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path, "EUR").start()
    try:
        assert dispatcher.submit([_detected()]) == 1
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    ((path, body),) = receiver.posts
    assert path == "/"
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith(":warning: GPU GPU-H1 on node-h1")
    assert "vision/segmentation (user ada, job job-7)" in body["text"]
    assert "Waste so far: 0.60 EUR for 0.17 GPU-hours" in body["text"]
    assert body["blocks"][0] == {
        "type": "section",
        "text": {"type": "mrkdwn", "text": body["text"]},
    }
    assert {"type": "mrkdwn", "text": "*Owner*\nvision/segmentation (user ada, job job-7)"} in body[
        "blocks"
    ][1]["fields"]


def test_alertmanager_payload_and_resolve_share_the_labels(receiver, tmp_path):
    sink = _sink(receiver.url, SinkKind.ALERTMANAGER, dashboard_url="http://dash:8501")
    detected = _detected()
    dispatcher = AlertDispatcher([sink], tmp_path).start()
    try:
        dispatcher.submit([detected])
        receiver.wait_for(1)
        dispatcher.submit([_resolved(detected)])
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    (fire_path, fire), (resolve_path, resolve) = receiver.posts
    assert fire_path == resolve_path == "/api/v2/alerts"
    assert isinstance(fire, list) and len(fire) == 1
    (firing,) = fire
    (resolving,) = resolve
    assert firing["labels"] == resolving["labels"]
    assert firing["labels"] == {
        "alertname": "TallyGpuAllocatedIdle",
        "severity": "warning",
        "source": "tally",
        "subject": "GPU-H1",
        "gpu_uuid": "GPU-H1",
        "node": "node-h1",
        "pool": "h100",
        "model": "NVIDIA H100 80GB HBM3",
        "team": "vision",
        "project": "segmentation",
        "user": "ada",
        "job": "job-7",
    }
    assert firing["startsAt"] == resolving["startsAt"] == "2026-11-01T00:00:00Z"
    assert "endsAt" not in firing  # no resend interval: Alertmanager's resolve_timeout applies
    assert resolving["endsAt"] == "2026-11-01T01:10:00Z"
    assert firing["generatorURL"] == "http://dash:8501"
    assert resolving["annotations"]["summary"].startswith("Resolved: GPU GPU-H1")
    assert "busy again" in resolving["annotations"]["summary"]


def test_firing_alerts_are_resent_to_alertmanager_until_resolved(receiver, tmp_path):
    sink = _sink(receiver.url, SinkKind.ALERTMANAGER, resend_interval_s=0.2)
    dispatcher = AlertDispatcher([sink], tmp_path).start()
    try:
        detected = _detected()
        dispatcher.submit([detected])
        posts = receiver.wait_for(3)
        assert len(posts) >= 3
        assert all(body[0]["labels"]["gpu_uuid"] == "GPU-H1" for _, body in posts)
        assert all("endsAt" in body[0] for _, body in posts)  # expire unless re-sent
        dispatcher.submit([_resolved(detected)])
        dispatcher.drain(10)
        time.sleep(0.6)
        count = len(receiver.posts)
        time.sleep(0.6)
        assert len(receiver.posts) == count  # nothing firing: nothing re-sent
    finally:
        dispatcher.stop()


def test_duplicates_are_delivered_once_also_after_a_restart(receiver, tmp_path):
    alert = _detected()
    dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path).start()
    try:
        assert dispatcher.submit([alert, alert]) == 1
        assert dispatcher.submit([alert]) == 0
        dispatcher.drain(10)
    finally:
        dispatcher.stop()
    restarted = AlertDispatcher([_sink(receiver.url)], tmp_path).start()
    try:
        assert restarted.submit([alert]) == 0
        assert restarted.submit([_resolved(alert)]) == 1
        restarted.drain(10)
    finally:
        restarted.stop()
    kinds = [body["text"].split()[0] for _, body in receiver.posts]
    assert kinds == [":warning:", ":white_check_mark:"]


def test_a_failing_receiver_is_retried_with_backoff(receiver, tmp_path):
    receiver.script = [503, 500, 429]
    metrics = TallyMetrics()
    dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path, metrics=metrics).start()
    try:
        started = time.monotonic()
        dispatcher.submit([_detected()])
        assert dispatcher.drain(10)
        elapsed = time.monotonic() - started
    finally:
        dispatcher.stop()
    assert len(receiver.posts) == 4  # three failures, then accepted
    assert elapsed >= 0.02 + 0.04 + 0.08  # backoff doubled between tries
    assert _sample(metrics, "tally_alert_delivery_failures_total", sink="ops") == 3
    assert (
        _sample(metrics, "tally_alert_deliveries_total", sink="ops", kind="tally.idle.detected")
        == 1
    )
    assert _sample(metrics, "tally_alert_sink_up", sink="ops") == 1
    log = DeliveryLog(tmp_path)
    assert log.state("ops", _detected().id).state is DeliveryState.SENT
    log.close()


def test_a_sink_that_keeps_failing_gives_up_and_counts_the_drop(receiver, tmp_path):
    receiver.status = 502
    metrics = TallyMetrics()
    sink = _sink(receiver.url, max_attempts=3)
    dispatcher = AlertDispatcher([sink], tmp_path, metrics=metrics).start()
    try:
        dispatcher.submit([_detected()])
        assert dispatcher.drain(10)
        health = dispatcher.health()["ops"]
    finally:
        dispatcher.stop()
    assert len(receiver.posts) == 3
    assert health["up"] is False and health["consecutive_failures"] == 3
    assert "HTTP 502" in health["last_error"]
    assert _sample(metrics, "tally_alert_drops_total", sink="ops", reason="gave_up") == 1
    assert _sample(metrics, "tally_alert_sink_up", sink="ops") == 0


def test_a_rejected_payload_is_not_retried(receiver, tmp_path):
    receiver.status = 400
    metrics = TallyMetrics()
    dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path, metrics=metrics).start()
    try:
        dispatcher.submit([_detected()])
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    assert len(receiver.posts) == 1
    assert _sample(metrics, "tally_alert_drops_total", sink="ops", reason="rejected") == 1


def test_a_down_sink_does_not_block_the_stream_or_the_other_sinks(receiver, second, tmp_path):
    second.delay_s = 1.0  # answers after the sink's timeout: every try times out
    slow = _sink(second.url, name="slow", timeout_s=0.3, max_attempts=3)
    gone = _sink(f"http://127.0.0.1:{_free_port()}", name="gone", max_attempts=1000)
    fine = _sink(receiver.url, name="fine")
    metrics = TallyMetrics()
    dispatcher = AlertDispatcher([slow, gone, fine], tmp_path, metrics=metrics).start()
    try:
        started = time.monotonic()
        alerts = [_detected(f"GPU-{i}") for i in range(5)]
        assert dispatcher.submit(alerts) == 15
        assert time.monotonic() - started < 0.5  # submit only records and queues
        assert len(receiver.wait_for(5, timeout_s=5)) == 5
        assert time.monotonic() - started < 3
        assert dispatcher.health()["gone"]["up"] is False
        assert _sample(metrics, "tally_alert_delivery_failures_total", sink="gone") >= 1
    finally:
        dispatcher.stop(timeout_s=2)


def test_a_full_queue_drops_the_alert_and_says_so(second, tmp_path, caplog):
    second.delay_s = 1.0
    sink = _sink(second.url, name="tiny", queue_size=1, timeout_s=0.2, max_attempts=1)
    metrics = TallyMetrics()
    dispatcher = AlertDispatcher([sink], tmp_path, metrics=metrics).start()
    try:
        dispatcher.submit([_detected("GPU-0")])
        time.sleep(0.05)  # the worker took GPU-0 and is waiting on the receiver
        dispatcher.submit([_detected(f"GPU-{i}") for i in range(1, 4)])
    finally:
        dispatcher.stop(timeout_s=2)
    assert _sample(metrics, "tally_alert_drops_total", sink="tiny", reason="queue_full") == 2
    assert any("queue full" in r.getMessage() for r in caplog.records)
    log = DeliveryLog(tmp_path)
    assert log.state("tiny", _detected("GPU-3").id).reason == "queue_full"
    log.close()


def test_alerts_queued_before_a_restart_are_delivered_after_it(receiver, tmp_path):
    down = _sink(f"http://127.0.0.1:{_free_port()}", max_attempts=1000, backoff_max_s=5)
    dispatcher = AlertDispatcher([down], tmp_path).start()
    alert = _detected()
    dispatcher.submit([alert])
    time.sleep(0.1)
    dispatcher.stop(timeout_s=2)  # stopped while retrying: the alert stays queued
    restarted = AlertDispatcher([_sink(receiver.url)], tmp_path).start()
    try:
        assert restarted.drain(10)
    finally:
        restarted.stop()
    ((_, body),) = receiver.posts
    assert "GPU-H1" in body["text"]


def _config_file(tmp_path, sinks: list[dict[str, Any]]):
    path = tmp_path / "tally.yaml"
    data = a_config_dict(ledger={"data_dir": str(tmp_path / "data")}, alerts={"sinks": sinks})
    path.write_text(yaml.safe_dump(data))
    return path


def test_alerts_test_command_reports_each_sink(receiver, second, tmp_path):
    path = _config_file(
        tmp_path,
        [
            {"name": "chat", "kind": "slack", "url": receiver.url},
            {"name": "am", "kind": "alertmanager", "url": second.url},
            {
                "name": "broken",
                "kind": "slack",
                "url": f"http://127.0.0.1:{_free_port()}/hook",
                "timeout_s": 0.5,
                "backoff_initial_s": 0.01,
            },
        ],
    )
    result = CliRunner().invoke(cli, ["alerts", "test", "--config", str(path)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("ok      chat (slack): HTTP 200") for line in lines)
    assert any(line.startswith("ok      am (alertmanager): HTTP 200") for line in lines)
    assert any(line.startswith("FAILED  broken (slack) after 3 tries") for line in lines)
    ((_, slack),) = receiver.posts
    assert "GPU-TEST" in slack["text"]
    (_, fire), (_, resolve) = second.posts  # the test alert is resolved again at once
    assert "endsAt" in resolve[0] and fire[0]["labels"] == resolve[0]["labels"]


def test_alerts_test_command_succeeds_when_every_sink_answers(receiver, tmp_path):
    path = _config_file(tmp_path, [{"name": "chat", "kind": "slack", "url": receiver.url}])
    result = CliRunner().invoke(cli, ["alerts", "test", "--config", str(path)])
    assert result.exit_code == 0, result.output


def test_alert_sink_config_is_validated_with_file_and_field(tmp_path):
    path = _config_file(tmp_path, [{"name": "x", "kind": "pager", "url": "ftp://nope"}])
    result = CliRunner().invoke(cli, ["alerts", "test", "--config", str(path)])
    assert result.exit_code == 2
    assert "alerts.sinks[0].kind" in result.output
    assert "alerts.sinks[0].url" in result.output


@pytest.mark.broker
def test_run_loop_delivers_from_the_alerts_topic(broker, receiver, tmp_path):
    import asyncio

    from aiokafka import AIOKafkaProducer

    from tests.conftest import create_topics

    create_topics(broker.bootstrap, ["t.alerts"], partitions=2)
    idle = IdleAlert(
        kind=AlertKind.DETECTED,
        subject="GPU-9",
        gpu_uuid="GPU-9",
        node="n",
        pool="p",
        model="m",
        owner=Owner("vision", None, None, None),
        since_us=T0_US,
        at_us=T0_US + 40 * MIN_US,
        waste_gpu_ms=1,
        waste_micros=1,
    )

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        for value in (encode_alert(idle), encode_alert(idle), b"not json"):  # a resend, junk
            await producer.send_and_wait("t.alerts", value, key=b"GPU-9")
        await producer.stop()
        dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path).start()
        stop = asyncio.Event()
        task = asyncio.create_task(
            consume_alerts((broker.bootstrap,), "t.alerts", dispatcher, stop=stop)
        )
        deadline = time.monotonic() + 20
        while not receiver.posts and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        stop.set()
        await task
        dispatcher.stop()

    asyncio.run(scenario())
    assert len(receiver.posts) == 1
    assert "GPU-9" in receiver.posts[0][1]["text"]


def test_resolved_alert_keeps_the_episode(tmp_path):
    detected = _detected()
    resolved = _resolved(detected)
    assert resolved.episode == detected.episode and resolved.id != detected.id
    assert replace(detected, kind=AlertKind.RESOLVED).resolved
