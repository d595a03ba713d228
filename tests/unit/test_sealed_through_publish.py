"""The global shard owner's publisher (`streams.sealed_through`) against the real broker and two
samples shards published to a directory store: it puts the shards' watermark (the slower
shard's newest sealed usage) with the union's usage up to it on the admin topic, where it
decodes as the event; called again with that watermark folded, it publishes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from ledger.admin import JobUsage, ShardsSealedThrough, TeamUsage, decode_admin_message
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore, PrefixedStore
from ledger.store.replica import Publisher
from ledger.units import Unit
from streams.sealed_through import publish_sealed_through
from tally.broker import EmbeddedBroker
from tests.builders import INTERVAL_US, T0_US
from tests.conftest import create_topics
from tests.unit.test_store import ingest, message

ADMIN = "t.admin"


def a_shard(base: Path, store: LocalObjectStore, partition: int, samples: int) -> None:
    """A samples shard holding `samples` of job-1's samples, one an interval from T0 (each
    sample's usage ends at its time), sealed and published."""
    name = f"samples-{partition}"
    with DuckDBStore(base / name) as shard:
        times = range(1, samples + 1)
        ingest(shard, message(0, *times, partition=partition, gpu=f"GPU-{partition}"))
        shard.seal()
    Publisher(base / name, PrefixedStore(store, f"shards/{name}")).push()


async def publish_twice(
    broker: EmbeddedBroker, store: LocalObjectStore, cache: Path
) -> tuple[ShardsSealedThrough | None, ShardsSealedThrough | None, bytes | None]:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    await producer.start()
    try:
        first = await publish_sealed_through(store, cache, producer, ADMIN, {"job-1"}, None)
        known = first.through_us if first else None
        again = await publish_sealed_through(store, cache, producer, ADMIN, {"job-1"}, known)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        ADMIN, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 10)
        rest = await consumer.getmany(timeout_ms=200)  # nothing after it
    finally:
        await consumer.stop()
    assert not any(rest.values())
    return first, again, record.value


def test_the_watermark_is_published_once_it_advanced(broker, tmp_path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    a_shard(tmp_path, store, 2, samples=4)  # usage through T0 + 4 intervals
    a_shard(tmp_path, store, 3, samples=2)  # through T0 + 2 intervals: the watermark
    create_topics(broker.bootstrap, [ADMIN], partitions=1)
    first, again, value = asyncio.run(publish_twice(broker, store, tmp_path / "cache"))
    assert first is not None and again is None
    assert first.through_us == T0_US + 2 * INTERVAL_US
    assert first.shards == ("samples-2", "samples-3")
    # two samples of each shard end by the watermark; a sample costs 10_000 µ and 10_000 GPU-ms
    used = 4 * 10_000
    assert first.jobs == (JobUsage("job-1", Unit.GPU_MS, used), JobUsage("job-1", Unit.MONEY, used))
    assert first.teams == (
        TeamUsage("vision", Unit.GPU_MS, "2026-11", used),
        TeamUsage("vision", Unit.MONEY, "2026-11", used),
    )
    envelopes, dead = decode_admin_message(value)
    assert dead == [] and [e.data for e in envelopes] == [first]
