"""The scheduler service's pipeline (`scheduler.pipeline`, `scheduler.enactment`) while an
enactment is in flight: the executor's start is held on a gate in its thread, and what happens
meanwhile is asserted by the order of what was recorded, never by timing — a submit is answered
(published) while the start is still held, a second tick decides but its enactment waits, the
running service keeps ticking and a stop waits for the enactment, a cancel's stop comes after
the start, and no job is started twice. Plus the pipeline's publication watermark and the
enactment plan, as tables; a tick's admission cap, concurrent starts, and a local run's start
reported by its own enactment, its process group on disk before that."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Collection
from urllib.parse import quote

import orjson
import pytest

from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobFailed,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    WaitReason,
)
from scheduler import work_store
from scheduler.api.handlers import _answer
from scheduler.enactment import failures, plan
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor
from scheduler.executors.local import LocalExecutor
from scheduler.jobs_topic import Outgoing
from scheduler.model import RunningJob
from scheduler.ports import (
    JobStatus,
    KnowsProcessGroups,
    PollsCheaply,
    StartsConcurrently,
    StopReason,
    Work,
)
from scheduler.records import SubmitRequest
from scheduler.work_store import RunFiles, WorkStore
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
        self.polls = 0

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        self.calls.append(("start", job.job_id))
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        super().start(job, work, time_limit_us=time_limit_us)
        self.calls.append(("started", job.job_id))

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        self.calls.extend(("stop", j) for j in job_ids)
        return super().stop(job_ids, reason)

    def poll(self) -> tuple[JobStatus, ...]:
        self.polls += 1
        return super().poll()


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


def test_the_running_service_ticks_while_its_enactment_is_held_and_a_stop_waits_for_it(
    tmp_path,
):
    """`run` enacts behind its ticks: with a start held at the gate, the ticks go on; a stop
    returns only once that enactment is over, and the job was started once."""
    rig, gated = _gated(tmp_path)
    rig.service.cycle_interval_s = 0.001

    async def go() -> tuple[str, bool, bool]:
        runner = asyncio.create_task(rig.service.run())
        job = (await rig.submit()).job_id  # wakes the ticks
        assert await asyncio.to_thread(gated.entered.wait, WAIT_S)
        held_at = rig.service.ticks
        for _ in range(100_000):
            if rig.service.ticks >= held_at + 3:
                break
            await asyncio.sleep(0)
        ticked = rig.service.ticks >= held_at + 3
        stopping = asyncio.create_task(rig.service.stop(stop_jobs=False))
        for _ in range(100):
            await asyncio.sleep(0)
        waited = not stopping.done()
        gated.gate.set()
        await stopping
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return job, ticked, waited

    job, ticked, waited = asyncio.run(go())
    assert ticked and waited
    assert [s.job_id for s in gated.starts] == [job]
    assert gated.calls == [("start", job), ("started", job)]


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


def test_a_published_submit_has_its_work_on_disk_and_a_failed_write_answers_202_with_the_job(
    tmp_path, monkeypatch
):
    """201 means the `JobSubmitted` is acknowledged and the job's command is on disk (a fresh
    work store, as after a restart, reads it); a round whose write fails sends nothing, and its
    submit is answered 202 with the job it made (which exists: the next round writes and sends
    it), never 500."""
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
        first = await rig.service.submit(rig_request(rig))
        nothing = list(rig.publisher.messages)
        accepted = await rig.service.submit(rig_request(rig))
        return first, nothing, accepted

    first, nothing, accepted = asyncio.run(go())
    assert nothing == [] and not first.published and accepted.published
    assert _answer(first, 201).status == 202
    submitted = [e.job_id for e in rig.events() if isinstance(e, JobSubmitted)]
    assert submitted == [first.record.job_id, accepted.record.job_id]
    fresh = WorkStore(rig.dispatcher.works.dir)
    for job in submitted:
        assert fresh.get(job) == Work(command=("true",))


@pytest.mark.parametrize(
    ("cap", "first_tick", "second_tick", "capped"),
    [(None, 3, 3, False), (1, 1, 2, True), (2, 2, 3, True), (3, 3, 3, False)],
    ids=["no-cap", "cap-1", "cap-2", "cap-equal-to-the-backlog"],
)
def test_a_tick_admits_at_most_its_cap_and_the_rest_wait_with_tick_limit_for_the_next(
    tmp_path, cap, first_tick, second_tick, capped
):
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    rig.dispatcher.admissions_per_tick = cap

    async def go() -> tuple[list[str], int, bool, int]:
        jobs = [(await rig.submit()).job_id for _ in range(3)]
        await rig.ticks(1)
        once = len([e for e in rig.events() if isinstance(e, JobAdmitted)])
        was_capped = rig.dispatcher.capped
        await rig.ticks(1)
        return jobs, once, was_capped, len([e for e in rig.events() if isinstance(e, JobAdmitted)])

    jobs, once, was_capped, twice = asyncio.run(go())
    assert (once, twice, was_capped) == (first_tick, second_tick, capped)
    admitted = [e.job_id for e in rig.events() if isinstance(e, JobAdmitted)]
    assert admitted == jobs[:twice]  # in order, each once
    limited = [
        e.job_id
        for e in rig.events()
        if isinstance(e, JobWaiting) and e.reason is WaitReason.TICK_LIMIT
    ]
    assert limited == jobs[first_tick:]  # what the first tick's cap left out, and said so


class PairedExecutor(FakeExecutor):
    """The fake executor, whose starts may run concurrently and must: each waits at a barrier
    for the other (started one after the other, the first would break it)."""

    concurrent_starts = 2

    def __init__(self, rig: Rig) -> None:
        super().__init__(clock=rig.clock, default=RUNS_FOREVER)
        self.barrier = threading.Barrier(2, timeout=WAIT_S)
        self.lock = threading.Lock()

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        self.barrier.wait()
        with self.lock:  # the fake itself is not thread-safe
            super().start(job, work, time_limit_us=time_limit_us)


def test_an_executor_that_allows_it_gets_its_starts_concurrently_each_job_once(tmp_path):
    rig = Rig(tmp_path)
    paired = PairedExecutor(rig)
    rig.executor = rig.dispatcher.executor = paired
    assert isinstance(paired, StartsConcurrently)

    async def go() -> list[str]:
        jobs = [(await rig.submit()).job_id for _ in range(2)]
        await rig.ticks(2)
        return jobs

    jobs = asyncio.run(go())
    assert not paired.barrier.broken
    assert sorted(s.job_id for s in paired.starts) == sorted(jobs)
    started = [e.job_id for e in rig.events() if isinstance(e, JobStarted)]
    assert sorted(started) == sorted(jobs)


class ThreadNoting(PairedExecutor):
    """The paired executor, noting the OS thread of every start."""

    def __init__(self, rig: Rig) -> None:
        super().__init__(rig)
        self.threads: list[int] = []

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        self.threads.append(threading.get_native_id())
        super().start(job, work, time_limit_us=time_limit_us)


def test_later_enactments_start_on_the_same_threads_and_a_stop_lets_them_end(tmp_path):
    rig = Rig(tmp_path)
    noting = ThreadNoting(rig)
    rig.executor = rig.dispatcher.executor = noting

    async def go() -> list[str]:
        jobs = []
        for _ in range(2):  # two enactments of two concurrent starts each
            jobs += [(await rig.submit()).job_id for _ in range(2)]
            await rig.ticks(2)
        pool = rig.service.pipeline.starts
        assert pool._pool is not None  # kept between enactments
        await rig.service.stop(stop_jobs=False)
        assert pool._pool is None
        return jobs

    jobs = asyncio.run(go())
    assert sorted(s.job_id for s in noting.starts) == sorted(jobs)
    assert len(noting.threads) == 4 and len(set(noting.threads)) == 2  # made once, not per call


def test_a_local_start_is_reported_by_its_own_enactment_once_its_group_is_on_disk(tmp_path):
    """The enactment polls the local executor (`PollsCheaply`) once its starts are made and
    their groups recorded, so the tick that admits a job publishes its `JobStarted` too — and
    the group is on disk when that message is published (a crash after it still leaves a file
    for the restart to kill the run by)."""
    rig = Rig(tmp_path)
    local = LocalExecutor(tmp_path / "logs", grace_s=1.0)
    rig.executor = rig.dispatcher.executor = local
    assert isinstance(local, StartsConcurrently) and isinstance(local, KnowsProcessGroups)
    assert isinstance(local, PollsCheaply)
    runs = rig.dispatcher.runs
    assert runs is not None
    on_disk: dict[str, str | None] = {}  # job → its group file when its JobStarted went out

    def look(message: Outgoing) -> None:
        if isinstance(message.event, JobStarted):  # what a restarted service would read
            found = RunFiles(runs.dir).recorded(message.event.job_id)
            on_disk[message.event.job_id] = None if found is None else str(found)

    rig.publisher.refuse = look  # sees each message as it is published; refuses none

    async def go() -> list[str]:
        jobs = [(await rig.submit(work=Work(command=("sleep", "30")))).job_id for _ in range(2)]
        await rig.ticks(1)  # admitted, published, started, reported
        return jobs

    try:
        jobs = asyncio.run(go())
        started = [e.job_id for e in rig.events() if isinstance(e, JobStarted)]
        assert sorted(started) == sorted(jobs)
        assert on_disk == {job: str(local.pgid(job)) for job in jobs}
    finally:
        local.stop(local.active(), StopReason.CANCELLED)


def test_a_tick_decides_while_an_enactment_is_in_flight_and_enacts_after_it(tmp_path):
    """Deciding does not take the executor lock: with a start held at the gate, a tick's
    decisions are made and published (the executor not polled meanwhile: the poll is owed to
    the enactment); their enactment waits for the one in flight, and each job starts once, in
    decision order."""
    rig, gated = _gated(tmp_path)

    async def go() -> tuple[str, str, list[str], bool, bool]:
        first = (await rig.submit()).job_id
        tick = await _in_flight(rig, gated)
        later = (await rig.service.submit(rig_request(rig))).record.job_id
        polls = gated.polls
        decided = await rig.service.decide()
        gated.calls.append(("decided", later))
        admitted = [e.job_id for e in decided if isinstance(e, JobAdmitted)]
        unpolled = gated.polls == polls
        published = [m.event for m in rig.publisher.messages]
        on_topic = any(isinstance(e, JobAdmitted) and e.job_id == later for e in published)
        gated.gate.set()
        await tick
        await rig.service.enact()
        return first, later, admitted, unpolled, on_topic

    first, later, admitted, unpolled, on_topic = asyncio.run(go())
    assert admitted == [later] and unpolled and on_topic
    # the poll the deciding tick skipped was owed to the enactment, which made it after its
    # starts: both runs are reported, each once
    started = [e.job_id for e in rig.events() if isinstance(e, JobStarted)]
    assert sorted(started) == sorted([first, later]) and not rig.service.pipeline.poll_owed
    assert gated.calls == [
        ("start", first),
        ("decided", later),
        ("started", first),
        ("start", later),
        ("started", later),
    ]


def test_run_files_keep_a_batch_while_one_of_its_jobs_runs_and_a_restart_reads_the_newest(
    tmp_path,
):
    """One file per enactment: it stays while any of its jobs is not forgotten (a job started
    again is found in its newer batch), goes with the flush after the last; a restarted
    service reads the newest group of each job, also from a job's own file (`record`, earlier
    versions), and drops what it inherited once recovered."""
    runs = RunFiles(tmp_path / "runs")

    def batches() -> int:
        return len(list((tmp_path / "runs").glob("batch-*.pids")))

    assert runs.write_all([("job-a", "100"), ("job/b", "101"), ("job-c", "not-a-group")]) == []
    runs.forget("job-a")
    runs.flush()
    kept = batches()
    assert runs.write_all([("job-a", "200")]) == []  # started again: a second batch
    runs.forget("job/b")  # the first batch's last job
    runs.flush()
    after_b = batches()
    runs.record("job-d", "300")  # a status's group: its own file
    runs.flush()
    fresh = RunFiles(tmp_path / "runs")
    seen = {job: fresh.recorded(job) for job in ("job-a", "job/b", "job-c", "job-d")}
    fresh.drop_inherited()
    assert (kept, after_b, batches()) == (1, 1, 0)
    assert seen == {"job-a": 200, "job/b": None, "job-c": None, "job-d": 300}


@pytest.mark.parametrize("layout", ["batch", "one-file-per-job"])
def test_a_fresh_work_store_reads_batches_and_the_older_one_file_per_job(tmp_path, layout):
    works = WorkStore(tmp_path / "jobs")
    wanted = {
        "job-a": Work(command=("train", "--lr", "0.1"), env=(("K", "v"),), cwd="/srv"),
        "job/b": Work(script="#!/bin/sh\necho hi\n"),
    }
    for job, work in wanted.items():
        works.put(job, work)
    works.sync()
    if layout == "one-file-per-job":  # what earlier versions wrote: <job>.json, no "job" key
        (batch,) = (tmp_path / "jobs").glob("batch-*.jsonl")
        for line in batch.read_bytes().splitlines():
            data = orjson.loads(line)
            (tmp_path / "jobs" / (quote(data.pop("job"), safe="") + ".json")).write_bytes(
                orjson.dumps(data)
            )
        batch.unlink()
    fresh = WorkStore(tmp_path / "jobs")
    assert {job: fresh.get(job) for job in wanted} == wanted
    assert fresh.get("job-c") is None
