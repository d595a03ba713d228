"""A shard's snapshot: the fold state its writer holds once a seal has dropped the sealed rows,
published with that seal, so the next owner takes the shard up by loading it instead of
replaying the shard's whole archive (`streams.shards`, `docs/architecture.md` "Shards").

What it holds is every table of the hot database (`ledger.store.hot_tables`, `hot_audit`,
`hot_identity`) but the rows a seal drops (`posting_rows`, `usage_rows`, `raw_events`: empty
once sealed) and what is no fold's state: the outbox and the messages the broker refused, which
a replay does not make either (the previous owner sent its outbox), and the `current_period`
mark of the balances sent. So it is what `ledger.store.rebuild.replay` rebuilds from the sealed
archive: applied offsets (`source_ranges`, sealed, one range per source partition: a writer
reads only each one's last offset and the last batch), the dedupe ids and scopes, idle
states, GPU assignment timelines, open holds, balances, the admin log, closed periods, the
audit trail, job owners and suspense, reversals, inventory and dead letters; and the prunes
recorded for the next batch (`ledger_meta`), as a replay's would be. The worker prunes right
after a seal, so a snapshot, taken inside the seal, never holds a prune its archive lacks.

Form: one tar file (`SNAPSHOT_NAME` in the data directory) of a `snapshot.json` (format, the
epoch of the writer that took it — 0 for one taken after a replay, before any claim — the last
archived batch and the sealed offset of each source partition) and one Parquet file per table.
The writer takes it inside the seal, after the manifests and before the publish
(`ledger.store.published`), and the `Publisher` stores it as a version the head names
(`ledger.store.head`): it is published by the same conditional put as the seal's manifests, so a
reader of one head never pairs it with another head's segments; a fenced writer's snapshot is
named by no head and so never loaded; and a superseded one is deleted `grace_s` after no head
names it, like every version. A seal that fails to publish puts the previous snapshot back with
the manifests.

Taking up (`take_up`): the snapshot is checked against the sealed ledger pulled with it (its
sealed offsets may not pass the postings manifest's), loaded into a fresh hot database, and the
archived batches after its last one are folded on top (normally none: every seal takes one)
and dropped from the hot tables as the sealed rows they are; the applied offsets must then be
the manifest's. Anything else — no snapshot (a ledger written before snapshots), another
format, a table missing or of other columns, other offsets — is a `SnapshotMismatch` naming
why, and the caller replays the whole archive instead.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ledger.errors import StoreError
from ledger.store.hot import DuckDBStore
from ledger.store.hot_audit import AUDIT_DDL
from ledger.store.hot_identity import IDENTITY_DDL
from ledger.store.hot_tables import HOT_TABLES_DDL
from ledger.store.layout import HOT_DB_NAME, SEGMENTS_DIR, SNAPSHOT_NAME, WRITER_SETTINGS
from ledger.store.port import SealResult
from ledger.store.rebuild import Difference, ReplaySettings, archive_batches, fold_batches
from ledger.store.segments import Manifest, atomic_write_bytes

SNAPSHOT_FORMAT = 1
_META = "snapshot.json"
# Hot tables that are not fold state: the rows a seal drops, and what is owed to the broker.
NOT_FOLD_STATE = frozenset({"posting_rows", "usage_rows", "raw_events", "outbox", "undeliverable"})
_NOT_STATE_META = ("current_period",)  # the balances sent: a new owner sends its own
_SEALED_ROWS = ("posting_rows", "usage_rows", "raw_events")

SourceKey = tuple[str, str, int]  # (incarnation, topic, partition)
# The applied ranges as one sealed range per source partition: all a writer reads of them is
# each partition's last offset and the last batch (the table keeps one row per batch for good).
_SOURCE_RANGES = (
    'SELECT incarnation, topic, "partition", min(first_offset) AS first_offset, '
    "max(last_offset) AS last_offset, max(committed_at_us) AS committed_at_us, "
    "TRUE AS sealed, max(batch_seq) AS batch_seq FROM source_ranges GROUP BY ALL"
)


class SnapshotMismatch(Exception):
    """The snapshot cannot stand for the sealed ledger it was pulled with (the reason)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A decoded snapshot: who took it, its last archived batch, each source partition's
    sealed offset (the last applied) and its tables."""

    epoch: int
    batch_seq: int
    sealed: Mapping[SourceKey, int]
    tables: Mapping[str, pa.Table]


@dataclass(frozen=True, slots=True)
class TakenUp:
    """A shard taken up from its snapshot: the snapshot's writer epoch and the archived batches
    folded after it."""

    epoch: int
    batches: int


def _state_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
        "AND table_type = 'BASE TABLE' ORDER BY table_name"
    ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]) not in NOT_FOLD_STATE]


def _sealed_offsets(con: duckdb.DuckDBPyConnection) -> dict[SourceKey, int]:
    rows = con.execute(
        'SELECT incarnation, topic, "partition", max(last_offset) FROM source_ranges GROUP BY ALL'
    ).fetchall()
    return {(str(i), str(t), int(p)): int(last) for i, t, p, last in rows}


def take_snapshot(con: duckdb.DuckDBPyConnection, epoch: int) -> bytes:
    """The fold state of the hot database `con` as it is once every committed range is sealed
    (inside a seal: its ranges are all being sealed), as a snapshot file's bytes."""
    tables: dict[str, pa.Table] = {}
    for name in _state_tables(con):
        query, params = f"SELECT * FROM {name}", None
        if name == "source_ranges":
            query = _SOURCE_RANGES
        elif name == "ledger_meta":
            query = "SELECT * FROM ledger_meta WHERE NOT list_contains($skip, key)"
            params = {"skip": list(_NOT_STATE_META)}
        tables[name] = con.sql(query, params=params).to_arrow_table()
    row = con.execute("SELECT coalesce(max(batch_seq), 0) FROM source_ranges").fetchall()
    meta = {
        "format": SNAPSHOT_FORMAT,
        "epoch": epoch,
        "batch_seq": int(row[0][0]),
        "sealed": [[*key, last] for key, last in sorted(_sealed_offsets(con).items())],
        "tables": sorted(tables),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, _META, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
        for name, table in sorted(tables.items()):
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink, compression="zstd")
            _add(tar, f"{name}.parquet", sink.getvalue().to_pybytes())
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)  # mtime 0: the same state is the same bytes (no new version)
    tar.addfile(info, io.BytesIO(data))


