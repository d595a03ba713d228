"""Against a real tansu broker: a message refused for its content is set aside once, and the
valid messages around it are delivered — by the scheduler's publisher and by the collector's
producer (the worker's outbox: tests/integration/test_oversized.py).

tansu 0.6 enforces no `max.message.bytes` (it took a 100 MiB message), so the refusal here is
the client's: aiokafka refuses a record over the producer's `max_request_size` with
`MessageSizeTooLargeError`, the error a broker answers for a message over its limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from collectors.producer import SampleProducer
from collectors.spool import Spool
from collectors.undeliverable import FILE_NAME as UNDELIVERABLE_FILE
from collectors.undeliverable import read_undeliverable
from ledger.events import envelope_for
from ledger.job_events import JobWaiting, WaitReason
from scheduler.jobs_topic import job_message
from scheduler.kafka import KafkaPublisher, KeyPartitioner, read_topic
from scheduler.ports import Refused
from scheduler.service import ServiceSettings
from tests.builders import INTERVAL_US, T0_US, a_sample
from tests.conftest import create_topics

pytestmark = pytest.mark.broker
LIMIT = 4096  # the scheduler publisher's max_request_size in this test


def _settings(bootstrap: str, tmp: Path) -> ServiceSettings:
    return ServiceSettings(
        bootstrap=(bootstrap,),
        jobs_topic="jobs",
        balances_topic="balances",
        alerts_topic="alerts",
        ledger_group="ledger",
        work_dir=tmp,
    )


def test_the_scheduler_publisher_refuses_one_message_and_sends_the_others(broker, tmp_path):
    create_topics(broker.bootstrap, ["jobs"], partitions=2)
    waiting = [JobWaiting(f"job-{i}", WaitReason.QUOTA_EXHAUSTED, T0_US + i) for i in range(3)]
    messages = [job_message(event, seq) for seq, event in enumerate(waiting, start=1)]
    too_large = replace(messages[1], value=messages[1].value + b" " * LIMIT)  # still valid JSON

    async def publish() -> list[object]:
        publisher = KafkaPublisher(_settings(broker.bootstrap, tmp_path), max_request_size=LIMIT)
        await publisher.start()
        try:
            return list(await publisher.publish([messages[0], too_large, messages[2]]))
        finally:
            await publisher.stop()

    placed = asyncio.run(publish())
    assert isinstance(placed[1], Refused) and "MessageSizeTooLargeError" in placed[1].reason
    assert all(isinstance(p, tuple) for p in (placed[0], placed[2])), placed
    on_topic = asyncio.run(read_topic(broker.bootstrap, "jobs", "test"))
    assert sorted(m.seq for m in on_topic if m.seq is not None) == [1, 3]
    assert {(m.partition, m.offset) for m in on_topic} == {placed[0], placed[2]}


def test_a_round_over_several_batches_lands_where_the_publisher_says(broker, tmp_path):
    """One call's messages go as record batches per partition (here at most `LIMIT` bytes:
    several per partition): each lands in the partition its key hashes to, at the offset the
    publisher reports for it, and a refused one in the middle leaves the rest in place."""
    create_topics(broker.bootstrap, ["jobs"], partitions=3)
    waiting = [JobWaiting(f"job-{i}", WaitReason.QUOTA_EXHAUSTED, T0_US + i) for i in range(60)]
    messages = [job_message(event, seq) for seq, event in enumerate(waiting, start=1)]
    messages[30] = replace(messages[30], value=messages[30].value + b" " * LIMIT)

    async def publish() -> list[object]:
        publisher = KafkaPublisher(_settings(broker.bootstrap, tmp_path), max_request_size=LIMIT)
        await publisher.start()
        try:
            first = list(await publisher.publish(messages[:45]))
            return first + list(await publisher.publish(messages[45:]))
        finally:
            await publisher.stop()

    placed = asyncio.run(publish())
    assert isinstance(placed[30], Refused), placed[30]
    on_topic = {
        m.seq: (m.partition, m.offset)
        for m in asyncio.run(read_topic(broker.bootstrap, "jobs", "t"))
    }
    expected = {m.seq: p for m, p in zip(messages, placed, strict=True) if isinstance(p, tuple)}
    assert on_topic == expected and len(expected) == 59
    hashed = KeyPartitioner()
    assert all(
        on_topic[m.seq][0] == hashed(m.key, [0, 1, 2], [0, 1, 2]) for m in messages if m.seq != 31
    )
    assert len({p for p, _ in on_topic.values()}) == 3  # every partition, several batches each
    assert max(o for _, o in on_topic.values()) * 300 > LIMIT


def test_the_collector_records_a_refused_message_once_and_delivers_the_rest(broker, tmp_path):
    create_topics(broker.bootstrap, ["samples"], partitions=1)
    huge = a_sample(gpu_uuid="GPU-huge", node="n" * (3 << 20))  # over the client's 2 MiB
    valid = [a_sample(gpu_uuid=f"GPU-{i}", sample_time_us=T0_US + INTERVAL_US) for i in range(3)]
    spool = Spool(tmp_path / "spool")
    producer = SampleProducer(broker.bootstrap, "samples", spool=spool)

    async def run() -> list[int]:
        await producer.start()
        try:
            producer.add(envelope_for(s, "sim://node-01") for s in [valid[0], huge, *valid[1:]])
            first = await producer.flush()
            return [first, await producer.flush()]  # nothing is sent again
        finally:
            await producer.stop()

    assert asyncio.run(run()) == [3, 0]
    assert producer.metrics.value("samples_dropped_total", reason="rejected") == 1
    assert producer.metrics.value("samples_sent_total") == 3
    assert producer.pending() == 0 and spool.records == 0
    (refused,) = read_undeliverable(tmp_path / "spool" / UNDELIVERABLE_FILE)
    assert (refused["topic"], refused["key"], refused["samples"]) == ("samples", "GPU-huge", 1)
    assert int(str(refused["bytes"])) > 3 << 20 and len(str(refused["value_start"])) <= 2048

    async def read() -> list[str]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            "samples", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            batch = await consumer.getmany(timeout_ms=5000)
            values = [m.value for ms in batch.values() for m in ms]
        finally:
            await consumer.stop()
        return [e["data"]["gpu_uuid"] for v in values for e in orjson.loads(v)]

    assert sorted(asyncio.run(read())) == ["GPU-0", "GPU-1", "GPU-2"]
