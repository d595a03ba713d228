"""The sealed ledger on an object store (`ledger.store.objects`): the writer's `Publisher`,
which puts what a seal wrote there, and the readers' `pull`, which brings it into a local
read cache that every reader (reports, exports, verify, rebuild, the dashboard) reads as an
ordinary data directory.

The writer seals into its local data directory as always (`ledger.store.sealing`), then
publishes, in this order:

1. every segment, segment rollup and archive segment the local manifests name that the store
   lacks;
2. the side files (admin log, closed periods, dead-letter summary, inventory, audit trail) and
   the ledger's identity (`ledger.json`: the time zone its books are kept in,
   `ledger.store.identity`), so a reader elsewhere books nothing into the wrong months;
3. the archive manifest, and the postings manifest **last**.

An object is named by a manifest only once it is stored (a PUT is atomic per object), so a
reader never finds a manifest naming a missing or partial object. The hot rows of a seal are
dropped only after the postings manifest naming them is stored: a publish that fails (the
store is down, refuses, times out) is retried a few times, and then the seal fails as a full
disk fails it — the local manifests are put back, the rows stay hot, and the next seal writes
and publishes the same files again. Nothing is lost and nothing half-done is visible.

Objects a new manifest no longer names (parts merged by a compaction, files of an interrupted
publish) are deleted only `grace_s` after the writer first published a manifest without them,
so a reader that read the previous manifest can still fetch every object it names.

`pull` reads the postings manifest first and the archive manifest after it (so the archive
never lags the postings, as on local disk), fetches the objects they name that the cache lacks,
each checked against the sha256 its manifest records, then the side files and the identity,
and writes the cache's manifests last; cached files no manifest names are removed (local
readers retry a file that vanished, as they do for a local compaction).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ledger.errors import SealError, SegmentError
from ledger.store.identity import IDENTITY_NAME
from ledger.store.integrity import remember_intact, require_intact
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.objects import ObjectStore, S3Settings, open_object_store
from ledger.store.sealing import io_reason
from ledger.store.segments import (
    MANIFEST_NAME,
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


def _side_files(segments_root: Path) -> list[Path]:
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
    """Publishes one data directory's sealed ledger to `store` (one writer per store)."""

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
    ) -> None:
        self.data_dir = Path(data_dir)
        self.store = store
        self.grace_s = grace_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._clock = clock
        self._stored: dict[str, int] | None = None  # segment key -> size, as stored
        self._put: dict[str, str] = {}  # side file / manifest key -> sha256 last put
        self._superseded: dict[str, float] = {}  # segment key -> when first unnamed
        # a directory with no sealed ledger yet must not publish over a store that has one
        self._checked = (self.data_dir / SEGMENTS_DIR / MANIFEST_NAME).is_file()

    def push(self) -> PushResult:
        """Publish what the local manifests name (see the module's order), retried; a store
        that keeps failing raises a `SealError` naming it and its reason."""
        last: OSError | None = None
        for attempt in range(self.attempts):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._push_once()
            except OSError as exc:
                last = exc
                self._stored = None  # list again: a failed PUT may or may not have landed
        assert last is not None
        where = self.store.describe()
        if isinstance(last.filename, str) and not last.filename.startswith(where):
            where = f"{where}/{last.filename}"  # the key the store refused
        raise SealError(where, io_reason(last))

    def _check_target(self) -> None:
        """Refuse (a `SealError`, not retried) a store holding a sealed ledger while this data
        directory has none: a new or lost writer's disk, or another ledger's `segments_url`.
        Publishing would replace that ledger's manifest with this one's."""
        key = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"
        raw = _get_or_none(self.store, key)
        if raw is not None and parse_manifest(raw, f"{self.store.describe()}/{key}"):
            raise SealError(
                f"{self.store.describe()}/{key}",
                f"the store holds a sealed ledger and {self.data_dir} has none; refusing to "
                "replace it (restore the data directory, or set another segments_url)",
            )
        self._checked = True

    def _push_once(self) -> PushResult:
        result = PushResult()
        if not self._checked:
            self._check_target()
        if self._stored is None:
            self._stored = {o.key: o.size for o in self.store.list() if o.key.endswith(".parquet")}
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
                key = f"{root}/{rel}"
                named.add(key)
                local = require_intact(self.data_dir / root / rel, sha256)
                if stored.get(key) == local.stat().st_size:
                    continue  # same name, same range: the same rows (sealing is deterministic)
                data = local.read_bytes()
                self.store.put(key, data)
                stored[key] = len(data)
                result.put.append(key)
        segments_root = self.data_dir / SEGMENTS_DIR
        side = [
            (f"{SEGMENTS_DIR}/{p.relative_to(segments_root).as_posix()}", p.read_bytes())
            for p in _side_files(segments_root)
        ]
        identity = self.data_dir / IDENTITY_NAME
        if identity.is_file():
            side.append((IDENTITY_NAME, identity.read_bytes()))
        for key, data in side + manifests:  # the postings manifest last
            digest = _sha256(data)
            if self._put.get(key) != digest:
                self.store.put(key, data)
                self._put[key] = digest
                result.put.append(key)
        result.deleted = self._collect(named)
        return result

    def _collect(self, named: set[str]) -> list[str]:
        """Delete the stored segments no published manifest has named for `grace_s`."""
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
    retried with the newer manifests; the store unreachable raises its `OSError`."""
    cache = Path(cache_dir)
    for attempt in range(attempts):
        try:
            _pull_once(store, cache)
            return cache
        except FileNotFoundError as exc:
            if attempt == attempts - 1:
                raise SegmentError(f"{store.describe()}: {exc}") from exc
    return cache


def _pull_once(store: ObjectStore, cache: Path) -> None:
    raw: dict[str, bytes | None] = {}
    raw[SEGMENTS_DIR] = _get_or_none(store, f"{SEGMENTS_DIR}/{MANIFEST_NAME}")
    raw[ARCHIVE_DIR] = _get_or_none(store, f"{ARCHIVE_DIR}/{MANIFEST_NAME}")  # after postings
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
                _fetch(store, f"{root}/{rel}", target, sha256)
    manifest_key = f"{SEGMENTS_DIR}/{MANIFEST_NAME}"
    for obj in store.list(f"{SEGMENTS_DIR}/"):
        if obj.key.endswith(".parquet") or obj.key == manifest_key:
            continue
        atomic_write_bytes(cache / obj.key, store.get(obj.key))
    identity = _get_or_none(store, IDENTITY_NAME)
    if identity is not None:
        atomic_write_bytes(cache / IDENTITY_NAME, identity)
    for root in _ROOTS:  # the archive's manifest first, the postings' last
        text = raw[root]
        if text is not None:
            atomic_write_bytes(cache / root / MANIFEST_NAME, text)
    for root in _ROOTS:
        folder = cache / root
        if folder.is_dir():
            for path in folder.rglob("*.parquet"):
                if path not in named[root]:
                    path.unlink(missing_ok=True)


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
