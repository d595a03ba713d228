"""One contract for every `Executor` adapter (`scheduler.ports`): local processes, the in-memory
fake, and a real single-node Slurm (skipped where Slurm is not installed).

Each test drives an executor only through the port — start, poll, stop, active, log_path —
with jobs of four behaviours: succeed, fail (exit 3), hold (a process tree that runs until
stopped) and missing (a command that does not exist). The fake plays them from scripted
outcomes; the others run them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest

from scheduler.executors.errors import JobAlreadyStarted
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor, Outcome
from scheduler.executors.local import LocalExecutor, WallClock
from scheduler.executors.processes import group_members
from scheduler.executors.slurm import SlurmExecutor, SubprocessRunner
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import Executor, JobStatus, RunState, StopReason, Work
from tests.scheduler_builders import a_spec
from tests.slurm.cluster import SlurmCluster, processes_with_env, register_marker, slurm_cluster

__all__ = ["slurm_cluster"]

SEEN = "seen CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES TALLY_JOB_ID=$TALLY_JOB_ID"
SCRIPTS = {
    "succeed": f'echo "{SEEN}"; echo to-stderr >&2',
    "fail": f'echo "{SEEN}"; exit 3',
    "hold": f'echo "{SEEN}"; sleep 60 & sleep 60; wait',
}
TIMEOUT_S = 20.0


class Behaviour(StrEnum):
    SUCCEED = "succeed"
    FAIL = "fail"
    HOLD = "hold"
    MISSING = "missing"


FAKE_OUTCOMES = {
    Behaviour.SUCCEED: Outcome(exit_code=0, output=SEEN.replace('"', "") + "\nto-stderr\n"),
    Behaviour.FAIL: Outcome(exit_code=3, output=SEEN + "\n"),
    Behaviour.HOLD: Outcome(exit_code=None, output=SEEN + "\n"),
    Behaviour.MISSING: Outcome(launch_error="no-such-command-xyz: not found"),
}
assert FAKE_OUTCOMES[Behaviour.HOLD].exit_code == RUNS_FOREVER.exit_code


@dataclass
class Harness:
    """One executor under the contract, with what only its kind can check."""

    kind: str
    executor: Executor
    device_ids: dict[str, str] = field(default_factory=dict)
    check_gone: Callable[[JobStatus], None] = lambda status: None
    seen: dict[str, list[JobStatus]] = field(default_factory=dict)

    def job(self, job_id: str, gpus: int = 1) -> RunningJob:
        return RunningJob(
            spec=a_spec(job_id, gpus=gpus),
            flavor=Flavor("main", "A100"),
            gpus=tuple(GpuRef(f"GPU-{job_id}-{i}", "tally-node") for i in range(gpus)),
            priority=0,
            preemptible=True,
            admitted_us=0,
        )

    def start(self, job_id: str, behaviour: Behaviour, gpus: int = 1) -> RunningJob:
        job = self.job(job_id, gpus)
        if isinstance(self.executor, FakeExecutor):
            self.executor.script(job_id, FAKE_OUTCOMES[behaviour])
        if behaviour is Behaviour.MISSING:
            work = Work(command=("no-such-command-xyz",))
        else:
            work = Work(command=("/bin/sh", "-c", SCRIPTS[behaviour]))
        self.executor.start(job, work)
        return job

    def poll(self) -> None:
        for status in self.executor.poll():
            self.seen.setdefault(status.job_id, []).append(status)

    def until(self, job_id: str, state: RunState) -> JobStatus:
        """Poll until the job reports `state` (or ends otherwise: a failure)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            self.poll()
            for status in self.seen.get(job_id, []):
                if status.state is state:
                    return status
                if status.state.ended:
                    raise AssertionError(f"{job_id} ended {status} while waiting for {state}")
            time.sleep(0.05)
        raise AssertionError(f"{job_id} never reported {state}; saw {self.seen.get(job_id)}")

    def log(self, job_id: str) -> str:
        path = self.executor.log_path(job_id)
        assert path is not None, f"{self.kind} keeps no log"
        return path.read_text() if path.exists() else ""

    def log_line(self, job_id: str, prefix: str = "seen ") -> str:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            lines = [ln for ln in self.log(job_id).splitlines() if ln.startswith(prefix)]
            if lines:
                return lines[-1]
            self.poll()
            time.sleep(0.05)
        raise AssertionError(f"{job_id} wrote no {prefix!r} line: {self.log(job_id)!r}")


def local_harness(tmp_path: Path) -> Harness:
    executor = LocalExecutor(tmp_path / "logs", grace_s=2.0)

    def gone(status: JobStatus) -> None:
        assert status.native_id, "the local executor names the process group"
        assert group_members(int(status.native_id)) == ()
        assert processes_with_env("TALLY_JOB_ID", status.job_id) == []

    return Harness("local", executor, check_gone=gone)


def fake_harness(tmp_path: Path) -> Harness:
    return Harness("fake", FakeExecutor(clock=WallClock(), log_dir=tmp_path / "logs"))


