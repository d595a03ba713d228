"""`verify_ledger`: the checks `tally ledger verify` runs over the sealed ledger.

Problems are returned as values (a `VerifyReport`), one readable line each:
- every segment the manifest lists exists, matches its checksum and row count, and holds only
  rows of its own incarnation, topic, partition and offset range;
- every segment's rollups, of every level (`ledger.store.rollup_files`), match their
  checksums and equal, row for row in exact integers, their aggregation of the segment's
  postings;
- per incarnation, topic and partition, the sealed offset ranges neither overlap nor leave gaps;
- no transaction appears in two segments (nothing counted twice);
- every transaction sums to zero per unit;
- every closed period (`segments/closed/<period>.json`) still holds exactly what it held when
  it was closed: its rows and checksum, recomputed from the segments (`ledger.closing`), match;
- the raw-event archive (`archive/`): every archive segment exists, matches its checksum and row
  count and holds only messages of its own range, once each; per partition its ranges neither
  overlap nor leave gaps, and they cover exactly the offsets the postings segments cover (a
  rebuild can replay everything sealed, and nothing more); the message of every sealed posting
  is archived; every batch is whole (positions 0..n-1, one incarnation) and, per partition,
  batch numbers never go down as offsets go up;
- the audit trail (`segments/audit.jsonl`, `ledger.audit`) is an unbroken hash chain: the first
  record that was altered, inserted, dropped or moved is named with its seq and what differs.

The read cache of a sharded ledger is verified by `ledger.store.union_verify` instead: each
shard with these checks, and the union against its shards.

A damaged file is named with the damage: missing, or its checksum does not match and why (not
a Parquet file — bad magic, cut short — or valid Parquet whose bytes changed); a manifest that
cannot be read is named with the byte where it breaks. Segment files no manifest lists are
reported as notes (`VerifyReport.notes`): readers never read them, and they do not fail
`verify`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import duckdb

from ledger.audit import verify_chain
from ledger.closing import CHECKSUM_ALGORITHM
from ledger.errors import SegmentError
from ledger.store.integrity import segment_damage
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.rollup_files import LEVELS, RollupInfo, RollupLevel, rollup_differences
from ledger.store.segments import Manifest, SegmentInfo, summarise_segment
from ledger.store.side_files import load_audit_file, load_closed_periods, period_checksum

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    segments: int
    rows: int
    transactions: int
    problems: tuple[str, ...]
    closed_periods: int = 0
    archive_segments: int = 0
    archived_messages: int = 0
    notes: tuple[str, ...] = ()  # findings that are not damage (files no manifest lists)
    audit_records: int = 0
    # a sharded ledger's (`ledger.store.union_verify`): each shard's own report, by name
    shards: tuple[tuple[str, VerifyReport], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def verify_ledger(data_dir: Path | str, progress: Progress | None = None) -> VerifyReport:
    """Verify the sealed ledger in `data_dir` (the module's checks); the read cache of a
    sharded ledger is verified shard by shard and as their union (`ledger.store.union_verify`)."""
    from ledger.store.union import is_union

    if is_union(Path(data_dir)):
        from ledger.store.union_verify import verify_union

        return verify_union(Path(data_dir), progress)
    root = Path(data_dir) / SEGMENTS_DIR
    problems: list[str] = []
    manifest = Manifest(root)
    try:
        segments = manifest.load()
    except SegmentError as exc:
        return VerifyReport(0, 0, 0, (str(exc),))
    notes = _strays(manifest, problems)
    con = duckdb.connect(":memory:")
    readable: list[Path] = []
    rows = 0
    for index, seg in enumerate(segments):
        damage = segment_damage(root / seg.path, seg.sha256)
        if damage is not None:
            problems.append(f"{root.name}/{seg.path}: {damage}")
        else:
            problems.extend(_check_segment(con, root, seg))
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
    archive_root = Path(data_dir) / ARCHIVE_DIR
    archive_segments, archived = _check_archive(con, archive_root, segments, readable, problems)
    with contextlib.suppress(SegmentError):  # an unreadable manifest: `_check_archive` says so
        notes += _strays(Manifest(archive_root), problems)
    con.close()
    audit_records = _check_audit(root, problems)
    return VerifyReport(
        len(segments),
        rows,
        transactions,
        tuple(problems),
        closed,
        archive_segments,
        archived,
        tuple(notes),
        audit_records,
    )


def _check_audit(root: Path, problems: list[str]) -> int:
    """Check the audit trail's hash chain; the number of its records."""
    try:
        records = load_audit_file(root)
    except SegmentError as exc:
        problems.append(str(exc))
        return 0
    broken = verify_chain(records)
    if broken is not None:
        problems.append(f"{root.name}/audit.jsonl: {broken}")
    return len(records)


def _strays(manifest: Manifest, problems: list[str]) -> list[str]:
    """Notes on segment files the manifest does not list (readers never read them; the writer
    removes them at its next seal). Without a manifest, files are a problem: the ledger's list
    of segments is gone."""
    root = manifest.root
    strays = manifest.strays() if root.is_dir() else []
    if strays and not manifest.path.exists():
        problems.append(
            f"{root.name}/{manifest.path.name}: missing, but {len(strays)} segment files exist"
        )
    return [
        f"{root.name}/{p.relative_to(root)}: stray file, not in the manifest (never read; the "
        "worker removes it at its next seal)"
        for p in strays
    ]


# ---------------------------------------------------------------------------- the archive


@dataclass(frozen=True, slots=True)
class CoverageGap:
    """Offsets `first..last` of one partition that one of postings and archive covers and the
    other does not."""

    incarnation: str
    topic: str
    partition: int
    first: int
    last: int
    archived: bool  # True: archived, no postings sealed; False: sealed, not archived

    def describe(self) -> str:
        where = f"{self.topic}[{self.partition}] of broker {self.incarnation}"
        if self.archived:
            return f"offsets {self.first}-{self.last} of {where} are archived but not sealed"
        return f"offsets {self.first}-{self.last} of {where} are sealed but not archived"


Interval = tuple[int, int]


def _covered(segments: Sequence[SegmentInfo]) -> dict[tuple[str, str, int], list[Interval]]:
    """Per partition, the offsets the segments cover, as sorted disjoint intervals."""
    spans: dict[tuple[str, str, int], list[Interval]] = {}
    for seg in segments:
        spans.setdefault((seg.incarnation, seg.topic, seg.partition), []).append(
            (seg.first_offset, seg.last_offset)
        )
    merged: dict[tuple[str, str, int], list[Interval]] = {}
    for key, found in spans.items():
        out: list[Interval] = []
        for first, last in sorted(found):
            if out and first <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], last))
            else:
                out.append((first, last))
        merged[key] = out
    return merged


