"""The scheduler service without a broker: the dispatcher on the fake executor, an in-memory
publisher and a manual clock. Decide → publish → enact, holds counted once, budgets and fair
share from `balances` messages, idle reclaim from alerts, runtime limits, retries, cancel,
replay of the jobs topic and recovery of lost jobs."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from ledger.alerts import AlertKind
from ledger.balances import BalanceRow, BalanceUpdate
from ledger.events import GpuHealth, HealthKind, SampleSource, encode_health
from ledger.holds import HoldPlaced, HoldReleased
from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobReclaimed,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    WaitReason,
)
from scheduler.dispatcher import Dispatcher
from scheduler.errors import Rejected, RejectKind
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor, Outcome
from scheduler.jobs_topic import Consumed, replay_order
from scheduler.ports import StopReason, Work
from scheduler.records import JobState, SubmitRequest
from tally.scheduling import build_dispatcher
from tests.unit.test_scheduler_service_support import (
    HOUR_US,
    MINUTE_US,
    SECOND_US,
    T0_US,
    Rig,
    budget_update,
    idle_alert,
)


def test_a_job_is_submitted_admitted_started_and_finished_in_that_order(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        record = await rig.submit(gpus=2)
        await rig.ticks(3)
        return record.job_id

    job = asyncio.run(go())
    assert rig.job_events(job) == [
        "JobSubmitted",
        "JobAdmitted",
        "HoldPlaced",
        "JobStarted",
        "JobFinished",
        "HoldReleased",
    ]
    kinds = [type(e) for e in rig.events()]
    assert kinds.count(GpuAssigned) == 2 and kinds.count(GpuReleased) == 2
    assert rig.dispatcher.records[job].state is JobState.FINISHED
    (started,) = rig.executor.starts
    assert started.job_id == job and len(started.devices) == 2
    keys = {m.key.decode() for m in rig.publisher.messages if isinstance(m.event, GpuAssigned)}
    assert keys == set(rig.dispatcher.records[job].gpu_uuids)  # GPU events keyed by UUID
    seqs = [m.seq for m in rig.publisher.messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_no_decision_is_enacted_before_the_broker_took_its_events(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        await rig.submit()
        rig.publisher.fail_next = 2  # the admission's first two publications fail
        task = asyncio.create_task(rig.service.tick())
        await asyncio.sleep(0.05)
        started_while_failing = len(rig.executor.starts)
        await task
        return started_while_failing

    assert asyncio.run(go()) == 0
    assert len(rig.executor.starts) == 1
    assert any(isinstance(e, JobAdmitted) for e in rig.events())


def test_decisions_wait_for_a_broker_that_is_down_and_are_carried_out_when_it_returns(tmp_path):
    rig = Rig(tmp_path)
    rig.service.publish_timeout_s = 0.2
    rig.service.tick_publish_timeout_s = 0.2
    rig.publisher.fail_next = 1000

    async def go():
        accepted = await rig.service.submit(
            SubmitRequest("vision", "detection", "ada", "dev", 1, Work(command=("true",)))
        )
        await rig.ticks(2)  # admitted in the state, but nothing reached the broker
        nothing_yet = (list(rig.events()), list(rig.executor.starts))
        rig.publisher.fail_next = 0
        await rig.ticks(1)
        return accepted, nothing_yet

    accepted, (published, started) = asyncio.run(go())
    assert not accepted.published and published == [] and started == []
    job = accepted.record.job_id
    assert rig.job_events(job)[:3] == ["JobSubmitted", "JobAdmitted", "HoldPlaced"]
    assert [s.job_id for s in rig.executor.starts] == [job]  # started once it was published


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("queue", "nope", "unknown queue"),
        ("team", "ghosts", "unknown team"),
        ("project", "astrology", "no project"),
        ("models", ("V100",), "no GPUs of model"),
        ("models", ("A100", "V100"), "no GPUs of model 'V100'"),
        ("pool", "h100", "no pool"),
    ],
    ids=[
        "unknown-queue",
        "unknown-team",
        "unknown-project",
        "unknown-model",
        "unknown-model-among-several",
        "unknown-pool",
    ],
)
def test_submissions_naming_what_is_not_configured_are_rejected(tmp_path, field, value, message):
    rig = Rig(tmp_path)
    with pytest.raises(Rejected) as raised:
        asyncio.run(rig.submit(**{field: value}))
    assert raised.value.kind is RejectKind.UNKNOWN and message in str(raised.value)
    assert rig.events() == []


def test_an_exhausted_budget_makes_the_job_wait_and_a_grant_admits_it(tmp_path):
    rig = Rig(tmp_path)
    d = rig.dispatcher
    d.on_balance(budget_update("vision", 1, gpu_granted=1_000))  # 1 GPU-second

    async def go():
        record = await rig.submit(estimated_runtime_us=HOUR_US)
        await rig.ticks(1)
        waiting = d.records[record.job_id]
        d.on_balance(budget_update("vision", 2, gpu_granted=10 * 3_600_000))
        await rig.ticks(1)
        return waiting, d.records[record.job_id]

    waiting, after = asyncio.run(go())
    assert (waiting.state, waiting.reason) == (JobState.PENDING, "budget_exhausted")
    assert after.state is JobState.RUNNING
    assert after.hold_gpu_ms == 3_600_000


def test_a_stale_balance_message_is_ignored(tmp_path):
    d = Rig(tmp_path).dispatcher
    d.on_balance(budget_update("vision", 5, gpu_granted=100))
    d.on_balance(budget_update("vision", 4, gpu_granted=999_999))
    balance = d.balance_of("vision")
    assert balance is not None and balance.gpu_ms == 100


# every hold is counted once: by the scheduler until the ledger counts it, then by the ledger
@pytest.mark.parametrize(
    ("ledger_open_holds", "consumed", "acknowledged", "expected_gpu_ms"),
    [
        # the ledger has not folded the hold: its remaining excludes it, the core subtracts it
        (0, 0, False, 10_000_000 - 3_600_000),
        # the ledger counts the hold: the core is given it back, subtracts it once
        (3_600_000, 0, True, 10_000_000 - 3_600_000),
        # metered usage settled 1 GPU-hour of it: consumed once, the rest held once
        (2_600_000, 1_000_000, True, 10_000_000 - 3_600_000),
        # usage beyond the hold: all consumed, nothing held
        (0, 5_000_000, True, 10_000_000 - 5_000_000),
    ],
    ids=["not-yet-in-ledger", "in-ledger", "partly-settled", "overrun"],
)
def test_a_hold_is_counted_once_between_scheduler_and_ledger(
    tmp_path, ledger_open_holds, consumed, acknowledged, expected_gpu_ms
):
    rig = Rig(tmp_path)
    d = rig.dispatcher
    d.on_balance(budget_update("vision", 1, gpu_granted=10_000_000))

    async def go():
        record = await rig.submit(estimated_runtime_us=HOUR_US)
        rig.executor.script(record.job_id, RUNS_FOREVER)
        await rig.ticks(1)
        return record.job_id

    job = asyncio.run(go())
    assert d.state.open_holds("vision").gpu_ms == 3_600_000
    if acknowledged:  # the ledger committed past the HoldPlaced; its balance was read
        assert d.hold_acks.committed({0: 10**9}, {0: 7}) == 1
        assert d.hold_acks.caught_up({0: 7}) == 1
    d.on_balance(
        budget_update(
            "vision",
            2,
            gpu_granted=10_000_000,
            gpu_consumed=consumed,
            gpu_open_holds=ledger_open_holds,
        )
    )
    balance = d.balance_of("vision")
    assert balance is not None
    seen_by_core = balance.gpu_ms - d.state.open_holds("vision").gpu_ms
    assert seen_by_core == expected_gpu_ms
    assert d.hold_acks.track(job) is not None


def test_a_hold_is_acknowledged_only_after_the_ledger_committed_it_and_its_balance_was_read(
    tmp_path,
):
    rig = Rig(tmp_path)
    d = rig.dispatcher

    async def go():
        record = await rig.submit()
        rig.executor.script(record.job_id, RUNS_FOREVER)
        await rig.ticks(1)
        return record.job_id

    job = asyncio.run(go())
    track = d.hold_acks.track(job)
    assert track is not None and track.placed_at  # the broker said where it lies
    (offset,) = track.placed_at.values()
    assert d.hold_acks.committed({0: offset}, {0: 5}) == 0  # the ledger is not past it yet
    assert d.hold_acks.committed({0: offset + 1}, {0: 5}) == 1
    assert d.hold_acks.caught_up({0: 4}) == 0 and not track.acknowledged
    assert d.hold_acks.caught_up({0: 5}) == 1 and track.acknowledged


def test_holds_are_released_when_a_held_run_ends_and_never_placed_twice(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        record = await rig.submit(queue="train")
        rig.executor.script(record.job_id, Outcome(exit_code=1), Outcome())
        await rig.ticks(6)
        return record.job_id

    job = asyncio.run(go())
    holds = [e for e in rig.events() if isinstance(e, HoldPlaced | HoldReleased)]
    assert [type(h).__name__ for h in holds] == [
        "HoldPlaced",
        "HoldReleased",
        "HoldPlaced",
        "HoldReleased",
    ]  # one hold per attempt, released before the next is placed
    assert rig.dispatcher.state.open_holds("vision").gpu_ms == 0
    assert rig.dispatcher.hold_acks.track(job) is None


def test_a_failed_job_is_retried_up_to_its_queues_limit(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        record = await rig.submit(queue="train")
        rig.executor.script(record.job_id, Outcome(exit_code=3))
        await rig.ticks(8)
        return record.job_id

    job = asyncio.run(go())
    failures = [e for e in rig.events() if isinstance(e, JobFailed)]
    assert [(f.attempt, f.retry, f.exit_code) for f in failures] == [(1, True, 3), (2, False, 3)]
    record = rig.dispatcher.records[job]
    assert (record.state, record.reason, record.attempt) == (JobState.FAILED, "exit_nonzero", 2)


def test_a_job_past_its_maximum_runtime_is_stopped(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        record = await rig.submit(queue="train", max_runtime_us=10 * MINUTE_US)
        rig.executor.script(record.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        rig.clock.advance(11 * MINUTE_US)
        await rig.ticks(1)
        return record.job_id

    job = asyncio.run(go())
    assert (job, StopReason.MAX_RUNTIME) in rig.executor.stops
    (failed,) = [e for e in rig.events() if isinstance(e, JobFailed)]
    assert (failed.reason, failed.retry) == (FailReason.MAX_RUNTIME, False)


def test_idle_gpus_are_reclaimed_by_queue_policy(tmp_path):
    rig = Rig(tmp_path)
    d = rig.dispatcher

    async def go():
        dev = await rig.submit(queue="dev")
        train = await rig.submit(team="language", queue="train")
        for job in (dev, train):
            rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        for job in (dev, train):
            for gpu in d.records[job.job_id].gpu_uuids:
                d.on_alert(idle_alert(gpu, rig.clock.now_us(), job.job_id))
        await rig.ticks(1)
        early = d.records[dev.job_id].state
        rig.clock.advance(11 * MINUTE_US)
        await rig.ticks(1)
        return dev.job_id, train.job_id, early

    dev, train, early = asyncio.run(go())
    assert early is JobState.RUNNING  # the dev queue reclaims after 10 minutes, not at once
    assert d.records[dev].state is JobState.RECLAIMED
    assert (dev, StopReason.RECLAIMED) in rig.executor.stops
    assert d.records[train].state is JobState.RUNNING  # training: alert only
    assert any(isinstance(e, JobReclaimed) for e in rig.events())


def test_an_idle_alert_about_a_previous_holder_does_not_reclaim_the_new_one(tmp_path):
    rig = Rig(tmp_path)
    d = rig.dispatcher

    async def go():
        job = await rig.submit(queue="dev")
        rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        for gpu in d.records[job.job_id].gpu_uuids:
            d.on_alert(idle_alert(gpu, T0_US - HOUR_US, "someone-else"))
        rig.clock.advance(HOUR_US)
        await rig.ticks(1)
        return job.job_id

    assert d.records[asyncio.run(go())].state is JobState.RUNNING


NOT_IDLE_ALERTS = (
    b"",
    b"not json",
    b"[1, 2]",
    b'{"type": "tally.idle.detected", "data": []}',
    b'{"type": "tally.idle.detected", "data": {"gpu_uuid": 7}}',
)


def _health_event(gpu: str) -> bytes:
    health = GpuHealth(
        node="node-a",
        gpu_uuid=gpu,
        gpu_index=0,
        kind=HealthKind.XID_ERROR,
        detail="XID 79: GPU has fallen off the bus",
        time_us=T0_US,
        source=SampleSource.NVML,
        xid=79,
    )
    return encode_health(health, source="nvml://node-a")


def test_health_events_and_malformed_messages_on_the_alerts_topic_are_ignored(tmp_path):
    rig = Rig(tmp_path)
    d = rig.dispatcher

    async def go():
        job = await rig.submit(queue="dev")
        rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        for gpu in d.records[job.job_id].gpu_uuids:
            for value in (*NOT_IDLE_ALERTS, _health_event(gpu)):
                d.on_alert(value)  # nothing to reclaim, and no exception
        rig.clock.advance(11 * MINUTE_US)
        await rig.ticks(1)
        running = d.records[job.job_id].state
        for gpu in d.records[job.job_id].gpu_uuids:
            d.on_alert(idle_alert(gpu, rig.clock.now_us(), job.job_id))
            for value in (*NOT_IDLE_ALERTS, _health_event(gpu)):
                d.on_alert(value)  # an open alert stays open
        rig.clock.advance(11 * MINUTE_US)
        await rig.ticks(1)
        return job.job_id, running

    job, running = asyncio.run(go())
    assert running is JobState.RUNNING
    assert d.records[job].state is JobState.RECLAIMED


def test_a_resolved_idle_alert_closes_the_open_one(tmp_path):
    rig = Rig(tmp_path)
    d = rig.dispatcher

    async def go():
        job = await rig.submit(queue="dev")
        rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        since = rig.clock.now_us()
        for gpu in d.records[job.job_id].gpu_uuids:
            d.on_alert(idle_alert(gpu, since, job.job_id))
            d.on_alert(idle_alert(gpu, since, job.job_id, kind=AlertKind.RESOLVED))
        rig.clock.advance(11 * MINUTE_US)
        await rig.ticks(1)
        return job.job_id

    assert d.records[asyncio.run(go())].state is JobState.RUNNING


def test_cancel_stops_a_running_job_and_refuses_an_ended_one(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        job = await rig.submit()
        rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        cancelled = (await rig.service.cancel(job.job_id, "vision")).record
        with pytest.raises(Rejected) as again:
            await rig.service.cancel(job.job_id, "vision")
        with pytest.raises(Rejected) as other_team:
            await rig.service.cancel(job.job_id, "language")
        return job.job_id, cancelled, again.value, other_team.value

    job, cancelled, again, other_team = asyncio.run(go())
    assert cancelled.state is JobState.CANCELLED
    assert (job, StopReason.CANCELLED) in rig.executor.stops
    assert again.kind is RejectKind.CONFLICT
    assert other_team.kind is RejectKind.NOT_FOUND
    assert rig.dispatcher.state.running_count == 0


def test_cancel_of_a_pending_job_never_starts_it(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        blockers = [await rig.submit(gpus=2) for _ in range(2)]  # its quota, and all it borrows
        for b in blockers:
            rig.executor.script(b.job_id, RUNS_FOREVER)
        await rig.ticks(1)
        waiting = await rig.submit(gpus=1)
        await rig.ticks(1)
        reason = rig.dispatcher.records[waiting.job_id].reason
        await rig.service.cancel(waiting.job_id, None)
        await rig.ticks(1)
        return waiting.job_id, reason

    job, reason = asyncio.run(go())
    assert reason == WaitReason.COHORT_EXHAUSTED
    assert rig.dispatcher.records[job].state is JobState.CANCELLED
    assert job not in {s.job_id for s in rig.executor.starts}


def test_consumer_usage_on_the_balances_topic_feeds_fair_share(tmp_path):
    d = Rig(tmp_path).dispatcher
    first = BalanceUpdate(
        account="consumer:vision/detection",
        seq=1,
        as_of_us=T0_US + 10 * 86_400 * SECOND_US,
        current_period="2026-11",
        periods=(BalanceRow("consumer:vision/detection", "gpu_ms", "2026-11", 7_200_000),),
        totals=(("gpu_ms", 7_200_000),),
    )
    d.on_balance(first)
    assert d.state.snapshot(first.as_of_us).fair_share["vision"] == 7_200_000
    later = BalanceUpdate(
        account="consumer:vision/detection",
        seq=2,
        as_of_us=first.as_of_us,
        current_period="2026-11",
        periods=(),
        totals=(("gpu_ms", 10_800_000),),
    )
    d.on_balance(later)
    assert d.state.snapshot(first.as_of_us).fair_share["vision"] == 10_800_000
    assert "language" not in d.state.snapshot(first.as_of_us).fair_share


def _consumed(rig: Rig, partitions: int, seed: int) -> list[Consumed]:
    """The published messages as a replay reads them: spread over partitions by key, each
    partition in order, the partitions interleaved at random."""
    rng = random.Random(seed)
    by_partition: dict[int, list[Consumed]] = {}
    for m in rig.publisher.messages:
        p = sum(m.key) % partitions
        part = by_partition.setdefault(p, [])
        part.append(Consumed(p, len(part), m.value, m.seq))
    out: list[Consumed] = []
    queues = [list(v) for v in by_partition.values()]
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return out


def test_a_restarted_service_rebuilds_its_state_from_the_jobs_topic(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        long = [await rig.submit(gpus=2, queue="train") for _ in range(2)]
        for job in long:
            rig.executor.script(job.job_id, RUNS_FOREVER)
        done = await rig.submit(team="language", queue="dev")
        await rig.ticks(3)
        waiting = await rig.submit(team="language", gpus=2, queue="serve")  # preempts
        await rig.ticks(1)
        return [j.job_id for j in long], done.job_id, waiting.job_id

    long, done, waiting = asyncio.run(go())
    old = rig.dispatcher
    fresh = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
    applied = fresh.replay(_consumed(rig, partitions=3, seed=7))
    assert applied == len([e for e in rig.events() if not isinstance(e, HoldPlaced | HoldReleased)])
    assert fresh.replay_errors == 0
    running = {j.job_id for j in old.state.running_jobs()}
    assert {j.job_id for j in fresh.state.running_jobs()} == running
    assert fresh.records == old.records
    assert running & set(long) and waiting in running  # the serve job preempted a borrower
    assert any(r.preemptions for r in fresh.records.values())
    assert fresh.state.open_holds("vision") == old.state.open_holds("vision")
    for job in running:
        for uuid in old.records[job].gpu_uuids:
            assert fresh.state.holder(uuid) == job
    assert fresh.explain(done) == old.explain(done)
    for job in running:  # hold positions come back from the HoldPlaced messages
        track = fresh.hold_acks.track(job)
        assert track is not None and track.placed_at


def test_replay_orders_events_by_publication_across_partitions(tmp_path):
    """A GPU released by one job and assigned to another in the same instant: keyed by GPU
    UUID and job id they land in different partitions; the seq header puts them in order."""
    rig = Rig(tmp_path)

    async def go():
        first = await rig.submit(gpus=2)
        await rig.ticks(1)
        second = await rig.submit(gpus=2)  # finishes the first, then takes its GPUs
        await rig.ticks(4, step_us=0)
        return first.job_id, second.job_id

    asyncio.run(go())
    for seed in range(20):
        fresh = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
        fresh.replay(_consumed(rig, partitions=4, seed=seed))
        assert fresh.replay_errors == 0
        assert fresh.records == rig.dispatcher.records


def test_replay_without_seq_headers_falls_back_to_event_time(tmp_path):
    rig = Rig(tmp_path)
    asyncio.run(rig.submit())
    plain = [Consumed(0, i, m.value, None) for i, m in enumerate(rig.publisher.messages)]
    assert [type(e).__name__ for _, e in replay_order(plain)] == ["JobSubmitted"]
    assert [e for _, e in replay_order([Consumed(0, 0, b"garbage", None)])] == []


def test_jobs_the_executor_lost_fail_on_restart_and_retry_per_queue(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        train = await rig.submit(queue="train")
        dev = await rig.submit(team="language", queue="dev")
        for job in (train, dev):
            rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        return train.job_id, dev.job_id

    train, dev = asyncio.run(go())
    fresh: Dispatcher = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
    fresh.replay(_consumed(rig, partitions=2, seed=1))
    events = fresh.recover()
    failed = {e.job_id: e for e in events if isinstance(e, JobFailed)}
    assert set(failed) == {train, dev}
    assert all(f.reason is FailReason.EXECUTOR_LOST for f in failed.values())
    assert failed[train].retry and not failed[dev].retry  # train retries once; dev never
    assert fresh.state.running_count == 0
    assert fresh.state.pending_job(train) is not None
    released = [e for e in fresh.take_outbox() if isinstance(e.event, HoldReleased)]
    assert {m.event.job_id for m in released} == {train, dev}


def test_a_job_whose_command_was_lost_fails_without_retry(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        job = await rig.submit(queue="train")
        for path in (tmp_path / "scheduler" / "jobs").iterdir():
            path.unlink()
        rig.dispatcher.works._cache.clear()
        await rig.ticks(2)
        return job.job_id

    job = asyncio.run(go())
    record = rig.dispatcher.records[job]
    assert (record.state, record.reason) == (JobState.FAILED, "executor_lost")
    assert rig.dispatcher.state.running_count == 0
    assert not rig.executor.starts


def test_a_clean_stop_stops_the_local_jobs_and_says_so_on_the_topic(tmp_path):
    rig = Rig(tmp_path)

    async def go():
        job = await rig.submit(queue="train")
        rig.executor.script(job.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        await rig.service.stop(stop_jobs=True)
        return job.job_id

    job = asyncio.run(go())
    assert rig.executor.active() == ()
    (failed,) = [e for e in rig.events() if isinstance(e, JobFailed)]
    assert (failed.job_id, failed.reason, failed.retry) == (job, FailReason.EXECUTOR_LOST, True)


def test_every_published_message_decodes_as_what_the_ledger_and_replay_expect(tmp_path):
    from ledger.job_events import decode_job_event
    from ledger.jobs_message import decode_jobs_message

    rig = Rig(tmp_path)

    async def go():
        await rig.submit(queue="train", gpus=2)
        await rig.ticks(3)

    asyncio.run(go())
    kinds = set()
    for m in rig.publisher.messages:
        message = decode_jobs_message(m.value)
        assert message.dead == ()
        if isinstance(m.event, HoldPlaced | HoldReleased):
            assert len(message.holds) == 1 and m.key == m.event.job_id.encode()
        else:
            assert decode_job_event(m.value).data == m.event
        kinds.add(type(m.event))
    assert {JobSubmitted, JobAdmitted, JobStarted, JobFinished, GpuAssigned} <= kinds
    assert JobWaiting not in kinds  # admitted at once: no wait to report


@pytest.mark.parametrize(
    "ticks", [1, 2], ids=["crash-before-the-start-is-reported", "crash-after-the-start-is-reported"]
)
def test_a_restart_kills_what_a_lost_local_run_left_and_retries_it(tmp_path, ticks):
    """A real process group from the local executor outlives the service that started it; the
    next service marks the job failed (executor_lost, retried) and kills the group — also when
    the service died right after the tick that started it, before any poll reported it (its
    group was recorded as it started)."""
    import os
    import signal

    from scheduler.executors.local import LocalExecutor
    from scheduler.executors.processes import alive_groups, wait_until

    rig = Rig(tmp_path)
    local = LocalExecutor(tmp_path / "logs", grace_s=1)
    first = build_dispatcher(rig.config, local, rig.clock)
    rig.dispatcher = first
    rig.service.dispatcher = first

    async def go():
        job = await rig.submit(queue="train", work=Work(command=("sleep", "60")))
        await rig.ticks(ticks)
        return job.job_id

    job = asyncio.run(go())
    pgid = local.pgid(job)
    assert pgid is not None and alive_groups([pgid])
    try:
        fresh = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
        fresh.replay(_consumed(rig, partitions=2, seed=3))
        (failed, *_) = fresh.recover()
        assert isinstance(failed, JobFailed)
        assert (failed.reason, failed.retry) == (FailReason.EXECUTOR_LOST, True)
        assert "leftover processes were killed" in failed.detail
        assert wait_until(lambda: not alive_groups([pgid]), 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        local.poll()  # reap the leader
