"""A `jobs` message the broker refuses for its content (too large, corrupt) is a clear
`MessageRefused`, never retried within a call and never a crash of the service."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import CorruptRecordException, KafkaConnectionError, MessageSizeTooLargeError

from scheduler.errors import BrokerUnavailable, MessageRefused
from scheduler.kafka import _kafka
from scheduler.ports import Work
from scheduler.records import SubmitRequest
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


def test_a_refused_publish_is_reported_unpublished_at_once_and_the_service_goes_on(tmp_path):
    rig = Rig(tmp_path)
    rig.service.publish_timeout_s = 30.0  # a retry loop would hold the call this long
    memory_publish = rig.publisher.publish
    calls = {"refused": 0}

    async def refusing(messages):
        if calls["refused"] < 1:
            calls["refused"] += 1
            raise MessageRefused("publishing to jobs: the broker refused a message")
        return await memory_publish(messages)

    rig.publisher.publish = refusing  # type: ignore[method-assign]

    async def go():
        started = time.monotonic()
        accepted = await rig.service.submit(
            SubmitRequest("vision", "detection", "ada", "dev", 1, Work(command=("true",)))
        )
        took = time.monotonic() - started
        await rig.ticks(2)  # the next publish goes through: nothing was lost
        return accepted, took

    accepted, took = asyncio.run(go())
    assert not accepted.published and took < 5.0
    assert calls["refused"] == 1
    assert rig.job_events(accepted.record.job_id)[0] == "JobSubmitted"
