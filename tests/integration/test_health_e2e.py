"""End to end against a real tansu broker: `tally worker` and `tally collect` serve `/healthz`
and `/readyz` beside `/metrics`. Started with a backlog on the samples topic, the worker is
alive at once, not ready while it has not joined the group or is behind, and ready once
everything on the topic is applied (its own metrics agree). The collector serves on the host
the config (or `--metrics-host`) names, and is ready once connected with an empty spool."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import requests
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import fleet_of, load, pipeline_config, produce, rounds, wait_until
from tests.integration.test_metrics_e2e import MetricsWorker, scrape, value

pytestmark = pytest.mark.broker


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return sum(ends.values())


def test_worker_turns_ready_once_its_backlog_is_applied(broker, tmp_path):
    data = pipeline_config(tmp_path, nodes=1, partitions=2)
    data["worker"] = {"batch_max_messages": 50, "batch_within_s": 0.05, "ready_max_lag": 0}
    config, path = load(tmp_path, data)
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 2)
    produced = rounds(fleet_of(config), 0, 30)
    asyncio.run(produce(broker.bootstrap, topics.samples, produced))
    on_topic = asyncio.run(_end_offsets(broker.bootstrap, topics.samples, 2))
    assert on_topic > 100  # a backlog of several batches of 50

    worker = MetricsWorker(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        base = worker.url().removesuffix("/metrics")
        first = requests.get(f"{base}/readyz", timeout=5)
        assert first.status_code == 503
        assert first.json()["status"] == "not_ready"
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200

        answers: list[requests.Response] = []

        def ready() -> bool:
            answers.append(requests.get(f"{base}/readyz", timeout=5))
            return answers[-1].status_code == 200

        wait_until(ready, 90, "the worker to be ready", worker, interval_s=0.05)
        applied = value(scrape(f"{base}/metrics"), "tally_worker_batch_messages_sum")
        body = answers[-1].json()
        live = requests.get(f"{base}/healthz", timeout=5)
    finally:
        assert worker.stop() == 0

    assert body["status"] == "ready"
    assert body["checks"]["broker"] == {"ok": True, "detail": "connected"}
    assert body["checks"]["assigned"] == {"ok": True, "detail": "2 samples partitions assigned"}
    assert body["checks"]["lag"] == {"ok": True, "detail": "0 messages behind (limit 0)"}
    # ready means every sample on the topic is in the ledger
    assert applied == sum(len(r) for r in produced)
    # before that, it said why not: no partition yet, or messages behind
    reasons = {
        name
        for answer in answers[:-1]
        for name, check in answer.json()["checks"].items()
        if not check["ok"]
    }
    assert reasons & {"assigned", "lag"}
    assert live.status_code == 200
    assert live.json()["status"] == "alive"
    assert live.json()["checks"]["loop"]["ok"] is True


COLLECTOR_URL = re.compile(r"collector metrics on (http://\S+)/metrics")


def _collector(tmp_path: Path, bootstrap: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    data = pipeline_config(tmp_path, nodes=1)
    data["metrics"] = {"collector_port": 0, "collector_host": "127.0.0.2"}
    _, path = load(tmp_path, data)
    log = tmp_path / "collector.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            tally_command(
                *("collect", "--source", "sim", "--config", str(path)),
                *("--bootstrap", bootstrap, "--spool-dir", str(tmp_path / "spool")),
                *extra,
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
    return proc, log


def _base_url(proc: subprocess.Popen, log: Path) -> str:
    found: list[str] = []

    def logged() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")
        found.extend(COLLECTOR_URL.findall(log.read_text(errors="replace")))
        return bool(found)

    wait_until(logged, 60, "the collector to log its metrics URL")
    return found[-1]


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    return proc.wait(30)


def test_collector_serves_health_on_its_configured_host(broker, tmp_path):
    create_topics(broker.bootstrap, ["tally.samples", "tally.alerts"], 2)
    proc, log = _collector(tmp_path, broker.bootstrap)
    try:
        base = _base_url(proc, log)
        assert base.startswith("http://127.0.0.2:")  # metrics.collector_host, not 127.0.0.1
        answers: list[requests.Response] = []

        def ready() -> bool:
            answers.append(requests.get(f"{base}/readyz", timeout=5))
            return answers[-1].status_code == 200

        wait_until(ready, 60, "the collector to be ready")
        assert answers[-1].json()["checks"] == {
            "broker": {"ok": True, "detail": "connected"},
            "spool": {"ok": True, "detail": "empty"},
        }
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        assert "tally_collector_broker_up 1.0" in requests.get(f"{base}/metrics", timeout=5).text
    finally:
        assert _stop(proc) == 0, log.read_text(errors="replace")


def test_collector_without_a_broker_is_alive_but_not_ready(tmp_path):
    proc, log = _collector(tmp_path, "127.0.0.1:1", "--metrics-host", "127.0.0.3")
    try:
        base = _base_url(proc, log)
        assert base.startswith("http://127.0.0.3:")  # --metrics-host wins over the config
        answer = requests.get(f"{base}/readyz", timeout=5)
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        _stop(proc)
    assert answer.status_code == 503
    assert answer.json()["checks"]["broker"]["ok"] is False
