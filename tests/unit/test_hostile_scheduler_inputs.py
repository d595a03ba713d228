"""Hostile input on the topics the scheduler reads: `balances`, `alerts` and its replay of
`jobs`, against the real dispatcher on the fake executor.

- `balances`: garbage is an `EventError` (the feed logs and skips it), never another
  exception; well-formed updates with hostile content (negative and 2⁶⁴ sequence numbers,
  times before 1970 and in 9999, balances of ±2⁶³, unknown accounts and teams, control
  characters) never raise in `on_balance`; afterwards a valid budget still admits a job;
- `alerts`: any value is an idle alert or ignored, by the scheduler and by alert delivery
  (`streams.alerts.consumer.read_alert`);
- `jobs` replay: garbage values and `tally-seq` headers (missing, non-numeric, repeated, 2⁶⁴)
  interleaved with the topic's real messages rebuild exactly the state the real messages alone
  rebuild; well-formed job events that make no sense (a start before any submit, a finish of
  an unknown job, GPUs that do not exist) are refused one by one, never a crash.

The example counts are the named constants below.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.alerts import AlertKind, decode_alert
from ledger.balances import (
    BalanceRow,
    BalanceUpdate,
    BudgetLine,
    BudgetStatus,
    decode_balance_update,
    encode_balance_update,
)
from ledger.errors import EventError
from ledger.job_events import (
    GpuAssigned,
    JobFinished,
    JobStarted,
    JobSubmitted,
    encode_job_event,
)
from scheduler.executors.fake import FakeExecutor
from scheduler.jobs_topic import Consumed
from scheduler.records import JobState
from streams.alerts.consumer import read_alert
from tally.scheduling import build_dispatcher
from tests.hostile import YEAR_9999_US, dumps, nested, not_json, wrong_shapes
from tests.scheduler_builders import a_spec
from tests.unit.test_scheduler_service_support import T0_US, Rig, budget_update, idle_alert

BALANCE_EXAMPLES = 200  # garbage values decoded
ALERT_EXAMPLES = 200  # garbage values read by alert delivery
HOSTILE_BALANCE_EXAMPLES = 60  # lists of 1-8 hostile updates folded into a dispatcher
REPLAY_EXAMPLES = 40  # replays of the real messages with 1-10 garbage messages among them
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _valid_balance() -> dict[str, Any]:
    value = encode_balance_update(budget_update("vision", 1, gpu_granted=10**9))
    parsed: dict[str, Any] = orjson.loads(value)
    return parsed


@st.composite
def broken_balance(draw: st.DrawFn) -> bytes:
    """A balance message with one part replaced by something of the wrong type or shape."""
    obj = _valid_balance()
    target = draw(st.sampled_from(("top", "data", "budget", "line")))
    where: dict[str, Any] = {
        "top": obj,
        "data": obj["data"],
        "budget": obj["data"]["budget"],
        "line": obj["data"]["budget"]["lines"][0],
    }[target]
    key = draw(st.sampled_from(sorted(where)))
    where[key] = draw(
        st.sampled_from(
            (None, "", 1.5, 2**70, -(2**70), [], {}, [[1]], "x", {"a": [1]}, [{"unit": 1}])
        )
    )
    return dumps(obj)


BALANCE_GARBAGE = st.one_of(not_json(), wrong_shapes(), broken_balance())


@settings(SETTINGS, max_examples=BALANCE_EXAMPLES)
@given(value=BALANCE_GARBAGE)
def test_balance_garbage_is_an_event_error_or_an_update(value):
    try:
        update = decode_balance_update(value)
    except EventError:
        return
    assert isinstance(update, BalanceUpdate)


@settings(SETTINGS, max_examples=ALERT_EXAMPLES)
@given(value=st.one_of(not_json(), wrong_shapes(), st.just(nested(1000)), st.none()))
def test_alert_delivery_skips_garbage(value):
    assert read_alert(value, "tally.alerts[0]@0") is None


NASTY_INT = st.sampled_from((-1, 0, 1, 2**62, 2**63 - 1, -(2**63), 2**64 - 1))
NASTY_TIME = st.sampled_from((T0_US, -1, 0, YEAR_9999_US, 2**63 - 1))
ACCOUNTS = st.sampled_from(
    (
        "budget:vision",
        "consumer:vision/detection",
        "consumer:vision",
        "consumer:",
        "budget:",
        "budget:nobody",
        "hold:vision",
        ":",
        "consumer:\x00/\n",
        "z" * 300,
    )
)


@st.composite
def hostile_update(draw: st.DrawFn) -> BalanceUpdate:
    lines = tuple(
        BudgetLine(
            draw(st.sampled_from(("gpu_ms", "money_micros", "?"))),
            *draw(st.tuples(NASTY_INT, NASTY_INT, NASTY_INT)),
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    account = draw(ACCOUNTS)
    return BalanceUpdate(
        account=account,
        seq=draw(NASTY_INT),
        as_of_us=draw(NASTY_TIME),
        current_period=draw(st.sampled_from((None, "2026-11", "9999-99", ""))),
        periods=tuple(
            BalanceRow(
                account,
                "gpu_ms",
                draw(st.sampled_from(("2026-11", "0000-00", ""))),
                draw(NASTY_INT),
            )
            for _ in range(draw(st.integers(0, 2)))
        ),
        totals=tuple((u, draw(NASTY_INT)) for u in draw(st.sets(st.sampled_from(("gpu_ms", "?"))))),
        budget=draw(
            st.sampled_from(
                (None, BudgetStatus("vision", "2026-11", lines), BudgetStatus("", "", lines))
            )
        ),
    )


@settings(SETTINGS, max_examples=HOSTILE_BALANCE_EXAMPLES)
@given(
    updates=st.lists(hostile_update(), min_size=1, max_size=8),
    alerts=st.lists(st.one_of(not_json(), wrong_shapes()), max_size=3),
)
def test_hostile_balances_and_alerts_leave_the_scheduler_working(updates, alerts, tmp_path_factory):
    rig = Rig(tmp_path_factory.mktemp("rig"))
    for update in updates:
        rig.dispatcher.on_balance(update)  # values as the wire may carry them (up to 2⁶⁴-1)
    for value in alerts:
        rig.dispatcher.on_alert(value)
        with pytest.raises(EventError):
            decode_alert(value)
    rig.dispatcher.on_alert(idle_alert("GPU-x", T0_US, None))
    # a valid budget after the garbage: its seq is above any the garbage used
    rig.dispatcher.on_balance(budget_update("vision", 2**64, gpu_granted=10**12))
    rig.dispatcher.on_balance(budget_update("language", 2**64, gpu_granted=10**12))

    async def go():
        job = await rig.submit(team="language")
        await rig.ticks(2)
        return job.job_id

    job = asyncio.run(go())
    assert rig.dispatcher.records[job].state in (JobState.RUNNING, JobState.FINISHED)


def _jobs_topic(tmp_path) -> tuple[Rig, list[Consumed]]:
    rig = Rig(tmp_path)

    async def go():
        await rig.submit(gpus=2, queue="train")
        await rig.submit(team="language")
        await rig.ticks(3)
        await rig.submit(team="language", gpus=2)

    asyncio.run(go())
    messages = [Consumed(0, i, m.value, m.seq) for i, m in enumerate(rig.publisher.messages)]
    return rig, messages


HEADERS = st.one_of(st.none(), st.sampled_from((0, -1, 1, 2**64 - 1, 2**70)))


def _nonsense_events() -> list[bytes]:
    """Well-formed job events that make no sense against the topic's story."""
    spec = a_spec("job-ghost", queue="nonexistent", team="nobody")
    return [
        encode_job_event(JobStarted("job-never-submitted", T0_US), "tally://scheduler"),
        encode_job_event(JobFinished("job-unknown", YEAR_9999_US), "tally://scheduler"),
        encode_job_event(JobSubmitted(spec, T0_US), "tally://scheduler"),
        encode_job_event(
            GpuAssigned("GPU-none", "n", "p", "m", "job-x", "t", "p", "u", 1), "tally://scheduler"
        ),
    ]


