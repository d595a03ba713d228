"""`verify` over the read cache of a sharded ledger (`ledger.store.union`): every shard checked
as the ledger it is (`verify_ledger` on its own tree: its segments, rollups, ranges, archive,
audit chain, and its closed-period records against its own postings), and the union checked
against its shards:

- the union's manifests list exactly the shards' entries, paths prefixed (`union_rules`), and
  every file they name is the shard's file (the same file, or the same bytes);
- no transaction appears in two shards (nothing counted twice across them);
- the shards keep their books in one time zone;
- the periods the union shows closed are exactly those every shard closed, and each union
  record holds the rows and checksum of the union's postings of its period;
- the union's admin log, inventory and audit trail are the global shard's, its dead-letter
  summary the shards' summed;
- an admin reversal the global shard logged as another shard's (`ELSEWHERE_OUTCOME`) that no
  shard posted, once every samples shard has folded it (its sealed admin log holds the event
  or a later one of the global shard's log), is reported as a note: its target is in no shard
  (unknown, already reversed, or not applied yet when the reversal was folded) — what a whole
  ledger refuses as a dead letter.

Each shard's problems and notes are prefixed `shard <name>: `, so a damaged object is named
with its shard; the per-shard reports travel in `VerifyReport.shards`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa

from ledger.admin import AdjustmentRecorded
from ledger.admin.view import ELSEWHERE_OUTCOME
from ledger.errors import SegmentError
from ledger.periods import zone_name
from ledger.store.identity import recorded_zone
from ledger.store.integrity import segment_damage
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR, sql_list
from ledger.store.replica import side_files
from ledger.store.segments import Manifest, SegmentInfo
from ledger.store.side_files import (
    CLOSED_DIR,
    REFUSED_NAME,
    load_admin_log,
    load_closed_periods,
    load_refused,
    period_checksum,
)
from ledger.store.union import shard_dir, union_shards
from ledger.store.union_rules import (
    ROOT_SHARD,
    closed_in_union,
    common_zone,
    shard_entry,
    side_source,
    summed_refused,
)
from ledger.store.verify import VerifyReport, verify_ledger

Progress = Callable[[int, int], None]
_ROOTS = (SEGMENTS_DIR, ARCHIVE_DIR)


def verify_union(data_dir: Path, progress: Progress | None = None) -> VerifyReport:
    """Verify each shard of the union in `data_dir`, then the union against them; one report,
    its counts the shards' summed (closed periods: the union's)."""
    names = union_shards(data_dir)
    dirs = {name: shard_dir(data_dir, name) for name in names}
    total = sum(_count(d) for d in dirs.values())
    done = 0
    reports: list[tuple[str, VerifyReport]] = []
    for name, d in dirs.items():
        base = done

        def step(n: int, _of: int, base: int = base) -> None:
            if progress is not None:
                progress(base + n, total)

        report = verify_ledger(d, step)
        if not d.is_dir():
            report = replace(report, problems=("missing from the cache: pull again",))
        done += report.segments
        reports.append((name, report))
    problems: list[str] = []
    union_notes: list[str] = []
    intact = {name for name, report in reports if report.ok}
    closed = _check_union(data_dir, dirs, intact, problems, union_notes)
    for name, report in reports:
        problems += [f"shard {name}: {p}" for p in report.problems]
    notes = [f"shard {name}: {n}" for name, r in reports for n in r.notes] + union_notes
    source = side_source(names)
    audit = next((r.audit_records for name, r in reports if name == source), 0)
    return VerifyReport(
        sum(r.segments for _, r in reports),
        sum(r.rows for _, r in reports),
        sum(r.transactions for _, r in reports),
        tuple(problems),
        closed,
        sum(r.archive_segments for _, r in reports),
        sum(r.archived_messages for _, r in reports),
        tuple(notes),
        audit,
        tuple(reports),
    )


def _count(d: Path) -> int:
    try:
        return len(Manifest(d / SEGMENTS_DIR).load())
    except SegmentError:
        return 0


def _check_union(
    data_dir: Path,
    dirs: dict[str, Path],
    intact: set[str],
    problems: list[str],
    notes: list[str],
) -> int:
    """Check the union against its shards (the module's list); the union's closed periods.
    The postings of shards that failed their own checks (`intact`: those that passed) are left
    out of the checks that read them: their damage is reported already."""
    try:
        common_zone({name: zone_name(recorded_zone(d)) for name, d in dirs.items()})
    except SegmentError as exc:
        problems.append(str(exc))
    postings: list[Path] = []
    for root in _ROOTS:
        try:
            listed = Manifest(data_dir / root).load()
            expected = [
                shard_entry(seg, name)
                for name, d in dirs.items()
                for seg in Manifest(d / root).load()
            ]
        except SegmentError as exc:
            problems.append(str(exc))
            continue
        if sorted(listed, key=_order) != sorted(expected, key=_order):
            problems.append(
                f"{root}/manifest.json: lists {len(listed)} segments, not the {len(expected)} "
                "of the shards as they are (pull again)"
            )
        for seg in listed:
            problems += _check_files(data_dir / root, dirs, seg)
        if root == SEGMENTS_DIR:
            postings = [
                data_dir / root / seg.path for seg in listed if seg.path.split("/")[1] in intact
            ]
    whole = intact == set(dirs)
    with duckdb.connect(":memory:") as con:
        if postings:
            _check_doubled(con, data_dir, postings, problems)
        closed = _check_closed(con, data_dir, dirs, postings if whole else None, problems)
        if whole:
            notes += _unposted_reversals(con, dirs, postings, problems)
    _check_side_files(data_dir, dirs, problems)
    return closed


def _order(seg: SegmentInfo) -> tuple[str, ...]:
    return (seg.path,)


def _check_files(root: Path, dirs: dict[str, Path], seg: SegmentInfo) -> list[str]:
    """Every file a union entry names is its shard's file (checked by the shard's verify), or
    holds the same bytes."""
    found = []
    files = [(seg.path, seg.sha256), *((r.path, r.sha256) for r in seg.rollups())]
    for path, sha256 in files:
        parts = path.split("/", 2)
        shard = dirs.get(parts[1]) if len(parts) == 3 else None
        if shard is not None:
            try:
                if os.path.samefile(root / path, shard / root.name / parts[2]):
                    continue
            except OSError:
                pass
        damage = segment_damage(root / path, sha256)
        if damage is not None:
            found.append(f"{root.name}/{path}: {damage}")
    return found


def _check_doubled(
    con: duckdb.DuckDBPyConnection, data_dir: Path, files: list[Path], problems: list[str]
) -> None:
    """No transaction in the segments of two shards."""
    readable = [f for f in files if f.is_file()]
    if not readable:
        return
    cut = len(str(data_dir / SEGMENTS_DIR)) + 2  # the file name from `shards/<name>/…`
    try:
        for txn_id, shards in con.execute(
            "SELECT txn_id, list(DISTINCT split_part(substr(filename, ?), '/', 2)) "
            f"FROM read_parquet([{sql_list(readable)}], filename = true) GROUP BY txn_id "
            "HAVING count(DISTINCT split_part(substr(filename, ?), '/', 2)) > 1 "
            "ORDER BY txn_id LIMIT 20",
            [cut, cut],
        ).fetchall():
            problems.append(f"transaction {txn_id} appears in shards {', '.join(sorted(shards))}")
    except duckdb.Error as exc:
        problems.append(f"the shards' segments could not be read together: {exc}")


def _check_closed(
    con: duckdb.DuckDBPyConnection,
    data_dir: Path,
    dirs: dict[str, Path],
    postings: list[Path] | None,
    problems: list[str],
) -> int:
    """The union's closed periods are those every shard closed, each with the union's rows and
    checksum (`postings`: the union's files; None: a shard is damaged, checksums not
    compared); how many it has."""
    try:
        union = {c.period: c for c in load_closed_periods(data_dir / SEGMENTS_DIR)}
        shards = {
            name: [c.period for c in load_closed_periods(d / SEGMENTS_DIR)]
            for name, d in dirs.items()
        }
    except SegmentError as exc:
        problems.append(str(exc))
        return 0
    expected = closed_in_union(shards)
    if sorted(union) != expected:
        problems.append(
            f"the union shows closed {', '.join(sorted(union)) or 'no period'}, but the periods "
            f"every shard closed are {', '.join(expected) or 'none'}"
        )
    if postings is None:
        return len(union)
    readable = [f for f in postings if f.is_file()]
    for period, record in sorted(union.items()):
        rows, digest = 0, hashlib.sha256(b"").hexdigest()
        try:
            if readable:
                rows, digest = period_checksum(con, f"read_parquet([{sql_list(readable)}])", period)
        except duckdb.Error as exc:
            problems.append(f"closed period {period} of the union could not be read: {exc}")
            continue
        if (rows, digest) != (record.rows, record.sha256):
            problems.append(
                f"closed period {period} of the union: its record says {record.rows} postings "
                f"(sha256 {record.sha256[:12]}…), the shards hold {rows} (sha256 {digest[:12]}…)"
            )
    return len(union)


def _unposted_reversals(
    con: duckdb.DuckDBPyConnection, dirs: dict[str, Path], postings: list[Path], problems: list[str]
) -> list[str]:
    """The admin reversals the global shard logged as another shard's that no shard posted (a
    reversal's transaction id is its event's id), among those every samples shard has folded:
    one note each. Every shard folds the admin topic in the same order, so a shard has folded
    an event once its sealed log holds that event or one the global shard logged after it."""
    source = side_source(dirs)
    if source is None:
        return []
    try:
        log = load_admin_log(dirs[source] / SEGMENTS_DIR)
        order = {e.envelope.id: index for index, e in enumerate(log)}
        reached = len(log)  # how far into the global shard's log every samples shard has folded
        for name, d in dirs.items():
            if name not in (source, ROOT_SHARD):
                own = [order.get(e.envelope.id, -1) for e in load_admin_log(d / SEGMENTS_DIR)]
                reached = min(reached, max(own, default=-1))
    except SegmentError as exc:
        problems.append(str(exc))
        return []
    logged = {
        e.envelope.id: e.envelope.data.reverses_txn
        for e in log[: reached + 1]
        if e.outcome == ELSEWHERE_OUTCOME
        and isinstance(e.envelope.data, AdjustmentRecorded)
        and e.envelope.data.reverses_txn is not None
    }
    readable = [f for f in postings if f.is_file()]
    if not logged:
        return []
    posted: set[str] = set()
    if readable:
        con.register("reversal_ids", pa.table({"txn_id": sorted(logged)}))
        posted = {
            str(i)
            for (i,) in con.execute(
                f"SELECT DISTINCT txn_id FROM read_parquet([{sql_list(readable)}]) "
                "SEMI JOIN reversal_ids USING (txn_id)"
            ).fetchall()
        }
        con.unregister("reversal_ids")
    return [
        f"admin reversal {event} of transaction {target}: no shard holds its target, so none "
        "posted it (a whole ledger refuses it as a dead letter)"
        for event, target in sorted(logged.items())
        if event not in posted
    ]


def _check_side_files(data_dir: Path, dirs: dict[str, Path], problems: list[str]) -> None:
    """The union's admin log, inventory and audit trail are the global shard's; its dead-letter
    summary is the shards' summed."""
    segments = data_dir / SEGMENTS_DIR
    source = side_source(dirs)
    expected: dict[str, bytes] = {}
    if source is not None:
        own = dirs[source] / SEGMENTS_DIR
        for path in side_files(own):
            rel = path.relative_to(own)
            if rel.parts[0] != CLOSED_DIR and rel.name != REFUSED_NAME:
                expected[rel.as_posix()] = path.read_bytes()
    held = {
        p.relative_to(segments).as_posix(): p
        for p in side_files(segments)
        if p.relative_to(segments).parts[0] != CLOSED_DIR and p.name != REFUSED_NAME
    }
    for name in sorted(expected.keys() | held.keys()):
        if name not in held or held[name].read_bytes() != expected.get(name):
            whose = f"the {source} shard's" if source else "no shard's"
            problems.append(f"{SEGMENTS_DIR}/{name}: not {whose} (pull again)")
    try:
        summed = summed_refused(load_refused(d / SEGMENTS_DIR) for d in dirs.values())
        if load_refused(segments) != summed:
            problems.append(f"{SEGMENTS_DIR}/{REFUSED_NAME}: not the shards' summed (pull again)")
    except SegmentError as exc:
        problems.append(str(exc))
