"""Metered usage for fair share, as the scheduler is fed it: each team's consumer GPU time in
the sealed ledger, summed per hour it ended in (`tally whatif` starts a replay's fair share
from it; the Team page's standing reads the same figures).

Whole hours come from the segments' metered rollups (`ledger.store.rollup_files.METERED`:
consumer GPU time per team and UTC hour it ended in, so a group's `end_us` has the hour of
every posting in it); the part of the hour `before_us` cuts comes from the postings of the
segments that can hold it. `team_hour_columns` returns the same rows as columns (numpy arrays),
for folds over every team-hour of the ledger (the Team page's fair share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ledger.read.reports import CONSUMER_SQL, ReportQueries

HOUR_US = 3_600_000_000


_HOUR = f"(end_us - 1) // {HOUR_US}"
# the whole hours, from the metered rollups
_WHOLE_SQL = (
    f"SELECT team, {_HOUR} AS hour, CAST(sum(amount) AS BIGINT) AS gpu_ms FROM {{metered}} "
    f"WHERE ({_HOUR} + 1) * {HOUR_US} <= ? GROUP BY ALL ORDER BY hour, team"
)
# the hour `before_us` cuts, from the postings that can hold it
_CUT_SQL = (
    f"SELECT team, {_HOUR} AS hour, CAST(sum(amount) AS BIGINT) FROM {{postings}} "
    f"WHERE {CONSUMER_SQL} AND unit = 'gpu_ms' AND team IS NOT NULL "
    "AND end_us > ? AND end_us <= ? GROUP BY ALL ORDER BY team"
)


def _cut_rows(q: ReportQueries, before_us: int) -> list[tuple[str, int, int]]:
    """The rows of the hour `before_us` cuts (none when it ends a whole hour)."""
    cut = before_us // HOUR_US * HOUR_US
    if cut == before_us:
        return []
    rows = q.rows(_CUT_SQL, [cut, before_us], (cut, before_us + 1))
    return [(str(team), int(number), int(amount)) for team, number, amount in rows]


def team_hour_usage(q: ReportQueries, before_us: int) -> list[tuple[str, int, int]]:
    """(team, UTC hour number, consumer GPU-ms) per team and hour its usage ended in, of the
    postings that ended by `before_us`, ordered by hour, then team."""
    rows = q.rows(_WHOLE_SQL, [before_us // HOUR_US * HOUR_US])
    whole = [(str(team), int(number), int(amount)) for team, number, amount in rows]
    return whole + _cut_rows(q, before_us)  # the cut hour after every whole one


@dataclass(frozen=True, slots=True)
class TeamHours:
    """`team_hour_usage`'s rows as columns, in its order: each row's team (an index into
    `teams`), UTC hour number and consumer GPU-ms."""

    teams: tuple[str, ...]
    team: npt.NDArray[np.intp]
    hour: npt.NDArray[np.int64]
    gpu_ms: npt.NDArray[np.int64]


def team_hour_columns(q: ReportQueries, before_us: int) -> TeamHours:
    """`team_hour_usage(q, before_us)` as columns (read as Arrow, not as Python tuples)."""
    whole = q.arrow(_WHOLE_SQL, [before_us // HOUR_US * HOUR_US])
    cut = _cut_rows(q, before_us)
    names = pa.chunked_array(
        [
            *whole.column("team").cast(pa.string()).chunks,
            pa.array([t for t, _, _ in cut], pa.string()),
        ],
        pa.string(),
    ).combine_chunks()
    encoded = pc.dictionary_encode(names)

    def ints(column: str, extra: list[int]) -> npt.NDArray[np.int64]:
        head = whole.column(column).to_numpy().astype(np.int64)
        return np.concatenate([head, np.array(extra, dtype=np.int64)])

    return TeamHours(
        tuple(str(t) for t in encoded.dictionary.to_pylist()),
        encoded.indices.to_numpy(zero_copy_only=False).astype(np.intp),
        ints("hour", [h for _, h, _ in cut]),
        ints("gpu_ms", [a for _, _, a in cut]),
    )


def hourly_team_usage(q: ReportQueries, before_us: int) -> tuple[tuple[str, int, int], ...]:
    """(team, GPU-ms, end of the hour µs) per team and hour of usage ending by `before_us`, in
    time order; an hour cut by `before_us` ends there."""
    return tuple(
        (team, amount, min(before_us, (hour + 1) * HOUR_US))
        for team, hour, amount in team_hour_usage(q, before_us)
        if amount > 0
    )
