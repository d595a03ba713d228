"""The sealed ledger on an object store (`ledger.store.objects`): the writer's `Publisher`,
which puts what a seal wrote there, and the readers' `pull`, which brings it into a local
read cache that every reader (reports, exports, verify, rebuild, the dashboard) reads as an
ordinary data directory.

The writer seals into its local data directory as always (`ledger.store.sealing`), then
publishes, in this order:

1. every segment, segment rollup and archive segment the local manifests name that the store
   lacks, each under its path with the start of its sha256 (`segment_key`): immutable, and
   never the key of other bytes;
2. a *version* of every file that changes from seal to seal — the side files (admin log, closed
   periods, dead-letter summary, inventory, audit trail), the ledger's identity (`ledger.json`:
   the time zone its books are kept in, `ledger.store.identity`), a shard's snapshot
   (`snapshot.tar`, `ledger.store.snapshot`: the fold state of the seal, which readers do not
   pull), the archive manifest and the postings manifest — each under its sha256
   (`versions/<path>/<sha256>`), also immutable;
3. the head (`head.json`, `ledger.store.head`), naming the version of each of those files:
   one conditional PUT that makes the whole seal visible at once, and fails (`WriterFenced`)
   for a writer another one has claimed the ledger from since.

A writer claims the ledger on its first publish (the head's epoch + 1). An object is named only
once it is stored, so a reader never finds a head naming a missing or partial object, and what a
fenced writer stored is named by no head, so it is never read. The hot rows of a seal are
dropped only after the head naming them is stored: a publish that fails (the store is down,
refuses, times out) is retried a few times, and then the seal fails as a full disk fails it —
the local manifests are put back, the rows stay hot, and the next seal writes and publishes the
same files again. Nothing is lost and nothing half-done is visible.

Objects the head no longer names (parts merged by a compaction, superseded versions, files of an
interrupted or fenced publish) are deleted only `grace_s` after the writer first published a
head without them, so a reader that read the previous head can still fetch every object it
names. A store published before heads existed (its manifests and side files under their own
paths) is read as it is until a writer claims it: the claim stores a version of each of those
files and names them, so readers see the same ledger before and after.

`pull` reads the head, then the postings manifest it names and the archive manifest after it
(so the archive never lags the postings, as on local disk), fetches the objects they name that
the cache lacks, each checked against the sha256 its manifest records, then the side files and
the identity, and writes the cache's manifests last (a head naming none — its writer has
sealed no postings yet, as a global shard before its first admin event — is a ledger with
nothing sealed: its manifests are written empty, so a reader finds a ledger as in the writer's
own directory); cached files no manifest names are removed (local readers retry a file that
vanished, as they do for a local compaction). A store holding shards
(`shards/<name>/head.json`, each a published ledger of its own) is pulled shard by shard and
read as their union (`ledger.store.union`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ledger.errors import SealError, SegmentError
from ledger.store.head import (
    HEAD_KEY,
    VERSIONS_DIR,
    Head,
    Writer,
    WriterFenced,
    decode_head,
    new_owner,
    segment_key,
    version_key,
)
from ledger.store.identity import IDENTITY_NAME
from ledger.store.integrity import remember_intact, require_intact
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR, SNAPSHOT_NAME
from ledger.store.objects import ObjectStore, S3Settings, WriteConflict, open_object_store
from ledger.store.sealing import io_reason
from ledger.store.segments import (
    MANIFEST_NAME,
    Manifest,
    SegmentInfo,
    atomic_write_bytes,
    parse_manifest,
)

REPLICA_DIR = "replica"  # under a reader's data directory: the read cache
DEFAULT_GRACE_S = 3600.0
_ROOTS = (ARCHIVE_DIR, SEGMENTS_DIR)  # the archive's manifest is published first


@dataclass
class PushResult:
    """What one publish stored and deleted (object keys)."""

    put: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def side_files(segments_root: Path) -> list[Path]:
    """The side files under a segments root: everything but segments, manifests and
    temporaries."""
    if not segments_root.is_dir():
        return []
    return sorted(
        p
        for p in segments_root.rglob("*")
        if p.is_file()
        and p.suffix != ".parquet"
        and not p.name.startswith(".")
        and p != segments_root / MANIFEST_NAME
    )


class Publisher:
    """Publishes one data directory's sealed ledger to `store`, as the writer that claimed it
    (`ledger.store.head`): one writer per store at a time; a writer another one has fenced
    raises `WriterFenced` from `push` and must stop."""

    def __init__(
        self,
        data_dir: Path | str,
        store: ObjectStore,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        attempts: int = 4,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.store = store
        self.grace_s = grace_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.owner = owner or new_owner()
        self._sleep = sleep
        self._clock = clock
        self._stored: dict[str, int] | None = None  # immutable object key -> size, as stored
        self._superseded: dict[str, float] = {}  # object key -> when first unnamed
        self._head: Head | None = None  # the head this writer last wrote (None: not claimed)
        self._tag: str | None = None  # its tag in the store
        # a directory with no sealed ledger yet must not publish over a store that has one
        self._had_ledger = (self.data_dir / SEGMENTS_DIR / MANIFEST_NAME).is_file()

    @property
    def writer(self) -> Writer | None:
        """This publisher's claim (None until its first `push` or `claim`)."""
        return None if self._head is None else self._head.writer

    def push(self) -> PushResult:
        """Publish what the local manifests name (see the module's order), retried; a store
        that keeps failing raises a `SealError` naming it and its reason, a writer fenced by
        another one `WriterFenced` (at once: retrying cannot help)."""
        last: OSError | None = None
        for attempt in range(self.attempts):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                if self._head is None:
                    self._claim_once()
                return self._push_once()
            except OSError as exc:
                last = exc
                self._stored = None  # list again: a failed PUT may or may not have landed
        assert last is not None
        where = self.store.describe()
        if isinstance(last.filename, str) and not last.filename.startswith(where):
            where = f"{where}/{last.filename}"  # the key the store refused
        raise SealError(where, io_reason(last))

    def claim(self) -> Writer:
        """Claim the published ledger for this writer (the head's epoch + 1), fencing whoever
        held it; retried like `push`."""
        for attempt in range(self.attempts):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._claim_once()
            except OSError as exc:
                last = exc
        assert last is not None
        raise SealError(self.store.describe(), io_reason(last))

    def _claim_once(self) -> Writer:
        where = f"{self.store.describe()}/{HEAD_KEY}"
        for _ in range(self.attempts):
            current, tag = _read_head(self.store)
            self._check_target(current)
            epoch = (current.writer.epoch if current else 0) + 1
            claimed = Head(
                Writer(epoch, self.owner),
                (current.sequence if current else 0) + 1,
                current.files if current else self._carry_legacy(),
            )
            try:
                self._tag = self.store.put_if(HEAD_KEY, claimed.encode(), tag)
            except WriteConflict:
                continue  # another writer wrote the head meanwhile: read it again
            self._head = claimed
            return claimed.writer
        raise SealError(where, "the head kept changing while this writer claimed it")

    def _carry_legacy(self) -> tuple[tuple[str, str], ...]:
        """Versions of the mutable files of a store published before heads existed, stored
        and returned as a head's `files`: the first head names the ledger readers saw."""
        legacy = _LegacyFiles(self.store)
        files = []
        for root in _ROOTS:  # each segment copied to its key under a head
            raw = legacy.read(f"{root}/{MANIFEST_NAME}")
            for rel, sha256 in _named_files([] if raw is None else parse_manifest(raw, root)):
                self.store.put(segment_key(root, rel, sha256), self.store.get(f"{root}/{rel}"))
        paths = [f"{root}/{MANIFEST_NAME}" for root in _ROOTS]
        for path in [*legacy.side_paths(), IDENTITY_NAME, *paths]:
            data = legacy.read(path)
            if data is not None:
                digest = _sha256(data)
                self.store.put(version_key(path, digest), data)
                files.append((path, digest))
        return tuple(sorted(files))

    def _check_target(self, current: Head | None) -> None:
        """Refuse (a `SealError`, not retried) a store holding a sealed ledger while this data
        directory has none: a new or lost writer's disk, or another ledger's `segments_url`.
        Publishing would replace that ledger's manifest with this one's."""
        if self._had_ledger:
            return
        key = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"
        source = _LegacyFiles(self.store) if current is None else _HeadFiles(self.store, current)
        raw = source.read(key)
        if raw is not None and parse_manifest(raw, f"{self.store.describe()}/{key}"):
            raise SealError(
                f"{self.store.describe()}/{key}",
                f"the store holds a sealed ledger and {self.data_dir} has none; refusing to "
                "replace it (restore the data directory, or set another segments_url)",
            )

    def _push_once(self) -> PushResult:
        assert self._head is not None
        result = PushResult()
        if self._stored is None:
            self._stored = {o.key: o.size for o in self.store.list() if _immutable(o.key)}
        stored = self._stored
        manifests: list[tuple[str, bytes]] = []
        named: set[str] = set()
        for root in _ROOTS:
            path = self.data_dir / root / MANIFEST_NAME
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            manifests.append((f"{root}/{MANIFEST_NAME}", raw))
            for rel, sha256 in _named_files(parse_manifest(raw, str(path))):
                key = segment_key(root, rel, sha256)
                named.add(key)
                local = require_intact(self.data_dir / root / rel, sha256)
                if stored.get(key) == local.stat().st_size:
                    continue  # same name, same range: the same rows (sealing is deterministic)
                data = local.read_bytes()
                self.store.put(key, data)
                stored[key] = len(data)
                result.put.append(key)
        segments_root = self.data_dir / SEGMENTS_DIR
        mutable = [
            (f"{SEGMENTS_DIR}/{p.relative_to(segments_root).as_posix()}", p.read_bytes())
            for p in side_files(segments_root)
        ]
        for name in (IDENTITY_NAME, SNAPSHOT_NAME):  # a shard's snapshot: `ledger.store.snapshot`
            path = self.data_dir / name
            if path.is_file():
                mutable.append((name, path.read_bytes()))
        files: dict[str, str] = {}
        for path_key, data in mutable + manifests:
            digest = _sha256(data)
            key = version_key(path_key, digest)
            if stored.get(key) != len(data):
                self.store.put(key, data)
                stored[key] = len(data)
                result.put.append(key)
            files[path_key] = digest
            named.add(key)
        head = Head(self._head.writer, self._head.sequence + 1, tuple(sorted(files.items())))
        if head.files != self._head.files:
            self._put_head(head)  # the one write that makes the seal visible
            result.put.append(HEAD_KEY)
        result.deleted = self._collect(named)
        return result

    def _put_head(self, head: Head) -> None:
        assert self._head is not None
        mine = self._head.writer
        try:
            self._tag = self.store.put_if(HEAD_KEY, head.encode(), self._tag)
            self._head = head
            return
        except WriteConflict:
            current, tag = _read_head(self.store)
        where = f"{self.store.describe()}/{HEAD_KEY}"
        if current is None or current.writer != mine:
            raise WriterFenced(where, mine, None if current is None else current.writer)
        # this writer's own head (a PUT that landed though its answer was lost): go on from it
        self._head, self._tag = current, tag
        self._put_head(Head(mine, current.sequence + 1, head.files))

    def _collect(self, named: set[str]) -> list[str]:
        """Delete the stored segments and versions no published head has named for
        `grace_s`."""
        assert self._stored is not None
        now = self._clock()
        deleted = []
        for key in sorted(self._stored):
            if key in named:
                self._superseded.pop(key, None)
                continue
            since = self._superseded.setdefault(key, now)
            if now - since >= self.grace_s:
                try:
                    self.store.delete(key)
                except OSError:
                    continue  # left for the next publish: a leftover, never read
                del self._stored[key]
                del self._superseded[key]
                deleted.append(key)
        return deleted


