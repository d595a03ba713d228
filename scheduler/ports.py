"""The scheduler's ports: what the pure core needs from the world, as small Protocols.

Their adapters: the Kafka publisher and feeds (`scheduler.kafka`), the local executor (process
groups pinned with `CUDA_VISIBLE_DEVICES`) and the Slurm executor (`scheduler.executors`), each
with an in-memory fake beside it (`MemoryPublisher` here, `scheduler.executors.fake`) and one
contract suite run against both.

The executor port (adapters in `scheduler.executors`) owns its vocabulary here: `Work` (what a
job runs), `StopReason` (why it is told to stop), `RunState` and `JobStatus` (what it reports).
Its contract:
- `start` after the job's `GpuAssigned` events are applied; it never raises for a job that
  cannot launch (a missing command, a batch script Slurm refuses): that job is reported
  `FAILED` by the next `poll`. It raises `ExecutorError` (`scheduler.executors.errors`) only
  for what is wrong with the executor or the caller: the backend is unreachable, the job is
  already started there;
- `stop` returns only once every process of those jobs has ended, so their GPUs may be handed
  to another job (a cycle that preempts emits the victims' `GpuReleased` before the
  preemptor's `GpuAssigned`); it returns each job's last status — `STOPPED`, or how it ended
  on its own if it ended first — and ignores jobs it does not run;
- `poll` reports every change of state once, in order, as `JobStatus` values: `RUNNING` once
  per run (before its end, even if the run was too short to be seen running), then one ended
  state — or `FAILED` alone for a run that never launched; a job is forgotten after its ended
  status (its log stays). A job stopped by `stop` is never reported by `poll`;
- every decision stays in the pure core: `scheduler.executors.bridge` turns statuses into
  `jobs` events (finish, fail, retry) and decisions into `start`/`stop` calls.

The publisher port (`Publisher`; adapters `scheduler.kafka.KafkaPublisher` and the in-memory
`MemoryPublisher`, below) sends `jobs` messages (`scheduler.jobs_topic`) in order and
returns once the broker acknowledged every one, with where each landed — or `Refused`, for a
message the broker refused for its content (too large, corrupt: sending it again cannot
succeed), while the others are still sent; when the broker cannot be reached, it raises
`BrokerUnavailable` and the caller sends them all again. A message sent twice is harmless: a
replay skips a repeated `tally-seq`, the ledger drops a repeated event id.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from ledger.holds import HoldEvent
from ledger.job_events import JobEvent
from scheduler.errors import BrokerUnavailable
from scheduler.executors.errors import InvalidWork
from scheduler.jobs_topic import Outgoing
from scheduler.model import Balance, RunningJob


class Clock(Protocol):
    def now_us(self) -> int: ...


class EventSink(Protocol):
    """Publishes decisions on the `jobs` topic, keyed by job id or GPU UUID."""

    def publish(self, events: Sequence[JobEvent]) -> None: ...


class BalanceFeed(Protocol):
    """The latest balance per team, from the compacted `balances` topic."""

    def balances(self) -> Mapping[str, Balance]: ...


class UsageFeed(Protocol):
    """Metered GPU-ms per team since the last call, from the ledger (for fair share)."""

    def metered_since_last(self) -> Mapping[str, int]: ...


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = frozenset(("CUDA_VISIBLE_DEVICES", "TALLY_JOB_ID", "TALLY_ATTEMPT"))


@dataclass(frozen=True, slots=True)
class Work:
    """What a job runs: exactly one of `command` (an argv) or `script` (a batch script that
    starts with `#!`), extra environment variables, and a working directory.

    Every executor accepts both forms: the local executor runs a script from a file, Slurm
    wraps a command in a two-line script. The executor sets `CUDA_VISIBLE_DEVICES`,
    `TALLY_JOB_ID` and `TALLY_ATTEMPT`; `env` may not set them.
    """

    command: tuple[str, ...] = ()
    script: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    def __post_init__(self) -> None:
        if bool(self.command) == (self.script is not None):
            raise InvalidWork("work: give exactly one of a command or a script")
        if self.command and not self.command[0]:
            raise InvalidWork("work: a command needs a program")
        if self.script is not None and not self.script.startswith("#!"):
            raise InvalidWork("work: a script must start with #! and its interpreter")
        for name, value in self.env:
            if not ENV_NAME.fullmatch(name) or name in RESERVED_ENV:
                raise InvalidWork(f"work: {name!r} is not an environment variable a job may set")
            if "\0" in value:
                raise InvalidWork(f"work: the value of {name} contains a NUL byte")
        if len({name for name, _ in self.env}) != len(self.env):
            raise InvalidWork("work: an environment variable is set twice")


class StopReason(StrEnum):
    """Why an executor is told to stop a job. Only `PREEMPTED` jobs come back: Slurm requeues
    and holds them, so a later `start` releases the same Slurm job."""

    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    CANCELLED = "cancelled"
    MAX_RUNTIME = "max_runtime"


class RunState(StrEnum):
    """What an executor last saw of a job."""

    PENDING = "pending"  # accepted, not running yet (a Slurm queue); never reported by poll
    RUNNING = "running"
    FINISHED = "finished"  # its main process exited 0
    FAILED = "failed"  # exited non-zero or by a signal no stop sent, or could not launch
    TIMED_OUT = "timed_out"  # the backend's own runtime limit ended it (Slurm --time)
    CANCELLED = "cancelled"  # someone outside Tally ended it (scancel by hand)
    LOST = "lost"  # its node failed, it vanished, or the backend requeued or preempted it
    STOPPED = "stopped"  # ended by `stop`

    @property
    def ended(self) -> bool:
        return self not in (RunState.PENDING, RunState.RUNNING)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One observed change of a job's state.

    `exit_code`: for an ended job, its exit status, 128 + N when signal N ended it, None when
    it never launched or the backend does not say. `devices`: for `RUNNING`, the
    `CUDA_VISIBLE_DEVICES` entries the job was given (what Slurm chose, for Slurm).
    `native_id`: the process id or Slurm job id. `slurm_job_id`: the Slurm job id, from the
    Slurm executor only (published with `JobStarted`, so a process's `SLURM_JOB_ID` names the
    Tally job and a restarted executor finds its Slurm jobs again).
    """

    job_id: str
    state: RunState
    time_us: int
    exit_code: int | None = None
    devices: tuple[str, ...] = ()
    native_id: str = ""
    detail: str = ""
    slurm_job_id: str | None = None