def write_snapshot(con: duckdb.DuckDBPyConnection, data_dir: Path, epoch: int) -> bytes | None:
    """Write the snapshot of `con` (`take_snapshot`) to the data directory; the one it
    replaces (None: none), for `put_back`."""
    path = data_dir / SNAPSHOT_NAME
    try:
        previous: bytes | None = path.read_bytes()
    except FileNotFoundError:
        previous = None
    atomic_write_bytes(path, take_snapshot(con, epoch))
    return previous


def put_back(data_dir: Path, previous: bytes | None) -> None:
    """Undo `write_snapshot` (its seal failed to publish)."""
    path = data_dir / SNAPSHOT_NAME
    if previous is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write_bytes(path, previous)


def read_snapshot(raw: bytes) -> Snapshot:
    """The snapshot in `raw`; a `SnapshotMismatch` naming what is wrong with it."""
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
            members: dict[str, bytes] = {}
            for member in tar.getmembers():
                handle = tar.extractfile(member)
                if handle is not None:
                    members[member.name] = handle.read()
        meta = orjson.loads(members[_META])
        if meta["format"] != SNAPSHOT_FORMAT:
            raise SnapshotMismatch(f"format {meta['format']!r}, this build reads {SNAPSHOT_FORMAT}")
        tables = {
            str(n): pq.read_table(pa.BufferReader(members[f"{n}.parquet"])) for n in meta["tables"]
        }
        sealed = {(str(i), str(t), int(p)): int(last) for i, t, p, last in meta["sealed"]}
        return Snapshot(int(meta["epoch"]), int(meta["batch_seq"]), sealed, tables)
    except SnapshotMismatch:
        raise
    except (tarfile.TarError, KeyError, TypeError, ValueError, pa.ArrowException) as exc:
        raise SnapshotMismatch(f"unreadable: {exc!r}") from exc


def manifest_offsets(data_dir: Path) -> dict[SourceKey, int]:
    """Each source partition's last offset the sealed postings in `data_dir` cover."""
    offsets: dict[SourceKey, int] = {}
    for seg in Manifest(data_dir / SEGMENTS_DIR).load():
        key = (seg.incarnation, seg.topic, seg.partition)
        offsets[key] = max(offsets.get(key, -1), seg.last_offset)
    return offsets


