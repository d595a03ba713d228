"""A time range read from an hourly rollup level: its whole UTC hours from the level's rows, the
parts of an hour at either end from the postings, so a range that neither begins nor ends on an
hour (the Platform page's last 24 hours up to the newest sealed sample, the Capacity page's
demand window) reads exactly what the postings hold.

A level grouped by the UTC hour of a posting's start (`ledger.store.rollup_files`: fine,
gpus) keeps in each row postings that started in one hour, so a row's first start says which
side of an hour boundary all of them lie; the postings of the segments that can hold one that
started in an end part (`{edges}`, `LedgerQueries._edge_source`) are read in the level's shape
(`postings_as_rollup_sql`), one posting per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.store.rollup_files import HOUR_US, RollupLevel, postings_as_rollup_sql

_PLACEHOLDERS = {"rollup": "rollups"}  # a level's `{…}` in readers' SQL, where not its name


@dataclass(frozen=True, slots=True)
class HourSplit:
    """Postings started in [`since_us`, `until_us`), cut at whole UTC hours."""

    since_us: int
    until_us: int

    @property
    def hours(self) -> tuple[int, int] | None:
        """The whole hours inside the range (first hour's start, end of the last), if any."""
        first = -(-self.since_us // HOUR_US) * HOUR_US
        end = self.until_us // HOUR_US * HOUR_US
        return (first, end) if first < end else None

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """The parts of the range outside its whole hours (none, one or two)."""
        whole = self.hours
        parts: tuple[tuple[int, int], ...]
        if whole is None:
            parts = ((self.since_us, self.until_us),)
        else:
            parts = ((self.since_us, whole[0]), (whole[1], self.until_us))
        return tuple((lo, hi) for lo, hi in parts if lo < hi)

    @property
    def started(self) -> tuple[int, int]:
        """What a query's `started` is: the whole hours the level is read for (or the range)."""
        return self.hours or (self.since_us, self.until_us)

    def source(self, level: RollupLevel) -> tuple[str, list[Any]]:
        """A relation in `level`'s shape of every posting started in the range (its rows for
        the whole hours, the postings of the edges), and its parameters in order; the query
        passes `started` and `edges` (`ReportQueries.rows`)."""
        parts: list[str] = []
        params: list[Any] = []
        whole = self.hours
        if whole is not None:
            placeholder = _PLACEHOLDERS.get(level.name, level.name)
            parts.append(
                f"SELECT {level.columns_sql()} FROM {{{placeholder}}} "
                "WHERE start_us >= ? AND start_us < ?"
            )
            params += whole
        edges = self.edges
        if edges or not parts:
            within = " OR ".join("(start_us >= ? AND start_us < ?)" for _ in edges) or "FALSE"
            postings = postings_as_rollup_sql("{edges}", level)
            parts.append(f"SELECT * FROM ({postings}) WHERE {within}")
            params += [bound for edge in edges for bound in edge]
        return "(" + " UNION ALL ".join(parts) + ")", params
