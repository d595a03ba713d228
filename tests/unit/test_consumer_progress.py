"""`streams.progress.observe`: a consumer's assignment and lag recorded after a fetch, and a
rebalance that revokes partitions while a position is awaited (the lag unknown, never an
assertion from aiokafka's `highwater` on a partition no longer assigned)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import TopicPartition

from streams.progress import ConsumerProgress, observe

TP0, TP1 = TopicPartition("samples", 0), TopicPartition("samples", 1)


class Consumer:
    """The four calls `observe` makes, as aiokafka's consumer answers them; `revoke_after`
    positions, a rebalance takes every partition away (as the group coordinator does while a
    call awaits), and `highwater` asserts as aiokafka's does."""

    def __init__(self, high: dict[TopicPartition, int], at: dict[TopicPartition, int]) -> None:
        self.high, self.at = high, at
        self.assigned = set(high)
        self.revoke_after: int | None = None
        self.positions = 0

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        return 1_000

    def highwater(self, tp: TopicPartition) -> int:
        assert tp in self.assigned, "Partition is not assigned"
        return self.high[tp]

    async def position(self, tp: TopicPartition) -> int:
        await asyncio.sleep(0)
        self.positions += 1
        if self.revoke_after is not None and self.positions >= self.revoke_after:
            self.assigned.clear()
        return self.at[tp]


@pytest.mark.parametrize(
    ("revoke_after", "lag", "partitions"),
    [(None, 7, 2), (1, None, 2)],
    ids=["lag-summed-over-the-assignment", "revoked-while-a-position-was-awaited"],
)
def test_observe(revoke_after: int | None, lag: int | None, partitions: int) -> None:
    consumer = Consumer({TP0: 10, TP1: 20}, {TP0: 8, TP1: 15})
    consumer.revoke_after = revoke_after
    progress = ConsumerProgress()
    asyncio.run(observe(consumer, progress))
    assert progress.started and progress.partitions == partitions
    assert progress.lag == lag
