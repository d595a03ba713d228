"""A narrow read of a published ledger: only some of its side files — the admin log, the
ledger's identity — straight from the object store, for the readers that read nothing else
(`tally admin apply`, `tally request …`, `tally ledger close`). `replica.pull` would bring the
whole sealed ledger into a read cache first: every segment, rollup and archive manifest, which
is gigabytes to download for a fresh pod that reads one small file.

`pull_side` reads what a full pull reads first and stops there: the head (of a sharded store,
the folders under `shards/` and each shard's head, as `union.shard_heads` reads them), then the
version the head names of each file asked for, checked against the sha256 the head records.
Every file comes from one head, read once (never a mix of two heads); where a file the head
names is gone (deleted after its grace period, since a newer head no longer names it) the head
is read again, as a full pull does, and a file still missing after that, or whose bytes do not
match the head, is a `SegmentError` naming the object. Nothing is written to disk.

Of a sharded store the files are those the union of the shards would hold
(`ledger.store.union_rules`): the side files (admin log, inventory, audit trail) the global
shard's, else the root ledger's, else none; the identity the first shard's in the union's order
that has one. A store published before heads existed is read as it is (each file under its own
path).
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ledger.errors import SegmentError
from ledger.store.head import Head, version_key
from ledger.store.identity import IDENTITY_NAME
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.objects import ObjectStore, PrefixedStore
from ledger.store.replica import published_head
from ledger.store.segments import MANIFEST_NAME
from ledger.store.union import shard_heads
from ledger.store.union_rules import GLOBAL_SHARD, ROOT_SHARD, ordered, shard_prefix

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
    as its head names them now; None when the store holds no sealed ledger (no head naming a
    postings manifest, no shard, nothing published before heads). An object the head names that
    is missing is retried with the head read again, then a `SegmentError` naming it; the store
    unreachable raises its `OSError`."""
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
    if not heads:
        root, sealed = _root_ledger(store)
        if root is None or not sealed:
            return None
        return _read({path: [root] for path in paths})
    shards: dict[str, _Source] = {
        name: _HeadSource(PrefixedStore(store, shard_prefix(name)), head)
        for name, head in heads.items()
    }
    if GLOBAL_SHARD not in shards or not all(
        shards[GLOBAL_SHARD].names(p) for p in paths if p == IDENTITY_NAME
    ):
        root, _ = _root_ledger(store)  # a member of the union whenever it is published
        if root is not None:
            shards[ROOT_SHARD] = root
    # side files: the global shard's, else the root ledger's, else none; the identity: the
    # first shard's in the union's order that has one
    side = [n for n in ordered(shards) if n in (GLOBAL_SHARD, ROOT_SHARD)][:1]
    return _read(
        {
            path: [shards[n] for n in (ordered(shards) if path == IDENTITY_NAME else side)]
            for path in paths
        }
    )


def _root_ledger(store: ObjectStore) -> tuple[_Source | None, bool]:
    """The ledger published at the store's root (None: none) and whether it has a postings
    manifest (a reader's `has_ledger`)."""
    head = published_head(store)
    if head is not None:
        source = _HeadSource(store, head)
        return source, source.names(_POSTINGS_MANIFEST)
    legacy = _LegacySource(store)
    return (legacy, True) if legacy.names(_POSTINGS_MANIFEST) else (None, False)


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
