"""The collection loop for the simulated fleet: rounds on the sampling grid, packed and sent.

Time is passed in (`clock`) so the loop runs in real time, faster than real time, or
instantly in tests. A run first backfills `backfill_us` of history as fast as the broker takes
it, then keeps up with the clock at `speed` (1 = real time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from collectors.producer import SampleProducer
from collectors.simulated import SimulatedFleet, align
from ledger.events import envelope_for

Clock = Callable[[], int]


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
) -> int:
    """Produce rounds until `stop` is set or `max_rounds` are done; returns the rounds produced."""
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
        producer.add(envelope_for(s, sources[s.node]) for s in fleet.sample_round(t))
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