class Executor(Protocol):
    """Runs jobs on the GPUs the scheduler gave them; see the module's contract."""

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        """Launch `job` (one run of it). `time_limit_us` is the backend's own backstop, where
        it has one (Slurm `--time`); the core stops overdue jobs itself."""
        ...

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        """End these jobs (all at once, one grace period) and return their last statuses."""
        ...

    def poll(self) -> tuple[JobStatus, ...]:
        """Changes of state since the last poll, in order."""
        ...

    def active(self) -> tuple[str, ...]:
        """The jobs started here that have not ended (and, for Slurm, are not parked)."""
        ...

    def log_path(self, job_id: str) -> Path | None:
        """Where the job's stdout and stderr go (None: this executor keeps no log)."""
        ...


@runtime_checkable
class RebuildsFromTopic(Protocol):
    """An executor that rebuilds what it knows of earlier runs from the replayed `jobs`
    events (Slurm: its job → Slurm id map), before `Dispatcher.recover` asks what it runs."""

    def rebuild(self, events: Iterable[object]) -> int:
        """Take back the runs `events` (job events in topic order) show; how many it took."""
        ...


@runtime_checkable
class StartsConcurrently(Protocol):
    """An executor whose `start` may run in several threads at once (for different jobs):
    an enactment starts up to `concurrent_starts` jobs at a time (`scheduler.enactment`)."""

    concurrent_starts: int


