"""The fake executor: in memory, deterministic, with scripted outcomes — for scheduler tests and
simulations that need an executor without processes.

Each run of a job follows an `Outcome` counted in polls: `pending_polls` polls pending, then
one `RUNNING` status, then `running_polls` more polls before it ends (0: it ends in the poll
that sees it start); `exit_code=None` runs until stopped. Outcomes are scripted per job id, one
per run (the last repeats), with a default for unscripted jobs. Every status carries the fake
clock's time. The fake records what it was told (`starts`, `stops`) for tests to assert on.
When given a log directory it writes each run's `output` to the job's log, with `$NAME` and
`${NAME}` replaced from the environment the job would have had (`CUDA_VISIBLE_DEVICES`,
`TALLY_JOB_ID`, `TALLY_ATTEMPT`, `Work.env`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from scheduler.executors.errors import JobAlreadyStarted
from scheduler.executors.launch import job_environment, log_file, visible_devices
from scheduler.model import RunningJob
from scheduler.ports import Clock, Executor, JobStatus, RunState, StopReason, Work


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one run of a fake job goes.

    `end`: the ended state (default: FINISHED for exit 0, FAILED otherwise). `launch_error`:
    the run cannot launch, reported FAILED with exit 127 at the first poll.
    """

    exit_code: int | None = 0
    end: RunState | None = None
    pending_polls: int = 0
    running_polls: int = 1
    output: str = ""
    launch_error: str | None = None

    @property
    def ended_state(self) -> RunState:
        if self.end is not None:
            return self.end
        return RunState.FINISHED if self.exit_code == 0 else RunState.FAILED


RUNS_FOREVER = Outcome(exit_code=None)


class ManualClock:
    """A clock that moves only when told."""

    def __init__(self, now_us: int = 0) -> None:
        self.now = now_us

    def now_us(self) -> int:
        return self.now

    def advance(self, us: int) -> None:
        self.now += us


@dataclass(slots=True)
class _Run:
    job: RunningJob
    outcome: Outcome
    devices: tuple[str, ...]
    env: dict[str, str]
    polls: int = 0
    running: bool = False


@dataclass(frozen=True, slots=True)
class Started:
    job_id: str
    attempt: int
    devices: tuple[str, ...]
    work: Work
    time_limit_us: int | None


class FakeExecutor:
    """Scripted, in-memory executor; see the module."""

    def __init__(
        self,
        outcomes: Mapping[str, Sequence[Outcome]] | None = None,
        *,
        default: Outcome = Outcome(),
        clock: Clock | None = None,
        log_dir: Path | None = None,
        device_ids: Mapping[str, str] | None = None,
    ) -> None:
        self.outcomes = {job_id: list(o) for job_id, o in (outcomes or {}).items()}
        self.default = default
        self.clock: Clock = clock or ManualClock()
        self.log_dir = log_dir
        self.device_ids = dict(device_ids or {})
        self.starts: list[Started] = []
        self.stops: list[tuple[str, StopReason]] = []
        self._runs: dict[str, _Run] = {}
        self._count: dict[str, int] = {}

    def script(self, job_id: str, *outcomes: Outcome) -> None:
        """The outcomes of the job's next runs, in order (the last one repeats)."""
        self.outcomes[job_id] = list(outcomes)
        self._count.pop(job_id, None)

    def _next_outcome(self, job_id: str) -> Outcome:
        scripted: Sequence[Outcome] = self.outcomes.get(job_id, ())
        n = self._count.get(job_id, 0)
        self._count[job_id] = n + 1
        if not scripted:
            return self.default
        return scripted[min(n, len(scripted) - 1)]

    # ------------------------------------------------------------------ the port

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        if job.job_id in self._runs:
            raise JobAlreadyStarted(f"job {job.job_id} is already running here")
        devices = visible_devices(job, self.device_ids)
        self.starts.append(Started(job.job_id, job.attempt, devices, work, time_limit_us))
        env = job_environment(job, work, devices, {})
        self._runs[job.job_id] = _Run(job, self._next_outcome(job.job_id), devices, env)

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        statuses = []
        for job_id in dict.fromkeys(job_ids):
            run = self._runs.pop(job_id, None)
            if run is None:
                continue
            self.stops.append((job_id, reason))
            statuses.append(
                JobStatus(
                    job_id,
                    RunState.STOPPED,
                    self.clock.now_us(),
                    128 + 15,
                    run.devices,
                    f"fake-{job_id}",
                    f"{reason.value}: stopped",
                )
            )
        return tuple(statuses)

    def poll(self) -> tuple[JobStatus, ...]:
        now = self.clock.now_us()
        out: list[JobStatus] = []
        for job_id, run in list(self._runs.items()):
            run.polls += 1
            outcome = run.outcome
            native = f"fake-{job_id}"
            if outcome.launch_error is not None:
                del self._runs[job_id]
                self._write_log(run, f"tally: cannot start: {outcome.launch_error}\n")
                out.append(
                    JobStatus(job_id, RunState.FAILED, now, 127, (), native, outcome.launch_error)
                )
                continue
            if run.polls <= outcome.pending_polls:
                continue
            if not run.running:
                run.running = True
                self._write_log(run, Template(outcome.output).safe_substitute(run.env))
                out.append(JobStatus(job_id, RunState.RUNNING, now, None, run.devices, native))
            ran = run.polls - outcome.pending_polls - 1
            if outcome.exit_code is not None and ran >= outcome.running_polls:
                del self._runs[job_id]
                out.append(
                    JobStatus(job_id, outcome.ended_state, now, outcome.exit_code, (), native)
                )
        return tuple(out)

    def active(self) -> tuple[str, ...]:
        return tuple(self._runs)

    def log_path(self, job_id: str) -> Path | None:
        return None if self.log_dir is None else log_file(self.log_dir, job_id)

    def _write_log(self, run: _Run, text: str) -> None:
        path = self.log_path(run.job.job_id)
        if path is not None and text:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as log:
                log.write(text)


if TYPE_CHECKING:
    _conforms: Executor = FakeExecutor()
