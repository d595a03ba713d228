"""What every rollup shares: the units and SQL fragments, the sidebar's `Filters`, the ledger's
identity (`ledger_version`, `closed_periods`), what it holds (`extent`), and the way to the jobs
topic's messages in the sealed raw-event archive (`archived_job_log`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from ledger.read import job_history
from ledger.read.reports import ReportQueries, period_clause, period_of
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.segments import MANIFEST_NAME
from ledger.store.side_files import ADMIN_LOG_NAME, INVENTORY_NAME, load_closed_periods

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
WEEK_US = 7 * DAY_US
MS_PER_HOUR = 3_600_000
CAPACITY_SQL = "account LIKE 'capacity:%'"
# Usage net of its reversals: a usage transaction counts, and so does the reversal of one (its
# exact negation, same GPU, model, pool and interval: a late owner's correction, an admin
# reversal), so a corrected sample and its re-posting sum to the re-posting alone. A reversal of
# an adjustment (no model) is no usage.
USAGE_SQL = "(kind = 'usage' OR kind = 'reversal' AND model <> '')"


def by_day(q: ReportQueries) -> str:
    """The smallest rollup level whose rows each lie in one day of the ledger's zone: the daily
    level (a row per UTC day, `{daily}`, about a sixteenth of the coarse level's rows) when the
    zone is UTC, else the coarse level (hours, `{coarse}`). A query that buckets or clips
    `start_us` to days reads this; one that uses no time at all reads `{daily}` in any zone."""
    return "{daily}" if q.zone is UTC else "{coarse}"


@dataclass(frozen=True, slots=True)
class Filters:
    """The sidebar's selection. `period`: a `YYYY-MM` label (None: all periods)."""

    period: str | None = None
    team: str | None = None
    pool: str | None = None

    def sql(self, by_booking: bool = True) -> tuple[str, list[Any]]:
        """A WHERE fragment for these filters; the period by booking or by usage time."""
        chosen = period_of(self.period)
        if by_booking or chosen is None:
            clause, params = period_clause(chosen)
        else:
            clause, params = "start_us >= ? AND start_us < ?", [chosen.start_us, chosen.end_us]
        if self.team is not None:
            clause += " AND team = ?"
            params.append(self.team)
        if self.pool is not None:
            clause += " AND pool = ?"
            params.append(self.pool)
        return clause, params

    @property
    def booked(self) -> str | None:
        """The booked period `sql()` (by booking) selects, for `ReportQueries.rows`' `booked`."""
        chosen = period_of(self.period)
        return None if chosen is None else chosen.label


# ------------------------------------------------------------------------------ the ledger


def ledger_version(data_dir: Path | str) -> str:
    """A key that changes whenever the sealed ledger, its raw-event archive, its admin log, its
    inventory copy or its closed periods change.

    The manifests are replaced atomically by every seal and compaction, the admin log by every
    batch of admin events, and closed-period records are written once, so their bytes identify
    what readers see.
    """
    root = Path(data_dir) / SEGMENTS_DIR
    digest = hashlib.sha256()
    for path in (
        root / MANIFEST_NAME,
        Path(data_dir) / ARCHIVE_DIR / MANIFEST_NAME,
        root / ADMIN_LOG_NAME,
        root / INVENTORY_NAME,
    ):
        try:
            digest.update(path.read_bytes())
        except FileNotFoundError:
            digest.update(b"none: " + path.name.encode())
    closed = root / "closed"
    if closed.is_dir():
        for path in sorted(closed.glob("*.json")):
            digest.update(path.name.encode())
    return digest.hexdigest()


def closed_periods(data_dir: Path | str) -> tuple[str, ...]:
    """Labels of the closed periods of the ledger in `data_dir`, oldest first.

    A period is closed when `ledger.closing` has written its record.
    """
    return tuple(c.period for c in load_closed_periods(Path(data_dir) / SEGMENTS_DIR))


@dataclass(frozen=True, slots=True)
class Extent:
    """What the ledger holds: the choices the sidebar offers, and its time range."""

    periods: tuple[str, ...]  # newest first
    teams: tuple[str, ...]
    pools: tuple[str, ...]
    models: tuple[str, ...]
    first_us: int | None
    newest_us: int | None

    @property
    def empty(self) -> bool:
        return self.newest_us is None


def extent(q: ReportQueries) -> Extent:
    """Periods, teams, pools, models and the usage's time span of the sealed ledger, merged
    from the segments' summaries (`ledger.store.segments.SegmentSummary`): no scan of the
    postings."""
    summaries = q.segment_summaries()
    firsts = [s.usage_first_us for s in summaries if s.usage_first_us is not None]
    lasts = [s.usage_last_us for s in summaries if s.usage_last_us is not None]
    return Extent(
        periods=tuple(sorted({p for s in summaries for p in s.periods}, reverse=True)),
        teams=tuple(sorted({t for s in summaries for t in s.teams})),
        pools=tuple(sorted({p for s in summaries for p in s.pools})),
        models=tuple(sorted({m for s in summaries for m in s.models})),
        first_us=min(firsts, default=None),
        newest_us=max(lasts, default=None),
    )


def _data_dir(q: ReportQueries) -> Path:
    return q.root.parent


def archived_job_log(q: ReportQueries, topic: str) -> job_history.JobEventLog:
    """The jobs topic's messages in the sealed raw-event archive of the ledger `q` reads
    (`ledger.read.job_history.read_job_event_log`)."""
    return job_history.read_job_event_log(_data_dir(q), topic)
