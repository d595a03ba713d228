"""End to end against a real tansu broker: one oversized message never stops the ledger.

Samples whose `id` (or a `data` field) is a 1 MiB string become bounded dead letters, and the
valid samples around them are booked exactly. An outbox message the broker refuses (here one of
2 MiB queued before the worker starts, as an older build queued the whole oversized id: the
worker's producer refuses anything over Faust's `producer_max_request_size`, 1 MB) is kept as
undeliverable and the worker goes on.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from ledger.events import MAX_DEAD_LETTER_BYTES, envelope_to_dict
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.port import OutboxMessage
from tests.conftest import create_topics
from tests.integration.support import (
    WorkerProcess,
    expected_balances,
    fleet_of,
    load,
    pipeline_config,
    produce,
    rounds,
    sealed_transactions,
    wait_until,
)

pytestmark = pytest.mark.broker
MIB = 1 << 20


async def _send_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=8 * MIB)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=5000)
        return [m.value for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()


def test_oversized_messages_never_stop_the_worker(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 1)
    good = rounds(fleet_of(config), 0, 2)
    big_id = envelope_to_dict(good[0][0]) | {"id": "i" * MIB}
    big_field = envelope_to_dict(good[0][1])
    big_field["data"] = big_field["data"] | {"node": "n" * MIB}

    # What an older build queued for such a sample: a dead letter carrying the id whole.
    data_dir = config.ledger.data_dir
    store = DuckDBStore(data_dir)
    try:
        refused = OutboxMessage("old-letter", config.topics.deadletter, None, b"x" * (2 * MIB))
        store.commit("an-older-broker", [], [], outbox=[refused])
    finally:
        store.close()

    asyncio.run(produce(broker.bootstrap, config.topics.samples, good[:1]))
    asyncio.run(
        _send_raw(
            broker.bootstrap,
            config.topics.samples,
            [orjson.dumps(big_id), orjson.dumps(big_field)],
        )
    )
    asyncio.run(produce(broker.bootstrap, config.topics.samples, good[1:]))
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        envelopes = [e for r in good for e in r]
        wait_until(
            lambda: sealed_transactions(data_dir) == len(envelopes),
            90,
            "the valid samples to be sealed",
            worker,
        )
        wait_until(
            lambda: "kept as undeliverable" in worker.log.read_text(errors="replace"),
            30,
            "the refused outbox message to be set aside",
            worker,
        )
        letters = asyncio.run(_read_all(broker.bootstrap, config.topics.deadletter))
        worker.assert_alive()
        assert LedgerQueries(data_dir).balances() == expected_balances(config, envelopes)
    finally:
        assert worker.stop() == 0
    assert len(letters) == 2, [v[:200] for v in letters]
    assert all(len(v) <= MAX_DEAD_LETTER_BYTES for v in letters)
    ids = [orjson.loads(v)["event_id"] for v in letters]
    assert ids[0].endswith("]") and f"[cut: {MIB} chars, sha256 " in ids[0]
    assert ids[1] == big_field["id"]
    store = DuckDBStore(data_dir)
    try:
        [kept] = store.undeliverable()
        assert kept.message.id == "old-letter" and "MessageSizeTooLarge" in kept.reason
        assert store.pending_outbox() == []
    finally:
        store.close()
