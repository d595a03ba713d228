"""The admin, jobs and inventory-reports topics as a sharded worker reads them: outside any
consumer group, each partition from the offset its shards need.

Every shard folds admin and jobs (a samples shard for its views: prices, teams, closed periods,
owners, assignments; the global shard for everything), and only the global shard folds
inventory reports. A worker's shards need not be at the same offset of these topics (one taken
up from its head a moment ago is behind), so the feed is told, before each fetch, where each
partition is to be read from (`ViewFeed.fetch`, the lowest offset any shard still needs), seeks
there when that is not where it stands, and pauses the partitions no shard reads. Each shard's
ingestor skips what it applied already (its applied offsets are in its store), so handing a
shard messages it has is harmless: the feed needs no state beyond its position.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from ledger.store.port import ConsumedMessage

log = logging.getLogger("tally.worker")
PartitionKey = tuple[str, int]


class ViewFeed:
    """Reads `topics` (all their partitions) outside any group."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        topics: Sequence[str],
        kafka_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap = list(bootstrap)
        self._topics = list(topics)
        self._options = dict(kafka_options or {})
        self._consumer: AIOKafkaConsumer | None = None
        self._at: dict[TopicPartition, int] = {}  # where the next fetch reads from
        self.partitions: list[PartitionKey] = []

    async def start(self) -> None:
        """Connect and learn the topics' partitions (a `KafkaError` when the broker is away)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self._options,
        )
        await consumer.start()
        try:
            await consumer.topics()  # the metadata of every topic, these included
            tps = [
                TopicPartition(topic, p)
                for topic in self._topics
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            consumer.assign(tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self.partitions = [(tp.topic, tp.partition) for tp in tps]

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def fetch(
        self, starts: Mapping[PartitionKey, int], max_records: int, timeout_ms: int
    ) -> list[ConsumedMessage]:
        """The next messages of the partitions in `starts`, each read from its offset there
        (or from where the previous fetch left off, when that is the same); partitions not in
        `starts` are not read."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        wanted: list[TopicPartition] = []
        for tp in consumer.assignment():
            start = starts.get((tp.topic, tp.partition))
            if start is None:
                consumer.pause(tp)
                self._at.pop(tp, None)
                continue
            consumer.resume(tp)
            wanted.append(tp)
            if self._at.get(tp) != start:
                consumer.seek(tp, start)
                self._at[tp] = start
        if not wanted:
            return []
        fetched = await consumer.getmany(*wanted, timeout_ms=timeout_ms, max_records=max_records)
        messages: list[ConsumedMessage] = []
        for tp, records in fetched.items():
            for r in records:
                if r.offset < self._at.get(tp, 0):
                    continue  # fetched before a seek back
                messages.append(ConsumedMessage(r.topic, r.partition, r.offset, r.value, r.key))
            if records:
                self._at[tp] = max(self._at.get(tp, 0), records[-1].offset + 1)
        return messages
