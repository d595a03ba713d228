"""End to end with real processes on a real tansu broker: the simulated collector reports its
nodes → the ledger worker folds them and publishes the compacted `inventory` topic → the
scheduler places jobs only on the GPUs the collector reported. The scheduler's config names a
second node the collector does not report: nothing is placed there. A collector that stops
makes its GPUs stale (no new placements); started again, they are placeable again. The
collector's topology labels (a node's rail, its GPUs' NVLink domain) reach the scheduler's
inventory, and a gang requiring one NVLink domain runs there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from streams.kafka import ensure_topics
from tally.broker import free_port
from tests.conftest import write_config
from tests.integration.support import (
    CollectorProcess,
    WorkerProcess,
    load,
    pipeline_config,
    wait_until,
)
from tests.integration.test_scheduler_e2e import ADMIN, VISION, SchedulerProcess, tally

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _config(tmp_path: Path, port: int, nodes: int) -> dict[str, Any]:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"admin": ADMIN, "teams": {"vision": VISION}}))
    data = pipeline_config(tmp_path, nodes=nodes, partitions=2)
    data["fleet"]["pools"] = [data["fleet"]["pools"][0] | {"gpus_per_node": 2}]  # a100 only
    data["fleet"]["workloads"] = {"training": 0, "inference": 0, "notebook": 0, "unallocated": 1}
    data["sampling"] = {"interval_s": 1}
    data["inventory"] = {"stale_after_intervals": 3, "report_every_rounds": 1}
    data["quotas"] = [{"team": "vision", "pool": "a100", "model": "A100", "nominal": 8}]
    data["queues"] = [{"name": "dev", "class": "dev"}]
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    return data


def test_jobs_run_only_on_reported_gpus_and_stale_gpus_take_no_new_jobs(broker, tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    # the scheduler's (and worker's) config: two nodes of two GPUs in its `fleet:` …
    config, path = load(tmp_path, _config(tmp_path, port, nodes=2))
    # … the collector's: the same seed, so the same first node, and only that one
    collector_data = _config(tmp_path, port, nodes=1)
    collector_data["inventory"] |= {
        "labels": {"topology.rail": "r7"},
        "gpu_labels": {i: {"topology.nvlink_domain": "nvl-a"} for i in ("0", "1")},
    }
    collector_path = write_config(tmp_path / "collector.yaml", collector_data)
    topics = config.topics
    asyncio.run(ensure_topics(broker.bootstrap, list(topics.all().values()), 2, topics.compacted()))
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    collector = CollectorProcess(collector_path, broker.bootstrap, tmp_path / "collect.log")
    collector.start()
    scheduler = SchedulerProcess(path, broker.bootstrap, tmp_path / "scheduler.log", api).start()
    cli = ("--api", api, "--token", VISION)
    release = tmp_path / "release"

    def inventory() -> list[dict[str, Any]]:
        return list(scheduler.get("/v1/inventory", VISION)["gpus"])

    def submit(gpus: int, *command: str, topology: tuple[str, ...] = ()) -> str:
        args = ("job", "submit", *cli, "-q", "dev", "-p", "detection", "--gpus", str(gpus))
        args += topology
        done = tally(*args, "--", *command)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def job(job_id: str) -> dict[str, Any]:
        return dict(scheduler.get(f"/v1/jobs/{job_id}")["job"])

    try:
        wait_until(
            lambda: [g["status"] for g in inventory()] == ["live", "live"],
            60,
            "the collector's two GPUs in the scheduler's inventory",
            worker,
        )
        reported = {g["uuid"] for g in inventory()}
        assert {g["node"] for g in inventory()} == {"a100-node-00"}
        assert [g["topology"] for g in inventory()] == [
            {"nvlink_domain": "nvl-a", "rail": "r7"}
        ] * 2

        wait = ("sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done")
        first = submit(2, *wait, topology=("--topology", "nvlink"))
        wait_until(lambda: job(first)["state"] == "running", 30, "the first job to run", worker)
        assert set(job(first)["assigned"]["gpu_uuids"]) == reported
        second = submit(1, "true")  # a GPU is free only on the node nobody reported
        wait_until(lambda: job(second)["reason"] is not None, 30, "the second job to wait")
        assert job(second)["state"] == "pending"
        release.touch()
        wait_until(lambda: job(second)["state"] == "finished", 30, "the second job to run")
        assert set(job(second)["assigned"]["gpu_uuids"]) <= reported

        assert collector.stop() == 0  # silent: stale after 3 intervals
        wait_until(
            lambda: {g["status"] for g in inventory()} == {"stale"}, 30, "the GPUs to go stale"
        )
        third = submit(1, "true")
        wait_until(lambda: job(third)["reason"] is not None, 30, "the third job to wait")
        assert job(third)["state"] == "pending" and all(not g["placeable"] for g in inventory())

        collector.start()  # reports again: placeable again
        wait_until(lambda: job(third)["state"] == "finished", 60, "the third job to run", worker)
        assert set(job(third)["assigned"]["gpu_uuids"]) <= reported
        assert requests.get(f"{api}/v1/inventory", timeout=5).status_code == 401
    finally:
        release.touch()
        code = scheduler.stop()
        collector.stop()
        assert worker.stop() == 0
    assert code == 0, (tmp_path / "scheduler.log").read_text()[-3000:]
