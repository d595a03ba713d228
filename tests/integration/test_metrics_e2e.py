"""End to end against a real tansu broker: `tally worker` in a child process serves Prometheus
metrics at `/metrics` (a free port, `--metrics-port 0`, read from its log), and a scrape of the
real HTTP endpoint follows what it ingests: batches, messages and postings rise with the
samples, dead letters are counted, and the ledger gauges (idle GPUs by kind, GPUs reporting,
newest sealed sample, ledger lag) come from the sealed segments."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from ledger.attribution import attribute_sample
from ledger.events import Envelope
from ledger.read import rollups
from ledger.read.queries import LedgerQueries
from ledger.read.reports import ReportQueries
from tally.broker import free_port
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import (
    WorkerProcess,
    fleet_of,
    load,
    pipeline_config,
    produce,
    rounds,
    sealed_transactions,
    send_messages,
    wait_until,
)

pytestmark = pytest.mark.broker

URL = re.compile(r"worker metrics at (http://\S+/metrics)")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsWorker(WorkerProcess):
    """`tally worker --metrics-port 0`: the worker picks a free port and logs its URL."""

    def start(self) -> MetricsWorker:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                tally_command(
                    "worker",
                    "--config",
                    str(self.config_path),
                    "--bootstrap",
                    self.bootstrap,
                    "--metrics-port",
                    "0",
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        return self

    def url(self) -> str:
        found: list[str] = []

        def logged() -> bool:
            found.extend(URL.findall(self.log.read_text(errors="replace")))
            return bool(found)

        wait_until(logged, 60, "the worker to log its metrics URL", self)
        return found[-1]


def scrape(url: str) -> Samples:
    response = requests.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def postings_of(config, envelopes: list[Envelope]) -> int:
    prices, centres = config.price_book(), config.organisation.cost_centre_of()
    return sum(len(attribute_sample(e, prices, centres).postings) for e in envelopes)


def sealed_rows(data_dir: Path) -> int:
    return sum(s.rows for s in LedgerQueries(data_dir).segments())


def test_worker_metrics_endpoint_follows_ingest_and_the_sealed_ledger(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1))
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 2)
    data_dir = config.ledger.data_dir
    gpus = sum(p.nodes * p.gpus_per_node for p in config.fleet.pools)  # 16 boards
    produced = rounds(fleet_of(config), 0, 20)
    first = [e for r in produced[:10] for e in r]
    second = [e for r in produced[10:] for e in r]

    worker = MetricsWorker(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        url = worker.url()
        assert url.startswith("http://127.0.0.1:") and not url.startswith("http://127.0.0.1:0/")
        empty = scrape(url)
        assert value(empty, "tally_worker_batch_messages_count") == 0
        assert value(empty, "tally_ledger_segments") == 0
        assert value(empty, "tally_idle_gpus", kind="unallocated") == 0
        assert value(empty, "tally_ledger_lag_seconds") is None  # nothing sealed yet
        assert not [k for k in empty if k[0].startswith(("tally_scheduler", "tally_alert"))]

        asyncio.run(produce(broker.bootstrap, topics.samples, produced[:10]))
        wait_until(
            lambda: sealed_transactions(data_dir) == len(first), 90, "round 1 sealed", worker
        )
        after_first = scrape(url)
        asyncio.run(send_messages(broker.bootstrap, topics.samples, [(b"gpu", b"{not json")]))
        asyncio.run(produce(broker.bootstrap, topics.samples, produced[10:]))
        wait_until(
            lambda: sealed_transactions(data_dir) == len(first) + len(second),
            90,
            "round 2 sealed",
            worker,
        )
        wait_until(  # the ledger gauges read the manifest the latest seal wrote
            lambda: (
                value(scrape(url), "tally_ledger_segments")
                == len(LedgerQueries(data_dir).segments())
            ),
            30,
            "the scrape to see the latest seal",
            worker,
        )
        after_second = scrape(url)
        scraped_at = time.time()
    finally:
        assert worker.stop() == 0

    # batches, messages and postings rise with the ingested samples, exactly
    assert value(after_first, "tally_worker_batch_messages_sum") == len(first)
    assert value(after_second, "tally_worker_batch_messages_sum") == len(first) + len(second) + 1
    assert value(after_first, "tally_worker_batch_postings_sum") == postings_of(config, first)
    assert (
        value(after_second, "tally_worker_batch_postings_sum")
        == postings_of(config, first + second)
        == sealed_rows(data_dir)
    )
    batches_1 = value(after_first, "tally_worker_batch_messages_count")
    batches_2 = value(after_second, "tally_worker_batch_messages_count")
    assert batches_1 is not None and batches_2 is not None and 1 <= batches_1 < batches_2
    assert value(after_second, "tally_worker_batch_postings_count") == batches_2
    assert value(after_second, "tally_worker_commit_seconds_count") == batches_2
    assert (value(after_second, "tally_worker_commit_seconds_sum") or 0) > 0
    assert value(after_first, "tally_worker_dead_letters_total") == 0
    assert value(after_second, "tally_worker_dead_letters_total") == 1
    assert not [k for k in after_second if k[0] == "tally_worker_errors_total"]

    # the ledger gauges: the sealed ledger's own answers
    queries = ReportQueries(data_dir)
    try:
        now = rollups.fleet_now(queries)
    finally:
        queries.close()
    assert now.as_of_us is not None
    for state in (rollups.GpuState.ALLOCATED_IDLE, rollups.GpuState.UNALLOCATED):
        assert value(after_second, "tally_idle_gpus", kind=state.value) == now.count(state)
    assert value(after_second, "tally_gpus_reporting") == now.gpus >= gpus
    newest = value(after_second, "tally_ledger_newest_sealed_timestamp_seconds")
    assert newest == now.as_of_us / 1e6
    lag = value(after_second, "tally_ledger_lag_seconds")
    assert lag is not None and lag == pytest.approx(max(0.0, scraped_at - newest), abs=30)


BANNER_URL = re.compile(r"(http://\S+/metrics) \((worker|scheduler|collector)\)")


def test_up_prints_both_metrics_urls_and_serves_them(tmp_path):
    """`tally up` with ports 0: it picks the ports, passes them to its children and prints
    them in its banner; the worker's endpoint counts batches, the scheduler's reports every
    configured queue; the worker, the scheduler and the collector each turn ready
    (`/readyz` 200) on the same port."""
    data = pipeline_config(tmp_path, nodes=1)
    data["broker"] = {"mode": "embedded"}
    data["queues"] = [{"name": "dev", "class": "dev"}, {"name": "train", "class": "training"}]
    data["scheduler"] = {
        "port": free_port(),
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tmp_path / "scheduler" / "tokens.yaml")},
    }
    data["metrics"] = {"worker_port": 0, "scheduler_port": 0, "collector_port": 0}
    _, path = load(tmp_path, data)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            tally_command("up", "--config", str(path), "--no-dashboard"),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=tmp_path,
        )
    try:
        wait_until(lambda: "Tally is up" in log_path.read_text(), 60, "the banner")
        urls = {who: url for url, who in BANNER_URL.findall(log_path.read_text())}
        assert set(urls) == {"worker", "scheduler", "collector"}
        assert len(set(urls.values())) == 3
        assert all(":0/" not in url for url in urls.values())

        def served(url: str, name: str, **labels: str) -> float | None:
            try:
                return value(scrape(url), name, **labels)
            except requests.RequestException:
                return None

        wait_until(
            lambda: (served(urls["worker"], "tally_worker_batch_messages_count") or 0) > 0,
            90,
            "the worker's endpoint to count a batch",
        )
        for queue in ("dev", "train"):
            wait_until(
                lambda q=queue: (
                    served(urls["scheduler"], "tally_scheduler_queue_length", queue=q) == 0
                ),
                60,
                f"the scheduler's endpoint to report queue {queue}",
            )
        scheduler = scrape(urls["scheduler"])
        assert not [k for k in scheduler if k[0].startswith(("tally_worker", "tally_ledger"))]
        for who, url in urls.items():
            base = url.removesuffix("/metrics")

            def ready(base: str = base) -> bool:
                try:
                    return requests.get(f"{base}/readyz", timeout=5).status_code == 200
                except requests.RequestException:
                    return False

            wait_until(ready, 60, f"the {who} to be ready")
            body = requests.get(f"{base}/readyz", timeout=5).json()
            assert body["status"] == "ready" and all(c["ok"] for c in body["checks"].values())
            assert requests.get(f"{base}/healthz", timeout=5).json()["status"] == "alive"
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, log_path.read_text()[-4000:]
