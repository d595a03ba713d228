"""The local executor driven by the pure scheduler core, on real processes: a cycle's decisions
are applied to `SchedulerState`, carried out by `bridge.enact`, and what the processes do comes
back through `bridge.observe` as events.

Stories: a high-priority job preempts a team's low-priority `sleep` jobs — their process groups
are killed before it starts on their GPUs, and they requeue and run again once it is done; an
idle dev job is reclaimed; a job past its maximum runtime is stopped; a failing job is retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
    PreemptReason,
    WaitReason,
)
from ledger.units import US_PER_SECOND
from scheduler.cycle import CycleResult, run_cycle
from scheduler.executors.bridge import enact, observe
from scheduler.executors.local import LocalExecutor
from scheduler.executors.processes import group_members
from scheduler.lifecycle import overdue
from scheduler.model import (
    IdleAction,
    IdlePolicy,
    Node,
    Policy,
    QueueClass,
    RunningJob,
)
from scheduler.ports import JobStatus, RunState, StopReason, Work
from scheduler.reclaim import IdleAlert, IdleGpu, idle_decisions
from scheduler.state import SchedulerState
from tests.scheduler_builders import a_queue, a_team

GPUS = ("GPU-aaaa", "GPU-bbbb")
DEVICE_IDS = {"GPU-aaaa": "0", "GPU-bbbb": "1"}
TREE = 'echo "start $TALLY_JOB_ID attempt $TALLY_ATTEMPT gpus $CUDA_VISIBLE_DEVICES"; '
HOLD = TREE + "sleep 60 & sleep 60; wait"


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class Stack:
    """The scheduler's state, one local executor, and the work each job runs."""

    state: SchedulerState
    executor: LocalExecutor
    policy: Policy = field(default_factory=Policy)
    works: dict[str, Work] = field(default_factory=dict)
    log: list[JobEvent] = field(default_factory=list)
    stopped: list[JobStatus] = field(default_factory=list)

    def apply(self, events: tuple[JobEvent, ...] | list[JobEvent]) -> None:
        for event in events:
            self.state.apply(event)
            self.log.append(event)

    def submit(self, job_id: str, queue: str, gpus: int, script: str, **spec: int) -> None:
        t = now_us()
        self.works[job_id] = Work(command=("/bin/sh", "-c", script))
        job = JobSpec(
            job_id=job_id,
            team="vision",
            project="vision-project",
            user="ada",
            queue=queue,
            gpus=gpus,
            submit_us=t,
            estimated_runtime_us=60 * US_PER_SECOND,
            **spec,  # type: ignore[arg-type]
        )
        self.apply([JobSubmitted(spec=job, time_us=t)])

    def decide(self, events: tuple[JobEvent, ...]) -> None:
        """Apply decisions, then carry them out (stops before starts)."""
        self.apply(events)
        self.stopped.extend(enact(events, self.state, self.executor, self.works.__getitem__))

    def cycle(self) -> CycleResult:
        snap = self.state.snapshot(now_us(), self.policy.heads_per_queue)
        result = run_cycle(snap, self.policy)
        self.decide(result.events)
        return result

    def observe_until(self, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.apply(list(observe(self.executor, self.state)))
            if done():
                return
            assert time.monotonic() < deadline, f"timed out; events: {self.log[-5:]}"
            time.sleep(0.02)

    def running(self, job_id: str) -> RunningJob:
        job = self.state.running_job(job_id)
        assert job is not None, f"{job_id} is not running"
        return job

    def started(self, job_id: str) -> bool:
        job = self.state.running_job(job_id)
        return job is not None and job.started_us is not None

    def pgid(self, job_id: str) -> int:
        pgid = self.executor.pgid(job_id)
        assert pgid is not None, f"{job_id} has no process group"
        return pgid

    def log_lines(self, job_id: str) -> list[str]:
        return self.executor.log_path(job_id).read_text().splitlines()

    def wait_log(self, job_id: str, count: int = 1) -> list[str]:
        deadline = time.monotonic() + 10
        while True:
            lines = [ln for ln in self.log_lines(job_id) if ln.startswith("start ")]
            if len(lines) >= count:
                return lines
            assert time.monotonic() < deadline, f"{job_id} log: {self.log_lines(job_id)}"
            time.sleep(0.02)

    def gpus_of(self, job_id: str) -> str:
        return ",".join(DEVICE_IDS[g.uuid] for g in self.running(job_id).gpus)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    queues = (
        a_queue("batch", priority=0, preemptible=True, max_retries=1),
        a_queue("urgent", priority=10, preemptible=False),
        a_queue(
            "dev",
            QueueClass.DEV,
            priority=0,
            idle=IdlePolicy(IdleAction.RECLAIM, after_us=US_PER_SECOND),
            max_runtime_us=60 * US_PER_SECOND,
        ),
    )
    node = Node(name="local", pool="main", model="A100", gpu_uuids=GPUS)
    state = SchedulerState(queues, (a_team("vision", nominal=2, cohort=None),), (node,))
    executor = LocalExecutor(tmp_path / "logs", device_ids=DEVICE_IDS, grace_s=1.0)
    s = Stack(state, executor)
    yield s
    executor.stop(executor.active(), StopReason.CANCELLED)


def test_a_high_priority_job_preempts_real_processes_that_then_requeue(stack: Stack) -> None:
    stack.submit("low-1", "batch", 1, HOLD)
    stack.submit("low-2", "batch", 1, HOLD)
    assert stack.cycle().admitted == ("low-1", "low-2")
    stack.observe_until(lambda: stack.started("low-1") and stack.started("low-2"))
    victims = {job_id: stack.pgid(job_id) for job_id in ("low-1", "low-2")}
    for job_id, pgid in victims.items():
        gpus = stack.gpus_of(job_id)
        assert stack.wait_log(job_id) == [f"start {job_id} attempt 1 gpus {gpus}"]
        assert len(group_members(pgid)) >= 2, "a shell and its sleeps"

    stack.submit("urgent-1", "urgent", 2, TREE + "sleep 0.3")
    result = stack.cycle()

    assert sorted(result.preempted) == ["low-1", "low-2"]
    assert result.admitted == ("urgent-1",)
    preempted = [e for e in result.events if isinstance(e, JobPreempted)]
    assert {(e.by, e.reason) for e in preempted} == {("urgent-1", PreemptReason.HIGHER_PRIORITY)}
    assert [s.state for s in stack.stopped] == [RunState.STOPPED, RunState.STOPPED]
    for pgid in victims.values():
        assert group_members(pgid) == (), "the victims' whole groups are gone"
    assert stack.gpus_of("urgent-1") in ("0,1", "1,0")
    assert stack.wait_log("urgent-1") == [
        f"start urgent-1 attempt 1 gpus {stack.gpus_of('urgent-1')}"
    ]
    for job_id in victims:
        pending = stack.state.pending_job(job_id)
        assert pending is not None and pending.last_wait is WaitReason.PREEMPTED

    stack.observe_until(lambda: stack.state.is_done("urgent-1"))
    assert any(isinstance(e, JobFinished) and e.job_id == "urgent-1" for e in stack.log)
    assert sorted(stack.cycle().admitted) == ["low-1", "low-2"]
    for job_id in victims:
        first, second = stack.wait_log(job_id, count=2)
        assert second == f"start {job_id} attempt 1 gpus {stack.gpus_of(job_id)}"
        assert first.startswith(f"start {job_id} attempt 1 gpus ")
    assert stack.executor.active() == ("low-1", "low-2")


def test_an_idle_dev_job_is_reclaimed_and_its_processes_killed(stack: Stack) -> None:
    stack.submit("notebook", "dev", 1, HOLD)
    stack.cycle()
    stack.observe_until(lambda: stack.started("notebook"))
    stack.wait_log("notebook")
    pgid = stack.pgid("notebook")
    job = stack.running("notebook")
    assert job.started_us is not None
    idle = [IdleGpu(g.uuid, since_us=job.started_us) for g in job.gpus]
    snap = stack.state.snapshot(job.started_us + 2 * US_PER_SECOND)

    decisions = idle_decisions(idle, snap)
    events = tuple(d for d in decisions if not isinstance(d, IdleAlert))
    assert isinstance(events[0], JobReclaimed)
    stack.decide(events)

    (stopped,) = stack.stopped
    assert (stopped.job_id, stopped.state) == ("notebook", RunState.STOPPED)
    assert stopped.detail.startswith("reclaimed")
    assert group_members(pgid) == ()
    assert stack.state.is_done("notebook")
    assert stack.state.holder(job.gpus[0].uuid) is None


def test_a_job_past_its_maximum_runtime_is_stopped(stack: Stack) -> None:
    stack.submit("forever", "dev", 1, HOLD)
    stack.cycle()
    stack.observe_until(lambda: stack.started("forever"))
    pgid = stack.pgid("forever")
    started = stack.running("forever").started_us
    assert started is not None

    events = overdue(stack.state.snapshot(started + 61 * US_PER_SECOND))
    failed = events[0]
    assert isinstance(failed, JobFailed) and failed.reason is FailReason.MAX_RUNTIME
    stack.decide(events)

    assert [s.detail.split(":")[0] for s in stack.stopped] == ["max_runtime"]
    assert group_members(pgid) == ()
    assert stack.state.is_done("forever")


def test_a_failing_job_is_retried_with_the_next_attempt(stack: Stack) -> None:
    stack.submit("flaky", "batch", 1, TREE + '[ "$TALLY_ATTEMPT" = 2 ] || exit 3')
    stack.cycle()
    stack.observe_until(lambda: stack.state.pending_job("flaky") is not None)
    failed = [e for e in stack.log if isinstance(e, JobFailed)]
    assert [(e.exit_code, e.retry) for e in failed] == [(3, True)]

    stack.cycle()
    stack.observe_until(lambda: stack.state.is_done("flaky"))
    assert stack.wait_log("flaky", count=2)[1].startswith("start flaky attempt 2 ")
    job_events = [e for e in stack.log if not isinstance(e, GpuAssigned | GpuReleased)]
    assert [type(e).__name__ for e in job_events if e.job_id == "flaky"] == [
        "JobSubmitted",
        "JobAdmitted",
        "JobStarted",
        "JobFailed",
        "JobAdmitted",
        "JobStarted",
        "JobFinished",
    ]
