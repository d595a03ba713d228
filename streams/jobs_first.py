"""Jobs before samples: a samples batch waits, briefly, for the jobs topic read up to its end.

The jobs topic says who held which GPU when (`GpuAssigned`, `GpuReleased`); a sample is
charged by the timeline the ledger knows when it folds the sample. The scheduler publishes a
release as it decides it, so by the time a sample whose interval ends after the release is
fetched, the release is on the jobs topic already; but the worker reads the jobs topic by
another route (a Faust agent), and a samples batch folded before that route has caught up
charges the whole sample to the job that had just released the GPU (its holding still open in
the ledger's view) until the release is folded and corrects it (`ledger.job_owners.retimed`): a
reversal and a re-posting for every such sample. So before folding a samples batch the worker
reads the jobs topic's end offsets and waits until the ledger has applied every partition up to
them (`JobsFirst.wait`), for at most `limit_s`: the jobs route may be far behind, or hold no
partition of the topic at all (it is a group member too), and samples must not stop for it.
A failure to read the end offsets (the broker away) does not wait either.

`lagging` is the rule, pure: the partitions whose next offset to apply is below the end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("tally.worker")

PartitionEnd = Mapping[int, int]  # partition → end offset


def lagging(ends: PartitionEnd, next_offset: Callable[[int], int]) -> list[int]:
    """The partitions whose next offset to apply is below their end offset, sorted."""
    return sorted(p for p, end in ends.items() if next_offset(p) < end)


class JobsFirst:
    """Waits for the ledger to have applied the jobs topic up to its end offsets."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        options: Mapping[str, Any] | None = None,
        limit_s: float = 1.0,
        poll_s: float = 0.01,
        request_timeout_s: float = 0.5,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.options = dict(options or {})
        self.limit_s = limit_s
        self.poll_s = poll_s
        self.request_timeout_s = request_timeout_s
        self.waited_s = 0.0  # in all, for the worker's statistics and tests
        self._consumer: Any = None

    async def wait(self, next_offset: Callable[[int], int]) -> bool:
        """Wait until no jobs partition lags its end (now), or `limit_s`; whether it caught up
        (False also when the end offsets could not be read)."""
        ends = await self._ends()
        if ends is None:
            return False
        started = time.monotonic()
        try:
            while lagging(ends, next_offset):
                if time.monotonic() - started >= self.limit_s:
                    return False
                await asyncio.sleep(self.poll_s)
            return True
        finally:
            self.waited_s += time.monotonic() - started

    async def _ends(self) -> dict[int, int] | None:
        from aiokafka import TopicPartition
        from aiokafka.errors import KafkaError

        try:
            consumer = await asyncio.wait_for(self._started(), self.request_timeout_s)
            parts = consumer.partitions_for_topic(self.topic)
            if not parts:  # not known yet (the topic made after the worker started): ask again
                await asyncio.wait_for(consumer.topics(), self.request_timeout_s)
                parts = consumer.partitions_for_topic(self.topic) or set()
            if not parts:
                return {}
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            ends = await asyncio.wait_for(consumer.end_offsets(tps), self.request_timeout_s)
        except (TimeoutError, KafkaError, OSError) as exc:
            log.debug("jobs end offsets not read (%s): folding samples without waiting", exc)
            return None
        return {tp.partition: int(end) for tp, end in ends.items()}

    async def _started(self) -> Any:
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                client_id="tally-worker-jobs-first",
                enable_auto_commit=False,
                group_id=None,
                **self.options,
            )
            try:
                await consumer.start()
                await consumer.topics()  # the topic's metadata, for `partitions_for_topic`
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
