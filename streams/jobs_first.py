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

The end offsets are not asked for again while they cannot matter (`settled`): once the ledger
has applied the jobs topic up to the ends read at wall time T, every jobs record the broker had
appended before T is folded; a samples batch whose records were all produced before T (their
Kafka timestamps, set when the producer took the record (a spooled sample's when it was resent),
plus `skew_s` for the clocks of the collector's and the worker's hosts and for a release still
on its way to the broker when the sample spanning it was sent) was produced after no jobs record
that is not folded yet, as long as the ledger still has applied up to those ends (a new broker
incarnation starts its offsets afresh: asked again). A backlog
(a worker catching up, a backfill) is folded with one request at its start; a live feed's
batches, produced after the last check, ask each time, as before.

`lagging` and `settled` are the rules, pure: the partitions whose next offset to apply is below
the end; whether a samples batch may be folded without asking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tally.worker")

PartitionEnd = Mapping[int, int]  # partition → end offset


def lagging(ends: PartitionEnd, next_offset: Callable[[int], int]) -> list[int]:
    """The partitions whose next offset to apply is below their end offset, sorted."""
    return sorted(p for p, end in ends.items() if next_offset(p) < end)


@dataclass(frozen=True, slots=True)
class Caught:
    """A check the ledger caught up with: the jobs topic's end offsets read at wall time `at_ms`
    (taken before the request was sent), all of them applied."""

    at_ms: int
    ends: PartitionEnd


def settled(
    caught: Caught | None,
    newest_ms: int | None,
    next_offset: Callable[[int], int],
    skew_ms: int,
) -> bool:
    """Whether a samples batch whose newest record timestamp is `newest_ms` may be folded without
    reading the end offsets again: every record of it produced (by its timestamp, plus
    `skew_ms`) before the caught-up check, and the ledger still at or past that check's ends.
    No check yet, or no timestamp (None, or -1: the broker gave none): not settled."""
    if caught is None or newest_ms is None or newest_ms < 0:
        return False
    return newest_ms + skew_ms <= caught.at_ms and not lagging(caught.ends, next_offset)


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
        skew_s: float = 5.0,
    ) -> None:
        """`skew_s`: how far the clock of a samples producer's host may run behind the worker's
        (see `settled`)."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.options = dict(options or {})
        self.limit_s = limit_s
        self.poll_s = poll_s
        self.request_timeout_s = request_timeout_s
        self.skew_ms = int(skew_s * 1000)
        self.waited_s = 0.0  # in all, for the worker's statistics and tests
        self.asked = self.skipped = 0  # end offsets read; batches that needed none (`settled`)
        self._caught: Caught | None = None
        self._consumer: Any = None

    async def wait(self, next_offset: Callable[[int], int], newest_ms: int | None = None) -> bool:
        """Wait until no jobs partition lags its end (now), or `limit_s`; whether it caught up
        (False also when the end offsets could not be read). `newest_ms`: the samples batch's
        newest record timestamp; when the last caught-up check already covers it (`settled`),
        True at once, without asking the broker."""
        if settled(self._caught, newest_ms, next_offset, self.skew_ms):
            self.skipped += 1
            return True
        at_ms = time.time_ns() // 1_000_000
        ends = await self._ends()
        if ends is None:
            return False
        self.asked += 1
        started = time.monotonic()
        try:
            while lagging(ends, next_offset):
                if time.monotonic() - started >= self.limit_s:
                    return False
                await asyncio.sleep(self.poll_s)
            self._caught = Caught(at_ms, ends)
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
