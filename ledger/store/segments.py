"""Sealed Parquet segments, the raw-event archive, and the manifests that list them.

A segment holds the postings of one source partition's offset range and is named from it:

    segments/<topic>/<incarnation>/p<partition>/<first offset>-<last offset>.parquet

so sealing the same range twice (after a crash) writes the same file. The manifest
(`segments/manifest.json`) is the list readers trust: a file is visible only once the manifest,
written atomically, names it, and a compacted segment replaces its parts in one manifest write.
Files the manifest does not name are leftovers of an interrupted seal or compaction and are
removed by the writer.

The raw-event archive keeps every consumed message (its source coordinates, key and value
bytes, and the commit batch that applied it) beside the segments, sealed with them and named
the same way under a root of its own:

    archive/<topic>/<incarnation>/p<partition>/<first offset>-<last offset>.parquet

listed by `archive/manifest.json` (the same format). It lives outside `segments/` so that no
reader of postings can ever mistake a message file for postings. An archive segment covers the
same offset range as the postings segment sealed with it, and when compaction merges postings
segments the archive segments within the merged range are merged alike, so both are cut the
same way and per partition the two manifests cover the same offsets; `ledger.store.verify` checks
the coverage.

Each postings segment's manifest entry also carries its `SegmentSummary` (the periods booked,
the teams charged, the pools and models used, the span of its usage), computed from the written
file by `summarise_segment`, so the pages' filters and "now" need no scan of the ledger
(`ledger.read.rollups.extent`). Segments are immutable, so a summary never goes stale; `verify`
recomputes it, and an entry without one (an older manifest) is summarised when read.

Each postings segment sealed since rollups exist has a rollup beside it
(`<first>-<last>.rollup.parquet`, `ledger.store.rollup_files`: its postings summed per period,
account, unit, owner, job, model, pool and hour), written with the segment and named by the
same entry (`SegmentInfo.rollup`, with its own sha256), so the two become visible together; so is
its coarse, daily, metered, jobs and gpus rollups (`<first>-<last>.coarse.parquet`,
`….daily.parquet`, `….metered.parquet`, `….jobs.parquet`, `….gpus.parquet`: `SegmentInfo.coarse`,
`.daily`, `.metered`, `.jobs`, `.gpus`).
The manifest is forward compatible: an entry's keys this code does not know (a level a newer
writer adds) are kept and written back unchanged (`SegmentInfo.unknown`), and the files such a
key names (shaped like a rollup's entry) count as the entry's — published, pulled, never
removed as strays — though nothing here reads them.

Every entry records the sha256 of its file. Readers take the files to read from
`Manifest.checked` / `Manifest.files`, which check each one against its checksum
(`ledger.store.integrity`, once per process per file) and raise a `SegmentError` naming a
missing or damaged file; a manifest that is cut short or not JSON raises one naming the byte
where it breaks. Files under the root that the manifest does not list (`Manifest.strays`) are
never read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from ledger.errors import SegmentError
from ledger.store.integrity import file_sha256, require_intact
from ledger.store.layout import sql_path
from ledger.store.rollup_files import RollupInfo

__all__ = ["file_sha256"]  # re-exported: the checksum every manifest entry records

MANIFEST_NAME = "manifest.json"
ARCHIVE_DIR = "archive"
MANIFEST_VERSION = 1
_CHECK_RETRIES = 3
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# SegmentInfo's rollup fields
_ROLLUP_ENTRIES = ("rollup", "coarse", "daily", "metered", "jobs", "gpus")


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What one postings segment holds, for filters and time spans without a scan: the periods
    its postings are booked into (and those its usage is booked into), the teams on consumer
    accounts, the pools and models with usage, and the first start and last end of its usage
    intervals (None: no usage)."""

    periods: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    usage_first_us: int | None = None
    usage_last_us: int | None = None
    usage_periods: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, entry: dict[str, object]) -> SegmentSummary:
        def texts(name: str) -> tuple[str, ...]:
            values = entry.get(name) or ()
            if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
                raise TypeError(f"summary {name}: expected a list of strings")
            return tuple(values)

        def time(name: str) -> int | None:
            value = entry.get(name)
            if value is not None and type(value) is not int:
                raise TypeError(f"summary {name}: expected an integer")
            return value

        return cls(
            texts("periods"),
            texts("teams"),
            texts("pools"),
            texts("models"),
            time("usage_first_us"),
            time("usage_last_us"),
            texts("usage_periods"),
        )


# A segment's postings, few rows per segment: the distinct values a summary lists and, per
# them, the first start and last end (`summary_of` folds them).
_SUMMARY_SQL = (
    "SELECT period, kind = 'usage', "
    "CASE WHEN account LIKE 'consumer:%' THEN team END, pool, model, "
    "min(start_us), max(end_us) FROM {source} GROUP BY ALL"
)
_SummaryRow = tuple[str | None, bool, str | None, str | None, str | None, int | None, int | None]


def summarise_segment(con: duckdb.DuckDBPyConnection, path: Path) -> SegmentSummary:
    """The summary of the postings segment file at `path` (raises duckdb.Error if unreadable)."""
    return summarise(con, f"read_parquet('{sql_path(path)}')")[0]