def load_snapshot(snapshot: Snapshot, data_dir: Path) -> None:
    """Write the hot database of `data_dir` (which has none) with the snapshot's tables, into
    the schema of this build; a `SnapshotMismatch` when a table is missing or does not fit."""
    db = data_dir / HOT_DB_NAME
    if db.exists():
        raise FileExistsError(db)
    con = duckdb.connect(str(db))
    try:
        con.execute(WRITER_SETTINGS + HOT_TABLES_DDL + AUDIT_DDL + IDENTITY_DDL)
        con.execute("BEGIN TRANSACTION")
        for name in _state_tables(con):
            table = snapshot.tables.get(name)
            if table is None:
                raise SnapshotMismatch(f"it has no table {name} (taken by an older Tally)")
            con.register("snapshot_rows", table)
            try:
                con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM snapshot_rows")
            except duckdb.Error as exc:
                raise SnapshotMismatch(f"its table {name} does not fit: {exc}") from exc
            finally:
                con.unregister("snapshot_rows")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        db.unlink(missing_ok=True)
        raise
    con.close()


class _Unsealable(DuckDBStore):
    """The store the batches after a snapshot are folded into. Their rows are sealed already
    (the pulled ledger holds them), so it cannot seal them again (a period's close seals first):
    the snapshot is then refused, before anything is written beside the pulled ledger."""

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        raise SnapshotMismatch("a batch after it closes a period, which seals first")


def _seal_folded(data_dir: Path) -> None:
    """Mark what was folded after a snapshot sealed and drop its rows: the sealed ledger pulled
    holds them already (a seal drops them the same way)."""
    con = duckdb.connect(str(data_dir / HOT_DB_NAME))
    try:
        con.execute("BEGIN TRANSACTION")
        for table in _SEALED_ROWS:
            con.execute(f"DELETE FROM {table}")
        con.execute("UPDATE source_ranges SET sealed = TRUE")
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
    finally:
        con.close()


def take_up(raw: bytes, data_dir: Path, settings: ReplaySettings) -> TakenUp:
    """Give the sealed ledger pulled into `data_dir` the hot database its snapshot `raw` (as
    the same head names it) stands for, and the archived batches after it (module docstring);
    a `SnapshotMismatch` naming why it cannot (`data_dir` is then left without one)."""
    snapshot = read_snapshot(raw)
    sealed = manifest_offsets(data_dir)
    ahead = sorted(k for k, last in snapshot.sealed.items() if last > sealed.get(k, -1))
    if ahead:
        raise SnapshotMismatch(f"it is past the sealed ledger on {_describe(ahead[0])}")
    try:
        load_snapshot(snapshot, data_dir)
        batches = 0
        if snapshot.sealed != sealed:
            problems: list[Difference] = []
            with _Unsealable(data_dir) as store:
                later = archive_batches(data_dir, after_seq=snapshot.batch_seq)
                batches, _ = fold_batches(store, later, settings, problems, seal=False)
                while pending := store.pending_outbox():
                    store.mark_sent([m.id for m in pending])
            if problems:
                raise SnapshotMismatch(f"the archive after it {problems[0].note}")
            _seal_folded(data_dir)
            con = duckdb.connect(str(data_dir / HOT_DB_NAME))
            try:
                applied = _sealed_offsets(con)
            finally:
                con.close()
            if applied != sealed:
                raise SnapshotMismatch(
                    f"with the {batches} archived batches after it, it applied other offsets "
                    "than the sealed ledger holds"
                )
            write_snapshot_of(data_dir, snapshot.epoch)
        else:
            atomic_write_bytes(data_dir / SNAPSHOT_NAME, raw)
    except BaseException as exc:
        for name in (HOT_DB_NAME, f"{HOT_DB_NAME}.wal"):
            (data_dir / name).unlink(missing_ok=True)
        if isinstance(exc, duckdb.Error | StoreError):
            raise SnapshotMismatch(f"loading it failed: {exc}") from exc
        raise
    return TakenUp(snapshot.epoch, batches)


def write_snapshot_of(data_dir: Path, epoch: int) -> None:
    """Write the snapshot of the (closed, sealed) hot database in `data_dir` beside it: a
    shard restored by a replay publishes one with its first seal, whatever it folds."""
    con = duckdb.connect(str(data_dir / HOT_DB_NAME))
    try:
        atomic_write_bytes(data_dir / SNAPSHOT_NAME, take_snapshot(con, epoch))
    finally:
        con.close()


def _describe(key: SourceKey) -> str:
    incarnation, topic, partition = key
    return f"{topic}[{partition}]@{incarnation}"
