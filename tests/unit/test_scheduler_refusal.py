"""A `jobs` message the broker refuses for its content (too large, corrupt) is recorded as
undeliverable (counted, measured, one line in the scheduler's work_dir), never sent again, never
a crash, and never holds up the messages behind it; a broker that is merely away is retried."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import CorruptRecordException, KafkaConnectionError, MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner

from ledger.job_events import JobSubmitted
from scheduler.errors import BrokerUnavailable, MessageRefused
from scheduler.jobs_topic import Outgoing
from scheduler.kafka import KeyPartitioner, _kafka, _outcomes
from scheduler.ports import MemoryPublisher, Work
from scheduler.records import JobState, SubmitRequest
from scheduler.service import Accepted, SchedulerService
from scheduler.undeliverable import FILE_NAME as UNDELIVERABLE_FILE
from scheduler.undeliverable import UndeliverableLog
from tally.metrics import TallyMetrics
from tests.unit.test_scheduler_service_support import Rig


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        pytest.param(MessageSizeTooLargeError("x" * 100_000), MessageRefused, id="too-large"),
        pytest.param(CorruptRecordException(), MessageRefused, id="corrupt"),
        pytest.param(KafkaConnectionError(), BrokerUnavailable, id="connection-lost"),
        pytest.param(OSError("reset"), BrokerUnavailable, id="socket-error"),
    ],
)
def test_the_adapter_tells_a_refused_message_from_a_broker_away(raised, expected):
    async def call() -> None:
        raise raised

    with pytest.raises(expected) as info:
        asyncio.run(_kafka("publishing to jobs", call()))
    assert type(info.value) is expected and len(str(info.value)) <= 2048


@pytest.mark.parametrize(
    ("key", "partitions"),
    [
        (b"job-0123456789ab", [0, 1, 2, 3]),
        (b"GPU-7f3e2c1a-0000-4000-8000-000000000001", [0, 1, 2, 3]),
        (b"job-0123456789ab", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
        (b"x", [3, 5]),
        (b"", [0, 1, 2]),
    ],
    ids=["job-4", "gpu-4", "job-12", "one-byte-2-of-them", "empty-key-3"],
)
def test_the_key_partitioner_puts_a_key_where_the_default_one_does_every_time(key, partitions):
    cached = KeyPartitioner()
    expected = DefaultPartitioner()(key, partitions, partitions)
    assert [cached(key, partitions, partitions[:1]) for _ in range(3)] == [expected] * 3


@pytest.mark.parametrize(
    "settled",
    [
        pytest.param(["ok:0", "ok:1", "ok:2"], id="all-acknowledged-in-order"),
        pytest.param(["ok:2", "ok:0", "ok:1"], id="acknowledged-out-of-order"),
        pytest.param(["ok:0", "refused:1", "ok:2"], id="one-refused-the-rest-go-on"),
        pytest.param(["refused:0", "refused:1"], id="every-one-refused"),
        pytest.param([], id="none"),
    ],
)
def test_acknowledgements_come_back_in_send_order_as_gather_gives_them(settled):
    """`_outcomes` gives what `asyncio.gather(..., return_exceptions=True)` gives: each
    acknowledgement's result or exception, in the order the messages were sent, whatever the
    order they settle in."""

    async def run(collect) -> list[object]:
        loop = asyncio.get_running_loop()
        acks = [loop.create_future() for _ in settled]
        errors = {i: MessageSizeTooLargeError(f"message {i}") for i in range(len(settled))}

        def settle() -> None:
            for what in settled:
                how, _, index = what.partition(":")
                ack = acks[int(index)]
                if how == "ok":
                    ack.set_result((0, int(index)))
                else:
                    ack.set_exception(errors[int(index)])

        loop.call_later(0.001, settle)
        return [x if isinstance(x, tuple) else str(x) for x in await collect(acks)]

    ours = asyncio.run(run(_outcomes))
    gathered = asyncio.run(run(lambda acks: asyncio.gather(*acks, return_exceptions=True)))
    assert ours == gathered
    assert len(ours) == len(settled)


def _refuse_mallory(message: Outgoing) -> str | None:
    """The broker refuses mallory's `JobSubmitted` for its content, whatever is sent after it."""
    spec = getattr(message.event, "spec", None)
    if isinstance(message.event, JobSubmitted) and spec is not None and spec.user == "mallory":
        return "MessageSizeTooLargeError: the message is larger than max.message.bytes"
    return None


def _request(user: str) -> SubmitRequest:
    return SubmitRequest("vision", "detection", user, "dev", 1, Work(command=("true",)))


def test_a_refused_message_is_undeliverable_once_and_the_messages_behind_it_go_on(tmp_path):
    rig = Rig(tmp_path)
    rig.publisher = MemoryPublisher(refuse=_refuse_mallory)
    metrics = TallyMetrics(sections=("scheduler",))
    recorded = UndeliverableLog(tmp_path / "scheduler" / UNDELIVERABLE_FILE)
    rig.service = SchedulerService(
        rig.dispatcher,
        rig.publisher,
        publish_timeout_s=30.0,  # a retry loop would hold the call this long
        observer=metrics,
        undeliverable_log=recorded,
    )

    async def go() -> tuple[Accepted, Accepted, float]:
        started = time.monotonic()
        refused = await rig.service.submit(_request("mallory"))
        valid = await rig.service.submit(_request("ada"))
        took = time.monotonic() - started
        await rig.ticks(5)
        return refused, valid, took

    refused, valid, took = asyncio.run(go())
    assert took < 5.0
    mallory, ada = refused.record.job_id, valid.record.job_id
    # never sent again: offered once, and nothing of it waits
    (seq,) = {int(str(e["seq"])) for e in recorded.entries()}
    assert rig.publisher.offered[seq] == 1
    assert rig.dispatcher.outbox == []
    # the valid job behind it was published, admitted, run and finished
    assert rig.job_events(ada)[0] == "JobSubmitted"
    assert rig.dispatcher.records[ada].state is JobState.FINISHED
    # mallory's decisions go on too (only its JobSubmitted is missing from the topic)
    assert "JobSubmitted" not in rig.job_events(mallory)
    assert rig.dispatcher.records[mallory].state is JobState.FINISHED
    # counted, measured, recorded
    assert rig.service.undeliverable == 1
    assert metrics.registry.get_sample_value("tally_scheduler_undeliverable_total") == 1.0
    (entry,) = recorded.entries()
    assert (entry["event"], entry["job_id"]) == ("JobSubmitted", mallory)
    assert "MessageSizeTooLargeError" in str(entry["reason"])
    assert entry["bytes"] == len(str(entry["value_start"]).encode())  # a small message, whole


def test_a_broker_away_is_retried_and_nothing_is_undeliverable(tmp_path):
    rig = Rig(tmp_path)
    rig.publisher.fail_next = 3  # BrokerUnavailable three times, then it answers

    async def go() -> Accepted:
        accepted = await rig.service.submit(_request("ada"))
        await rig.ticks(3)
        return accepted

    accepted = asyncio.run(go())
    assert accepted.published  # retried within the call, with backoff
    assert rig.service.undeliverable == 0
    assert rig.dispatcher.records[accepted.record.job_id].state is JobState.FINISHED
    assert all(count == 1 for count in rig.publisher.offered.values())