def summarise(
    con: duckdb.DuckDBPyConnection, source: str
) -> tuple[SegmentSummary, tuple[int | None, int | None]]:
    """The summary of the postings of `source` (a relation with the postings' `period`, `kind`,
    `account`, `team`, `pool`, `model`, `start_us` and `end_us`, such as the finest grouping
    of a segment read as postings, `rollup_files.as_postings_sql`), and the first start and last
    end of all of them (None: no postings)."""
    return summary_of(con.execute(_SUMMARY_SQL.format(source=source)).fetchall())


def summary_of(
    rows: list[_SummaryRow],
) -> tuple[SegmentSummary, tuple[int | None, int | None]]:
    """A summary (and extent) from `_SUMMARY_SQL`'s rows: each (period, whether usage, the team
    of a consumer account, pool, model, first start, last end)."""

    def texts(values: Iterable[str | None]) -> tuple[str, ...]:
        return tuple(sorted({v for v in values if v is not None}))

    usage = [row for row in rows if row[1]]
    firsts = [row[5] for row in usage if row[5] is not None]
    lasts = [row[6] for row in usage if row[6] is not None]
    summary = SegmentSummary(
        texts(row[0] for row in rows),
        texts(row[2] for row in rows),
        texts(row[3] for row in usage if row[3]),
        texts(row[4] for row in usage if row[4]),
        min(firsts, default=None),
        max(lasts, default=None),
        texts(row[0] for row in usage),
    )
    starts = [row[5] for row in rows if row[5] is not None]
    ends = [row[6] for row in rows if row[6] is not None]
    return summary, (min(starts, default=None), max(ends, default=None))


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One sealed segment as the manifest records it. `path` is relative to the segments root."""

    path: str
    incarnation: str
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    rows: int
    sha256: str
    min_start_us: int | None
    max_end_us: int | None
    summary: SegmentSummary | None = None  # postings segments only
    rollup: RollupInfo | None = None  # postings segments sealed with one (`rollup_files`)
    coarse: RollupInfo | None = None  # its coarse rollup (`rollup_files.COARSE`), likewise
    daily: RollupInfo | None = None  # its daily rollup (`rollup_files.DAILY`), likewise
    metered: RollupInfo | None = None  # its metered rollup (`rollup_files.METERED`), likewise
    jobs: RollupInfo | None = None  # its jobs rollup (`rollup_files.JOBS`), likewise
    gpus: RollupInfo | None = None  # its gpus rollup (`rollup_files.GPUS`), likewise
    # Entries this code does not know (a newer writer's levels), as (key, JSON text): kept and
    # written back as they were; those shaped like a rollup name files of the entry's.
    unknown: tuple[tuple[str, str], ...] = ()

    def rollups(self) -> tuple[RollupInfo, ...]:
        """This entry's rollup files (fine, coarse, daily, metered, jobs, gpus), those it has,
        then those of levels this code does not know (`unknown`): published, pulled and kept
        with the segment, though no query here reads them."""
        known = (r for r in map(self.rollup_of, _ROLLUP_ENTRIES) if r is not None)
        return (*known, *_unknown_rollups(self.unknown))

    def rollup_of(self, level: str) -> RollupInfo | None:
        """Its rollup of the level named `level` (`RollupLevel.name`: one of `_ROLLUP_ENTRIES`)."""
        found: RollupInfo | None = getattr(self, level)
        return found

    def files(self) -> tuple[str, ...]:
        """The paths (relative to the root) of this entry's files: the segment, its rollups."""
        return (self.path, *(r.path for r in self.rollups()))


def safe_name(text: str) -> str:
    """A path component made from `text`: unsafe characters become `_`."""
    cleaned = _SAFE.sub("_", text)
    return cleaned or "_"


def segment_path(incarnation: str, topic: str, partition: int, first: int, last: int) -> str:
    return (
        f"{safe_name(topic)}/{safe_name(incarnation)}/p{partition:04d}/"
        f"{first:020d}-{last:020d}.parquet"
    )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader sees the old file or the new one, never a torn one.

    A write that fails (the disk is full) leaves the old file and no temporary one, and raises
    the `OSError` with `path` as its file name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    fsync_dir(path.parent)


_FIELDS = frozenset(SegmentInfo.__dataclass_fields__) - {"unknown"}


def _segment_info(entry: dict[str, object]) -> SegmentInfo:
    summary = entry.get("summary")
    if summary is not None and not isinstance(summary, dict):
        raise TypeError("summary: expected an object")
    levels: dict[str, RollupInfo | None] = {}
    for name in _ROLLUP_ENTRIES:
        value = entry.get(name)
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{name}: expected an object")
        levels[name] = None if value is None else RollupInfo.from_dict(value)
    fields = {
        k: v for k, v in entry.items() if k in _FIELDS and k not in ("summary", *_ROLLUP_ENTRIES)
    }
    # forward compatible: a newer writer's entries (a rollup level added since) are kept as
    # they are, not refused
    unknown = tuple(
        (k, json.dumps(v, sort_keys=True)) for k, v in sorted(entry.items()) if k not in _FIELDS
    )
    return SegmentInfo(
        **fields,  # type: ignore[arg-type]
        summary=None if summary is None else SegmentSummary.from_dict(summary),
        **levels,  # type: ignore[arg-type]
        unknown=unknown,
    )