def _subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The offsets of `a` not in `b` (both sorted and disjoint)."""
    out: list[Interval] = []
    for first, last in a:
        lo = first
        for b_first, b_last in b:
            if b_last < lo or b_first > last:
                continue
            if b_first > lo:
                out.append((lo, b_first - 1))
            lo = max(lo, b_last + 1)
            if lo > last:
                break
        if lo <= last:
            out.append((lo, last))
    return out


def archive_coverage(
    postings: Sequence[SegmentInfo], archive: Sequence[SegmentInfo]
) -> tuple[CoverageGap, ...]:
    """Where the postings segments and the archive segments cover different offsets."""
    sealed, archived = _covered(postings), _covered(archive)
    gaps: list[CoverageGap] = []
    for key in sorted(sealed.keys() | archived.keys()):
        mine, theirs = sealed.get(key, []), archived.get(key, [])
        gaps += [CoverageGap(*key, f, la, archived=False) for f, la in _subtract(mine, theirs)]
        gaps += [CoverageGap(*key, f, la, archived=True) for f, la in _subtract(theirs, mine)]
    return tuple(gaps)


def _check_archive(
    con: duckdb.DuckDBPyConnection,
    root: Path,
    postings: list[SegmentInfo],
    postings_files: list[Path],
    problems: list[str],
) -> tuple[int, int]:
    """Check the archive against itself and the postings segments; (segments, messages)."""
    try:
        segments = Manifest(root).load()
    except SegmentError as exc:
        problems.append(f"archive: {exc}")
        return 0, 0
    readable: list[Path] = []
    messages = 0
    for seg in segments:
        damage = segment_damage(root / seg.path, seg.sha256)
        if damage is not None:
            problems.append(f"archive: {seg.path}: {damage}")
            continue
        problems.extend(f"archive: {p}" for p in _check_archive_segment(con, root, seg))
        readable.append(root / seg.path)
        messages += seg.rows
    problems.extend(f"archive: {p}" for p in _check_ranges(segments))
    problems.extend(f"archive: {gap.describe()}" for gap in archive_coverage(postings, segments))
    if not readable:
        return len(segments), messages
    source = f"read_parquet({_sql_list(readable)})"
    try:
        for inc, topic, partition, offset, copies in con.execute(
            f'SELECT incarnation, topic, "partition", "offset", count(*) FROM {source} '
            "GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL LIMIT 20"
        ).fetchall():
            problems.append(
                f"archive: offset {offset} of {topic}[{partition}] of broker {inc} "
                f"is archived {copies} times"
            )
        for (seq,) in con.execute(
            f"SELECT batch_seq FROM {source} GROUP BY batch_seq "
            "HAVING count(DISTINCT incarnation) > 1 OR count(DISTINCT batch_index) <> count(*) "
            "OR min(batch_index) <> 0 OR max(batch_index) <> count(*) - 1 "
            "ORDER BY batch_seq LIMIT 20"
        ).fetchall():
            problems.append(f"archive: batch {seq} is not whole (positions or broker differ)")
        for inc, topic, partition, offset, seq, before in con.execute(
            f'SELECT incarnation, topic, "partition", "offset", batch_seq, prev FROM ('
            "SELECT *, lag(batch_seq) OVER "
            '(PARTITION BY incarnation, topic, "partition" ORDER BY "offset") AS prev '
            f"FROM {source}) WHERE batch_seq < prev ORDER BY ALL LIMIT 20"
        ).fetchall():
            problems.append(
                f"archive: offset {offset} of {topic}[{partition}] of broker {inc} is in batch "
                f"{seq}, before the batch {before} of an earlier offset"
            )
        if postings_files:
            for inc, topic, partition, offset in con.execute(
                "SELECT DISTINCT p.incarnation, p.src_topic, p.src_partition, p.src_offset "
                f"FROM read_parquet({_sql_list(postings_files)}) p ANTI JOIN {source} a "
                "ON a.incarnation = p.incarnation AND a.topic = p.src_topic "
                'AND a."partition" = p.src_partition AND a."offset" = p.src_offset '
                "ORDER BY ALL LIMIT 20"
            ).fetchall():
                problems.append(
                    f"archive: offset {offset} of {topic}[{partition}] of broker {inc} has "
                    "sealed postings but its message is not archived"
                )
    except duckdb.Error as exc:
        problems.append(f"archive: segments could not be read together: {exc}")
    return len(segments), messages


def _check_archive_segment(
    con: duckdb.DuckDBPyConnection, root: Path, seg: SegmentInfo
) -> list[str]:
    path = root / seg.path
    sql_path = str(path).replace("'", "''")
    try:
        row = con.execute(
            "SELECT count(*), "
            'count(*) FILTER ("offset" < ? OR "offset" > ? OR "partition" <> ? '
            "OR topic <> ? OR incarnation <> ?) "
            f"FROM read_parquet('{sql_path}')",
            [seg.first_offset, seg.last_offset, seg.partition, seg.topic, seg.incarnation],
        ).fetchone()
    except duckdb.Error as exc:
        return [f"{seg.path}: unreadable: {exc}"]
    assert row is not None
    count, strays = row
    problems = []
    if count != seg.rows:
        problems.append(f"{seg.path}: holds {count} messages, the manifest says {seg.rows}")
    if strays:
        problems.append(f"{seg.path}: {strays} messages lie outside the segment's source range")
    return problems


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
    name = f"{root.name}/{seg.path}"
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
        return [f"{name}: unreadable: {exc}"]
    assert row is not None
    count, strays, amount_type = row
    problems = []
    if count != seg.rows:
        problems.append(f"{name}: holds {count} rows, the manifest says {seg.rows}")
    if strays:
        problems.append(f"{name}: {strays} rows lie outside the segment's source range")
    if count and amount_type != "BIGINT":
        problems.append(f"{name}: amounts are {amount_type}, not integers")
    if seg.summary is not None and summarise_segment(con, path) != seg.summary:
        problems.append(f"{name}: the manifest's summary does not match the segment's rows")
    for level in LEVELS:
        rollup = seg.rollup_of(level.name)
        if rollup is not None:
            problems.extend(_check_rollup(con, root, seg.path, rollup, level))
    return problems


def _check_rollup(
    con: duckdb.DuckDBPyConnection,
    root: Path,
    segment: str,
    rollup: RollupInfo,
    level: RollupLevel,
) -> list[str]:
    """A segment's rollup (of any level): intact, and equal row for row (exact integers) to
    `level`'s aggregation of the segment's postings (`ledger.store.rollup_files`)."""
    name = f"{root.name}/{rollup.path}"
    damage = segment_damage(root / rollup.path, rollup.sha256)
    if damage is not None:
        return [f"{name}: {damage}"]
    try:
        differing = rollup_differences(con, root / segment, root / rollup.path, level)
    except duckdb.Error as exc:
        return [f"{name}: unreadable: {exc}"]
    if differing:
        return [f"{name}: {differing} rows differ from the aggregation of {segment}"]
    return []


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
