"""Writing sealed segments from the hot tables: postings and archived messages of committed
source ranges out to immutable Parquet files, compaction of small segments, and the archive
kept cut as the postings are; every postings segment written (sealed or compacted) gets its
rollups of every level (`ledger.store.rollup_files`), beside it, named by its manifest
entry. Every file is written to a temporary name, fsynced and renamed, so an interrupted run
leaves nothing a manifest names half-written.

A write the system refuses (the disk is full, an I/O error) removes its temporary file and
raises a `SealError` naming the file being written and the reason; the manifests are written
only after every file of a seal is in place and the hot rows are dropped only after them, so a
failed seal loses nothing and the next one writes the same files again. Compaction checks the
segments it merges against their checksums first, so a damaged segment is never copied into a
new one with a fresh checksum."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ledger.errors import SealError, StoreError
from ledger.store.integrity import remember_intact, require_intact
from ledger.store.layout import first_row, sql_path
from ledger.store.port import SealResult
from ledger.store.rollup_files import FINE, LEVELS, RollupInfo, write_rollup
from ledger.store.segments import (
    Manifest,
    SegmentInfo,
    SegmentSummary,
    file_sha256,
    fsync_dir,
    segment_path,
    summarise,
)
from ledger.store.sorted_writer import write_sorted_range

_LEVEL_NAMES = tuple(level.name for level in LEVELS)


@dataclass(frozen=True, slots=True)
class SealKind:
    """Where one kind of hot row (postings, archived messages) is sealed, and how."""

    table: str
    root: Path
    manifest: Manifest
    in_range: str  # the rows of one source range ($inc, $topic, $part, $first, $last)
    order: str  # the order of rows in a segment file; it begins with `offset_column`
    offset_column: str  # the rows' source offset


class Segmenter:
    """Writes the segments of one data directory with the writer's connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection, segments_root: Path, archive_root: Path):
        self._con = con
        # Called after a seal's manifests are written and before its hot rows are dropped
        # (`ledger.store.replica`: publish to the object store); raising keeps the rows hot.
        self.publish: Callable[[], object] | None = None
        self.postings = SealKind(
            "postings",
            segments_root,
            Manifest(segments_root),
            "incarnation = $inc AND src_topic = $topic AND src_partition = $part "
            "AND src_offset BETWEEN $first AND $last",
            "src_offset, txn_id, leg",
            "src_offset",
        )
        self.archive = SealKind(
            "raw_events",
            archive_root,
            Manifest(archive_root),
            'incarnation = $inc AND topic = $topic AND "partition" = $part '
            'AND "offset" BETWEEN $first AND $last',
            '"offset"',
            '"offset"',
        )

    def seal_committed(self, before_copies: Callable[[], object] | None = None) -> SealResult:
        """Write every committed, unsealed source range out to its postings and archive
        segments, then drop those rows from the hot tables and mark the ranges sealed.
        `before_copies` is called once there is something to seal, before the first file is
        written (the writer checkpoints there: `ledger.store.hot_memory`); raising seals nothing.

        The archive manifest is written before the postings manifest, so the archive never lags
        the postings a reader sees; an interrupted seal leaves its ranges unsealed, and the next
        one writes the same files again.
        """
        result = SealResult()
        con = self._con
        groups = con.execute(
            'SELECT incarnation, topic, "partition", min(first_offset), max(last_offset) '
            "FROM source_ranges WHERE NOT sealed GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        if groups:
            if before_copies is not None:
                before_copies()
            entries = {s.path: s for s in self.postings.manifest.load()}
            archive = {s.path: s for s in self.archive.manifest.load()}
            before = (list(entries.values()), list(archive.values()))
            for incarnation, topic, partition, first, last in groups:
                info = self.write_segment(incarnation, topic, partition, first, last)
                entries[info.path] = info
                result.sealed.append(info)
                kept = self.seal_range(self.archive, incarnation, topic, partition, first, last)
                if kept is not None:  # a range committed without its messages has none
                    archive[kept.path] = kept
                    result.archived.append(kept)
            self.archive.manifest.save(archive.values())
            self.postings.manifest.save(entries.values())
            if self.publish is not None:
                try:
                    self.publish()
                except BaseException:  # the rows stay hot: the manifests must not name them
                    self.archive.manifest.save(before[1])
                    self.postings.manifest.save(before[0])
                    raise
            con.execute("BEGIN TRANSACTION")
            try:
                for incarnation, topic, partition, first, last in groups:
                    params = [incarnation, topic, partition, first, last]
                    con.execute(
                        "DELETE FROM posting_rows WHERE incarnation = ? AND src_topic = ? "
                        "AND src_partition = ? AND src_offset BETWEEN ? AND ?",
                        params,
                    )
                    con.execute(
                        "DELETE FROM usage_rows WHERE incarnation = ? AND topic = ? "
                        'AND "partition" = ? AND "offset" BETWEEN ? AND ?',
                        params,
                    )
                    con.execute(
                        "DELETE FROM raw_events WHERE incarnation = ? AND topic = ? "
                        'AND "partition" = ? AND "offset" BETWEEN ? AND ?',
                        params,
                    )
                    con.execute(
                        "UPDATE source_ranges SET sealed = TRUE WHERE incarnation = ? "
                        'AND topic = ? AND "partition" = ? AND first_offset >= ? '
                        "AND last_offset <= ?",
                        params,
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return result

    def write_segment(
        self, incarnation: str, topic: str, partition: int, first: int, last: int
    ) -> SegmentInfo:
        info = self.seal_range(self.postings, incarnation, topic, partition, first, last)
        assert info is not None
        return info

    def seal_range(
        self, kind: SealKind, incarnation: str, topic: str, partition: int, first: int, last: int
    ) -> SegmentInfo | None:
        """Write the hot rows of one source range to their segment; None when there are none.
        The rows are sorted a slice of offsets at a time (`ledger.store.sorted_writer`)."""
        rel = segment_path(incarnation, topic, partition, first, last)
        params: dict[str, object] = {
            "inc": incarnation,
            "topic": topic,
            "part": partition,
            "first": first,
            "last": last,
        }
        if kind is self.archive:  # a range committed without its messages has no archive
            row = first_row(
                self._con.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {kind.table} WHERE {kind.in_range})", params
                )
            )
            if not row or not row[0]:
                return None
        return self._write_segment_file(
            kind,
            rel,
            (kind.table, kind.in_range, params),
            incarnation,
            topic,
            partition,
            first,
            last,
        )

    def _write_segment_file(
        self,
        kind: SealKind,
        rel: str,
        rows_of: tuple[str, str, dict[str, object]],
        incarnation: str,
        topic: str,
        partition: int,
        first: int,
        last: int,
    ) -> SegmentInfo:
        """Write the rows `rows_of` names (source, condition, parameters: hot rows of a range,
        or sealed files merged) to a segment in its order (`ledger.store.sorted_writer`): to a
        temporary name, fsynced and renamed; roll it up (postings) and describe it for the
        manifest."""
        target = kind.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            source, in_range, params = rows_of
            rows = write_sorted_range(
                self._con, source, in_range, kind.offset_column, kind.order, params, tmp
            )
            with tmp.open("rb") as handle:
                os.fsync(handle.fileno())
            tmp.replace(target)
            summary: SegmentSummary | None = None
            extent: tuple[int | None, int | None] = (None, None)
            levels: dict[str, RollupInfo | None] = dict.fromkeys(_LEVEL_NAMES)
            if kind is self.postings:
                summary, extent, levels = self._roll_up(target, rel)
            fsync_dir(target.parent)
            sha256 = file_sha256(target)
        except (OSError, duckdb.IOException) as exc:
            tmp.unlink(missing_ok=True)
            raise SealError(str(target), io_reason(exc)) from exc
        remember_intact(target, sha256)
        return SegmentInfo(
            path=rel,
            incarnation=incarnation,
            topic=topic,
            partition=partition,
            first_offset=first,
            last_offset=last,
            rows=rows,
            sha256=sha256,
            min_start_us=extent[0],
            max_end_us=extent[1],
            summary=summary,
            unknown=(),
            **levels,
        )

    def _roll_up(
        self, segment: Path, rel: str
    ) -> tuple[SegmentSummary, tuple[int | None, int | None], dict[str, RollupInfo | None]]:
        """The summary, interval extent and rollups (written beside it, every level) of the
        postings segment just written at `segment`. A level derived from another
        (`RollupLevel.derived_from`) is aggregated from that one's file, and the summary and
        extent from the fine rollup's: the same values from a fraction of the rows (`verify`
        checks every level against the segment itself)."""
        con = self._con
        levels: dict[str, RollupInfo | None] = {}
        written: dict[str, Path] = {}
        for level in LEVELS:
            path = level.path(rel)
            target = self.postings.root / path
            source = segment if level.derived_from is None else written[level.derived_from]
            rows = write_rollup(con, source, target, level, level.derived_from is not None)
            written[level.name] = target
            sha256 = file_sha256(target)
            remember_intact(target, sha256)
            levels[level.name] = RollupInfo(path, rows, sha256)
        summary, extent = summarise(con, f"read_parquet('{sql_path(written[FINE.name])}')")
        return summary, extent, levels

    def compact(self, kind: SealKind, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        segments = kind.manifest.load()
        by_partition: dict[tuple[str, str, int], list[SegmentInfo]] = {}
        for seg in segments:
            by_partition.setdefault((seg.incarnation, seg.topic, seg.partition), []).append(seg)
        runs: list[list[SegmentInfo]] = []
        for segs in by_partition.values():
            segs.sort(key=lambda s: s.first_offset)
            run: list[SegmentInfo] = []
            total = 0
            for seg in segs:
                adjacent = not run or run[-1].last_offset + 1 == seg.first_offset
                if seg.rows < below_rows and adjacent and total + seg.rows <= below_rows:
                    run.append(seg)
                    total += seg.rows
                    continue
                if len(run) >= min_segments:
                    runs.append(run)
                run, total = ([seg], seg.rows) if seg.rows < below_rows else ([], 0)
            if len(run) >= min_segments:
                runs.append(run)
        if not runs:
            return []
        keep = {s.path: s for s in segments}
        merged: list[SegmentInfo] = []
        for run in runs:
            head, tail = run[0], run[-1]
            files = ", ".join(
                f"'{sql_path(require_intact(kind.root / s.path, s.sha256))}'" for s in run
            )
            rel = segment_path(
                head.incarnation, head.topic, head.partition, head.first_offset, tail.last_offset
            )
            info = self._write_segment_file(
                kind,
                rel,
                _merged(files),
                head.incarnation,
                head.topic,
                head.partition,
                head.first_offset,
                tail.last_offset,
            )
            if info.rows != sum(s.rows for s in run):
                raise StoreError(f"compaction of {rel} lost rows")
            for seg in run:
                keep.pop(seg.path, None)
            keep[info.path] = info
            merged.append(info)
        kind.manifest.save(keep.values())
        return merged

    def align_archive(self) -> list[SegmentInfo]:
        """Merge the archive segments that lie within one postings segment into one of the same
        range and name, so the archive is cut as the postings are (compaction merges postings
        segments by their rows; archived messages are far fewer and larger than postings).
        Run on every seal, it also finishes an alignment a crash interrupted."""
        archive = self.archive.manifest.load()
        runs: list[tuple[SegmentInfo, list[SegmentInfo]]] = []
        for seg in self.postings.manifest.load():
            parts = [
                a
                for a in archive
                if (a.incarnation, a.topic, a.partition)
                == (seg.incarnation, seg.topic, seg.partition)
                and seg.first_offset <= a.first_offset
                and a.last_offset <= seg.last_offset
            ]
            if len(parts) > 1:
                runs.append((seg, sorted(parts, key=lambda a: a.first_offset)))
        if not runs:
            return []
        kind = self.archive
        keep = {a.path: a for a in archive}
        merged: list[SegmentInfo] = []
        for seg, parts in runs:
            files = ", ".join(
                f"'{sql_path(require_intact(kind.root / a.path, a.sha256))}'" for a in parts
            )
            info = self._write_segment_file(
                kind,
                seg.path,
                _merged(files),
                seg.incarnation,
                seg.topic,
                seg.partition,
                seg.first_offset,
                seg.last_offset,
            )
            if info.rows != sum(a.rows for a in parts):
                raise StoreError(f"aligning the archive of {seg.path} lost messages")
            for part in parts:
                keep.pop(part.path, None)
            keep[info.path] = info
            merged.append(info)
        kind.manifest.save(keep.values())
        return merged

    def remove_unlisted_files(self) -> int:
        """Delete segment and archive files their manifest does not name (leftovers of
        interrupted work)."""
        removed = 0
        for kind in (self.postings, self.archive):
            listed = {kind.root / path for s in kind.manifest.load() for path in s.files()}
            for path in kind.root.rglob("*.parquet"):
                if path not in listed:
                    path.unlink(missing_ok=True)
                    removed += 1
            for path in kind.root.rglob(".*.tmp-*"):
                path.unlink(missing_ok=True)
        return removed


def _merged(files: str) -> tuple[str, str, dict[str, object]]:
    """The rows of the sealed `files` (a SQL list of paths) merged, for `_write_segment_file`;
    by name: archive segments from before a column was added lack it (NULL)."""
    return f"read_parquet([{files}], union_by_name = true)", "TRUE", {}


_ERRNO = re.compile(r'"errno"\s*:\s*"?(\d+)')


def io_reason(exc: BaseException) -> str:
    """What the system said about a failed write: the OS's words for its errno (`No space left
    on device`) when there is one, from an `OSError` or a DuckDB I/O error; else the message."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    found = _ERRNO.search(str(exc))
    if found is not None:
        return os.strerror(int(found.group(1)))
    return str(exc)