def _unknown_rollups(unknown: tuple[tuple[str, str], ...]) -> tuple[RollupInfo, ...]:
    """The files that entries of levels this code does not know name: each one shaped like a
    rollup's entry (path, rows, sha256)."""
    found = []
    for _, text in unknown:
        value = json.loads(text)
        if isinstance(value, dict):
            try:
                found.append(RollupInfo.from_dict(value))
            except TypeError:
                continue
    return tuple(found)


class Manifest:
    """The manifest file of a segments (or archive) root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / MANIFEST_NAME

    def load(self) -> list[SegmentInfo]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return parse_manifest(raw, str(self.path))

    def checked(self) -> list[SegmentInfo]:
        """The segments listed, each file checked against its checksum (`require_intact`): a
        missing or damaged one raises a `SegmentError` naming it. A file that vanished because
        a compaction replaced it meanwhile is retried with the new manifest."""
        for _ in range(_CHECK_RETRIES - 1):
            segments = self.load()
            try:
                for seg in segments:
                    require_intact(self.root / seg.path, seg.sha256)
                return segments
            except SegmentError:
                if self.load() == segments:
                    raise
        segments = self.load()
        for seg in segments:
            require_intact(self.root / seg.path, seg.sha256)
        return segments

    def checked_where(self, wanted: Callable[[SegmentInfo], bool]) -> list[SegmentInfo]:
        """The listed segments `wanted` picks, each checked as `checked` checks them (retried
        when a compaction replaced one meanwhile); the others are not read, so not checked."""
        for attempt in range(_CHECK_RETRIES):
            segments = [s for s in self.load() if wanted(s)]
            try:
                for seg in segments:
                    require_intact(self.root / seg.path, seg.sha256)
                return segments
            except SegmentError:
                if (
                    attempt == _CHECK_RETRIES - 1
                    or [s for s in self.load() if wanted(s)] == segments
                ):
                    raise
        raise AssertionError("unreachable")

    def strays(self) -> list[Path]:
        """Segment files under the root the manifest does not list (leftovers of an interrupted
        seal, or files put there by hand): readers never read them, the writer removes them."""
        listed = {self.root / path for s in self.load() for path in s.files()}
        return sorted(p for p in self.root.rglob("*.parquet") if p not in listed)

    def save(self, segments: Iterable[SegmentInfo]) -> None:
        ordered = sorted(
            segments, key=lambda s: (s.topic, s.incarnation, s.partition, s.first_offset)
        )
        doc = {"version": MANIFEST_VERSION, "segments": [_entry(s) for s in ordered]}
        atomic_write_bytes(self.path, json.dumps(doc, indent=1).encode())

    def files(self) -> list[Path]:
        """The files of `checked`: every one intact, or a `SegmentError`."""
        return [self.root / s.path for s in self.checked()]


def _entry(seg: SegmentInfo) -> dict[str, object]:
    """A manifest entry; `rollup` and `coarse` only when there is one (older readers' entries
    stay as they were)."""
    entry = asdict(seg)
    for name in _ROLLUP_ENTRIES:
        if entry[name] is None:
            del entry[name]
    del entry["unknown"]
    entry.update((k, json.loads(text)) for k, text in seg.unknown)
    return entry


def parse_manifest(raw: bytes, where: str) -> list[SegmentInfo]:
    """The entries of the manifest text `raw` (read from `where`, named in errors); raises a
    `SegmentError` naming the damage."""
    try:
        doc = json.loads(raw.decode())
    except UnicodeDecodeError as exc:
        raise SegmentError(
            f"{where}: unreadable manifest: not UTF-8 text at byte {exc.start}"
        ) from exc
    except ValueError as exc:
        raise SegmentError(f"{where}: unreadable manifest: {_json_damage(raw, exc)}") from exc
    try:
        entries = doc["segments"]
        if not isinstance(entries, list):
            raise TypeError("segments: expected a list")
        infos = []
        for index, entry in enumerate(entries):
            try:
                infos.append(_segment_info(entry))
            except (KeyError, TypeError, ValueError) as exc:
                raise TypeError(f"entry {index}: {exc}") from exc
        return infos
    except (KeyError, TypeError) as exc:
        raise SegmentError(f"{where}: unreadable manifest: {exc}") from exc


def _json_damage(raw: bytes, exc: ValueError) -> str:
    """Where and how the JSON text `raw` breaks: cut short, or not JSON at a byte."""
    if not raw.strip():
        return f"empty ({len(raw)} bytes)"
    if isinstance(exc, json.JSONDecodeError):
        at = len(exc.doc[: exc.pos].encode())
        if at >= len(raw.rstrip()) or exc.msg.startswith("Unterminated string"):
            return f"truncated at byte {len(raw)} (the JSON ends before it is complete)"
        return f"not valid JSON at byte {at}: {exc.msg}"
    return f"not valid JSON: {exc}"
