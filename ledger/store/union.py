"""A read cache of a sharded ledger: every shard pulled as a data directory of its own, and the
union of them that every reader reads as one ledger (the rules: `ledger.store.union_rules`).

    <cache>/shards/<name>/             each shard, as `replica.pull_ledger` brings one ledger:
                                       its manifests, segments, side files, `ledger.json`;
                                       `verify` checks each as a ledger of its own
    <cache>/segments/manifest.json     the union: every shard's entries, paths prefixed
    <cache>/segments/shards/<name>/…   hard links to the shard's files (no bytes copied)
    <cache>/archive/…                  the same for the raw-event archive
    <cache>/segments/<side files>      the union's: admin log, inventory, audit trail (the
                                       global shard's), refused.json (summed), closed/ (periods
                                       every shard closed)
    <cache>/ledger.json                the shards' one time zone
    <cache>/union.json                 which shards the union was made of (and the shards'
                                       closed records each union record was computed from)

`shard_heads` finds the shards by one listing of the folders under `shards/` (on S3, with a
delimiter: never a listing of every shard's objects) and one read of each folder's head;
`pull_shards` pulls each shard from that head (a shard whose head changed mid-pull so that an
object it named is gone is pulled again with its new head, as one ledger's pull is). A cache
that held the store's one ledger when shards appeared links that ledger's files as the root
shard's (`shards/_root/`) before its pull, so it is not downloaded again.
then writes the union: links first, then the side files and the identity, then the archive's
manifest and the postings' manifest last — so a reader reads the previous union or the new one,
whole (a link it still reads stays until the new manifest is written, even when its shard's
compaction removed the shard's own name for the file). Links no manifest names are removed
afterwards, and the trees of shards that are gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import duckdb
import orjson

from ledger.closing import ClosedPeriod
from ledger.errors import SegmentError
from ledger.periods import zone_name
from ledger.store.head import HEAD_KEY, Head
from ledger.store.identity import IDENTITY_NAME, recorded_zone
from ledger.store.integrity import remember_intact, require_intact
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR, sql_list
from ledger.store.objects import ObjectStore, PrefixedStore
from ledger.store.replica import published_head, pull_ledger, side_files
from ledger.store.segments import Manifest, SegmentInfo, atomic_write_bytes
from ledger.store.side_files import (
    CLOSED_DIR,
    REFUSED_NAME,
    closed_period_path,
    load_closed_periods,
    load_refused,
    period_checksum,
    write_refused,
)
from ledger.store.union_rules import (
    ROOT_SHARD,
    SHARDS_PREFIX,
    closed_in_union,
    common_zone,
    ordered,
    shard_entry,
    shard_of_head_key,
    shard_prefix,
    side_source,
    summed_refused,
    union_record,
)

UNION_NAME = "union.json"
UNION_VERSION = 1
_ROOTS = (ARCHIVE_DIR, SEGMENTS_DIR)  # the archive's manifest is written first


def shard_heads(store: ObjectStore) -> dict[str, Head]:
    """The shards `store` holds (each folder under `shards/` with a head,
    `shards/<name>/head.json`) and their heads, by name: one listing of the folders and one
    read of each head — never a listing of the shards' objects."""
    heads: dict[str, Head] = {}
    for name in store.folders(SHARDS_PREFIX):
        if shard_of_head_key(f"{shard_prefix(name)}/{HEAD_KEY}") is None:
            continue  # not a shard's name
        head = published_head(PrefixedStore(store, shard_prefix(name)))
        if head is not None:
            heads[name] = head
    return heads


def is_union(data_dir: Path) -> bool:
    """Whether `data_dir` is the read cache of a sharded ledger."""
    return (data_dir / UNION_NAME).is_file()


def union_shards(data_dir: Path) -> list[str]:
    """The shards the union in `data_dir` is made of, in the union's order."""
    return list(_marker(data_dir).get("shards", []))


def shard_dir(data_dir: Path, name: str) -> Path:
    """Where the shard `name` of the union in `data_dir` is cached, as a data directory."""
    return data_dir / SHARDS_PREFIX / name