def slurm_harness(tmp_path: Path, cluster: SlurmCluster) -> Harness:
    executor = SlurmExecutor(
        tmp_path / "logs", runner=SubprocessRunner(env=cluster.env), stop_timeout_s=30
    )

    def gone(status: JobStatus) -> None:
        state = cluster.run(
            "squeue", "--noheader", "--states=all", f"--jobs={status.native_id}", "--format=%T"
        ).stdout.strip()
        assert state == "CANCELLED"
        assert processes_with_env("TALLY_JOB_ID", status.job_id) == []

    return Harness("slurm", executor, check_gone=gone)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kind" in metafunc.fixturenames:
        register_marker(metafunc.config)
        metafunc.parametrize(
            "kind",
            ["local", "fake", pytest.param("slurm", marks=pytest.mark.slurm)],
        )


@pytest.fixture
def harness(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    if kind == "local":
        h = local_harness(tmp_path)
    elif kind == "fake":
        h = fake_harness(tmp_path)
    else:
        h = slurm_harness(tmp_path, request.getfixturevalue("slurm_cluster"))
    yield h
    h.executor.stop(h.executor.active(), StopReason.CANCELLED)


def unique(name: str) -> str:
    return f"{name}-{time.monotonic_ns() % 10**9}"


# ---------------------------------------------------------------------------- the contract


def test_a_job_runs_then_finishes_with_exit_0(harness: Harness) -> None:
    job_id = unique("ok")
    harness.start(job_id, Behaviour.SUCCEED)
    finished = harness.until(job_id, RunState.FINISHED)
    states = [s.state for s in harness.seen[job_id]]
    assert states == [RunState.RUNNING, RunState.FINISHED]
    assert finished.exit_code == 0
    assert job_id not in harness.executor.active()


def test_a_failing_command_fails_with_its_exit_code(harness: Harness) -> None:
    job_id = unique("fail")
    harness.start(job_id, Behaviour.FAIL)
    failed = harness.until(job_id, RunState.FAILED)
    assert failed.exit_code == 3
    assert [s.state for s in harness.seen[job_id]] == [RunState.RUNNING, RunState.FAILED]


def test_a_missing_command_fails_with_127_and_raises_nothing(harness: Harness) -> None:
    job_id = unique("missing")
    harness.start(job_id, Behaviour.MISSING)
    failed = harness.until(job_id, RunState.FAILED)
    assert failed.exit_code == 127
    assert "not found" in harness.log(job_id) or "No such file" in harness.log(job_id)


def test_stop_ends_the_job_and_its_whole_process_tree(harness: Harness) -> None:
    job_id = unique("stop")
    harness.start(job_id, Behaviour.HOLD)
    harness.until(job_id, RunState.RUNNING)
    harness.log_line(job_id)
    (stopped,) = harness.executor.stop([job_id], StopReason.CANCELLED)
    assert (stopped.job_id, stopped.state) == (job_id, RunState.STOPPED)
    assert stopped.detail.startswith("cancelled")
    harness.check_gone(stopped)
    assert job_id not in harness.executor.active()
    harness.poll()
    assert [s.state for s in harness.seen[job_id]] == [RunState.RUNNING], "poll is silent"


def test_the_job_sees_the_gpus_it_was_given(harness: Harness) -> None:
    job_id = unique("gpus")
    job = harness.start(job_id, Behaviour.HOLD, gpus=2)
    running = harness.until(job_id, RunState.RUNNING)
    line = harness.log_line(job_id)
    assert len(running.devices) == 2
    assert line == f"seen CUDA_VISIBLE_DEVICES={','.join(running.devices)} TALLY_JOB_ID={job_id}"
    if harness.kind != "slurm":  # Slurm picks the devices of a node itself
        assert running.devices == tuple(g.uuid for g in job.gpus)


def test_logs_capture_stdout_and_stderr(harness: Harness) -> None:
    job_id = unique("logs")
    harness.start(job_id, Behaviour.SUCCEED)
    harness.until(job_id, RunState.FINISHED)
    log = harness.log(job_id)
    assert f"TALLY_JOB_ID={job_id}" in log
    assert "to-stderr" in log


def test_two_concurrent_jobs_do_not_interfere(harness: Harness) -> None:
    held, quick = unique("held"), unique("quick")
    harness.start(held, Behaviour.HOLD)
    harness.start(quick, Behaviour.SUCCEED)
    harness.until(quick, RunState.FINISHED)
    held_running = harness.until(held, RunState.RUNNING)
    quick_running = harness.seen[quick][0]
    assert set(held_running.devices).isdisjoint(quick_running.devices)
    assert harness.executor.active() == (held,)
    assert f"TALLY_JOB_ID={held}" in harness.log_line(held)
    assert held not in harness.log(quick)
    (stopped,) = harness.executor.stop([held, quick], StopReason.PREEMPTED)
    assert stopped.job_id == held
    assert harness.executor.active() == ()


def test_stop_ignores_jobs_it_does_not_run(harness: Harness) -> None:
    assert harness.executor.stop(["never-started"], StopReason.CANCELLED) == ()


def test_starting_a_running_job_twice_is_refused(harness: Harness) -> None:
    job_id = unique("twice")
    harness.start(job_id, Behaviour.HOLD)
    with pytest.raises(JobAlreadyStarted):
        harness.start(job_id, Behaviour.HOLD)
