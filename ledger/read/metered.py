"""Metered usage for fair share, as the scheduler is fed it: each team's consumer GPU time in
the sealed ledger, summed per hour it ended in (`tally whatif` starts a replay's fair share
from it; the Team page's standing reads the same postings)."""

from __future__ import annotations

from ledger.read.reports import CONSUMER_SQL, ReportQueries

HOUR_US = 3_600_000_000


def hourly_team_usage(q: ReportQueries, before_us: int) -> tuple[tuple[str, int, int], ...]:
    """(team, GPU-ms, end of the hour µs) per team and hour of usage ending by `before_us`, in
    time order; an hour cut by `before_us` ends there."""
    rows = q.rows(
        f"SELECT team, (end_us - 1) // {HOUR_US} AS hour, sum(amount) FROM {{postings}} "
        f"WHERE {CONSUMER_SQL} AND unit = 'gpu_ms' AND team IS NOT NULL AND end_us <= ? "
        "GROUP BY ALL ORDER BY hour, team",
        [before_us],
    )
    return tuple(
        (str(team), int(amount), min(before_us, (int(hour) + 1) * HOUR_US))
        for team, hour, amount in rows
        if int(amount) > 0
    )
