"""Metered usage for fair share, as the scheduler is fed it: each team's consumer GPU time in
the sealed ledger, summed per hour it ended in (`tally whatif` starts a replay's fair share
from it; the Team page's standing reads the same figures).

Whole hours come from the segments' metered rollups (`ledger.store.rollup_files.METERED`:
consumer GPU time per team and UTC hour it ended in, so a group's `end_us` has the hour of
every posting in it); the part of the hour `before_us` cuts comes from the postings of the
segments that can hold it.
"""

from __future__ import annotations

from ledger.read.reports import CONSUMER_SQL, ReportQueries

HOUR_US = 3_600_000_000


def team_hour_usage(q: ReportQueries, before_us: int) -> list[tuple[str, int, int]]:
    """(team, UTC hour number, consumer GPU-ms) per team and hour its usage ended in, of the
    postings that ended by `before_us`, ordered by hour, then team."""
    hour = f"(end_us - 1) // {HOUR_US}"
    cut = before_us // HOUR_US * HOUR_US
    rows = q.rows(
        f"SELECT team, {hour} AS hour, sum(amount) FROM {{metered}} "
        f"WHERE ({hour} + 1) * {HOUR_US} <= ? GROUP BY ALL ORDER BY hour, team",
        [cut],
    )
    if cut < before_us:  # one hour, after every whole one
        rows += q.rows(
            f"SELECT team, {hour} AS hour, sum(amount) FROM {{postings}} "
            f"WHERE {CONSUMER_SQL} AND unit = 'gpu_ms' AND team IS NOT NULL "
            "AND end_us > ? AND end_us <= ? GROUP BY ALL ORDER BY team",
            [cut, before_us],
            (cut, before_us + 1),
        )
    return [(str(team), int(number), int(amount)) for team, number, amount in rows]


def hourly_team_usage(q: ReportQueries, before_us: int) -> tuple[tuple[str, int, int], ...]:
    """(team, GPU-ms, end of the hour µs) per team and hour of usage ending by `before_us`, in
    time order; an hour cut by `before_us` ends there."""
    return tuple(
        (team, amount, min(before_us, (hour + 1) * HOUR_US))
        for team, hour, amount in team_hour_usage(q, before_us)
        if amount > 0
    )
