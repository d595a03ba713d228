"""The collection loops: rounds on the sampling grid, wrapped in envelopes, packed and sent.

- `run_simulated` drives the simulated fleet. A run first backfills `backfill_us` of history as
  fast as the broker takes it, then keeps up with the clock at `speed` (1 = real time). Its
  nodes' inventory reports go out like any collector's: at the first round, on change, and
  periodically once it keeps up with the clock.
- `run_rounds` drives a real-time reader (NVML, dcgm-exporter, or anything whose `read_round()`
  returns samples and health events): one round per `interval_s` on the sampling grid, its
  samples added to the producer and flushed, its health events sent after the inventory
  reports that are due (`collectors.inventory`), on the same `inventory-reports` topic keyed
  by node (the worker folds them into the GPU's inventory record). A
  read that raises is counted and logged and the loop goes on; a round that is
  due while the previous one is still being handled is skipped, never run in a burst.

Time is passed in (`clock`) so the loops run in real time, faster than real time, or
instantly in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from collectors.errors import ProducerError
from collectors.inventory import InventoryReporter
from collectors.metrics import CollectorMetrics, ErrorKind
from collectors.producer import SampleProducer
from collectors.simulated import SimulatedFleet, align
from ledger.events import GpuHealth, GpuSample, SampleEnvelope, encode_health, envelope_for

log = logging.getLogger("tally.collector")

Clock = Callable[[], int]
HealthSender = Callable[[bytes, bytes], object]


def wall_clock_us() -> int:
    return time.time_ns() // 1_000


@dataclass(frozen=True, slots=True)
class RunPlan:
    start_us: int
    backfill_us: int = 0
    speed: float = 1.0
    pack_rounds: int = 1
    max_rounds: int | None = None


def source_name(node: str) -> str:
    return f"sim://{node}"


async def run_simulated(
    fleet: SimulatedFleet,
    producer: SampleProducer,
    plan: RunPlan,
    stop: asyncio.Event,
    clock: Clock = wall_clock_us,
    on_flush: Callable[[int], None] | None = None,
    reporter: InventoryReporter | None = None,
) -> int:
    """Produce rounds until `stop` is set or `max_rounds` are done; returns the rounds produced.
    `reporter` sends the fleet's inventory reports (their interval: the sampling interval in
    wall-clock time, `interval / speed`)."""
    interval = fleet.interval_us
    t = align(plan.start_us - plan.backfill_us, interval) + interval
    rounds = 0
    packed = 0
    sources = {gpu.node: source_name(gpu.node) for gpu in fleet.gpus}
    while not stop.is_set() and (plan.max_rounds is None or rounds < plan.max_rounds):
        backfilling = t <= plan.start_us
        if not backfilling:
            # Real-time phase: sim time runs `speed` times faster than the clock from start.
            due_wall = plan.start_us + (t - plan.start_us) / plan.speed
            wait_s = (due_wall - clock()) / 1e6
            if wait_s > 0:
                if packed:
                    await _flush(producer, on_flush)
                    packed = 0
                try:
                    await asyncio.wait_for(stop.wait(), timeout=wait_s)
                    break
                except TimeoutError:
                    pass
        samples = fleet.sample_round(t)
        producer.add(envelope_for(s, sources[s.node]) for s in samples)
        if reporter is not None:
            reporter.after_round(samples, int(interval / plan.speed), periodic=not backfilling)
        rounds += 1
        packed += 1
        if packed >= plan.pack_rounds or not backfilling:
            await _flush(producer, on_flush)
            packed = 0
        t += interval
    if packed:
        await _flush(producer, on_flush)
    return rounds


async def _flush(producer: SampleProducer, on_flush: Callable[[int], None] | None) -> None:
    sent = await producer.flush()
    if on_flush is not None:
        on_flush(sent)


# ---------------------------------------------------------------------------- real-time rounds


class Round(Protocol):
    """What one read gives. `collectors.nvml.RoundResult` fits; a dcgm `ScrapeResult` fits as
    `RoundResult(tuple(e.data for e in r.envelopes), r.health, ())` (the same sources)."""

    @property
    def samples(self) -> Sequence[GpuSample]: ...

    @property
    def health(self) -> Sequence[GpuHealth]: ...


class SampleSink(Protocol):
    """Where a round's envelopes go: `SampleProducer`, or a fake in tests."""

    metrics: CollectorMetrics

    def add(self, envelopes: Iterable[SampleEnvelope]) -> None: ...

    async def flush(self) -> int: ...


