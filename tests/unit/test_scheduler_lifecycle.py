"""Job ends: retries of failed jobs up to a limit, stopping jobs past their maximum runtime,
cancelling, and what the state does with each."""

from dataclasses import dataclass

import pytest

from ledger.job_events import FailReason, GpuReleased, JobFailed, WaitReason
from scheduler.lifecycle import cancel, fail, finish, overdue, runtime_limit
from tests.scheduler_builders import A100, HOUR_US, MINUTE_US, T0_US, a_cluster, a_queue, a_spec


@dataclass(frozen=True)
class RetryCase:
    reason: FailReason
    attempt: int
    max_retries: int
    retry: bool


RETRIES = [
    pytest.param(RetryCase(FailReason.EXIT_NONZERO, 1, 2, True), id="first-failure-retried"),
    pytest.param(RetryCase(FailReason.EXIT_NONZERO, 2, 2, True), id="last-allowed-retry"),
    pytest.param(RetryCase(FailReason.EXIT_NONZERO, 3, 2, False), id="retries-exhausted"),
    pytest.param(RetryCase(FailReason.EXIT_NONZERO, 1, 0, False), id="queue-without-retries"),
    pytest.param(RetryCase(FailReason.EXECUTOR_LOST, 1, 1, True), id="lost-executor-retried"),
    pytest.param(RetryCase(FailReason.MAX_RUNTIME, 1, 5, False), id="max-runtime-never-retried"),
    pytest.param(RetryCase(FailReason.CANCELLED, 1, 5, False), id="cancel-never-retried"),
]


@pytest.mark.parametrize("case", RETRIES)
def test_retries(case: RetryCase) -> None:
    cluster = a_cluster(queues=(a_queue(max_retries=case.max_retries),))
    cluster.run(a_spec("j", "vision", gpus=2))
    for _ in range(case.attempt - 1):  # fail and readmit until this attempt
        cluster.apply(
            fail(
                cluster.running("j"),
                a_queue(max_retries=99),
                FailReason.EXIT_NONZERO,
                cluster.now_us,
            )
        )
        cluster.settle()
    job = cluster.running("j")
    assert job.attempt == case.attempt
    queue = cluster.state.queues["train"]
    events = fail(job, queue, case.reason, cluster.now_us, exit_code=1)
    failed = events[0]
    assert isinstance(failed, JobFailed)
    assert failed.retry is case.retry
    assert {e.gpu_uuid for e in events if isinstance(e, GpuReleased)} == {g.uuid for g in job.gpus}
    cluster.apply(events)
    pending = cluster.state.pending_job("j")
    if case.retry:
        assert pending is not None
        assert pending.attempt == case.attempt + 1
        assert pending.last_wait is WaitReason.RETRYING
        assert pending.spec.submit_us == T0_US  # keeps its place by age
    else:
        assert pending is None
        assert cluster.state.is_done("j")
    assert cluster.state.used("vision", job.flavor) == 0


@dataclass(frozen=True)
class RuntimeCase:
    queue_max_min: int | None
    job_max_min: int | None
    ran_min: int
    stopped: bool


RUNTIMES = [
    pytest.param(RuntimeCase(60, None, 61, True), id="past-queue-maximum"),
    pytest.param(RuntimeCase(60, None, 60, True), id="at-queue-maximum"),
    pytest.param(RuntimeCase(60, None, 59, False), id="within-queue-maximum"),
    pytest.param(RuntimeCase(60, 30, 31, True), id="job-maximum-below-queue-maximum"),
    pytest.param(RuntimeCase(30, 60, 31, True), id="queue-maximum-below-job-maximum"),
    pytest.param(RuntimeCase(None, 30, 31, True), id="job-maximum-only"),
    pytest.param(RuntimeCase(None, None, 10_000, False), id="no-maximum"),
]


@pytest.mark.parametrize("case", RUNTIMES)
def test_jobs_past_maximum_runtime_are_stopped(case: RuntimeCase) -> None:
    queue_max = None if case.queue_max_min is None else case.queue_max_min * MINUTE_US
    job_max = None if case.job_max_min is None else case.job_max_min * MINUTE_US
    cluster = a_cluster(queues=(a_queue(max_runtime_us=queue_max, max_retries=3),))
    cluster.run(a_spec("j", "vision", max_runtime_us=job_max), a_spec("other", "audio"))
    started = cluster.running("j").since_us
    cluster.now_us = started + case.ran_min * MINUTE_US
    events = overdue(cluster.snapshot())
    stopped = {e.job_id for e in events if isinstance(e, JobFailed)}
    if not case.stopped:
        assert "j" not in stopped
        return
    assert "j" in stopped
    failed = next(e for e in events if isinstance(e, JobFailed) and e.job_id == "j")
    assert failed.reason is FailReason.MAX_RUNTIME and not failed.retry
    cluster.apply(events)
    assert cluster.state.is_done("j")


def test_runtime_counts_from_the_reported_start() -> None:
    from ledger.job_events import JobStarted

    cluster = a_cluster(queues=(a_queue(max_runtime_us=HOUR_US),))
    cluster.run(a_spec("j", "vision"))
    cluster.apply([JobStarted("j", cluster.now_us + 30 * MINUTE_US)])
    job = cluster.running("j")
    assert runtime_limit(job, cluster.state.queues["train"]) == HOUR_US
    cluster.now_us += 80 * MINUTE_US  # 80 min since admission, 50 since start
    assert overdue(cluster.snapshot()) == ()


def test_finish_releases_every_gpu_and_ends_the_job() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("j", "vision", gpus=3))
    job = cluster.running("j")
    cluster.apply(finish(job, cluster.now_us))
    assert cluster.state.is_done("j")
    assert cluster.state.free_total(job.flavor) == 16
    assert all(cluster.state.holder(g.uuid) is None for g in job.gpus)


def test_cancel_a_pending_job() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("hog", "vision", gpus=16))
    cluster.submit(a_spec("j", "vision"))
    cluster.cycle()
    pending = cluster.state.pending_job("j")
    assert pending is not None
    events = cancel(pending, cluster.now_us, "user asked")
    assert [type(e) for e in events] == [JobFailed]
    cluster.apply(events)
    assert cluster.state.pending_job("j") is None and cluster.state.is_done("j")


def test_cancel_a_running_job_releases_its_gpus() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("j", "vision", gpus=2))
    events = cancel(cluster.running("j"), cluster.now_us)
    assert sum(isinstance(e, GpuReleased) for e in events) == 2
    cluster.apply(events)
    assert cluster.state.is_done("j")
    assert cluster.state.free_total(A100) == 16