def _immutable(key: str) -> bool:
    """Whether `key` names an immutable object a writer stores (a segment or a version): the
    objects a writer deletes once no head names them. Only its own: a ledger published at a
    store's root never takes the objects of the shards beside it (`shards/…`) for its own."""
    if key.startswith(f"{VERSIONS_DIR}/"):
        return True
    return key.endswith(".parquet") and key.startswith(tuple(f"{root}/" for root in _ROOTS))


def _read_head(store: ObjectStore) -> tuple[Head | None, str | None]:
    try:
        raw, tag = store.get_tagged(HEAD_KEY)
    except FileNotFoundError:
        return None, None
    return decode_head(raw, f"{store.describe()}/{HEAD_KEY}"), tag


class _Files(Protocol):
    """The mutable files of a published ledger as one reader sees them."""

    def read(self, path: str) -> bytes | None:
        """The file at `path` (relative to a data directory); None when there is none."""
        ...

    def side_paths(self) -> list[str]:
        """The side files' paths (under `segments/`, not a manifest)."""
        ...

    def segment_key(self, root: str, rel: str, sha256: str) -> str:
        """The object key of the segment file a manifest under `root` names at `rel`."""
        ...


@dataclass(frozen=True, slots=True)
class _HeadFiles:
    """The files one head names, each version checked against the sha256 the head records."""

    store: ObjectStore
    head: Head

    def read(self, path: str) -> bytes | None:
        sha256 = self.head.file_map().get(path)
        if sha256 is None:
            return None
        key = version_key(path, sha256)
        data = self.store.get(key)
        if _sha256(data) != sha256:
            raise SegmentError(f"{self.store.describe()}/{key}: checksum does not match the head")
        return data

    def side_paths(self) -> list[str]:
        manifest = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"
        return [p for p, _ in self.head.files if p.startswith(f"{SEGMENTS_DIR}/") and p != manifest]

    def segment_key(self, root: str, rel: str, sha256: str) -> str:
        return segment_key(root, rel, sha256)


