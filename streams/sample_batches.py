"""The samples topic, consumed in batches straight from the broker.

Faust hands a stream its messages one event at a time, about 100 µs each on a 2-core machine
(event objects, per-event acknowledgement, the conductor), which caps a real-time feed (one
sample per message) near 10k samples/s whatever the ledger does with them. So the samples
topic, the one high-volume input, is read by an aiokafka group consumer that runs inside the
worker's Faust app: each `getmany` batch goes to the ingest as it is, and its offsets are
committed to the broker after the ledger commit, never before. The admin and jobs topics, small
and ordered, stay Faust agents.

Exactly-once effect holds as for the agents: the offsets a batch applied are in the store, so a
batch fetched again (after a crash, a rebalance, or an offset commit that failed because the
group rebalanced meanwhile) is skipped there. The consumer group is the worker's `group_id`
with `.samples` appended: Faust's own group uses Faust's partition assignor, which a plain
consumer cannot share a group with.

A fetched batch goes to the ledger in parts of at most `MAX_PART_BYTES` of message values (at
least one message each), each applied and committed to the ledger in turn, and the broker
offsets are committed after the last: a part is what a smaller fetch would have been, so the
ledger's effect is the same, while the worker's memory per commit stays bounded. Packed history
(30 rounds per message) fetched 2,000 messages at a time is ~60,000 samples: folded as one
commit, the ingest's peak memory rose ~420 MiB on the benchmark's data (measured in process);
in parts of 8 MiB, ~280 MiB.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from ledger.store.port import ConsumedMessage
from streams.kafka import DEFAULT_GROUP_OPTIONS
from streams.progress import ConsumerProgress, observe

log = logging.getLogger("tally.worker")
RETRY_S = 1.0
MAX_PART_BYTES = 8 << 20  # ~10,000 samples of the collector's JSON per ledger commit

OnBatch = Callable[[list[ConsumedMessage]], Awaitable[None]]
OnAssigned = Callable[[], Awaitable[None]]


class PartitionHooks(Protocol):
    """What a sharded worker does as partitions move (`streams.sharded_worker`)."""

    async def revoked(self, partitions: set[int]) -> None:
        """Before `partitions` are given up (seal and hand them over)."""

    async def assigned(self, partitions: set[int]) -> None:
        """`partitions` were assigned (the whole assignment), paused: each is fetched once the
        hooks resume it (`SampleBatchConsumer.resume_at`). Called within the rebalance, whose
        heartbeats wait for it: it must return quickly."""


def parts(
    messages: Sequence[ConsumedMessage], max_bytes: int = MAX_PART_BYTES
) -> list[list[ConsumedMessage]]:
    """`messages` in order, cut into runs whose values add up to at most `max_bytes` (a
    message larger than that is a run of its own)."""
    runs: list[list[ConsumedMessage]] = []
    run: list[ConsumedMessage] = []
    size = 0
    for message in messages:
        length = len(message.value) if message.value else 0
        if run and size + length > max_bytes:
            runs.append(run)
            run, size = [], 0
        run.append(message)
        size += length
    if run:
        runs.append(run)
    return runs


def newest_stamp(stamps: Sequence[int | None]) -> int | None:
    """The newest of records' timestamps; None when one has none (or there are none)."""
    if not stamps or any(t is None for t in stamps):
        return None
    return max(t for t in stamps if t is not None)


def samples_group(group_id: str) -> str:
    return f"{group_id}.samples"


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self, consumer: AIOKafkaConsumer, on_assigned: OnAssigned, hooks: PartitionHooks | None
    ) -> None:
        self._consumer = consumer
        self._on_assigned = on_assigned
        self._hooks = hooks

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        # each batch is committed to the ledger before the next fetch; a sharded worker seals
        if self._hooks is not None:
            await self._hooks.revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._on_assigned()
        if self._hooks is None:
            return
        self._consumer.pause(*assigned)  # fetched from where their shard says, once taken up
        await self._hooks.assigned({tp.partition for tp in assigned})


