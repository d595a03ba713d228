"""What the seal and `verify` compute per segment besides writing its rollups, checked on
segments Hypothesis generates (few examples: NULL and shared owners, jobs, units, idle flags,
intervals across hour and day boundaries, non-consumer accounts):

- the summary and extent folded in Python from one small query (`segments.summarise`) equal what
  one query of DuckDB's sorted distinct lists computed before, and what reading the file gives
  (the oracle below, kept here only);
- `rollup_files.rollup_differences` (what `verify` runs per level, one GROUP BY over both sides
  instead of two `EXCEPT ALL`s) finds every level's file equal to its aggregation of the
  postings — a level the seal derives from a finer level's file (`RollupLevel.derived_from`)
  included, and the summary the seal reads from the fine rollup — and counts the rows of a
  lying one as `EXCEPT ALL` both ways counted them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.store.hot_tables import HOT_TABLES_DDL
from ledger.store.layout import sql_path
from ledger.store.rollup_files import HOUR_US, LEVELS, rollup_differences, write_rollup
from ledger.store.segments import SegmentSummary, summarise

Posting = tuple[Any, ...]
BASE_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % (24 * HOUR_US)


def oracle_summary(
    con: duckdb.DuckDBPyConnection, segment: Path
) -> tuple[SegmentSummary, tuple[int | None, int | None]]:
    """The summary as one query over the segment's postings computed it before (DuckDB's
    sorted distinct lists), and the extent as the seal read it from the file."""
    row = con.execute(
        "SELECT list(DISTINCT period ORDER BY period), "
        "list(DISTINCT team ORDER BY team) "
        "FILTER (account LIKE 'consumer:%' AND team IS NOT NULL), "
        "list(DISTINCT pool ORDER BY pool) FILTER (kind = 'usage' AND coalesce(pool, '') <> ''), "
        "list(DISTINCT model ORDER BY model) "
        "FILTER (kind = 'usage' AND coalesce(model, '') <> ''), "
        "min(start_us) FILTER (kind = 'usage'), max(end_us) FILTER (kind = 'usage'), "
        "list(DISTINCT period ORDER BY period) FILTER (kind = 'usage'), "
        f"min(start_us), max(end_us) FROM read_parquet('{sql_path(segment)}')"
    ).fetchone()
    assert row is not None
    periods, teams, pools, models, first, last, usage_periods, start, end = row
    summary = SegmentSummary(
        tuple(periods or ()), tuple(teams or ()), tuple(pools or ()), tuple(models or ()),
        first, last, tuple(usage_periods or ()),
    )  # fmt: skip
    return summary, (start, end)


OWNERS = st.sampled_from(
    [(None, None, None, None), ("ml", "vision", "ana", "j1"), ("ml", "vision", "bo", "j2"),
     ("ml", None, None, "j3"), ("nlp", "chat", "ana", None), ("nlp", "chat", "cy", "j4")]
)  # fmt: skip
POSTING = st.tuples(
    OWNERS,
    st.sampled_from(["gpu_ms", "money_micros"]),
    st.sampled_from(["usage", "grant", "reversal"]),
    st.integers(-(10**12), 10**12),
    st.integers(0, 50 * HOUR_US),  # start after BASE_US: across hours and days
    st.integers(1, 3 * HOUR_US),  # length
    st.booleans(),  # idle
    st.sampled_from([("H100", "a"), ("A100", "b"), (None, None)]),
)


def write_segment(con: duckdb.DuckDBPyConnection, postings: list[Posting], to: Path) -> None:
    """A postings segment file of `postings` (each with its balancing provider leg), written as
    the seal writes one."""
    con.execute("DELETE FROM posting_rows")
    rows = []
    for n, (owner, unit, kind, amount, start, length, idle, (model, pool)) in enumerate(postings):
        team, project, user, job = owner
        start_us = BASE_US + start
        period = "2023-11" if start < 30 * HOUR_US else "2023-12"
        for leg, account in enumerate((f"consumer:{team}", "provider:cluster")):
            rows.append(
                (f"t{n}", leg, kind, account, unit, amount if leg == 0 else -amount,
                 team, project, user, job, "cc" if team else None, "GPU-1", model, pool,
                 "node-1", start_us, start_us + length, "c", "inc", "samples", 0, n,
                 period, 40, idle)
            )  # fmt: skip
    con.executemany(f"INSERT INTO posting_rows VALUES ({', '.join('?' * 25)})", rows)
    con.execute(
        f"COPY (SELECT * FROM postings ORDER BY src_offset, txn_id, leg) TO '{sql_path(to)}' "
        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)"
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(POSTING, min_size=1, max_size=60))
def test_the_summary_and_every_level_agree_with_the_segments_rows(
    tmp_path_factory: pytest.TempPathFactory, postings: list[Posting]
) -> None:
    root = tmp_path_factory.mktemp("segment")
    con = duckdb.connect()
    con.execute(HOT_TABLES_DDL)
    segment = root / "0-9.parquet"
    write_segment(con, postings, segment)
    oracle = oracle_summary(con, segment)
    assert summarise(con, f"read_parquet('{sql_path(segment)}')") == oracle
    written: dict[str, Path] = {}
    for level in LEVELS:  # as the seal writes them: a derived level from its finer level's file
        path = written[level.name] = root / level.path("0-9.parquet")
        source = segment if level.derived_from is None else written[level.derived_from]
        write_rollup(con, source, path, level, rolled=level.derived_from is not None)
        assert rollup_differences(con, segment, path, level) == 0, level.name
    fine = written[LEVELS[0].name]
    assert summarise(con, f"read_parquet('{sql_path(fine)}')") == oracle  # as the seal reads it


def two_postings(con: duckdb.DuckDBPyConnection, segment: Path) -> None:
    owner = ("ml", "vision", "ana", "j1")
    write_segment(
        con,
        [(owner, "gpu_ms", "usage", 5, 0, 10, False, ("H100", "a")),
         (owner, "gpu_ms", "usage", 7, 2 * HOUR_US, 10, True, ("H100", "a"))],
        segment,
    )  # fmt: skip


def test_rollup_differences_counts_the_rows_a_lying_file_does_not_share(tmp_path: Path) -> None:
    con = duckdb.connect()
    con.execute(HOT_TABLES_DDL)
    segment = tmp_path / "0-1.parquet"
    two_postings(con, segment)
    fine, lying = tmp_path / "fine.parquet", tmp_path / "lying.parquet"
    assert write_rollup(con, segment, fine, LEVELS[0]) == 4  # 2 postings × 2 legs, 2 hours
    # the same rows, the last hour's amounts one more: two rows missing, two extra
    con.execute(
        f"COPY (SELECT * REPLACE (amount + (start_us > {BASE_US + HOUR_US})::BIGINT AS amount) "
        f"FROM read_parquet('{sql_path(fine)}')) TO '{sql_path(lying)}' (FORMAT parquet)"
    )
    assert rollup_differences(con, segment, fine, LEVELS[0]) == 0
    assert rollup_differences(con, segment, lying, LEVELS[0]) == 4
    # a row twice: one extra (counted with its multiplicity, as EXCEPT ALL counts it)
    doubled = tmp_path / "doubled.parquet"
    con.execute(
        f"COPY (SELECT * FROM read_parquet('{sql_path(fine)}') UNION ALL "
        f"(SELECT * FROM read_parquet('{sql_path(fine)}') LIMIT 1)) "
        f"TO '{sql_path(doubled)}' (FORMAT parquet)"
    )
    assert rollup_differences(con, segment, doubled, LEVELS[0]) == 1
