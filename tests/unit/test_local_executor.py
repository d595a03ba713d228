"""The local executor on real processes (exit statuses, launch failures, process groups,
grace and SIGKILL, stragglers, zombies, logs), the port's `Work` validation and log names, and
the bridge's tables (decisions → orders, statuses → events)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ledger.job_events import (
    FailReason,
    GpuReleased,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobStarted,
    PreemptReason,
)
from scheduler.cycle import run_cycle
from scheduler.executors import local as local_module
from scheduler.executors.bridge import enact, status_events, stop_orders
from scheduler.executors.errors import InvalidWork, JobAlreadyStarted, StopTimeout
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor, Outcome
from scheduler.executors.launch import log_name
from scheduler.executors.local import LocalExecutor, exit_status
from scheduler.executors.processes import group_members
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import JobStatus, RunState, StopReason, Work
from tests.scheduler_builders import HOUR_US, a_cluster, a_queue, a_spec, a_team, nodes

SH = "/bin/sh"


def a_job(job_id: str = "job-1", gpus: int = 1, attempt: int = 1) -> RunningJob:
    return RunningJob(
        spec=a_spec(job_id, gpus=gpus),
        flavor=Flavor("main", "A100"),
        gpus=tuple(GpuRef(f"GPU-{job_id}-{i}", "node-1") for i in range(gpus)),
        priority=0,
        preemptible=True,
        admitted_us=0,
        attempt=attempt,
    )


def sh(script: str) -> Work:
    return Work(command=(SH, "-c", script))


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[LocalExecutor]:
    ex = LocalExecutor(tmp_path / "logs", grace_s=0.5, kill_timeout_s=2.0)
    yield ex
    ex.stop(ex.active(), StopReason.CANCELLED)


def until_ended(ex: LocalExecutor, job_id: str, timeout_s: float = 10.0) -> list[JobStatus]:
    seen: list[JobStatus] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.extend(s for s in ex.poll() if s.job_id == job_id)
        if seen and seen[-1].state.ended:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{job_id} did not end; saw {seen}")


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def zombie_children() -> list[int]:
    """Children of this process that are zombies (not reaped)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z" and int(fields[1]) == me:
            found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------- exit statuses


@pytest.mark.parametrize(
    ("returncode", "state", "code"),
    [
        pytest.param(0, RunState.FINISHED, 0, id="zero-finished"),
        pytest.param(3, RunState.FAILED, 3, id="non-zero-failed"),
        pytest.param(-9, RunState.FAILED, 137, id="sigkill-128-plus-9"),
        pytest.param(-15, RunState.FAILED, 143, id="sigterm-128-plus-15"),
    ],
)
def test_exit_status(returncode: int, state: RunState, code: int) -> None:
    assert exit_status(returncode) == (state, code)


@dataclass(frozen=True, slots=True)
class RunCase:
    work: Work
    state: RunState
    exit_code: int
    in_log: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            RunCase(sh("echo out; echo err >&2"), RunState.FINISHED, 0, "out\nerr\n"), id="ok"
        ),
        pytest.param(RunCase(sh("exit 7"), RunState.FAILED, 7, ""), id="exit-7"),
        pytest.param(RunCase(sh("kill -KILL $$"), RunState.FAILED, 137, ""), id="killed-itself"),
        pytest.param(
            RunCase(Work(command=("no-such-command-xyz",)), RunState.FAILED, 127, "cannot start"),
            id="missing-command-127",
        ),
        pytest.param(
            RunCase(Work(command=("/etc/hostname",)), RunState.FAILED, 126, "cannot start"),
            id="not-executable-126",
        ),
        pytest.param(
            RunCase(
                Work(command=("true",), cwd="/no/such/dir"), RunState.FAILED, 127, "cannot start"
            ),
            id="missing-cwd",
        ),
        pytest.param(
            RunCase(
                Work(script="#!/bin/sh\necho from-script $TALLY_ATTEMPT\n"),
                RunState.FINISHED,
                0,
                "from-script 1",
            ),
            id="script-by-shebang",
        ),
        pytest.param(
            RunCase(
                Work(command=(SH, "-c", "echo $WANDB_MODE"), env=(("WANDB_MODE", "offline"),)),
                RunState.FINISHED,
                0,
                "offline",
            ),
            id="work-env",
        ),
    ],
)  # fmt: skip
def test_runs_report_how_they_ended(executor: LocalExecutor, case: RunCase) -> None:
    executor.start(a_job(), case.work)
    statuses = until_ended(executor, "job-1")
    last = statuses[-1]
    assert (last.state, last.exit_code) == (case.state, case.exit_code)
    assert case.in_log in executor.log_path("job-1").read_text()
    assert executor.active() == ()
    assert zombie_children() == []


