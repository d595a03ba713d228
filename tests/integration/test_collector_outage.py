"""A broker outage during collection loses nothing: against real tansu brokers and a real worker.

The collector (`run_rounds` reading simulated rounds, a spooling `SampleProducer`) runs
throughout. The broker is stopped for 20 s while the collector keeps reading, so samples go to
the disk spool; then a broker is started again on the same port. tansu keeps nothing across a
restart (a new incarnation, empty topics), so the topics are created again; the collector
reconnects and replays its spool. At the end the sealed ledger holds every sample read,
exactly once.

What a memory-storage broker acknowledged is gone with it unless a consumer took it first. So
before the broker is stopped the collector is parked between two rounds (everything read so
far is acknowledged) and the test waits until the worker sealed all of it; from then on, every
sample read must reach the ledger through the spool or the new broker.

The worker runs throughout. When it is handed messages from the new broker while it still
stands for the old one, it exits rather than misfile them, and is restarted (as `tally up`
restarts it); it then takes the new broker from its first offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

import pytest

from collectors.nvml import RoundResult
from collectors.producer import SampleProducer
from collectors.runner import run_rounds, sample_source, wall_clock_us
from collectors.simulated import SimulatedFleet
from collectors.spool import Spool
from ledger.events import Envelope, envelope_for
from ledger.read.queries import LedgerQueries
from tally.broker import EmbeddedBroker, free_port
from tests.builders import T0_US
from tests.conftest import create_topics
from tests.integration.support import (
    WorkerProcess,
    expected_balances,
    fleet_of,
    load,
    pipeline_config,
    sealed_transactions,
    wait_until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

INTERVAL_S = 0.25
OUTAGE_S = 20.0


class SimulatedReader:
    """One simulated round per call, at simulated times; can be parked between rounds."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.next_us = T0_US + fleet.interval_us
        self.phase = "before"
        self.read: dict[str, list[Envelope]] = {"before": [], "outage": [], "after": []}
        self._open = threading.Event()
        self._open.set()
        self._parked = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> RoundResult:
        if not self._open.is_set():
            self._parked.set()
            self._open.wait()
            self._parked.clear()
        samples = tuple(self.fleet.sample_round(self.next_us))
        self.next_us += self.fleet.interval_us
        with self._lock:
            self.read[self.phase].extend(envelope_for(s, sample_source(s)) for s in samples)
        return RoundResult(samples, (), ())

    def park(self) -> None:
        """Return once the collector waits before its next read (its last flush is done)."""
        self._open.clear()
        assert self._parked.wait(10), "the collector did not come round to its next read"

    def resume(self, phase: str) -> None:
        self.phase = phase
        self._open.set()

    def envelopes(self, *phases: str) -> list[Envelope]:
        with self._lock:
            return [e for p in phases for e in self.read[p]]


@dataclass
class Collector:
    """The collector loop on its own thread and event loop."""

    bootstrap: str
    topic: str
    spool_dir: object
    reader: SimulatedReader
    producer: SampleProducer | None = None
    spool: Spool | None = None
    failure: list[BaseException] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Collector:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the collector did not start"
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by stop()
            self.failure.append(exc)
            self._ready.set()

    async def _main(self) -> None:
        self.spool = Spool(self.spool_dir)  # type: ignore[arg-type]
        self.producer = SampleProducer(
            self.bootstrap,
            self.topic,
            spool=self.spool,
            send_timeout_s=3.0,
            connect_timeout_s=3.0,
            min_backoff_s=0.25,
            max_backoff_s=1.0,
            replay_budget_s=1.0,
        )
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self.producer.start()
        self._ready.set()
        try:
            await run_rounds(self.reader, self.producer, INTERVAL_S, self._stop, wall_clock_us)
        finally:
            await self.producer.stop()
            self.spool.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self.reader.resume(self.reader.phase)
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the collector did not stop"
        assert not self.failure, self.failure


def _ledger_ids(data_dir) -> set[str]:
    queries = LedgerQueries(data_dir)
    try:
        return {row[0] for row in queries._query("SELECT DISTINCT txn_id FROM {postings}")}
    finally:
        queries.close()


def test_samples_read_while_the_broker_is_down_reach_the_ledger_exactly_once(tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1, partitions=2))
    topics = list(config.topics.all().values())
    data_dir = config.ledger.data_dir
    port = free_port()
    reader = SimulatedReader(fleet_of(config))
    first = EmbeddedBroker(port=port, log_path=tmp_path / "broker-1.log").start()
    second: EmbeddedBroker | None = None
    worker = WorkerProcess(path, first.bootstrap, tmp_path / "worker.log")
    collector = Collector(first.bootstrap, config.topics.samples, tmp_path / "spool", reader)
    try:
        create_topics(first.bootstrap, topics, 2)
        worker.start()
        collector.start()
        producer = collector.producer
        assert producer is not None and producer.connected and producer.idempotent

        # Before: the pipeline runs; then park the collector and let the worker take it all.
        wait_until(lambda: sealed_transactions(data_dir) >= 160, 60, "samples sealed", worker)
        reader.park()
        before = reader.envelopes("before")
        wait_until(
            lambda: sealed_transactions(data_dir) == len(before),
            30,
            "the worker to seal everything the first broker acknowledged",
            worker,
        )
        assert producer.spool is not None and producer.spool.records == 0

        # Outage: the broker is gone; the collector keeps reading and spools.
        first.stop()
        reader.resume("outage")
        outage_ends = time.monotonic() + OUTAGE_S
        most_spooled = 0
        while time.monotonic() < outage_ends:
            most_spooled = max(most_spooled, producer.spool.records)
            time.sleep(0.2)
        assert not producer.connected
        assert most_spooled > 0 and producer.spool.samples > 0
        assert producer.metrics.value("broker_up") == 0
        assert producer.metrics.value("samples_spooled_total") >= producer.spool.samples

        # A new broker on the same port: empty, so the topics are created again.
        second = EmbeddedBroker(port=port, log_path=tmp_path / "broker-2.log").start()
        create_topics(second.bootstrap, topics, 2)
        reader.resume("after")
        wait_until(
            lambda: producer.connected and producer.spool.records == 0,
            30,
            "the collector to replay its spool",
        )
        time.sleep(3 * INTERVAL_S * 4)  # a few live rounds on the new broker
        collector.stop()

        outage = reader.envelopes("outage")
        everything = reader.envelopes("before", "outage", "after")
        assert len(outage) >= 16 * int(OUTAGE_S / INTERVAL_S * 0.8)
        assert producer.metrics.value("samples_replayed_total") >= len(outage)
        assert producer.dropped_samples == 0

        wait_until(
            lambda: worker.supervise() and sealed_transactions(data_dir) == len(everything),
            90,
            f"all {len(everything)} samples to be sealed",
        )
        assert worker.restarts <= 1  # at most once, for the one broker change
        sealed = _ledger_ids(data_dir)
        missing = {e.id for e in outage} - sealed
        assert not missing, f"{len(missing)} samples read during the outage are missing"
        assert sealed == {e.id for e in everything}
        assert LedgerQueries(data_dir).balances() == expected_balances(config, everything)
    finally:
        cleanups = [collector.stop, worker.stop, first.stop]
        if second is not None:
            cleanups.append(second.stop)
        for cleanup in cleanups:  # each one runs, whatever the others raise
            with contextlib.suppress(Exception):
                cleanup()
