"""The worker's outbox publisher: a message the broker refuses for its content is set aside as
undeliverable (kept in the store, counted, logged in one bounded line) and never stops the
rest; any other send error fails the publish and leaves the message queued."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import (
    CorruptRecordException,
    KafkaConnectionError,
    MessageSizeTooLargeError,
)
from faust.exceptions import ProducerSendError

from ledger.pricing import Price, PriceBook
from ledger.store.port import OffsetRange, OutboxMessage
from streams.kafka import content_refusal
from streams.worker import LedgerWorker, WorkerSettings


class FakeTopic:
    """A Faust topic as the publisher uses it: `send` raises (client-side refusal, as Faust
    wraps aiokafka's) or returns a future the broker settles."""

    def __init__(self, largest: int = 1000) -> None:
        self.largest = largest
        self.sent: list[bytes] = []
        self.corrupt: set[bytes] = set()
        self.down = False

    async def send(self, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        if len(value) > self.largest:
            try:
                raise MessageSizeTooLargeError("The message is too large")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.down:
            future.set_exception(KafkaConnectionError("connection lost"))
        elif value in self.corrupt:
            future.set_exception(CorruptRecordException())
        else:
            self.sent.append(value)
            future.set_result(None)
        return future


class Observer:
    def __init__(self) -> None:
        self.undeliverable_topics: list[str] = []

    def observe_batch(self, messages: int, postings: int, commit_seconds: float) -> None: ...

    def dead_letter(self, count: int = 1) -> None: ...

    def worker_error(self, kind: str) -> None: ...

    def undeliverable(self, topic: str, count: int = 1) -> None:
        self.undeliverable_topics.extend([topic] * count)


@pytest.fixture
def worker(tmp_path):
    settings = WorkerSettings(
        bootstrap=("127.0.0.1:1",),
        group_id="test",
        samples_topic="samples",
        deadletter_topic="deadletter",
        alerts_topic="alerts",
        data_dir=tmp_path / "ledger",
        prices=PriceBook((Price("*", 2_500_000),)),
        cost_centres={},
    )
    w = LedgerWorker(settings, Observer())
    yield w
    w.store.close()


def queue(worker: LedgerWorker, *messages: OutboxMessage) -> None:
    worker.store.commit("inc", [OffsetRange("samples", 0, 0, 0)], [], outbox=list(messages))


def msg(n: int, value: bytes, topic: str = "deadletter") -> OutboxMessage:
    return OutboxMessage(f"m-{n}", topic, None, value)


@pytest.mark.parametrize(
    ("refused", "why"),
    [
        pytest.param(b"x" * 5000, "MessageSizeTooLargeError", id="too-large-client-side"),
        pytest.param(b"corrupt", "CorruptRecordException", id="corrupt-broker-side"),
    ],
)
def test_a_refused_message_is_kept_undeliverable_and_the_rest_goes_on(worker, refused, why, caplog):
    topic = FakeTopic()
    topic.corrupt.add(b"corrupt")
    worker._outputs = {"deadletter": topic, "alerts": topic}
    queue(worker, msg(1, b"first"), msg(2, refused), msg(3, b"third", "alerts"))
    with caplog.at_level(logging.ERROR, logger="tally.worker"):
        asyncio.run(worker.publish_outbox())
    assert topic.sent == [b"first", b"third"]
    assert worker.store.pending_outbox() == []
    [kept] = worker.store.undeliverable()
    assert kept.message.id == "m-2" and kept.message.value == refused
    assert kept.reason.startswith(why)
    assert worker.stats.undeliverable == 1
    assert worker.observer.undeliverable_topics == ["deadletter"]
    [line] = [r.getMessage() for r in caplog.records if "undeliverable" in r.getMessage()]
    assert "m-2" in line and len(line) < 4096


def test_a_broker_away_fails_the_publish_and_keeps_the_message_queued(worker):
    topic = FakeTopic()
    worker._outputs = {"deadletter": topic}
    queue(worker, msg(1, b"first"))
    topic.down = True
    with pytest.raises(KafkaConnectionError):
        asyncio.run(worker.publish_outbox())
    assert [m.id for m in worker.store.pending_outbox()] == ["m-1"]
    assert worker.store.undeliverable() == []
    topic.down = False
    asyncio.run(worker.publish_outbox())
    assert topic.sent == [b"first"] and worker.store.pending_outbox() == []


@pytest.mark.parametrize(
    ("exc", "refused"),
    [
        pytest.param(MessageSizeTooLargeError(), True, id="too-large"),
        pytest.param(CorruptRecordException(), True, id="corrupt"),
        pytest.param(KafkaConnectionError(), False, id="connection-lost"),
        pytest.param(TimeoutError(), False, id="timeout"),
    ],
)
def test_content_refusal_is_found_through_fausts_wrapping(exc, refused):
    try:
        try:
            raise exc
        except Exception as inner:
            raise ProducerSendError("Error while sending") from inner
    except ProducerSendError as wrapped:
        assert (content_refusal(wrapped) is exc) is refused
    assert (content_refusal(exc) is exc) is refused