def test_a_launch_failure_is_reported_without_running_first(executor: LocalExecutor) -> None:
    executor.start(a_job(), Work(command=("no-such-command-xyz",)))
    (status,) = executor.poll()
    assert status.state is RunState.FAILED
    assert "No such file or directory" in status.detail


def test_running_is_reported_once_before_the_end_even_for_a_fast_job(
    executor: LocalExecutor,
) -> None:
    executor.start(a_job(), sh("exit 0"))
    time.sleep(0.2)
    states = [s.state for s in until_ended(executor, "job-1")]
    assert states == [RunState.RUNNING, RunState.FINISHED]


def test_environment_pins_gpus_by_mapped_index_or_uuid(tmp_path: Path) -> None:
    job = a_job(gpus=2)
    ex = LocalExecutor(tmp_path, device_ids={job.gpus[0].uuid: "3"})
    ex.start(job, sh('echo "$CUDA_VISIBLE_DEVICES|$TALLY_JOB_ID|$TALLY_ATTEMPT"'))
    running = until_ended(ex, "job-1")[0]
    assert running.devices == ("3", "GPU-job-1-1")
    assert ex.log_path("job-1").read_text() == "3,GPU-job-1-1|job-1|1\n"


ECHO_ENV = 'echo "$TALLY_TEST_BASE|$WANDB_MODE|$CUDA_VISIBLE_DEVICES"'