def sample_source(sample: GpuSample) -> str:
    """The envelope source of a sample: `nvml://node`, `dcgm://node`, `sim://node`."""
    return f"{sample.source.value}://{sample.node}"


def _health_source(health: GpuHealth) -> str:
    return f"{health.source.value}://{health.node}"


async def run_rounds(
    read_round: Callable[[], Round],
    producer: SampleSink,
    interval_s: float,
    stop: asyncio.Event,
    clock: Clock = wall_clock_us,
    *,
    health_topic_sender: HealthSender | None = None,
    metrics: CollectorMetrics | None = None,
    once: bool = False,
    source_of: Callable[[GpuSample], str] = sample_source,
    sleep: Callable[[float], Awaitable[object]] | None = None,
    reporter: InventoryReporter | None = None,
) -> int:
    """Read, wrap and send a round every `interval_s` until `stop` is set (with the inventory
    reports `reporter` finds due).

    Returns the rounds read (a read that raised is not one).

    `read_round` runs in a worker thread (NVML and HTTP reads block). `once` reads one round
    now, sends it and returns. `metrics` defaults to the producer's, so one `/metrics` shows
    both. Health events go to `health_topic_sender(key, value)` (e.g.
    `producer.topic_sender(inventory_reports_topic)`) when given, else they are only logged.
    `sleep(s)` waits up to s seconds of `clock` time (default: real time, cut short by `stop`).
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    metrics = metrics or producer.metrics
    interval_us = int(interval_s * 1_000_000)
    rounds = 0
    due = clock() if once else align(clock(), interval_us) + interval_us
    if sleep is None:

        async def sleep(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=seconds)

    while not stop.is_set():
        wait_s = (due - clock()) / 1e6
        if wait_s > 0:
            await sleep(wait_s)
            continue
        if await _one_round(
            read_round, producer, health_topic_sender, metrics, source_of, reporter, interval_us
        ):
            rounds += 1
        if once:
            break
        due += interval_us
        now = clock()
        if due < now:  # behind: resume at the next grid point, the missed ones are skipped
            late = -(-now // interval_us) * interval_us
            log.debug("the collector fell behind: skipping %d rounds", (late - due) // interval_us)
            due = late
    return rounds


async def _one_round(
    read_round: Callable[[], Round],
    producer: SampleSink,
    health_topic_sender: HealthSender | None,
    metrics: CollectorMetrics,
    source_of: Callable[[GpuSample], str],
    reporter: InventoryReporter | None = None,
    interval_us: int = 0,
) -> bool:
    """Read one round and hand it to the producer; False when the read failed."""
    try:
        result = await asyncio.to_thread(read_round)
    except Exception as exc:  # a failed read must not end collection
        metrics.error(ErrorKind.READ)
        log.warning("reading a round failed: %s: %s", type(exc).__name__, exc)
        return False
    metrics.rounds.inc()
    metrics.samples_read.inc(len(result.samples))
    metrics.last_round_time.set_to_current_time()
    for problem in getattr(result, "problems", ()):
        log.warning("%s", problem)
    producer.add(envelope_for(s, source_of(s)) for s in result.samples)
    if reporter is not None:
        reporter.after_round(result.samples, interval_us)
    for health in result.health:
        if health_topic_sender is None:
            log.warning("GPU %s: %s (%s)", health.gpu_uuid, health.kind.value, health.detail)
            continue
        health_topic_sender(health.node.encode(), encode_health(health, _health_source(health)))
    try:
        await producer.flush()
    except ProducerError as exc:  # no spool: the producer keeps the messages for next time
        log.warning("%s", exc)
    return True
