"""`verify_ledger`: the checks `tally ledger verify` runs over the sealed ledger.

Problems are returned as values (a `VerifyReport`), one readable line each:
- every segment the manifest lists exists, matches its checksum and row count, and holds only
  rows of its own incarnation, topic, partition and offset range;
- per incarnation, topic and partition, the sealed offset ranges neither overlap nor leave gaps;
- no transaction appears in two segments (nothing counted twice);
- every transaction sums to zero per unit;
- every closed period (`segments/closed/<period>.json`) still holds exactly what it held when
  it was closed: its rows and checksum, recomputed from the segments (`ledger.closing`), match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import duckdb

from ledger.closing import CHECKSUM_ALGORITHM, load_closed_periods, period_checksum
from ledger.errors import SegmentError
from ledger.segments import Manifest, SegmentInfo, file_sha256
from ledger.store import SEGMENTS_DIR

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    segments: int
    rows: int
    transactions: int
    problems: tuple[str, ...]
    closed_periods: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def verify_ledger(data_dir: Path | str, progress: Progress | None = None) -> VerifyReport:
    root = Path(data_dir) / SEGMENTS_DIR
    problems: list[str] = []
    try:
        segments = Manifest(root).load()
    except SegmentError as exc:
        return VerifyReport(0, 0, 0, (str(exc),))
    con = duckdb.connect(":memory:")
    readable: list[Path] = []
    rows = 0
    for index, seg in enumerate(segments):
        problems.extend(_check_segment(con, root, seg))
        if (root / seg.path).exists():
            readable.append(root / seg.path)
            rows += seg.rows
        if progress is not None:
            progress(index + 1, len(segments))
    problems.extend(_check_ranges(segments))
    transactions = 0
    if readable:
        source = f"read_parquet({_sql_list(readable)}, filename = true)"
        try:
            unbalanced = con.execute(
                f"SELECT txn_id, unit, sum(amount) FROM {source} GROUP BY ALL "
                "HAVING sum(amount) <> 0 ORDER BY ALL LIMIT 20"
            ).fetchall()
            for txn_id, unit, total in unbalanced:
                problems.append(f"transaction {txn_id} sums to {total} {unit}, not zero")
            doubled = con.execute(
                f"SELECT txn_id, count(DISTINCT filename) FROM {source} GROUP BY txn_id "
                "HAVING count(DISTINCT filename) > 1 ORDER BY txn_id LIMIT 20"
            ).fetchall()
            for txn_id, files in doubled:
                problems.append(f"transaction {txn_id} appears in {files} segments")
            row = con.execute(f"SELECT count(DISTINCT txn_id) FROM {source}").fetchone()
            transactions = int(row[0]) if row else 0
        except duckdb.Error as exc:
            problems.append(f"segments could not be read together: {exc}")
    closed = _check_closed_periods(con, root, readable, problems)
    con.close()
    return VerifyReport(len(segments), rows, transactions, tuple(problems), closed)


def _check_closed_periods(
    con: duckdb.DuckDBPyConnection, root: Path, files: list[Path], problems: list[str]
) -> int:
    try:
        closed = load_closed_periods(root)
    except SegmentError as exc:
        problems.append(str(exc))
        return 0
    if not closed:
        return 0
    source = f"read_parquet({_sql_list(files)})" if files else None
    for record in closed:
        if record.algorithm != CHECKSUM_ALGORITHM:
            problems.append(f"closed period {record.period}: unknown checksum {record.algorithm}")
            continue
        rows, digest = (0, _EMPTY_SHA256)
        if source is not None:
            try:
                rows, digest = period_checksum(con, source, record.period)
            except duckdb.Error as exc:
                problems.append(f"closed period {record.period}: could not be read: {exc}")
                continue
        if (rows, digest) != (record.rows, record.sha256):
            problems.append(
                f"closed period {record.period} changed: it was closed with {record.rows} "
                f"postings (sha256 {record.sha256[:12]}…), the segments hold {rows} "
                f"(sha256 {digest[:12]}…)"
            )
    return len(closed)


_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _check_segment(con: duckdb.DuckDBPyConnection, root: Path, seg: SegmentInfo) -> list[str]:
    path = root / seg.path
    if not path.exists():
        return [f"{seg.path}: listed in the manifest but missing"]
    if file_sha256(path) != seg.sha256:
        return [f"{seg.path}: checksum does not match the manifest (file changed or corrupt)"]
    sql_path = str(path).replace("'", "''")
    try:
        row = con.execute(
            "SELECT count(*), "
            "count(*) FILTER (src_offset < ? OR src_offset > ? OR src_partition <> ? "
            "OR src_topic <> ? OR incarnation <> ?), "
            f"typeof(any_value(amount)) FROM read_parquet('{sql_path}')",
            [seg.first_offset, seg.last_offset, seg.partition, seg.topic, seg.incarnation],
        ).fetchone()
    except duckdb.Error as exc:
        return [f"{seg.path}: unreadable: {exc}"]
    assert row is not None
    count, strays, amount_type = row
    problems = []
    if count != seg.rows:
        problems.append(f"{seg.path}: holds {count} rows, the manifest says {seg.rows}")
    if strays:
        problems.append(f"{seg.path}: {strays} rows lie outside the segment's source range")
    if count and amount_type != "BIGINT":
        problems.append(f"{seg.path}: amounts are {amount_type}, not integers")
    return problems


def _check_ranges(segments: list[SegmentInfo]) -> list[str]:
    problems = []
    by_partition: dict[tuple[str, str, int], list[SegmentInfo]] = {}
    for seg in segments:
        if seg.first_offset > seg.last_offset:
            problems.append(f"{seg.path}: range {seg.first_offset}-{seg.last_offset} is empty")
        by_partition.setdefault((seg.incarnation, seg.topic, seg.partition), []).append(seg)
    for (incarnation, topic, partition), segs in sorted(by_partition.items()):
        segs.sort(key=lambda s: (s.first_offset, s.last_offset))
        for before, after in pairwise(segs):
            where = f"{topic}[{partition}] of broker {incarnation}"
            if after.first_offset <= before.last_offset:
                problems.append(
                    f"{where}: offsets {after.first_offset}-"
                    f"{min(before.last_offset, after.last_offset)} are sealed twice "
                    f"({before.path}, {after.path})"
                )
            elif after.first_offset > before.last_offset + 1:
                problems.append(
                    f"{where}: offsets {before.last_offset + 1}-{after.first_offset - 1} "
                    "are missing"
                )
    return problems