@runtime_checkable
class PollsCheaply(Protocol):
    """An executor whose `poll` makes no remote call (the local executor: each run's process
    is asked): an enactment polls it right after its starts, in its thread, so a start is
    reported (`JobStarted`) in the publishing round after the enactment, not at the next
    tick."""

    polls_cheaply: bool


@runtime_checkable
class KnowsProcessGroups(Protocol):
    """An executor whose runs are process groups on this machine (the local executor): the
    groups an enactment started are recorded (`scheduler.work_store.RunFiles`) once its starts
    are made, before it ends and before any poll can report them."""

    def pgid(self, job_id: str) -> int | None:
        """The process group of the job's run, None if it runs no more."""
        ...


class SchedulerObserver(Protocol):
    """What the service reports for monitoring (`tally.metrics` implements it); never part of a
    decision. Counts are per decision applied (not per publication), so a decision that waits
    for the broker is counted once, when it is made; a replay counts nothing."""

    def scheduler_queue_length(self, queue: str, length: int) -> None:
        """Jobs pending in `queue` now (every configured queue is reported, empty ones as 0)."""
        ...

    def admitted(self, queue: str, count: int) -> None:
        """`count` more jobs of `queue` were admitted."""
        ...

    def preempted(self, queue: str, count: int) -> None:
        """`count` more running jobs of `queue` were preempted (reclaims are not preemptions)."""
        ...

    def scheduler_undeliverable(self, count: int) -> None:
        """`count` more `jobs` messages were refused by the broker for their content."""
        ...


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker refused a message for its content (too large, corrupt): sending it again
    cannot succeed. `reason` is the broker's (or the client's), bounded."""

    reason: str


Placement = tuple[int, int] | Refused  # (partition, offset) where a message landed, or Refused


class Publisher(Protocol):
    """Publishes the scheduler's `jobs` messages; see the module's contract."""

    async def publish(self, messages: Sequence[Outgoing]) -> list[Placement]:
        """Send in order and wait for every acknowledgement; where each landed, or `Refused`."""
        ...


class AlertPublisher(Protocol):
    """Publishes the scheduler's job alerts ((key, value) messages) on the alerts topic."""

    async def publish_alerts(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Send and wait for every acknowledgement; raises `BrokerUnavailable` if not."""
        ...


class MemoryPublisher:
    """The `Publisher`'s in-memory fake (tests, and a service run without a broker): keeps
    every message it acknowledged, in order, all in partition 0 at offsets 0, 1, 2, …;
    `fail_next` makes that many next calls raise `BrokerUnavailable` and keep nothing; a
    message for which `refuse` gives a reason is `Refused` with it, as a broker refuses one
    for its content (too large, corrupt); `offered` counts what each message was sent, by seq."""

    def __init__(
        self, partitions: int = 1, refuse: Callable[[Outgoing], str | None] | None = None
    ) -> None:
        self.messages: list[Outgoing] = []
        self.alert_messages: list[tuple[bytes, bytes]] = []
        self.admin_messages: list[tuple[bytes, bytes]] = []
        self.partitions = partitions
        self.refuse = refuse
        self.offered: Counter[int] = Counter()
        self.fail_next = 0

    async def publish(self, messages: Sequence[Outgoing]) -> list[Placement]:
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerUnavailable("the test broker is down")
        out: list[Placement] = []
        for m in messages:
            self.offered[m.seq] += 1
            reason = None if self.refuse is None else self.refuse(m)
            if reason is not None:
                out.append(Refused(reason))
                continue
            out.append((0, len(self.messages)))
            self.messages.append(m)
        return out

    async def publish_alerts(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerUnavailable("the test broker is down")
        self.alert_messages.extend(messages)

    async def publish_admin(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerUnavailable("the test broker is down")
        self.admin_messages.extend(messages)

    def events(self) -> list[JobEvent | HoldEvent]:
        return [m.event for m in self.messages]
