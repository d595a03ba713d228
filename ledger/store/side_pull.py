"""A narrow read of a published ledger: only some of its side files — the admin log, the
inventory, the audit trail, the ledger's identity — straight from the object store, for the
readers that read nothing else (`tally admin apply`, `tally request …`, `tally ledger close`,
`tally inventory list|cordon|uncordon`, `tally audit`). `replica.pull` would bring the whole
sealed ledger into a read cache first: every segment, rollup and archive manifest, which is
gigabytes to download for a fresh pod that reads one small file.

`pull_side` reads what a full pull reads first and stops there: the head (of a sharded store,
the folders under `shards/` and each shard's head, as `union.shard_heads` reads them, and the
root's head), then the version the head names of each file asked for, checked against the
sha256 the head records. Every file comes from one head, read once (never a mix of two heads);
where a file the head names is gone (deleted after its grace period, since a newer head no
longer names it) the head is read again, as a full pull does, and a file still missing after
that, or whose bytes do not match the head, is a `SegmentError` naming the object. Nothing is
written to disk.

A published head is a ledger, whether or not it names postings yet (its writer has opened it,
as a writer's own directory is a ledger from its first open: `replica.pull` writes empty
manifests for it); a store published before heads is one when it holds a postings manifest.

Of a sharded store the files are those the union of the shards would hold
(`ledger.store.union_rules`), with the union's checks: every member's identity is read and
they must name one time zone (`common_zone`: the same `SegmentError` a full pull raises), the
union's identity being the first member's in the union's order that has one; the side files
(admin log, inventory, audit trail) are the global shard's, else the root ledger's, else none
(a full pull takes them from that one shard too). A store published before heads existed is
read as it is (each file under its own path).
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ledger.errors import SegmentError
from ledger.periods import zone_name
from ledger.store.head import Head, version_key
from ledger.store.identity import IDENTITY_NAME, zone_of_record
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.objects import ObjectStore, PrefixedStore
from ledger.store.replica import published_head
from ledger.store.segments import MANIFEST_NAME
from ledger.store.union import shard_heads
from ledger.store.union_rules import (
    ROOT_SHARD,
    common_zone,
    ordered,
    shard_prefix,
    side_source,
)

_POSTINGS_MANIFEST = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"


@dataclass(frozen=True, slots=True)
class PublishedSide:
    """Side files of the published ledger, as one head names them: by their path in a data
    directory (`segments/admin-log.json`, `ledger.json`); a path absent: the ledger has no such
    file. `where`: the store (or its shard) each was read from, for messages."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    where: Mapping[str, str] = field(default_factory=dict)

    def get(self, path: str) -> bytes | None:
        return self.files.get(path)

    def describe(self, path: str) -> str:
        """Where the file at `path` was read from (an object store's URL and the path)."""
        return f"{self.where.get(path, '')}/{path}"


class _Source(Protocol):
    """One published ledger's files, as one reader sees them."""

    def names(self, path: str) -> bool:
        """Whether the ledger has a file at `path`."""
        ...

    def read(self, path: str) -> bytes | None:
        """The file at `path`; None when the ledger has none."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _HeadSource:
    """The files one head names, each version checked against the sha256 the head records."""

    store: ObjectStore
    head: Head

    def names(self, path: str) -> bool:
        return path in self.head.file_map()

    def read(self, path: str) -> bytes | None:
        sha256 = self.head.file_map().get(path)
        if sha256 is None:
            return None
        key = version_key(path, sha256)
        where = f"{self.store.describe()}/{key}"
        try:
            data = self.store.get(key)
        except FileNotFoundError as exc:  # retried with the head read again
            raise FileNotFoundError(errno.ENOENT, "named by the head", where) from exc
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SegmentError(f"{where}: checksum does not match the head")
        return data

    def describe(self) -> str:
        return self.store.describe()


@dataclass(frozen=True, slots=True)
class _LegacySource:
    """The files of a store published before heads existed: each under its own path."""

    store: ObjectStore

    def names(self, path: str) -> bool:
        return self.read(path) is not None  # one GET (a listing would list the folder's tree)

    def read(self, path: str) -> bytes | None:
        try:
            return self.store.get(path)
        except FileNotFoundError:
            return None

    def describe(self) -> str:
        return self.store.describe()


def pull_side(store: ObjectStore, paths: Sequence[str], attempts: int = 3) -> PublishedSide | None:
    """The files at `paths` (relative to a data directory) of the ledger published in `store`,
    as its head names them now; None when the store holds no ledger (no head, no shard, no
    postings manifest published before heads). An object the head names that is missing is
    retried with the head read again, then a `SegmentError` naming it; shards keeping their
    books in different time zones are a `SegmentError` naming two; the store unreachable raises
    its `OSError`."""
    for attempt in range(attempts):
        try:
            return _pull_once(store, paths)
        except FileNotFoundError as exc:
            if attempt == attempts - 1:
                raise SegmentError(
                    f"{exc.filename}: the published head names it, but the store does not hold "
                    "it (deleted, or never stored): the sealed ledger cannot be read as of "
                    "that head"
                ) from exc
    return None


def _pull_once(store: ObjectStore, paths: Sequence[str]) -> PublishedSide | None:
    heads = shard_heads(store)
    root = _root_ledger(store)  # a member of the union whenever it is published
    if not heads:
        return None if root is None else _read({path: [root] for path in paths})
    members: dict[str, _Source] = {
        name: _HeadSource(PrefixedStore(store, shard_prefix(name)), head)
        for name, head in heads.items()
    }
    if root is not None:
        members[ROOT_SHARD] = root
    # every member's identity, checked for one time zone as the union's pull checks it; the
    # union's: the first member's in the union's order that has one
    identities = {name: members[name].read(IDENTITY_NAME) for name in ordered(members)}
    common_zone(
        {
            name: zone_name(zone_of_record(raw, f"{members[name].describe()}/{IDENTITY_NAME}"))
            for name, raw in identities.items()
        }
    )
    side = side_source(members)  # side files: the global shard's, else the root's, else none
    files: dict[str, bytes] = {}
    where: dict[str, str] = {}
    for path in paths:
        found: Sequence[tuple[str, bytes | None]]
        if path == IDENTITY_NAME:
            found = [(n, raw) for n, raw in identities.items() if raw is not None][:1]
        else:
            found = [] if side is None else [(side, members[side].read(path))]
        for name, data in found:
            if data is not None:
                files[path], where[path] = data, members[name].describe()
    return PublishedSide(files, where)


def _root_ledger(store: ObjectStore) -> _Source | None:
    """The ledger published at the store's root: one with a head (named postings or not: a
    writer has opened it, as a writer's own directory is a ledger from its first open), or one
    published before heads with a postings manifest (a reader's `has_ledger`); None: none."""
    head = published_head(store)
    if head is not None:
        return _HeadSource(store, head)
    legacy = _LegacySource(store)
    return legacy if legacy.names(_POSTINGS_MANIFEST) else None


def _read(sources: Mapping[str, Sequence[_Source]]) -> PublishedSide:
    """Each path's file from the first of its sources that has one."""
    files: dict[str, bytes] = {}
    where: dict[str, str] = {}
    for path, candidates in sources.items():
        for source in candidates:
            data = source.read(path)
            if data is not None:
                files[path], where[path] = data, source.describe()
                break
    return PublishedSide(files, where)
