"""Helpers for end-to-end tests: a worker child process, producing simulated samples, and the
expected ledger computed independently from the produced samples."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from collectors.producer import SampleProducer
from collectors.runner import source_name
from collectors.simulated import PoolSpec, SimulatedFleet, TeamSpec, WorkloadKind
from ledger.attribution import attribute_sample
from ledger.events import Envelope, envelope_for
from ledger.pricing import PriceBook
from ledger.read.queries import LedgerQueries
from ledger.units import Unit
from tally.config import TallyConfig, parse_config
from tests.builders import T0_US
from tests.conftest import child_env, tally_command, write_config

MIX = (
    (WorkloadKind.TRAINING, 40),
    (WorkloadKind.INFERENCE, 20),
    (WorkloadKind.NOTEBOOK, 15),
    (WorkloadKind.UNALLOCATED, 25),
)


def pipeline_config(tmp: Path, nodes: int = 2, partitions: int = 4, **ledger: Any) -> dict:
    return {
        "broker": {"mode": "external", "bootstrap_servers": ["127.0.0.1:1"]},
        "topics": {"partitions": partitions},
        "ledger": {"data_dir": str(tmp / "ledger"), "seal_interval_s": 0.5, **ledger},
        "organisation": {
            "cost_centres": [
                {
                    "name": "research",
                    "teams": [
                        {"name": "vision", "projects": ["detection", "segmentation"]},
                        {"name": "language", "projects": ["pretraining"]},
                    ],
                },
                {"name": "product", "teams": [{"name": "search", "projects": ["ranking"]}]},
            ]
        },
        "fleet": {
            "seed": 11,
            "pools": [
                {"name": "a100", "model": "A100", "nodes": nodes, "gpus_per_node": 8},
                {"name": "h100", "model": "H100", "nodes": nodes, "gpus_per_node": 8},
            ],
        },
        "prices": [
            {"model": "A100", "per_gpu_hour": "1.80"},
            {"model": "H100", "per_gpu_hour": "3.20"},
        ],
        "worker": {"batch_max_messages": 500, "batch_within_s": 0.1},
        "metrics": {"worker_port": 0, "scheduler_port": 0},  # tests may run workers side by side
    }


def fleet_of(config: TallyConfig) -> SimulatedFleet:
    return SimulatedFleet(
        config.fleet.seed,
        [
            PoolSpec(p.name, p.model, p.nodes, p.gpus_per_node, p.memory_gib)
            for p in config.fleet.pools
        ],
        [TeamSpec(t.name, t.projects) for t in config.organisation.teams()],
        MIX,
        10_000_000,
    )


def rounds(fleet: SimulatedFleet, first: int, count: int) -> list[list[Envelope]]:
    return [
        [
            envelope_for(s, source_name(s.node))
            for s in fleet.sample_round(T0_US + (first + i) * fleet.interval_us)
        ]
        for i in range(count)
    ]


async def produce(
    bootstrap: str,
    topic: str,
    batches: Iterable[list[Envelope]],
    pack: int = 1,
    pause_s: float = 0.0,
) -> int:
    producer = SampleProducer(bootstrap, topic)
    await producer.start()
    sent = 0
    try:
        for i, envelopes in enumerate(batches, 1):
            producer.add(envelopes)
            if i % pack == 0:
                sent += await producer.flush()
                if pause_s:
                    await asyncio.sleep(pause_s)
        sent += await producer.flush()
    finally:
        await producer.stop()
    return sent


def expected_balances(config: TallyConfig, envelopes: Iterable[Envelope]) -> dict:
    """What the ledger must hold: each distinct event attributed once, folded per account."""
    expected = Expected(config)
    expected.add(envelopes)
    return expected.balances()


class Expected:
    """The ledger's totals computed independently, as samples are produced: each distinct
    event attributed once (`ledger.attribution`), folded per account and unit, and GPU-ms per
    (team, GPU)."""

    def __init__(self, config: TallyConfig) -> None:
        self.prices: PriceBook = config.price_book()
        self.centres = config.organisation.cost_centre_of()
        self.seen: set[str] = set()
        self._balances: Counter = Counter()
        self._gpu_ms: Counter = Counter()

    def add(self, envelopes: Iterable[Envelope]) -> None:
        for envelope in envelopes:
            if envelope.id in self.seen:
                continue
            self.seen.add(envelope.id)
            txn = attribute_sample(envelope, self.prices, self.centres)
            for p in txn.postings:
                self._balances[(p.account, p.unit.value)] += p.amount
                if p.unit is Unit.GPU_MS and p.amount > 0:
                    self._gpu_ms[(p.team, txn.gpu_uuid)] += p.amount

    @property
    def samples(self) -> int:
        return len(self.seen)

    def balances(self) -> dict:
        return dict(self._balances)

    def gpu_ms_by_team_and_gpu(self) -> dict:
        return dict(self._gpu_ms)


def gpu_ms_by_team_and_gpu(data_dir: Path) -> dict:
    """GPU-ms booked per (team, GPU) in the sealed ledger (positive legs: what was used)."""
    queries = LedgerQueries(data_dir)
    try:
        rows = queries._query(
            "SELECT team, gpu_uuid, sum(amount) FROM {postings} "
            "WHERE unit = 'gpu_ms' AND amount > 0 GROUP BY ALL"
        )
    finally:
        queries.close()
    return {(team, gpu): int(total) for team, gpu, total in rows}


class WorkerProcess:
    """`tally worker` in a child process, with its log in a file."""

    def __init__(self, config_path: Path, bootstrap: str, log: Path) -> None:
        self.config_path = config_path
        self.bootstrap = bootstrap
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> WorkerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                tally_command(
                    "worker", "--config", str(self.config_path), "--bootstrap", self.bootstrap
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        return self

    def commits(self) -> int:
        return self.log.read_text(errors="replace").count("batch committed")

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def supervise(self) -> bool:
        """Restart the worker if it exited because the broker changed (as `tally up` would);
        True while it runs. Any other exit fails the test."""
        from streams.worker import INCARNATION_CHANGED_EXIT

        assert self.proc is not None
        code = self.proc.poll()
        if code == INCARNATION_CHANGED_EXIT:
            self.restarts += 1
            self.start()
            return True
        self.assert_alive()
        return True

    def assert_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker exited with {self.proc.returncode}:\n"
                + self.log.read_text(errors="replace")[-4000:]
            )


def wait_until(
    predicate,
    timeout_s: float,
    what: str,
    worker: WorkerProcess | None = None,
    interval_s: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker is not None:
            worker.assert_alive()
        if predicate():
            return
        time.sleep(interval_s)
    tail = worker.log.read_text(errors="replace")[-3000:] if worker else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{tail}")


def sealed_transactions(data_dir: Path) -> int:
    return LedgerQueries(data_dir).transaction_count()


def load(tmp: Path, data: dict) -> tuple[TallyConfig, Path]:
    path = write_config(tmp / "tally.yaml", data)
    return parse_config(data, str(path)), path


def latest_balances(bootstrap: str, topic: str, timeout_ms: int = 2000) -> dict[str, Any]:
    """The newest message (highest `seq`) per account on the `balances` topic, decoded."""
    from aiokafka import AIOKafkaConsumer

    from ledger.balances import decode_balance_update

    async def read() -> dict[str, Any]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        latest: dict[str, Any] = {}
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=timeout_ms)
                if not batch:
                    return latest
                for messages in batch.values():
                    for message in messages:
                        update = decode_balance_update(message.value)
                        known = latest.get(update.account)
                        if known is None or update.seq > known.seq:
                            latest[update.account] = update
        finally:
            await consumer.stop()

    return asyncio.run(read())


async def send_messages(
    bootstrap: str, topic: str, messages: Iterable[tuple[bytes, bytes]]
) -> None:
    """Send (key, value) messages to `topic`, in order, each acknowledged."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


class CollectorProcess:
    """`tally collect --source sim` (no backfill) in a child process, with its log in a file;
    `rounds` stops it after that many rounds (its GPUs then fall silent)."""

    def __init__(
        self, config_path: Path, bootstrap: str, log: Path, rounds: int | None = None
    ) -> None:
        self.argv = tally_command(
            "collect", "--config", str(config_path), "--bootstrap", bootstrap,
            "--source", "sim", "--backfill-hours", "0",
            *(("--rounds", str(rounds)) if rounds is not None else ()),
        )  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CollectorProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        return self

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