def pull_shards(
    store: ObjectStore, cache: Path, heads: Mapping[str, Head], attempts: int = 3
) -> None:
    """Pull every shard of `store` (those of `heads`, each from the head read there, and a
    ledger at its root, if any) into `cache` and write their union there."""
    members = list(heads)
    _seed_root(cache)
    if pull_ledger(store, shard_dir(cache, ROOT_SHARD), attempts):
        members.append(ROOT_SHARD)  # else: its tree (if any) is removed below
    for name, head in heads.items():
        shard = PrefixedStore(store, shard_prefix(name))
        pull_ledger(shard, shard_dir(cache, name), attempts, head)
    build_union(cache, ordered(members))
    shards_root = cache / SHARDS_PREFIX
    for gone in sorted(shards_root.iterdir()) if shards_root.is_dir() else []:
        if gone.name not in members:
            shutil.rmtree(gone, ignore_errors=True)


def _seed_root(cache: Path) -> None:
    """When `cache` holds the store's one ledger and is about to become a union (the store
    now has shards), link its files as the root shard's (`shards/_root/`), each checked against
    its manifest first, so the root's pull fetches only what changed since, not the whole
    ledger again. The plain ledger's own names go when the union's manifests replace its."""
    root = shard_dir(cache, ROOT_SHARD)
    if is_union(cache) or root.exists():
        return
    for top in _ROOTS:
        for seg in Manifest(cache / top).load():
            for rel, sha256 in _files(seg):
                try:
                    require_intact(cache / top / rel, sha256)
                except SegmentError:
                    continue  # missing or damaged: the pull fetches it
                _link(cache / top / rel, root / top / rel, sha256)


def drop_union(cache: Path) -> None:
    """Turn a cache that held a union back into a plain one (the store is no longer sharded):
    the shards' trees, the union's side files and records go; the next pull writes the one
    ledger's, and removes the union's links as files its manifests do not name."""
    if not is_union(cache):
        return
    shutil.rmtree(cache / SHARDS_PREFIX, ignore_errors=True)
    segments = cache / SEGMENTS_DIR
    for path in side_files(segments):
        path.unlink(missing_ok=True)
    (cache / IDENTITY_NAME).unlink(missing_ok=True)
    (cache / UNION_NAME).unlink()


def build_union(cache: Path, members: list[str]) -> None:
    """Write the union of the shards cached under `cache/shards/` (`members`, in the union's
    order) as `cache`'s ledger (the order: the module's)."""
    dirs = {name: shard_dir(cache, name) for name in members}
    zones = {name: zone_name(recorded_zone(d)) for name, d in dirs.items()}
    common_zone(zones)  # a SegmentError naming two shards that differ
    entries: dict[str, list[SegmentInfo]] = {}
    for root in _ROOTS:
        entries[root] = []
        for name, d in dirs.items():
            for seg in Manifest(d / root).load():
                for rel, sha256 in _files(seg):
                    _link(d / root / rel, cache / root / shard_prefix(name) / rel, sha256)
                entries[root].append(shard_entry(seg, name))
    closed = _write_side_files(cache, dirs, entries[SEGMENTS_DIR])
    identities = [d / IDENTITY_NAME for d in dirs.values() if (d / IDENTITY_NAME).is_file()]
    if identities:
        _write_if_changed(cache / IDENTITY_NAME, identities[0].read_bytes())
    else:
        (cache / IDENTITY_NAME).unlink(missing_ok=True)
    doc = {"version": UNION_VERSION, "shards": members, "closed": closed}
    _write_if_changed(cache / UNION_NAME, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for root in _ROOTS:  # the archive's manifest first, the postings' last
        Manifest(cache / root).save(entries[root])
    for root in _ROOTS:
        named = {cache / root / path for seg in entries[root] for path in seg.files()}
        folder = cache / root
        for path in folder.rglob("*.parquet"):
            if path not in named:
                path.unlink(missing_ok=True)


def _files(seg: SegmentInfo) -> list[tuple[str, str]]:
    return [(seg.path, seg.sha256), *((r.path, r.sha256) for r in seg.rollups())]


def _link(source: Path, target: Path, sha256: str) -> None:
    """`target` as another name of the shard's file `source` (a copy where the filesystem has
    no hard links); known intact, as the shard's pull just checked `source`."""
    try:
        if os.path.samefile(source, target):
            return
    except FileNotFoundError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    tmp.replace(target)
    remember_intact(target, sha256)


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, data)