@pytest.mark.parametrize(
    ("given", "process_env", "work_env", "seen"),
    [
        pytest.param(None, [{"TALLY_TEST_BASE": "one"}, {"TALLY_TEST_BASE": "two"}, {}], (),
                     ["one||GPU-job-0-0", "two||GPU-job-1-0", "||GPU-job-2-0"],
                     id="this-process-s-as-it-is-at-each-start"),
        pytest.param(None, [{"WANDB_MODE": "online"}] * 2, (("WANDB_MODE", "offline"),),
                     ["|offline|GPU-job-0-0", "|offline|GPU-job-1-0"], id="work-env-over-it"),
        pytest.param(None, [{"CUDA_VISIBLE_DEVICES": "9", "TALLY_TEST_BASE": "ü"}], (),
                     ["ü||GPU-job-0-0"], id="the-executor-s-own-over-it-non-ascii-kept"),
        pytest.param({"TALLY_TEST_BASE": "given", "PATH": os.defpath},
                     [{"TALLY_TEST_BASE": "ignored", "WANDB_MODE": "ignored"}], (),
                     ["given||GPU-job-0-0"], id="a-given-one-instead"),
    ],
)  # fmt: skip
def test_a_job_starts_from_the_environment_as_it_is_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given, process_env, work_env, seen
) -> None:
    """The process environment is read at each start (kept as bytes between starts while it
    does not change), under the work's variables and the executor's own."""
    ex = LocalExecutor(tmp_path, env=given)
    for i, variables in enumerate(process_env):
        for name in ("TALLY_TEST_BASE", "WANDB_MODE", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        ex.start(a_job(f"job-{i}"), Work(command=(SH, "-c", ECHO_ENV), env=work_env))
        until_ended(ex, f"job-{i}")
    logs = [ex.log_path(f"job-{i}").read_text().strip() for i in range(len(process_env))]
    assert logs == seen


def test_starting_a_running_job_again_is_refused(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh("sleep 30"))
    with pytest.raises(JobAlreadyStarted):
        executor.start(a_job(), sh("sleep 30"))


def test_log_is_appended_by_every_run(executor: LocalExecutor) -> None:
    for attempt in (1, 2):
        executor.start(a_job(attempt=attempt), sh("echo run $TALLY_ATTEMPT"))
        until_ended(executor, "job-1")
    assert executor.log_path("job-1").read_text() == "run 1\nrun 2\n"


# ---------------------------------------------------------------------------- stopping


def test_stop_terms_the_whole_group(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh("sleep 30 & sleep 30 & wait"))
    pgid = executor.pgid("job-1")
    assert pgid is not None
    wait_for(lambda: len(group_members(pgid)) == 3)
    started = time.monotonic()
    (status,) = executor.stop(["job-1"], StopReason.RECLAIMED)
    assert time.monotonic() - started < 0.5, "a group that obeys SIGTERM needs no grace"
    assert status.state is RunState.STOPPED
    assert status.detail.startswith("reclaimed: ended after SIGTERM")
    assert group_members(pgid) == ()
    assert executor.poll() == ()
    assert zombie_children() == []


def test_stop_kills_what_ignores_sigterm_after_the_grace(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh("trap '' TERM; sleep 30 & sleep 30; wait"))
    pgid = executor.pgid("job-1")
    assert pgid is not None
    wait_for(lambda: len(group_members(pgid)) == 3)  # the trap is set before the sleeps start
    started = time.monotonic()
    (status,) = executor.stop(["job-1"], StopReason.PREEMPTED)
    assert 0.5 <= time.monotonic() - started < 2.0
    assert (status.state, status.exit_code) == (RunState.STOPPED, 137)
    assert "SIGKILL after 0.5 s grace" in status.detail
    assert group_members(pgid) == ()


def test_stopping_many_jobs_shares_one_grace_period(executor: LocalExecutor) -> None:
    for n in range(3):
        executor.start(a_job(f"job-{n}"), sh("trap '' TERM; sleep 30; true"))
    for n in range(3):
        pgid = executor.pgid(f"job-{n}")
        assert pgid is not None
        wait_for(lambda pgid=pgid: len(group_members(pgid)) == 2)  # trapped, then sleeping
    started = time.monotonic()
    statuses = executor.stop([f"job-{n}" for n in range(3)], StopReason.PREEMPTED)
    assert time.monotonic() - started < 1.2
    assert [s.state for s in statuses] == [RunState.STOPPED] * 3


def test_stop_of_a_job_that_already_ended_reports_its_own_end(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh("exit 4"))
    time.sleep(0.3)
    (status,) = executor.stop(["job-1", "unknown"], StopReason.CANCELLED)
    assert (status.state, status.exit_code) == (RunState.FAILED, 4)
    assert executor.stop(["job-1"], StopReason.CANCELLED) == ()


def test_an_ended_jobs_stragglers_are_killed(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh("sleep 30 & echo leader-exits"))
    pgid = executor.pgid("job-1")
    assert pgid is not None
    statuses = until_ended(executor, "job-1")
    assert statuses[-1].state is RunState.FINISHED
    wait_for(lambda: group_members(pgid) == (), timeout_s=2)


def test_a_group_that_will_not_die_raises_stop_timeout(
    executor: LocalExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor.start(a_job(), sh("sleep 30"))
    pgid = executor.pgid("job-1")
    monkeypatch.setattr(local_module, "alive_groups", frozenset)
    monkeypatch.setattr(executor, "kill_timeout_s", 0.1)
    with pytest.raises(StopTimeout) as caught:
        executor.stop(["job-1"], StopReason.RECLAIMED)
    assert caught.value.job_ids == ("job-1",)
    assert executor.active() == ("job-1",), "a job whose GPUs are not free stays tracked"
    monkeypatch.undo()
    assert pgid is not None and group_members(pgid) == ()  # SIGKILL did reach it


# ---------------------------------------------------------------------------- port vocabulary


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="neither-command-nor-script"),
        pytest.param({"command": ("a",), "script": "#!/bin/sh\n"}, id="both"),
        pytest.param({"command": ("", "x")}, id="empty-program"),
        pytest.param({"script": "echo no shebang\n"}, id="script-without-shebang"),
        pytest.param({"command": ("a",), "env": (("1X", "v"),)}, id="bad-env-name"),
        pytest.param(
            {"command": ("a",), "env": (("CUDA_VISIBLE_DEVICES", "0"),)}, id="reserved-env"
        ),
        pytest.param({"command": ("a",), "env": (("TALLY_JOB_ID", "x"),)}, id="reserved-job-id"),
        pytest.param({"command": ("a",), "env": (("A", "1"), ("A", "2"))}, id="env-twice"),
        pytest.param({"command": ("a",), "env": (("A", "x\0y"),)}, id="nul-in-value"),
    ],
)
def test_invalid_work_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidWork):
        Work(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("job_id", "name"),
    [
        pytest.param("job-1", "job-1.log", id="plain"),
        pytest.param("../etc/passwd", "..%2Fetc%2Fpasswd.log", id="no-escape-from-the-dir"),
        pytest.param("a b%c", "a%20b%25c.log", id="spaces-and-percent"),
    ],
)
def test_log_names_stay_inside_the_log_directory(job_id: str, name: str) -> None:
    assert log_name(job_id) == name


