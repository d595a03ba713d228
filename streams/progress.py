"""What a consumer loop last saw of its partitions, for health checks: `ConsumerProgress`,
updated by the loop after each fetch (`observe`) and read from other threads (each field is
replaced whole, never mutated in place).

Lag is the sum over the assigned partitions of highwater − position: the messages the loop has
not handed on yet. It is unknown (None) until every assigned partition has answered a fetch
(aiokafka learns a partition's highwater from fetch responses). `answered_at` is when the
broker last answered a fetch for the least recently answered partition (Unix seconds): aiokafka
keeps reconnecting without raising, so a broker that went away shows as answers growing old.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import IllegalStateError, KafkaError

POSITION_TIMEOUT_S = 1.0


@dataclass(slots=True)
class ConsumerProgress:
    started: bool = False
    partitions: int = 0
    lag: int | None = None
    fetch_error: str | None = None
    answered_at: float | None = None

    def failed(self, exc: BaseException) -> None:
        self.fetch_error = f"{type(exc).__name__}: {exc}"[:300]


async def observe(consumer: Any, progress: ConsumerProgress) -> None:
    """Record `consumer`'s assignment and lag after a fetch that did not fail."""
    progress.started = True
    progress.fetch_error = None
    assigned = consumer.assignment()
    progress.partitions = len(assigned)
    total = 0
    polled = [consumer.last_poll_timestamp(tp) for tp in assigned]
    progress.answered_at = min(polled) / 1000 if polled and None not in polled else None
    for tp in assigned:
        if tp not in consumer.assignment():  # revoked while an earlier position was awaited
            progress.lag = None
            return
        high = consumer.highwater(tp)  # asserts `tp` assigned: checked above, no await between
        if high is None:
            progress.lag = None
            return
        try:
            position = await asyncio.wait_for(consumer.position(tp), POSITION_TIMEOUT_S)
        except (TimeoutError, IllegalStateError, KafkaError):  # reassigned meanwhile
            progress.lag = None
            return
        total += max(0, high - position)
    progress.lag = total if assigned else None
