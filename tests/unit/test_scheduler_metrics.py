"""The scheduler's metrics through its observer port: the service on the fake executor (the
test rig of `test_scheduler_service`) reports queue lengths, admissions and preemptions per
queue into `TallyMetrics`, counts each decision once (a replay counts none), and keeps
scheduling when the observer fails."""

from __future__ import annotations

import asyncio
from collections import Counter

from ledger.job_events import JobAdmitted, JobPreempted
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor
from scheduler.ports import SchedulerObserver
from scheduler.records import JobState
from scheduler.service import SchedulerService
from tally.metrics import TallyMetrics
from tally.scheduling import build_dispatcher
from tests.unit.test_scheduler_service import _consumed
from tests.unit.test_scheduler_service_support import Rig

QUEUES = ("dev", "train", "serve")


def _observed(tmp_path) -> tuple[Rig, TallyMetrics]:
    rig = Rig(tmp_path)
    metrics = TallyMetrics(sections=("scheduler",))
    observer: SchedulerObserver = metrics  # the port, implemented by the metrics
    rig.service.observer = observer
    return rig, metrics


def _value(metrics: TallyMetrics, name: str, queue: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"queue": queue})


def _lengths(metrics: TallyMetrics) -> dict[str, float | None]:
    return {q: _value(metrics, "tally_scheduler_queue_length", q) for q in QUEUES}


def _pending(rig: Rig) -> dict[str, int]:
    out = dict.fromkeys(QUEUES, 0)
    out.update(
        Counter(
            r.spec.queue for r in rig.dispatcher.records.values() if r.state is JobState.PENDING
        )
    )
    return out


def _decided(rig: Rig, kind: type) -> Counter[str]:
    return Counter(
        rig.dispatcher.records[e.job_id].spec.queue for e in rig.events() if isinstance(e, kind)
    )


async def _preempting_run(rig: Rig) -> None:
    """Vision borrows the whole fleet in `train`; language's `serve` job preempts a borrower;
    language's `dev` job waits throughout."""
    long = [await rig.submit(gpus=2, queue="train") for _ in range(2)]
    for job in long:
        rig.executor.script(job.job_id, RUNS_FOREVER)
    await rig.submit(team="language", queue="dev")
    await rig.ticks(3)
    await rig.submit(team="language", gpus=2, queue="serve")
    await rig.ticks(2)


def test_queue_lengths_follow_submissions_and_admissions(tmp_path):
    rig, metrics = _observed(tmp_path)

    async def go():
        await rig.submit(queue="dev")
        await rig.submit(queue="dev")
        submitted = _lengths(metrics)
        await rig.ticks(1)
        return submitted

    submitted = asyncio.run(go())
    assert submitted == {"dev": 2, "train": 0, "serve": 0}  # every configured queue, from 0
    assert _lengths(metrics) == {"dev": 0, "train": 0, "serve": 0}
    assert _value(metrics, "tally_scheduler_admissions_total", "dev") == 2
    assert _value(metrics, "tally_scheduler_preemptions_total", "dev") is None


def test_admissions_and_preemptions_are_counted_per_queue_as_decided(tmp_path):
    rig, metrics = _observed(tmp_path)
    asyncio.run(_preempting_run(rig))

    admitted, preempted = _decided(rig, JobAdmitted), _decided(rig, JobPreempted)
    assert preempted and set(preempted) == {"train"}  # the run does preempt a borrower
    for queue in QUEUES:
        assert (_value(metrics, "tally_scheduler_admissions_total", queue) or 0) == admitted[queue]
        assert (_value(metrics, "tally_scheduler_preemptions_total", queue) or 0) == preempted[
            queue
        ]
    assert _lengths(metrics) == _pending(rig)
    assert _pending(rig)["train"] >= 1  # the preempted job waits again, and is counted so


def test_a_cancel_shortens_the_queue(tmp_path):
    rig, metrics = _observed(tmp_path)

    async def go():
        for _ in range(3):
            rig.executor.script((await rig.submit(gpus=2, queue="train")).job_id, RUNS_FOREVER)
        await rig.ticks(1)
        waiting = [r for r in rig.dispatcher.records.values() if r.state is JobState.PENDING]
        before = _lengths(metrics)["train"]
        await rig.service.cancel(waiting[0].job_id, None)
        return before

    before = asyncio.run(go())
    assert before == 1
    assert _lengths(metrics)["train"] == 0


def test_a_replayed_service_reports_its_queues_and_counts_no_decision_twice(tmp_path):
    rig, _ = _observed(tmp_path)
    asyncio.run(_preempting_run(rig))

    fresh = build_dispatcher(rig.config, FakeExecutor(clock=rig.clock), rig.clock)
    fresh.replay(_consumed(rig, partitions=3, seed=3))
    metrics = TallyMetrics(sections=("scheduler",))
    service = SchedulerService(fresh, rig.publisher, observer=metrics)
    asyncio.run(service.start())  # recovery: the lost runs fail and are retried per queue

    lengths = {q: _value(metrics, "tally_scheduler_queue_length", q) for q in QUEUES}
    pending = Counter(r.spec.queue for r in fresh.records.values() if r.state is JobState.PENDING)
    assert lengths == {q: pending[q] for q in QUEUES}
    for queue in QUEUES:  # replayed admissions and preemptions were counted by the first run
        assert _value(metrics, "tally_scheduler_admissions_total", queue) is None
        assert _value(metrics, "tally_scheduler_preemptions_total", queue) is None


class _Broken:
    def scheduler_queue_length(self, queue: str, length: int) -> None:
        raise RuntimeError("observer down")

    def admitted(self, queue: str, count: int) -> None:
        raise RuntimeError("observer down")

    def preempted(self, queue: str, count: int) -> None:
        raise RuntimeError("observer down")


def test_a_failing_observer_never_stops_scheduling(tmp_path, caplog):
    rig = Rig(tmp_path)
    rig.service.observer = _Broken()

    async def go():
        record = await rig.submit(queue="dev")
        await rig.ticks(3)
        return record.job_id

    job = asyncio.run(go())
    assert rig.dispatcher.records[job].state is JobState.FINISHED
    assert "the scheduler observer failed" in caplog.text
