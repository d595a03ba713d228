"""End to end with real processes on a real tansu broker: the simulated collector reports a
node of three GPUs; an XID 79 published for the GPU a job runs on (as a collector sends it, on
`inventory-reports`) → the worker folds it (unhealthy) and raises a health alert → the
scheduler requeues the job with `gpu_unhealthy` (same attempt) onto another GPU and places
nothing new on the sick one; `tally inventory cordon` of another GPU (an operator's token: a
viewer's is refused before sending) stops placements there too and `uncordon` brings it back;
`tally alerts run` delivers the alert, with the XID's meaning, to a webhook receiver on
loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.events import GpuHealth, HealthKind, SampleSource, encode_health
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_inventory
from streams.kafka import ensure_topics
from tally.broker import free_port
from tests.conftest import child_env, tally_command
from tests.integration.support import (
    CollectorProcess,
    WorkerProcess,
    load,
    pipeline_config,
    wait_until,
)
from tests.integration.test_scheduler_e2e import ADMIN, VISION, SchedulerProcess, tally
from tests.unit.test_alerting import Receiver, _start_receiver

OPERATOR = "operator-token-0123456789"
VIEWER = "viewer-token-0123456789"

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture
def hook() -> Iterator[Receiver]:
    """A Slack-style webhook receiver on 127.0.0.1."""
    r = _start_receiver()
    yield r
    r.server.shutdown()


def _config(tmp_path: Path, port: int, hook: str) -> dict[str, Any]:
    tokens = tmp_path / "tokens.yaml"
    named = [
        {"name": "ops", "token": OPERATOR, "role": "operator"},
        {"name": "board", "token": VIEWER, "role": "viewer"},
    ]
    tokens.write_text(
        yaml.safe_dump({"admin": ADMIN, "teams": {"vision": VISION}, "tokens": named})
    )
    data = pipeline_config(tmp_path, nodes=1, partitions=2)
    data["fleet"]["pools"] = [data["fleet"]["pools"][0] | {"gpus_per_node": 3}]  # a100 only
    data["fleet"]["workloads"] = {"training": 0, "inference": 0, "notebook": 0, "unallocated": 1}
    data["sampling"] = {"interval_s": 1}
    data["inventory"] = {"stale_after_intervals": 30, "report_every_rounds": 1}
    data["quotas"] = [{"team": "vision", "pool": "a100", "model": "A100", "nominal": 8}]
    data["queues"] = [{"name": "dev", "class": "dev"}]
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    data["alerts"] = {"sinks": [{"name": "ops", "kind": "slack", "url": hook}]}
    return data


async def _publish(bootstrap: str, topic: str, health: GpuHealth) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        source = f"{health.source.value}://{health.node}"
        await producer.send_and_wait(topic, encode_health(health, source), key=health.node.encode())
    finally:
        await producer.stop()


def test_an_xid_79_requeues_the_job_and_cordons_keep_placements_off(
    broker,
    hook: Receiver,
    tmp_path: Path,
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    config, path = load(tmp_path, _config(tmp_path, port, hook.url))
    topics = config.topics
    asyncio.run(ensure_topics(broker.bootstrap, list(topics.all().values()), 2, topics.compacted()))
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    collector = CollectorProcess(path, broker.bootstrap, tmp_path / "collect.log").start()
    scheduler = SchedulerProcess(path, broker.bootstrap, tmp_path / "scheduler.log", api).start()
    alerts_log = tmp_path / "alerts.log"
    with alerts_log.open("ab") as out:
        alerts = subprocess.Popen(
            tally_command("alerts", "run", "--config", str(path), "--bootstrap", broker.bootstrap),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
    cli = ("--api", api, "--token", VISION)
    release = tmp_path / "release"
    wait = ("sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done")

    def gpus() -> dict[str, dict[str, Any]]:
        return {g["uuid"]: g for g in scheduler.get("/v1/inventory", VISION)["gpus"]}

    def submit(*command: str) -> str:
        args = ("job", "submit", *cli, "-q", "dev", "-p", "detection", "--gpus", "1")
        done = tally(*args, "--", *command)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def job(job_id: str) -> dict[str, Any]:
        return dict(scheduler.get(f"/v1/jobs/{job_id}")["job"])

    def on(job_id: str) -> str:
        (uuid,) = job(job_id)["assigned"]["gpu_uuids"]
        return str(uuid)

    try:
        wait_until(lambda: len(gpus()) == 3, 60, "the collector's three GPUs", worker)
        node = next(iter(gpus().values()))["node"]
        first = submit(*wait)
        wait_until(lambda: job(first)["state"] == "running", 30, "the first job to run", worker)
        sick = on(first)
        index = gpus()[sick]["index"]

        xid = GpuHealth(
            node,
            sick,
            index,
            HealthKind.XID_ERROR,
            "XID 79",
            time.time_ns() // 1000,
            SampleSource.SIMULATED,
            79,
        )
        asyncio.run(_publish(broker.bootstrap, topics.inventory_reports, xid))
        wait_until(
            lambda: gpus()[sick]["health"] == "unhealthy", 30, "the GPU to be unhealthy", worker
        )
        wait_until(
            lambda: job(first)["state"] == "running" and on(first) != sick,
            30,
            "the job to run again on another GPU",
            worker,
        )
        explained = tally("job", "explain", *cli, first)
        assert f"preempted by GPU {sick}: gpu_unhealthy" in explained.stdout, explained.stdout
        assert job(first)["attempt"] == 1  # a preemption, not a retry
        assert not gpus()[sick]["placeable"]
        assert "fallen off the bus" in (gpus()[sick]["health_reason"] or "")

        # cordon the last free GPU: the next job waits (sick and cordoned, the third busy)
        free = next(u for u in gpus() if u not in (sick, on(first)))
        wait_until(
            lambda: free in {g.uuid for g in load_inventory(config.ledger.data_dir / SEGMENTS_DIR)},
            30,
            "the sealed inventory to list the GPU",
            worker,
        )
        base = ("--config", str(path), "--bootstrap", broker.bootstrap, "--reason", "fan")
        refused = tally("inventory", "cordon", free, *base, "--token", VIEWER)
        assert refused.returncode == 2, refused.stderr  # a viewer cordons nothing: not sent
        assert "refused for viewer:board: role viewer may not gpu.cordon" in refused.stderr
        # an operator's cordon records its role; the worker checks it and applies it
        done = tally("inventory", "cordon", free, *base, "--actor", "ops", "--token", OPERATOR)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: gpus()[free]["cordoned"], 30, "the cordon to reach the scheduler")
        assert gpus()[free]["cordoned_by"] == "ops" and not gpus()[free]["placeable"]
        second = submit("true")
        wait_until(lambda: job(second)["reason"] is not None, 30, "the second job to wait")
        assert job(second)["state"] == "pending"
        time.sleep(1)  # a few cycles: still nothing for it
        assert job(second)["state"] == "pending"

        done = tally("inventory", "uncordon", free, *base)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: job(second)["state"] == "finished", 30, "the second job to run")
        assert on(second) == free

        posts = hook.wait_for(1, 30)
        texts = [body["text"] for _, body in posts]
        assert any(sick in t and "fallen off the bus" in t for t in texts), texts
    finally:
        release.touch()
        if alerts.poll() is None:
            os.killpg(alerts.pid, signal.SIGTERM)
        alerts.wait(30)
        code = scheduler.stop()
        collector.stop()
        assert worker.stop() == 0
    assert code == 0, (tmp_path / "scheduler.log").read_text()[-3000:]