# ---------------------------------------------------------------------------- bridge tables


def test_stop_orders_group_decisions_by_reason() -> None:
    events = [
        JobPreempted(job_id="a", by="x", reason=PreemptReason.HIGHER_PRIORITY, time_us=1),
        JobReclaimed(job_id="b", gpu_uuids=("g",), idle_since_us=0, time_us=1),
        JobPreempted(job_id="c", by="x", reason=PreemptReason.HIGHER_PRIORITY, time_us=1),
        JobFailed(job_id="d", reason=FailReason.CANCELLED, attempt=1, retry=False, time_us=1),
        JobFailed(job_id="e", reason=FailReason.MAX_RUNTIME, attempt=1, retry=False, time_us=1),
        JobFailed(job_id="f", reason=FailReason.EXIT_NONZERO, attempt=1, retry=True, time_us=1),
    ]
    assert stop_orders(events) == (
        (StopReason.PREEMPTED, ("a", "c")),
        (StopReason.RECLAIMED, ("b",)),
        (StopReason.CANCELLED, ("d",)),
        (StopReason.MAX_RUNTIME, ("e",)),
    )


@dataclass(frozen=True, slots=True)
class StatusCase:
    state: RunState
    started: bool
    exit_code: int | None
    first: type
    fail_reason: FailReason | None = None
    retry: bool = False


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(StatusCase(RunState.RUNNING, False, None, JobStarted), id="running-starts"),
        pytest.param(StatusCase(RunState.FINISHED, True, 0, JobFinished), id="finished"),
        pytest.param(
            StatusCase(RunState.FAILED, True, 3, JobFailed, FailReason.EXIT_NONZERO, True),
            id="failed-retried-within-limit",
        ),
        pytest.param(
            StatusCase(RunState.TIMED_OUT, True, 143, JobFailed, FailReason.MAX_RUNTIME),
            id="timed-out-never-retried",
        ),
        pytest.param(
            StatusCase(RunState.LOST, True, None, JobFailed, FailReason.EXECUTOR_LOST, True),
            id="lost-retried",
        ),
        pytest.param(
            StatusCase(RunState.CANCELLED, True, 143, JobFailed, FailReason.CANCELLED),
            id="cancelled-outside-never-retried",
        ),
        pytest.param(
            StatusCase(RunState.STOPPED, True, 143, JobFailed, FailReason.EXECUTOR_LOST, True),
            id="stopped-without-a-decision",
        ),
    ],
)
def test_status_events(case: StatusCase) -> None:
    job = a_job(gpus=2)
    if case.started:
        job = replace(job, started_us=5)
    status = JobStatus("job-1", case.state, 10, case.exit_code, detail="why")
    events = status_events(status, job, a_queue(max_retries=1))
    assert type(events[0]) is case.first
    assert all(e.time_us == 10 for e in events)
    released = [e for e in events if isinstance(e, GpuReleased)]
    assert len(released) == (0 if case.state is RunState.RUNNING else 2)
    if case.fail_reason is not None:
        failed = events[0]
        assert isinstance(failed, JobFailed)
        assert (failed.reason, failed.retry, failed.exit_code) == (
            case.fail_reason,
            case.retry,
            case.exit_code if case.state is not RunState.CANCELLED else None,
        )