def _write_side_files(
    cache: Path, dirs: dict[str, Path], postings: list[SegmentInfo]
) -> dict[str, dict[str, list[object]]]:
    """Write the union's side files (removing those it no longer has); the shards' closed
    records each union record was computed from (period → shard → [rows, sha256])."""
    segments = cache / SEGMENTS_DIR
    keep: set[Path] = set()
    source = side_source(dirs)
    if source is not None:  # admin log, inventory, audit trail: the global shard's
        own = dirs[source] / SEGMENTS_DIR
        for path in side_files(own):
            rel = path.relative_to(own)
            if rel.parts[0] != CLOSED_DIR and rel.name != REFUSED_NAME:
                _write_if_changed(segments / rel, path.read_bytes())
                keep.add(segments / rel)
    if any((d / SEGMENTS_DIR / REFUSED_NAME).is_file() for d in dirs.values()):
        groups = summed_refused(load_refused(d / SEGMENTS_DIR) for d in dirs.values())
        write_refused(segments, groups)
        keep.add(segments / REFUSED_NAME)
    closed, written = _write_closed(cache, dirs, postings)
    keep |= written
    for path in side_files(segments):
        if path not in keep:
            path.unlink(missing_ok=True)
    return closed


def _write_closed(
    cache: Path, dirs: dict[str, Path], postings: list[SegmentInfo]
) -> tuple[dict[str, dict[str, list[object]]], set[Path]]:
    """The union's closed-period records: one per period every shard closed, computed from
    the union's postings unless the shards' records are those it was computed from last."""
    segments = cache / SEGMENTS_DIR
    records = {
        name: {c.period: c for c in load_closed_periods(d / SEGMENTS_DIR)}
        for name, d in dirs.items()
    }
    before = _marker(cache).get("closed", {})
    closed: dict[str, dict[str, list[object]]] = {}
    written: set[Path] = set()
    con: duckdb.DuckDBPyConnection | None = None
    try:
        for period in closed_in_union({name: list(r) for name, r in records.items()}):
            inputs: dict[str, list[object]] = {
                name: [r[period].rows, r[period].sha256] for name, r in records.items()
            }
            path = closed_period_path(segments, period)
            closed[period] = inputs
            written.add(path)
            if before.get(period) == inputs and path.is_file():
                continue
            con = con or duckdb.connect(":memory:")
            rows, sha256 = _union_checksum(con, cache, postings, period)
            shards = {name: r[period] for name, r in records.items()}
            _write_record(path, union_record(period, shards, rows, sha256))
    finally:
        if con is not None:
            con.close()
    return closed, written


def _union_checksum(
    con: duckdb.DuckDBPyConnection, cache: Path, postings: list[SegmentInfo], period: str
) -> tuple[int, str]:
    """(rows, sha256) of the union's postings booked into `period` (`ledger.closing`)."""
    files = [
        cache / SEGMENTS_DIR / seg.path
        for seg in postings
        if seg.summary is None or period in seg.summary.periods
    ]
    if not files:
        return 0, hashlib.sha256(b"").hexdigest()
    return period_checksum(con, f"read_parquet([{sql_list(files)}])", period)


def _write_record(path: Path, record: ClosedPeriod) -> None:
    atomic_write_bytes(path, json.dumps(asdict(record), indent=1).encode())


def _marker(data_dir: Path) -> dict[str, Any]:
    try:
        doc = json.loads((data_dir / UNION_NAME).read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError:
        return {}  # rewritten by the next pull
    return doc if isinstance(doc, dict) else {}