@dataclass(frozen=True, slots=True)
class _LegacyFiles:
    """The files of a store published before heads existed: each under its own path."""

    store: ObjectStore

    def read(self, path: str) -> bytes | None:
        return _get_or_none(self.store, path)

    def side_paths(self) -> list[str]:
        manifest = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"
        return [
            o.key
            for o in self.store.list(f"{SEGMENTS_DIR}/")
            if not o.key.endswith(".parquet") and o.key != manifest
        ]

    def segment_key(self, root: str, rel: str, sha256: str) -> str:
        return f"{root}/{rel}"


def _named_files(entries: list[SegmentInfo]) -> list[tuple[str, str]]:
    """(path, sha256) of every file the manifest entries name: segments and their rollups
    (every level)."""
    named = [(seg.path, seg.sha256) for seg in entries]
    named += [(r.path, r.sha256) for seg in entries for r in seg.rollups()]
    return named


def _fetch(store: ObjectStore, key: str, target: Path, sha256: str) -> None:
    data = store.get(key)
    if _sha256(data) != sha256:
        raise SegmentError(f"{store.describe()}/{key}: checksum does not match the manifest")
    atomic_write_bytes(target, data)
    remember_intact(target, sha256)


def _get_or_none(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get(key)
    except FileNotFoundError:
        return None


def pull(store: ObjectStore, cache_dir: Path | str, attempts: int = 3) -> Path:
    """Bring the sealed ledger in `store` into `cache_dir` (a data directory readers read) and
    return `cache_dir`. An object that vanished meanwhile (deleted after its grace period) is
    retried with the newer manifests; the store unreachable raises its `OSError`. A store of
    shards (`shards/<name>/head.json`) is pulled shard by shard and read as their union
    (`ledger.store.union`)."""
    from ledger.store import union  # which builds on this module's pull of one ledger

    cache = Path(cache_dir)
    heads = union.shard_heads(store)
    if heads:
        union.pull_shards(store, cache, heads, attempts)
    else:
        union.drop_union(cache)  # the store was sharded when this cache was last pulled
        pull_ledger(store, cache, attempts)
    return cache


def pull_ledger(
    store: ObjectStore, cache: Path, attempts: int = 3, head: Head | None = None
) -> bool:
    """Bring the one published ledger in `store` (its head's, or a store's published before
    heads) into `cache`, retried as `pull` says; whether the store holds one (False: nothing
    was written). `head`: the store's head as the caller just read it, which the first
    attempt pulls (a retry reads the head again)."""
    for attempt in range(attempts):
        try:
            return _pull_once(store, cache, head if attempt == 0 else None)
        except FileNotFoundError as exc:
            if attempt == attempts - 1:
                raise SegmentError(f"{store.describe()}: {exc}") from exc
    return False


def pull_ledger_with(
    store: ObjectStore, cache: Path, path: str, attempts: int = 3
) -> tuple[bool, bytes | None]:
    """`pull_ledger`, and the file at `path` (relative to a data directory) as the head the
    pull read names it: never a version of another head (None: that head names none, or the
    store has no head)."""
    for attempt in range(attempts):
        head, _ = _read_head(store)
        try:
            found = _pull_once(store, cache, head)
            return found, None if head is None else _HeadFiles(store, head).read(path)
        except FileNotFoundError as exc:  # deleted after a newer head: pull that one
            if attempt == attempts - 1:
                raise SegmentError(f"{store.describe()}: {exc}") from exc
    return False, None


def _published_files(store: ObjectStore) -> _Files:
    head, _ = _read_head(store)
    return _LegacyFiles(store) if head is None else _HeadFiles(store, head)


def read_published(store: ObjectStore, path: str) -> bytes | None:
    """The file at `path` (relative to a data directory: `segments/manifest.json`) as the
    store's head names it now (or, in a store published before heads, as stored); None when
    the published ledger has none."""
    return _published_files(store).read(path)


def published_head(store: ObjectStore) -> Head | None:
    """The head of the ledger published in `store` (None: none, or published before heads)."""
    return _read_head(store)[0]


def _pull_once(store: ObjectStore, cache: Path, head: Head | None) -> bool:
    # the one read of the head (unless the caller read it)
    source = _published_files(store) if head is None else _HeadFiles(store, head)
    raw: dict[str, bytes | None] = {}
    raw[SEGMENTS_DIR] = source.read(f"{SEGMENTS_DIR}/{MANIFEST_NAME}")
    raw[ARCHIVE_DIR] = source.read(f"{ARCHIVE_DIR}/{MANIFEST_NAME}")  # after postings
    if isinstance(source, _LegacyFiles) and raw[SEGMENTS_DIR] is raw[ARCHIVE_DIR] is None:
        return False  # no head and no ledger published before heads: nothing to list
    named: dict[str, set[Path]] = {root: set() for root in _ROOTS}
    for root in _ROOTS:
        text = raw[root]
        if text is None:
            continue
        entries = parse_manifest(text, f"{store.describe()}/{root}/{MANIFEST_NAME}")
        for rel, sha256 in _named_files(entries):
            target = cache / root / rel
            named[root].add(target)
            try:
                require_intact(target, sha256)
            except SegmentError:
                _fetch(store, source.segment_key(root, rel, sha256), target, sha256)
    for side in source.side_paths():
        data = source.read(side)
        if data is not None:
            atomic_write_bytes(cache / side, data)
    identity = source.read(IDENTITY_NAME)
    if identity is not None:
        atomic_write_bytes(cache / IDENTITY_NAME, identity)
    for root in _ROOTS:  # the archive's manifest first, the postings' last
        text = raw[root]
        if text is not None:
            atomic_write_bytes(cache / root / MANIFEST_NAME, text)
        elif isinstance(source, _HeadFiles):  # a ledger with nothing sealed yet: empty
            Manifest(cache / root).save([])
    for root in _ROOTS:
        folder = cache / root
        if folder.is_dir():
            for path in folder.rglob("*.parquet"):
                if path not in named[root]:
                    path.unlink(missing_ok=True)
    # False: no head, and no ledger published before heads either
    return isinstance(source, _HeadFiles) or raw[SEGMENTS_DIR] is not None


def store_from_env(environ: Mapping[str, str]) -> ObjectStore | None:
    """The store a child process was handed in its environment (`TALLY_SEGMENTS_URL`,
    `TALLY_SEGMENTS_ENDPOINT_URL`, `TALLY_SEGMENTS_REGION`; credentials from the AWS
    variables); None when none was."""
    url = environ.get("TALLY_SEGMENTS_URL")
    if not url:
        return None
    settings = S3Settings(
        endpoint_url=environ.get("TALLY_SEGMENTS_ENDPOINT_URL") or None,
        region=environ.get("TALLY_SEGMENTS_REGION") or "us-east-1",
    )
    return open_object_store(url, settings)