@pytest.mark.parametrize(
    ("slurm_job_id", "expected"),
    [pytest.param("41", "slurm:41", id="slurm-run"), pytest.param(None, None, id="local-run")],
)
def test_a_start_carries_the_executor_s_own_id_of_the_run(
    slurm_job_id: str | None, expected: str | None
) -> None:
    status = JobStatus("job-1", RunState.RUNNING, 10, native_id="41", slurm_job_id=slurm_job_id)
    (started,) = status_events(status, a_job(), a_queue())
    assert started == JobStarted("job-1", 10, slurm_job_id=slurm_job_id)
    assert started.executor_id == expected  # the alias the ledger learns for the Tally job


@pytest.mark.parametrize(
    ("state", "job_known", "started"),
    [
        pytest.param(RunState.FINISHED, False, False, id="ended-in-the-core-first"),
        pytest.param(RunState.RUNNING, True, True, id="start-already-known"),
        pytest.param(RunState.PENDING, True, False, id="pending"),
    ],
)
def test_status_events_that_change_nothing(state: RunState, job_known: bool, started: bool) -> None:
    job = a_job()
    if started:
        job = replace(job, started_us=5)
    status = JobStatus("job-1", state, 10, 0)
    assert status_events(status, job if job_known else None, a_queue()) == ()


def test_signal_names_in_details(executor: LocalExecutor) -> None:
    executor.start(a_job(), sh(f"kill -{int(signal.SIGSEGV)} $$"))
    last = until_ended(executor, "job-1")[-1]
    assert (last.exit_code, last.detail) == (128 + int(signal.SIGSEGV), "killed by SIGSEGV")


class Recording(FakeExecutor):
    """A fake that also records the order of starts and stops."""

    def __init__(self) -> None:
        super().__init__(default=RUNS_FOREVER)
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        self.calls.append(("start", (job.job_id,)))
        super().start(job, work, time_limit_us=time_limit_us)

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        self.calls.append((f"stop {reason.value}", tuple(job_ids)))
        return super().stop(job_ids, reason)


def test_enact_stops_every_victim_before_it_starts_the_preemptor() -> None:
    cluster = a_cluster(
        teams=(a_team("vision", nominal=2, cohort=None),),
        queues=(a_queue("train", priority=0), a_queue("urgent", priority=10)),
        fleet=nodes(count=1, gpus=2),
    )
    fake = Recording()
    work = Work(command=("true",))

    def cycle() -> None:
        result = run_cycle(cluster.snapshot(), cluster.policy)
        cluster.apply(result.events)
        enact(result.events, cluster.state, fake, lambda job_id: work)

    cluster.submit(a_spec("low-1"), a_spec("low-2"))
    cycle()
    cluster.submit(a_spec("urgent", queue="urgent", gpus=2, max_runtime_us=HOUR_US))
    cycle()
    assert fake.calls == [
        ("start", ("low-1",)),
        ("start", ("low-2",)),
        ("stop preempted", ("low-1", "low-2")),
        ("start", ("urgent",)),
    ]
    assert fake.starts[-1].time_limit_us == HOUR_US
    assert fake.starts[-1].devices == tuple(g.uuid for g in cluster.running("urgent").gpus)


def test_fake_plays_scripted_runs_in_order() -> None:
    fake = FakeExecutor()
    fake.script("job-1", Outcome(exit_code=5, pending_polls=1), Outcome(exit_code=0))
    work = Work(command=("true",))
    fake.start(a_job(), work)
    assert fake.poll() == ()  # pending
    assert [s.state for s in fake.poll()] == [RunState.RUNNING]
    assert [(s.state, s.exit_code) for s in fake.poll()] == [(RunState.FAILED, 5)]
    fake.start(a_job(attempt=2), work)
    assert [s.state for s in fake.poll()] == [RunState.RUNNING]
    assert [s.state for s in fake.poll()] == [RunState.FINISHED]
    fake.start(a_job(attempt=3), work)
    fake.poll()
    assert [s.state for s in fake.poll()] == [RunState.FINISHED], "the last outcome repeats"