class SampleBatchConsumer:
    """Feeds the samples topic to `on_batch` in batches of at most `max_messages` (and
    `MAX_PART_BYTES`), committing each fetch's offsets after `on_batch` returned for all its
    parts."""

    def __init__(
        self,
        bootstrap: tuple[str, ...],
        group_id: str,
        topic: str,
        max_messages: int,
        within_s: float,
        on_batch: OnBatch,
        on_assigned: OnAssigned,
        kafka_options: Mapping[str, Any] | None = None,
        group_options: Mapping[str, int] = DEFAULT_GROUP_OPTIONS,
        hooks: PartitionHooks | None = None,
    ) -> None:
        self._bootstrap = list(bootstrap)
        self._group = samples_group(group_id)
        self._kafka_options = dict(kafka_options or {})  # security: SASL, TLS
        self._group_options = dict(group_options)  # session, heartbeat, rebalance, request
        self._topic = topic
        self._max = max_messages
        self._within_ms = max(1, int(within_s * 1000))
        self._on_batch = on_batch
        self._on_assigned = on_assigned
        self._hooks = hooks
        self._consumer: AIOKafkaConsumer | None = None
        self.progress = ConsumerProgress()  # assignment, lag, latest fetch error (health)
        # the newest Kafka record timestamp (epoch ms) of the part `on_batch` is handed now
        # (`streams.jobs_first.settled`); None before the first
        self.newest_ms: int | None = None

    def resume_at(self, partition: int, offset: int) -> bool:
        """Fetch `partition` from `offset` on (a sharded worker's shard's applied offset, not
        the group's committed one); False when it is no longer assigned."""
        consumer = self._consumer
        tp = TopicPartition(self._topic, partition)
        if consumer is None or tp not in consumer.assignment():
            return False
        consumer.seek(tp, offset)
        consumer.resume(tp)
        return True

    async def end_offsets(self) -> dict[int, int] | None:
        """Every partition's end offset (None: not started)."""
        consumer = self._consumer
        if consumer is None:
            return None
        await consumer.topics()  # the topic's metadata, its partitions included
        tps = [
            TopicPartition(self._topic, p) for p in consumer.partitions_for_topic(self._topic) or ()
        ]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: int(offset) for tp, offset in ends.items()}

    async def log_start(self, partition: int) -> int:
        """The first offset the broker still holds of `partition`."""
        assert self._consumer is not None
        tp = TopicPartition(self._topic, partition)
        return int((await self._consumer.beginning_offsets([tp]))[tp])

    def _new_consumer(self) -> AIOKafkaConsumer:  # needs the running loop
        return AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self._max,
            max_partition_fetch_bytes=8 << 20,
            **self._group_options,
            **self._kafka_options,
        )

    async def run(self) -> None:
        """Consume until cancelled."""
        consumer = self._consumer = self._new_consumer()
        consumer.subscribe(
            [self._topic], listener=_Rebalance(consumer, self._on_assigned, self._hooks)
        )
        while True:
            try:
                await consumer.start()
                break
            except KafkaError as exc:
                self.progress.failed(exc)
                log.warning("samples consumer cannot start yet: %s", exc)
                await asyncio.sleep(RETRY_S)
        try:
            while True:
                await self._step()
        finally:
            await consumer.stop()

    async def _step(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            fetched = await consumer.getmany(timeout_ms=self._within_ms, max_records=self._max)
        except KafkaError as exc:  # the broker is away: aiokafka reconnects, try again
            self.progress.failed(exc)
            log.warning("fetching samples failed: %s", exc)
            await asyncio.sleep(RETRY_S)
            return
        if not fetched:
            await observe(consumer, self.progress)
            return
        messages = [
            ConsumedMessage(r.topic, r.partition, r.offset, r.value, r.key)
            for records in fetched.values()
            for r in records
        ]
        stamps = [r.timestamp for records in fetched.values() for r in records]
        start = 0
        for part in parts(messages):
            self.newest_ms = newest_stamp(stamps[start : start + len(part)])
            start += len(part)
            await self._on_batch(part)
        offsets = {tp: records[-1].offset + 1 for tp, records in fetched.items() if records}
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:  # the ledger holds them: harmless
            log.info("offsets of an applied batch not committed to the broker: %s", exc)
        await observe(consumer, self.progress)
