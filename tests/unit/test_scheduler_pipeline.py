"""The scheduler service's pipeline (`scheduler.pipeline`, `scheduler.enactment`) while an
enactment is in flight: the executor's start is held on a gate in its thread, and what happens
meanwhile is asserted by the order of what was recorded, never by timing — a submit is answered
(published) while the start is still held, a second tick waits, a cancel's stop comes after the
start, and no job is started twice. Plus the pipeline's publication watermark and the
enactment plan, as tables."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection

import pytest

from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobFailed,
    JobStarted,
    JobSubmitted,
)
from scheduler import work_store
from scheduler.enactment import failures, plan
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor
from scheduler.jobs_topic import Outgoing
from scheduler.model import RunningJob
from scheduler.ports import JobStatus, StopReason, Work
from scheduler.records import SubmitRequest
from scheduler.work_store import WorkStore
from tests.unit.test_scheduler_service_support import Rig

WAIT_S = 10.0  # a bound on waiting for the other thread, never a measurement


class GatedExecutor(FakeExecutor):
    """The fake executor, whose `start` waits at a gate (in the enactment's thread) and which
    records every call in `calls`, in order, beside what the test records there."""

    def __init__(self, rig: Rig) -> None:
        super().__init__(clock=rig.clock, default=RUNS_FOREVER)
        self.calls: list[tuple[str, str]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        self.calls.append(("start", job.job_id))
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        super().start(job, work, time_limit_us=time_limit_us)
        self.calls.append(("started", job.job_id))

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        self.calls.extend(("stop", j) for j in job_ids)
        return super().stop(job_ids, reason)


def _gated(tmp_path) -> tuple[Rig, GatedExecutor]:
    rig = Rig(tmp_path)
    gated = GatedExecutor(rig)
    rig.executor = rig.dispatcher.executor = gated
    return rig, gated


async def _in_flight(rig: Rig, gated: GatedExecutor) -> asyncio.Task[object]:
    """A tick whose enactment is held at the gate (its start entered, not finished)."""
    tick = asyncio.create_task(rig.service.tick())
    assert await asyncio.to_thread(gated.entered.wait, WAIT_S)
    return tick


def test_a_submit_during_an_enactment_is_answered_before_it_ends_and_nothing_starts_twice(
    tmp_path,
):
    rig, gated = _gated(tmp_path)

    async def go() -> tuple[str, str, list[str], bool]:
        first = (await rig.submit()).job_id
        tick = await _in_flight(rig, gated)
        in_flight = set(rig.service.pipeline.in_flight)
        second = asyncio.create_task(rig.service.tick())  # waits for the executor
        accepted = await rig.service.submit(rig_request(rig))
        gated.calls.append(("answered", accepted.record.job_id))
        waiting_tick = not second.done()
        assert accepted.published and in_flight == {first}
        gated.gate.set()
        await tick
        await second
        await rig.ticks(3)
        return first, accepted.record.job_id, sorted(in_flight), waiting_tick

    first, later, in_flight, waiting_tick = asyncio.run(go())
    assert in_flight == [first] and waiting_tick
    # the answer came while the start of the first job was held at the gate
    assert gated.calls[:3] == [("start", first), ("answered", later), ("started", first)]
    assert [s.job_id for s in gated.starts] == [first, later]  # each started once
    submitted = [e.job_id for e in rig.events() if isinstance(e, JobSubmitted)]
    assert submitted == [first, later]
    for job in (first, later):
        started = [e for e in rig.events() if isinstance(e, JobStarted) and e.job_id == job]
        admitted = [e for e in rig.events() if isinstance(e, JobAdmitted) and e.job_id == job]
        assert len(started) == 1 and len(admitted) == 1


def test_a_cancel_during_its_jobs_start_stops_it_after_the_start_and_it_runs_no_more(tmp_path):
    rig, gated = _gated(tmp_path)

    async def go() -> str:
        job = (await rig.submit()).job_id
        tick = await _in_flight(rig, gated)
        cancel = asyncio.create_task(rig.service.cancel(job, None))
        for _ in range(10_000):  # the cancel's event is published before its stop is enacted
            if any(isinstance(e, JobFailed) for e in rig.events()):
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("the cancel was not published while its job's start was in flight")
        assert not cancel.done()  # answered only once its stop is carried out
        gated.calls.append(("cancel published", job))
        gated.gate.set()
        await tick
        await cancel
        await rig.ticks(3)
        return job

    job = asyncio.run(go())
    assert gated.calls == [
        ("start", job),
        ("cancel published", job),
        ("started", job),
        ("stop", job),
    ]
    (failed,) = [e for e in rig.events() if isinstance(e, JobFailed)]
    assert failed.reason is FailReason.CANCELLED
    assert len(gated.starts) == 1 and not gated.active()


def rig_request(rig: Rig) -> SubmitRequest:
    """A submit of the other team's (not `Rig.submit`'s)."""
    del rig
    return SubmitRequest("language", "pretraining", "ada", "dev", 1, Work(command=("true",)))


def _message(seq: int) -> Outgoing:
    return Outgoing(b"k", b"v", seq, JobFailed("job-x", FailReason.CANCELLED, 1, False, 1))


@pytest.mark.parametrize(
    ("outbox", "round_first", "seq", "published"),
    [
        ((), None, 5, True),
        ((6, 7), None, 5, True),
        ((5, 6), None, 5, False),
        ((3,), None, 5, False),
        ((), 4, 5, False),
        ((), 6, 5, True),
        ((8,), 6, 5, True),
    ],
    ids=[
        "nothing-waits",
        "only-later-messages-wait",
        "its-own-message-waits",
        "an-earlier-message-waits",
        "its-round-is-in-flight",
        "a-later-round-is-in-flight",
        "later-round-and-later-messages",
    ],
)
def test_a_seq_is_published_when_no_message_up_to_it_waits_or_is_in_flight(
    tmp_path, outbox, round_first, seq, published
):
    rig = Rig(tmp_path)
    pipeline = rig.service.pipeline
    rig.dispatcher.outbox[:] = [_message(s) for s in outbox]
    pipeline._round_first = round_first
    assert pipeline.published(seq) is published


def test_the_plan_starts_only_jobs_the_state_still_runs_and_fails_those_without_work(tmp_path):
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER

    async def go() -> list[str]:
        jobs = [(await rig.submit()).job_id for _ in range(3)]
        await rig.ticks(1)
        return jobs

    jobs = asyncio.run(go())
    admissions = [e for e in rig.events() if isinstance(e, JobAdmitted)]
    assert [a.job_id for a in admissions] == jobs
    rig.dispatcher.cancel(jobs[1])  # ended after its admission, before its enactment
    works = {jobs[0]: None, jobs[2]: Work(command=("true",))}  # the first job's work is gone
    planned = plan(admissions, rig.dispatcher.state, works.get)
    assert [s.job.job_id for s in planned.starts] == [jobs[2]]
    assert [j.job_id for j in planned.missing_work] == [jobs[0]]
    events = failures(planned, (), rig.dispatcher.state, rig.dispatcher.now_us())
    assert type(events[0]) is JobFailed and events[0].reason is FailReason.EXECUTOR_LOST
    assert {e.job_id for e in events} == {jobs[0]}  # with its GPU releases
    assert not events[0].retry  # no work: retrying cannot help


def test_a_published_submit_has_its_work_on_disk_and_a_failed_write_publishes_nothing(
    tmp_path, monkeypatch
):
    """201 means the `JobSubmitted` is acknowledged and the job's command is on disk (a fresh
    work store, as after a restart, reads it); a round whose write fails sends nothing and the
    next one writes and sends it."""
    rig = Rig(tmp_path)
    real_write = work_store._write
    failing = {"left": 1}

    def write(item):
        if failing["left"]:
            failing["left"] -= 1
            raise OSError("disk full")
        real_write(item)

    monkeypatch.setattr(work_store, "_write", write)

    async def go():
        with pytest.raises(OSError):
            await rig.service.submit(rig_request(rig))
        nothing = list(rig.publisher.messages)
        accepted = await rig.service.submit(rig_request(rig))
        return nothing, accepted

    nothing, accepted = asyncio.run(go())
    assert nothing == []
    submitted = [e.job_id for e in rig.events() if isinstance(e, JobSubmitted)]
    assert len(submitted) == 2 and accepted.published
    fresh = WorkStore(rig.dispatcher.works.dir)
    for job in submitted:
        assert fresh.get(job) == Work(command=("true",))
