"""`ShardsSealedThrough`: the cross-shard fact a sharded ledger's global shard folds
(`docs/design/several-workers.md`, "Cross-shard facts are events"). Its owner reads the shard
heads, publishes what it read on the `admin` topic as this event, and folds the event like any
other, so the global shard's archive holds every input its settlements and allowances came from
and `rebuild` reproduces them.

- `through_us`: the watermark, the minimum over the samples shards of their newest sealed usage
  time (the end of the newest usage interval a shard's head lists), in microseconds like every
  time of the ledger;
- `jobs`: per (job, unit) the union's usage up to the watermark (the net of its consumer
  postings, usage and reversals, whose interval ends at or before it), for the jobs whose holds
  the global shard settles;
- `teams`: per (team, unit, period) the same for the team's consumer accounts, what recurring
  budgets with carry-over or a quarterly cadence read as the team's spending;
- `covers`: the jobs whose usage `jobs` gives (a job of them with no line used nothing); a
  global shard settles only the holds of these jobs from the event, so a hold it learns of
  after the event was computed (its jobs topic read behind the admin topic) waits for the next
  event rather than being settled with no usage. None (an event from before the field, or one
  asked for every job): every job.

Amounts are integers in the ledger's units (GPU-ms, money micro-units); only budget units. The
event began at schema v1 (no v0 upcaster). `role`: only the ledger makes one (None); the
codec's field readers for the usage lines live here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ledger.admin.kinds import AdminKind
from ledger.errors import EventError
from ledger.periods import Period
from ledger.roles import Role
from ledger.units import Unit

SEALED_ENTITY = "shards"  # the event's key on the admin topic
MAX_USAGE_LINES = 100_000
_MAX = 1 << 62
_JOB = re.compile(r"^\S{1,256}$")
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_BUDGET_UNITS = (Unit.MONEY.value, Unit.GPU_MS.value)


@dataclass(frozen=True, slots=True)
class JobUsage:
    """A job's usage of `unit` in the union up to the watermark."""

    job_id: str
    unit: Unit
    amount: int


@dataclass(frozen=True, slots=True)
class TeamUsage:
    """A team's usage of `unit` booked into `period` in the union up to the watermark."""

    team: str
    unit: Unit
    period: str
    amount: int


@dataclass(frozen=True, slots=True)
class ShardsSealedThrough:
    """Every samples shard has sealed usage through `through_us`; `jobs` and `teams` are the
    union's usage up to it (module docstring). `shards`: the shards it was read from."""

    KIND: ClassVar[AdminKind] = AdminKind.SHARDS_SEALED_THROUGH
    through_us: int
    shards: tuple[str, ...]
    jobs: tuple[JobUsage, ...]
    teams: tuple[TeamUsage, ...]
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None
    covers: tuple[str, ...] | None = None

    @property
    def entity(self) -> str:
        return SEALED_ENTITY

    def covered(self) -> frozenset[str] | None:
        """The jobs whose usage the event gives (None: every job)."""
        return None if self.covers is None else frozenset(self.covers)

    def job_usage(self) -> dict[tuple[str, Unit], int]:
        return {(u.job_id, u.unit): u.amount for u in self.jobs}

    def team_usage(self) -> dict[tuple[str, Unit, str], int]:
        return {(u.team, u.unit, u.period): u.amount for u in self.teams}


def usage_lines_to_data(event: ShardsSealedThrough) -> dict[str, Any]:
    """The JSON form of the usage lines: arrays of [job, unit, amount] and
    [team, unit, period, amount] (compact: the event may name many jobs), and `covers` as an
    array of job ids when set (absent when None, so an event without it encodes, and is
    identified, as before)."""
    out: dict[str, Any] = {
        "jobs": [[u.job_id, u.unit.value, u.amount] for u in event.jobs],
        "teams": [[u.team, u.unit.value, u.period, u.amount] for u in event.teams],
    }
    if event.covers is not None:
        out["covers"] = list(event.covers)
    return out


def _lines(name: str, value: Any, width: int) -> list[list[Any]]:
    if type(value) is not list:
        raise EventError(f"{name}: expected an array")
    if len(value) > MAX_USAGE_LINES:
        raise EventError(f"{name}: more than {MAX_USAGE_LINES} lines")
    for index, line in enumerate(value):
        if type(line) is not list or len(line) != width:
            raise EventError(f"{name}[{index}]: expected an array of {width} items")
    return value


def _unit(name: str, value: Any) -> Unit:
    if type(value) is not str or value not in _BUDGET_UNITS:
        raise EventError(f"{name}: a usage line is in {' or '.join(_BUDGET_UNITS)}")
    return Unit(value)


def _amount(name: str, value: Any) -> int:
    if type(value) is not int or not -_MAX <= value <= _MAX:
        raise EventError(f"{name}: expected an integer in [-{_MAX}, {_MAX}]")
    return value


def _matching(name: str, value: Any, pattern: re.Pattern[str]) -> str:
    if type(value) is not str or not pattern.match(value):
        raise EventError(f"{name}: not a valid name")
    return value


def read_job_usage(name: str, value: Any) -> tuple[JobUsage, ...]:
    """The codec's reader of `jobs`; raises EventError."""
    out = tuple(
        JobUsage(
            _matching(f"{name}[{i}]", job, _JOB),
            _unit(f"{name}[{i}]", unit),
            _amount(f"{name}[{i}]", amount),
        )
        for i, (job, unit, amount) in enumerate(_lines(name, value, 3))
    )
    if len({(u.job_id, u.unit) for u in out}) != len(out):
        raise EventError(f"{name}: a (job, unit) named twice")
    return out


def read_team_usage(name: str, value: Any) -> tuple[TeamUsage, ...]:
    """The codec's reader of `teams`; raises EventError."""
    out: list[TeamUsage] = []
    for i, (team, unit, period, amount) in enumerate(_lines(name, value, 4)):
        if type(period) is not str:
            raise EventError(f"{name}[{i}]: expected a month such as 2026-11")
        try:
            label = Period.month(period).label
        except ValueError as exc:
            raise EventError(f"{name}[{i}]: {exc}") from exc
        out.append(
            TeamUsage(
                _matching(f"{name}[{i}]", team, _TEAM),
                _unit(f"{name}[{i}]", unit),
                label,
                _amount(f"{name}[{i}]", amount),
            )
        )
    if len({(u.team, u.unit, u.period) for u in out}) != len(out):
        raise EventError(f"{name}: a (team, unit, period) named twice")
    return tuple(out)


def read_covers(name: str, value: Any) -> tuple[str, ...]:
    """The codec's reader of `covers` (job ids, each once); raises EventError."""
    if type(value) is not list or len(value) > MAX_USAGE_LINES:
        raise EventError(f"{name}: expected an array of at most {MAX_USAGE_LINES} job ids")
    out = tuple(_matching(f"{name}[{i}]", job, _JOB) for i, job in enumerate(value))
    if len(set(out)) != len(out):
        raise EventError(f"{name}: a job named twice")
    return out


def read_shard_names(name: str, value: Any) -> tuple[str, ...]:
    """The codec's reader of `shards`; raises EventError."""
    if type(value) is not list or len(value) > 10_000:
        raise EventError(f"{name}: expected an array of shard names")
    return tuple(_matching(name, v, _TEAM) for v in value)
