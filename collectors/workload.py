"""The simulated cluster's workload: which jobs the example teams submit, and when.

Pure generation: a seed, the teams (with the pool each may run on), the workload mix and a rate
in; a submit schedule out. The same seed and window always give the same jobs, so the history
backfill (`tally.history`) and the live submitter (`tally.workload_runner`) agree, and any
hour of the schedule can be generated on its own.

Shape (the current workload mix, not a copied trace):
- arrivals follow a working week: busiest mid-afternoon UTC, quiet at night, weekends at a
  third (`ARRIVAL_SHAPE_PCT` × `WEEKDAY_PCT`); `jobs_per_hour` is the weekday-afternoon rate;
- jobs in flight when a stack starts (`in_flight`) are the live submitter's, the rest of the
  past the history's;
- a job's team is drawn in proportion to its quota (`TeamPool.max_gpus`), and asks for at
  most that many GPUs;
- a job's kind is drawn from the mix (`training`, `inference`, `notebook`; `unallocated` is
  capacity nobody asks for and so never drawn): training goes to the `training` queue with
  1, 2 or 4 GPUs for 1–6 hours, inference to `inference` with 1–2 GPUs for 2–8 hours, a
  notebook to `dev` with one GPU for 30 minutes to 3 hours and no work at all (the simulated
  collector meters it at ~0 % utilisation, so idle reclaim stops it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from collectors.simulated import HOUR_US, TeamSpec
from collectors.simulated import mix64 as _mix

MINUTE_US = 60_000_000
DAY_US = 24 * HOUR_US

# Arrival rate per UTC hour of day, % of the peak.
ARRIVAL_SHAPE_PCT = (
    *(20, 15, 10, 10, 10, 15, 25, 40),  # 00–07
    *(60, 80, 90, 95, 90, 95, 100, 100),  # 08–15
    *(95, 85, 70, 55, 45, 35, 30, 25),  # 16–23
)
WEEKDAY_PCT = (100, 100, 100, 100, 100, 35, 30)  # Monday … Sunday


class JobKind(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"


QUEUE_OF = {JobKind.TRAINING: "training", JobKind.INFERENCE: "inference", JobKind.NOTEBOOK: "dev"}
_GPUS = {JobKind.TRAINING: (1, 1, 2, 2, 4), JobKind.INFERENCE: (1, 1, 2), JobKind.NOTEBOOK: (1,)}
_RUNTIME_MIN = {  # [low, high) minutes
    JobKind.TRAINING: (60, 360),
    JobKind.INFERENCE: (120, 480),
    JobKind.NOTEBOOK: (30, 180),
}


@dataclass(frozen=True, slots=True)
class TeamPool:
    """Where a team's jobs run: its pool and the GPU model there (where it has a quota), and
    the most GPUs one of its jobs asks for (its quota there: a gang larger than the quota
    could wait for ever)."""

    team: TeamSpec
    pool: str
    model: str
    max_gpus: int = 8


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One submission of the schedule. `key` is unique and stable (the idempotency key of the
    live submission, the job id in the history); an `idle` job holds its GPUs and does no work
    (a forgotten notebook)."""

    key: str
    submit_us: int
    kind: JobKind
    team: str
    project: str
    user: str
    queue: str
    gpus: int
    pool: str
    model: str
    runtime_us: int
    idle: bool


def arrival_pct(hour_start_us: int) -> int:
    """The arrival rate of the hour starting at `hour_start_us`, in % of the peak."""
    day = (hour_start_us // DAY_US + 3) % 7  # 1970-01-01 was a Thursday
    return ARRIVAL_SHAPE_PCT[hour_start_us % DAY_US // HOUR_US] * WEEKDAY_PCT[day] // 100


def _kind(h: int, mix: Sequence[tuple[JobKind, int]]) -> JobKind:
    total = sum(w for _, w in mix)
    pick = h % total
    for kind, weight in mix:
        if pick < weight:
            return kind
        pick -= weight
    return mix[-1][0]


def _team(h: int, teams: Sequence[TeamPool]) -> TeamPool:
    """A team drawn in proportion to its quota, so each team's queue is as loaded as the
    others'."""
    pick = h % sum(t.max_gpus for t in teams)
    for where in teams:
        if pick < where.max_gpus:
            return where
        pick -= where.max_gpus
    return teams[-1]


def hour_jobs(
    seed: int,
    teams: Sequence[TeamPool],
    mix: Sequence[tuple[JobKind, int]],
    jobs_per_hour: int,
    hour_start_us: int,
) -> list[PlannedJob]:
    """The jobs submitted in the hour starting at `hour_start_us` (a multiple of an hour)."""
    if hour_start_us % HOUR_US:
        raise ValueError("an hour starts on the hour")
    mix = [(k, w) for k, w in mix if w > 0]
    if not teams or not mix or jobs_per_hour <= 0:
        return []
    hour = hour_start_us // HOUR_US
    expected_pct = jobs_per_hour * arrival_pct(hour_start_us)  # jobs × 100
    count = expected_pct // 100 + (1 if _mix(seed, hour, 0) % 100 < expected_pct % 100 else 0)
    jobs = []
    for n in range(count):
        h = _mix(seed, hour, n + 1)
        kind = _kind(h, mix)
        where = _team(_mix(h, 1), teams)
        team = where.team
        users = team.users or (f"{team.name}-user",)
        low, high = _RUNTIME_MIN[kind]
        runtime = (low + _mix(h, 2) % (high - low)) * MINUTE_US
        gpus = max(1, min(where.max_gpus, _GPUS[kind][_mix(h, 3) % len(_GPUS[kind])]))
        jobs.append(
            PlannedJob(
                key=f"sim-{seed}-{hour}-{n}",
                submit_us=hour_start_us + _mix(h, 5) % HOUR_US,
                kind=kind,
                team=team.name,
                project=team.projects[_mix(h, 6) % len(team.projects)],
                user=users[_mix(h, 7) % len(users)],
                queue=QUEUE_OF[kind],
                gpus=gpus,
                pool=where.pool,
                model=where.model,
                runtime_us=runtime,
                idle=kind is JobKind.NOTEBOOK,
            )
        )
    return sorted(jobs, key=lambda j: (j.submit_us, j.key))


def submit_schedule(
    seed: int,
    teams: Sequence[TeamPool],
    mix: Sequence[tuple[JobKind, int]],
    jobs_per_hour: int,
    start_us: int,
    end_us: int,
) -> list[PlannedJob]:
    """Every job submitted in [start_us, end_us), in submission order."""
    jobs: list[PlannedJob] = []
    hour = start_us - start_us % HOUR_US
    while hour < end_us:
        jobs.extend(
            j
            for j in hour_jobs(seed, teams, mix, jobs_per_hour, hour)
            if start_us <= j.submit_us < end_us
        )
        hour += HOUR_US
    return jobs


def in_flight(jobs: Sequence[PlannedJob], now_us: int) -> list[PlannedJob]:
    """The jobs of `jobs` submitted before `now_us` that would still be running then. The
    history leaves them out and the live submitter submits them at start with what is left of
    their runtime, so a stack that starts is as busy as its schedule says."""
    return [j for j in jobs if j.submit_us < now_us < j.submit_us + j.runtime_us]


def kind_of_queue(queue: str, kinds: Mapping[str, JobKind] | None = None) -> JobKind:
    """The utilisation profile of a job from its queue (the collector sees only the queue):
    `dev` runs notebooks, `inference` serves, anything else trains."""
    named = kinds if kinds is not None else {q: k for k, q in QUEUE_OF.items()}
    return named.get(queue, JobKind.TRAINING)
