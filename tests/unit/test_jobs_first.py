"""Jobs before samples (`streams.jobs_first`): the lag rule and the rule that skips asking, and the
wait against the real broker — caught up at once, caught up while waiting, given up after its
limit, not asking again for samples produced before a caught-up check, and not waiting at all
when the broker cannot be reached."""

from __future__ import annotations

import asyncio
import time

import pytest

from streams.jobs_first import Caught, JobsFirst, lagging, settled
from streams.sample_batches import newest_stamp
from tally.broker import EmbeddedBroker, free_port
from tests.conftest import create_topics
from tests.integration.support import send_messages

CASES = {
    "nothing-on-the-topic": ({}, {}, []),
    "caught-up": ({0: 3, 1: 5}, {0: 3, 1: 5}, []),
    "one-behind": ({0: 3, 1: 5}, {0: 3, 1: 4}, [1]),
    "never-read": ({0: 2, 1: 0}, {}, [0]),
    "ahead-of-an-old-end": ({0: 2}, {0: 9}, []),
}


@pytest.mark.parametrize(("ends", "applied", "behind"), CASES.values(), ids=CASES.keys())
def test_partitions_lag_while_their_next_offset_is_below_the_end(ends, applied, behind):
    assert lagging(ends, lambda p: applied.get(p, 0)) == behind


AT = 1_000_000  # the caught-up check's wall time, ms
SETTLED = {  # caught-up check (ends), newest sample timestamp, applied now, skew → settled
    "no-check-yet": (None, AT - 60_000, {0: 3}, 1000, False),
    "produced-before-the-check": ({0: 3, 1: 5}, AT - 60_000, {0: 3, 1: 5}, 1000, True),
    "produced-after-the-check": ({0: 3}, AT + 1, {0: 3}, 1000, False),
    "within-the-clock-skew": ({0: 3}, AT - 999, {0: 3}, 1000, False),
    "just-past-the-clock-skew": ({0: 3}, AT - 1000, {0: 3}, 1000, True),
    "applied-past-the-ends": ({0: 3}, AT - 60_000, {0: 7}, 1000, True),
    "offsets-afresh-new-incarnation": ({0: 3}, AT - 60_000, {}, 1000, False),
    "no-timestamp": ({0: 3}, None, {0: 3}, 1000, False),
    "broker-gave-no-timestamp": ({0: 3}, -1, {0: 3}, 1000, False),
    "empty-topic": ({}, AT - 60_000, {}, 1000, True),
}


@pytest.mark.parametrize(
    ("ends", "newest_ms", "applied", "skew_ms", "expected"), SETTLED.values(), ids=SETTLED.keys()
)
def test_samples_produced_before_a_caught_up_check_need_no_new_one(
    ends, newest_ms, applied, skew_ms, expected
):
    caught = None if ends is None else Caught(AT, ends)
    assert settled(caught, newest_ms, lambda p: applied.get(p, 0), skew_ms) is expected


STAMPS = {
    "none": ([], None),
    "newest": ([5, 9, 7], 9),
    "one-missing": ([5, None], None),
}


@pytest.mark.parametrize(("stamps", "newest"), STAMPS.values(), ids=STAMPS.keys())
def test_a_parts_newest_record_timestamp(stamps, newest):
    assert newest_stamp(stamps) == newest


def test_the_wait_follows_the_ledger_up_to_the_topics_end(broker: EmbeddedBroker) -> None:
    topic = "jobs-first.jobs"
    create_topics(broker.bootstrap, [topic], partitions=2)
    asyncio.run(send_messages(broker.bootstrap, topic, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]))
    applied: dict[int, int] = {}

    async def scenario() -> tuple[bool, bool, float, bool]:
        first = JobsFirst(broker.bootstrap, topic, limit_s=0.3)
        try:
            gave_up = await first.wait(lambda p: applied.get(p, 0))  # nothing applied yet
            started = time.monotonic()

            async def apply_later() -> None:  # the jobs route catches up meanwhile
                await asyncio.sleep(0.1)
                ends = await first._ends()
                assert ends is not None
                applied.update(ends)

            first.limit_s = 5.0
            caught, _ = await asyncio.gather(first.wait(lambda p: applied.get(p, 0)), apply_later())
            took = time.monotonic() - started
            again = await first.wait(lambda p: applied.get(p, 0))
            asked = first.asked
            old = await first.wait(lambda p: applied.get(p, 0), time.time_ns() // 10**6 - 60_000)
            skipped = first.asked - asked
            fresh = await first.wait(lambda p: applied.get(p, 0), time.time_ns() // 10**6)
            asked_again = first.asked - asked
        finally:
            await first.close()
        return gave_up, caught, took, again, (old, skipped, fresh, asked_again, first.skipped)

    gave_up, caught, took, again, later = asyncio.run(scenario())
    assert (gave_up, caught, again) == (False, True, True)
    assert sum(applied.values()) == 3
    assert took < 2.0  # it returned once caught up, not at its 5 s limit
    # samples a minute old: folded on the caught-up check, no request; samples of now: asked
    assert later == (True, 0, True, 1, 1)


def test_an_unreachable_broker_does_not_hold_samples_back() -> None:
    first = JobsFirst(f"127.0.0.1:{free_port()}", "jobs", limit_s=5.0, request_timeout_s=0.3)

    async def scenario() -> tuple[bool, float]:
        started = time.monotonic()
        try:
            return await first.wait(lambda p: 0), time.monotonic() - started
        finally:
            await first.close()

    caught, took = asyncio.run(scenario())
    assert caught is False
    assert took < 2.0
