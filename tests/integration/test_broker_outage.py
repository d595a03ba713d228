"""A 60-second broker outage while the whole pipeline runs: no sample lost, no decision enacted
without its event.

Real processes against the real tansu broker: a simulated collector (`tally collect --source
sim`), the ledger worker (`tally worker`) and the scheduler (`tally scheduler run`, local
executor) whose jobs are submitted over its HTTP API throughout. Every client reaches the
broker through `NetworkCut`, a TCP proxy the broker advertises; cutting it for 60 s makes the
broker unreachable (connections reset, then refused) while it keeps its topics, as a network
partition or a broker host outage would.

Afterwards:
- every sample the collector produced (the rounds it reports × the fleet's GPUs, regenerated
  from the simulated fleet) is in the sealed ledger exactly once, and its spool is empty;
- the worker, the scheduler and the collector ran throughout: same processes, no restart;
- every run the executor started (each job appends `$TALLY_JOB_ID` to a file when it starts)
  has its `JobStarted` on the `jobs` topic, and no job started while the broker was away: a
  decision is enacted only once the broker acknowledged its events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from collectors.runner import source_name
from collectors.spool import Spool
from ledger.events import envelope_for
from ledger.job_events import JobStarted, JobSubmitted
from ledger.read.queries import LedgerQueries
from scheduler.jobs_topic import decode_jobs_value
from scheduler.kafka import read_topic
from streams.kafka import ensure_topics
from tally.broker import EmbeddedBroker, free_port
from tally.components import simulated_fleet
from tests.conftest import child_env, tally_command
from tests.integration.netcut import NetworkCut
from tests.integration.support import (
    WorkerProcess,
    load,
    pipeline_config,
    sealed_transactions,
    wait_until,
)
from tests.integration.test_scheduler_e2e import VISION, SchedulerProcess

pytestmark = [pytest.mark.broker, pytest.mark.slow]

OUTAGE_S = 60.0
SPEED = 40  # simulated seconds per wall second: 4 rounds of 16 GPUs a second
GRACE_S = 3.0  # after the cut, for a start whose events were acknowledged just before it


class Collector:
    """`tally collect --source sim` in a child process, with its /metrics."""

    def __init__(self, config_path: Path, bootstrap: str, tmp: Path) -> None:
        self.port = free_port()
        self.spool_dir = tmp / "spool"
        self.log = tmp / "collector.log"
        self.argv = tally_command(
            "collect", "--config", str(config_path), "--bootstrap", bootstrap,
            "--source", "sim", "--backfill-hours", "0", "--speed", str(SPEED),
            "--spool-dir", str(self.spool_dir), "--metrics-port", str(self.port),
        )  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Collector:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        return self

    def metric(self, name: str) -> float:
        assert self.proc is not None and self.proc.poll() is None, self.tail()
        try:
            text = requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except requests.RequestException:
            return -1.0
        found = re.search(rf"^tally_collector_{name} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else -1.0

    def stop(self) -> int:
        """SIGTERM; the rounds it produced (from its last line)."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the collector is not running:\n{self.tail()}")
        os.killpg(self.proc.pid, signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.tail()
        produced = re.search(r"produced (\d+) rounds of (\d+) GPUs", self.tail())
        assert produced, self.tail()
        return int(produced.group(1))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class Submitter:
    """Submits a short job (1 GPU, ~1 s) every `every_s` over the API, on its own thread."""

    def __init__(self, api: str, started: Path, every_s: float = 1.0) -> None:
        self.api = api
        self.started = started
        self.every_s = every_s
        self.jobs: list[str] = []
        self.answers: Counter[int] = Counter()
        self.failure: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Submitter:
        self._thread.start()
        return self

    def _run(self) -> None:
        script = f'echo "$TALLY_JOB_ID" >> {self.started}; sleep 1'
        body = {"project": "detection", "user": "u", "queue": "dev", "gpus": 1}
        try:
            while not self._stop.is_set():
                response = requests.post(
                    f"{self.api}/v1/jobs",
                    json={**body, "command": ["sh", "-c", script]},
                    headers={"Authorization": f"Bearer {VISION}"},
                    timeout=90,
                )
                assert response.status_code in (201, 202), response.text
                self.answers[response.status_code] += 1
                self.jobs.append(response.json()["job"]["job_id"])
                self._stop.wait(self.every_s)
        except BaseException as exc:  # surfaced by stop()
            self.failure.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive() and not self.failure, self.failure


def runs_started(started: Path) -> Counter[str]:
    if not started.exists():
        return Counter()
    return Counter(line for line in started.read_text().split() if line)


def job_events(bootstrap: str, topic: str) -> list[Any]:
    consumed = asyncio.run(read_topic(bootstrap, topic, "outage-reader"))
    events = [decode_jobs_value(m.value) for m in sorted(consumed, key=lambda m: m.seq or 0)]
    return [e for e in events if e is not None]


def usage_ids(data_dir: Path) -> list[str]:
    """The samples the ledger booked: its usage transactions, less the re-postings of usage
    whose owner was learned late (a sample's usage names one cause, the sample; a re-posting's
    two: the event that made the owner known and the original it corrects; see
    `corrections`)."""
    queries = LedgerQueries(data_dir)
    try:
        rows = queries._query(
            "SELECT txn_id FROM {postings} WHERE kind = 'usage' AND leg = 0 "
            "AND NOT contains(cause, ' ')"
        )
    finally:
        queries.close()
    return [row[0] for row in rows]


def corrections(data_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """The originals the re-postings correct, those the reversals reverse (each a usage
    transaction the ledger booked; each corrected once: one reversal, one re-posting), and the
    re-postings' own ids (a re-posting is corrected in turn when a later change of its GPU's
    timeline, e.g. a release folded after it, splits its interval otherwise)."""
    queries = LedgerQueries(data_dir)
    try:
        rows = queries._query(
            "SELECT kind, split_part(cause, ' ', 2), txn_id FROM {postings} WHERE leg = 0 "
            "AND ((kind = 'usage' AND contains(cause, ' ')) OR kind = 'reversal')"
        )
    finally:
        queries.close()
    reposted = [original for kind, original, _ in rows if kind == "usage"]
    reversed_ = [original for kind, original, _ in rows if kind == "reversal"]
    repostings = [txn for kind, _, txn in rows if kind == "usage"]
    return reposted, reversed_, repostings


def sample_behind(txn: str, corrects: dict[str, str]) -> str:
    """The transaction at the start of `txn`'s chain of corrections (`corrects`: re-posting →
    the transaction it corrects): the sample's usage when the chain is whole."""
    seen: set[str] = set()
    while txn in corrects and txn not in seen:
        seen.add(txn)
        txn = corrects[txn]
    return txn


def first_round_us(data_dir: Path) -> int:
    queries = LedgerQueries(data_dir)
    try:
        rows = queries._query("SELECT min(end_us) FROM {postings} WHERE kind = 'usage'")
    finally:
        queries.close()
    return int(rows[0][0])


def test_a_60_second_broker_outage_loses_no_sample_and_enacts_no_decision_without_its_event(
    tmp_path,
):
    broker_port = free_port()
    cut = NetworkCut(broker_port).start()
    broker = EmbeddedBroker(
        port=broker_port, log_path=tmp_path / "broker.log", advertised_port=cut.port
    ).start()
    bootstrap = cut.bootstrap
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump({"admin": "admin-outage-token-0123456789", "teams": {"vision": VISION}})
    )
    data = pipeline_config(tmp_path, nodes=1, partitions=2)
    data["quotas"] = [{"team": "vision", "pool": "a100", "model": "A100", "nominal": 4}]
    data["queues"] = [{"name": "dev", "class": "dev"}]
    data["scheduler"] = {
        "port": api_port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    config, path = load(tmp_path, data)
    topics = config.topics
    data_dir = config.ledger.data_dir
    started = tmp_path / "started.txt"
    worker = WorkerProcess(path, bootstrap, tmp_path / "worker.log")
    scheduler = SchedulerProcess(path, bootstrap, tmp_path / "scheduler.log", api)
    collector = Collector(path, bootstrap, tmp_path)
    submitter = Submitter(api, started)
    try:
        asyncio.run(ensure_topics(bootstrap, list(topics.all().values()), 2, [topics.balances]))
        worker.start()
        scheduler.start()
        collector.start()
        submitter.start()
        pids = (worker.proc.pid, scheduler.proc.pid, collector.proc.pid)

        # before: samples are sealed and jobs run
        wait_until(lambda: sealed_transactions(data_dir) >= 160, 90, "samples sealed", worker)
        wait_until(lambda: len(runs_started(started)) >= 2, 60, "jobs to run", worker)

        # the outage: nobody reaches the broker for 60 s
        cut.cut()
        cut_at = time.monotonic()
        starts_at_cut: Counter[str] | None = None
        most_spooled = 0.0
        while time.monotonic() - cut_at < OUTAGE_S:
            worker.assert_alive()
            scheduler.healthy()  # raises if it exited
            if starts_at_cut is None and time.monotonic() - cut_at >= GRACE_S:
                starts_at_cut = runs_started(started)
            most_spooled = max(most_spooled, collector.metric("spool_samples"))
            time.sleep(1.0)
        starts_in_outage = runs_started(started) - (starts_at_cut or Counter())
        broker_up_in_outage = collector.metric("broker_up")
        cut.mend()
        outage_s = time.monotonic() - cut_at

        assert broker_up_in_outage == 0
        assert most_spooled > 0, "the collector spooled nothing while the broker was away"
        assert not starts_in_outage, f"jobs started without the broker: {starts_in_outage}"

        # after: the collector replays its spool, jobs submitted meanwhile run
        wait_until(
            lambda: collector.metric("broker_up") == 1 and collector.metric("spool_records") == 0,
            90,
            "the collector to replay its spool",
            worker,
        )
        submitted_in_outage = len(submitter.jobs)
        wait_until(
            lambda: len(submitter.jobs) >= submitted_in_outage + 2,
            60,
            "submissions to go on",
            worker,
        )
        submitter.stop()

        def all_ended() -> bool:
            listed = scheduler.get("/v1/jobs")["jobs"]
            return len(listed) == len(submitter.jobs) and all(
                j["state"] not in ("pending", "running") for j in listed
            )

        wait_until(all_ended, 90, "every submitted job to end", worker)
        rounds = collector.stop()
        assert (worker.proc.pid, scheduler.proc.pid) == pids[:2]
        worker.assert_alive()
        scheduler.healthy()
        fleet = simulated_fleet(config)
        samples = rounds * len(fleet.gpus)
        wait_until(
            lambda: len(usage_ids(data_dir)) >= samples,
            90,
            f"all {samples} samples to be sealed",
            worker,
        )
        time.sleep(1.0)  # anything counted twice would show up in a later seal

        # no sample lost, none twice: the ledger holds exactly the rounds the collector made
        first = first_round_us(data_dir)
        produced = [
            envelope_for(s, source_name(s.node)).id
            for i in range(rounds)
            for s in fleet.sample_round(first + i * fleet.interval_us)
        ]
        booked = usage_ids(data_dir)
        lost, extra = set(produced) - set(booked), set(booked) - set(produced)
        assert not lost and not extra, f"{len(lost)} samples lost, {len(extra)} unknown"
        # usage booked before the scheduler's assignment reached the ledger (the jobs topic was
        # cut too) is reversed and re-posted to the job: once each, and only booked samples
        reposted, reversed_, repostings = corrections(data_dir)
        assert sorted(reposted) == sorted(reversed_)
        assert len(set(reposted)) == len(reposted)
        # what a correction corrects is a booked sample, or a re-posting corrected in turn,
        # whose chain of originals leads back to a booked sample
        corrects = dict(zip(repostings, reposted, strict=True))
        assert set(reposted) <= set(booked) | set(corrects)
        assert all(sample_behind(txn, corrects) in set(booked) for txn in reposted)
        assert len(booked) == len(produced) == samples  # none twice
        assert Spool(collector.spool_dir).records == 0

        # no decision enacted without its event
        events = job_events(bootstrap, topics.jobs)
        on_topic = Counter(e.job_id for e in events if isinstance(e, JobStarted))
        submitted = {e.job_id for e in events if isinstance(e, JobSubmitted)}
        runs = runs_started(started)
        assert set(submitter.jobs) == submitted
        assert set(runs) == set(submitter.jobs)  # every job ran
        unannounced = {job: n for job, n in runs.items() if on_topic[job] < n}
        assert not unannounced, f"runs without their JobStarted: {unannounced}"
        figures = {
            "outage_s": round(outage_s, 1),
            "samples": samples,
            "samples_lost": len(set(produced) - set(booked)),
            "samples_twice": len(booked) - len(set(booked)),
            "other_transactions": sealed_transactions(data_dir) - len(booked),
            "most_spooled_samples": int(most_spooled),
            "jobs": len(submitter.jobs),
            "runs_started": sum(runs.values()),
            "runs_without_event": len(unannounced),
            "submits_202_unpublished": submitter.answers[202],
            "restarts": 0,
        }
        print(f"broker outage: {json.dumps(figures)}")
    finally:
        with contextlib.suppress(Exception):
            submitter.stop()
        for cleanup in (collector.kill, scheduler.stop, worker.stop, cut.stop, broker.stop):
            with contextlib.suppress(Exception):
                cleanup()