@pytest.mark.parametrize("with_nonsense", [False, True], ids=["garbage", "garbage-and-nonsense"])
@settings(SETTINGS, max_examples=REPLAY_EXAMPLES // 2)
@given(data=st.data())
def test_replay_with_garbage_rebuilds_the_same_jobs(with_nonsense, data, tmp_path_factory):
    rig, real = _jobs_topic(tmp_path_factory.mktemp("replay"))
    garbage_values = st.one_of(
        not_json(), wrong_shapes(), st.just(nested(1000)), st.just(b""), st.none()
    )
    bad = data.draw(st.lists(garbage_values, min_size=1, max_size=10), label="garbage")
    mixed = list(real)
    for value in bad:
        at = data.draw(st.integers(0, len(mixed)))
        mixed.insert(at, Consumed(1, 1000 + at, value, data.draw(HEADERS)))
    if with_nonsense:  # without a seq: one the scheduler used would stand for its message
        mixed += [Consumed(2, i, value, None) for i, value in enumerate(_nonsense_events())]

    def replayed(messages: list[Consumed]):
        fresh = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
        applied = fresh.replay(messages)
        return fresh, applied

    alone, applied_alone = replayed(real)
    fresh, applied = replayed(mixed)
    assert alone.records == rig.dispatcher.records  # the replay itself is exact
    if not with_nonsense:
        assert fresh.records == alone.records and applied == applied_alone
        assert fresh.replay_errors == 0
    else:  # the nonsense is refused event by event; the real jobs are all there
        for job_id, record in alone.records.items():
            assert dataclasses.asdict(fresh.records[job_id]) == dataclasses.asdict(record)


def test_an_alert_nested_1000_levels_deep_is_refused_not_a_crash():
    """Regression: `str()` of a field nested 1,000 levels deep raised RecursionError out of
    `decode_alert`, past the scheduler's and alert delivery's `EventError` handlers. (Hypothesis
    raises the recursion limit while it runs, so this is a plain test.)"""
    head = dumps({"id": "a", "type": AlertKind.DETECTED.value, "subject": "GPU-1"})[:-1]
    value = head + b', "data": {"gpu_uuid": "GPU-1", "node": ' + nested(990) + b"}}"
    with pytest.raises(EventError):
        decode_alert(value)
    assert read_alert(value, "tally.alerts[0]@0") is None
