"""Queueing delay (submission → first start) out of folded job rows: per day (of the ledger's
time zone), pool and model
(`daily_queue_waits`) and observed in a window beside the jobs still waiting (`observed_waits`).
Durations and quantiles are integer µs, by nearest rank (`quantile_us`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo

from ledger.periods import local_day_start
from ledger.read.job_history.fold import JobRow, JobState

US_PER_MINUTE = 60_000_000
US_PER_HOUR = 60 * US_PER_MINUTE
DAY_US = 24 * US_PER_HOUR


def quantile_us(values: Sequence[int], pct: int) -> int:
    """The `pct` percentile of `values` by nearest rank (an observed value); 0 when empty."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, -(-pct * len(ordered) // 100))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class QueueWaitDay:
    """Queueing delays (submission → first start) of the jobs that first started on one day
    (of the ledger's zone) in one pool and GPU model."""

    day_us: int
    pool: str | None
    model: str | None
    jobs: int
    p50_us: int
    p95_us: int
    max_us: int


def daily_queue_waits(
    rows: Iterable[JobRow],
    since_us: int | None = None,
    until_us: int | None = None,
    pool: str | None = None,
    zone: tzinfo = UTC,
) -> tuple[QueueWaitDay, ...]:
    """p50 / p95 / max queueing delay per day (in `zone`) of first start, pool and model, for
    jobs that first started in `[since_us, until_us)` (None: unbounded)."""
    groups: dict[tuple[int, str | None, str | None], list[int]] = {}
    for r in rows:
        wait = r.first_wait_us
        start = r.first_started_us
        if wait is None or start is None:
            continue
        if (since_us is not None and start < since_us) or (
            until_us is not None and start >= until_us
        ):
            continue
        if pool is not None and r.pool != pool:
            continue
        groups.setdefault((local_day_start(start, zone), r.pool, r.model), []).append(wait)
    return tuple(
        QueueWaitDay(day, p, m, len(w), quantile_us(w, 50), quantile_us(w, 95), max(w))
        for (day, p, m), w in sorted(groups.items(), key=lambda kv: _group_key(kv[0]))
    )


def _group_key(key: tuple[int, str | None, str | None]) -> tuple[int, str, str]:
    return (key[0], key[1] or "", key[2] or "")


@dataclass(frozen=True, slots=True)
class ObservedWaits:
    """Observed queueing of one GPU model (and pool) in `[since_us, until_us)`.

    `started`: jobs that first started in the window, with their delay's p50, p95 and max;
    `waiting`: jobs still waiting at `until_us` that asked for the model (or were admitted to
    it before), and the longest of those waits so far.
    """

    model: str
    pool: str | None
    since_us: int
    until_us: int
    started: int
    p50_us: int
    p95_us: int
    max_us: int
    waiting: int
    longest_waiting_us: int


def observed_waits(
    rows: Iterable[JobRow], model: str, since_us: int, until_us: int, pool: str | None = None
) -> ObservedWaits:
    waits: list[int] = []
    waiting: list[int] = []
    for r in rows:
        if r.model != model or (pool is not None and r.pool != pool):
            continue
        start, wait = r.first_started_us, r.first_wait_us
        if start is not None and wait is not None and since_us <= start < until_us:
            waits.append(wait)
        if r.state is JobState.WAITING and r.since_us < until_us:
            waiting.append(until_us - r.since_us)
    return ObservedWaits(
        model,
        pool,
        since_us,
        until_us,
        len(waits),
        quantile_us(waits, 50),
        quantile_us(waits, 95),
        max(waits, default=0),
        len(waiting),
        max(waiting, default=0),
    )
