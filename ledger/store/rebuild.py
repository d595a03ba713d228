"""Rebuild: replay the raw-event archive into a fresh ledger and compare it with the live one.

The archive (`ledger.store`, `archive/` beside `segments/`) holds every message the ledger
applied, each with the sequence number of the commit that applied it and its position in that
commit's batch. Replaying it means: for each archived batch, in sequence order,
1. run the dedupe prunes the live writer ran just before that batch, on the same state
   (`prune_window_us`: the per-scope prune by that window, `ledger.dedupe`; `pruned_before_us`:
   a prune by one cutoff, as ledgers before dedupe scopes pruned), so the replay forgets the
   same ids and refuses the same events as too late to deduplicate,
2. hand the batch's messages, in their archived order, to an `Ingestor` of the batch's broker
   incarnation (a new one when the incarnation changes, as the worker does on a new broker),
so admin events, holds and samples interleave exactly as they were folded; the fresh store ends
sealed. Every input of a batch's fold is either in the batch or a fold of earlier batches, so
with the same configuration (prices, cost centres, idle policy, input topics) the replay is
deterministic and equal to the live ledger.

Only what is sealed is compared: the live writer's database is not opened (it may be running),
and its sealed segments hold exactly the batches its sealed archive holds (one seal writes
both). `compare` is pure and returns differences as values:
- postings: per (account, unit, period) the number of postings, their sum and a fingerprint of
  their full rows (the order-independent sum of a hash per posting row, every column);
- balances: the rebuilt writer's balances table against the fold of the live sealed postings;
- closed periods: every field of each closed period's record, its rows and checksum included;
- the GPU inventory: every field of each GPU's record (the live side is `inventory.json`, which
  each seal writes from the same state it seals).
- the audit trail (`segments/audit.jsonl`): record by record, hashes included; the first
  record that differs is named (the chain differs from there on).
`rebuild` adds where the archive and the sealed postings cover different offsets (a rebuild
cannot see what was never archived) and anything the replay itself refused.

`--from topics` takes the message bytes from the broker instead (`batches_from_messages`): the
fold order still comes from the archive, and a message the broker no longer holds or holds
differently is a difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, tzinfo
from enum import StrEnum
from pathlib import Path

import duckdb

from ledger.audit import AuditRecord
from ledger.balances import BalanceRow, fold_rows
from ledger.closing import ClosedPeriod
from ledger.errors import SegmentError, StoreError
from ledger.idle import IdlePolicy
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.shards import ShardRole
from ledger.inventory import InventoryGpu
from ledger.pricing import PriceBook
from ledger.read.balances import FOLD_SQL
from ledger.store.hot import DuckDBStore
from ledger.store.identity import claim_zone
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.schema import POSTINGS_SCHEMA, archived_value
from ledger.store.segments import Manifest
from ledger.store.side_files import load_audit_file, load_closed_periods, load_inventory
from ledger.store.verify import archive_coverage

Progress = Callable[[int], None]  # batches replayed since the last call
BalanceKey = tuple[str, str, str]  # (account, unit, period)
MessageKey = tuple[str, str, int, int]  # (incarnation, topic, partition, offset)
_FETCH_ROWS = 8_192


@dataclass(frozen=True, slots=True)
class ArchivedBatch:
    """One commit's messages, in the order they were folded."""

    seq: int
    incarnation: str
    pruned_before_us: int | None
    messages: tuple[ConsumedMessage, ...]
    prune_window_us: int | None = None


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """The configuration a replay folds with: it must be the live writer's."""

    prices: PriceBook
    cost_centres: Mapping[str, str]
    idle_policy: IdlePolicy = field(default_factory=IdlePolicy)
    inputs: InputTopics = field(default_factory=InputTopics)
    seal_every: int = 512  # batches between seals, to keep the fresh writer's hot tables small
    zone: tzinfo = UTC  # the live ledger's time zone (`ledger.store.identity.recorded_zone`)
    role: ShardRole = ShardRole.WHOLE  # a shard's replay folds as its writer did


class DifferenceKind(StrEnum):
    POSTINGS = "postings"
    BALANCE = "balance"
    CLOSED_PERIOD = "closed-period"
    AUDIT = "audit"
    ARCHIVE = "archive"
    REPLAY = "replay"
    INVENTORY = "inventory"


@dataclass(frozen=True, slots=True)
class Difference:
    """One way the rebuilt ledger differs from the live one; None: absent on that side."""

    kind: DifferenceKind
    subject: str  # an account, a period, or a partition
    unit: str = ""
    period: str = ""
    live: int | None = None
    rebuilt: int | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class PostingsDigest:
    postings: int
    amount: int
    fingerprint: int


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """What a rebuild compares of one ledger."""

    postings: Mapping[BalanceKey, PostingsDigest]
    balances: Mapping[BalanceKey, int]
    closed: Mapping[str, ClosedPeriod]
    inventory: Mapping[str, InventoryGpu] = field(default_factory=dict)
    audit: tuple[AuditRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplayResult:
    batches: int
    messages: int
    balances: tuple[BalanceRow, ...]
    closed: tuple[ClosedPeriod, ...]
    problems: tuple[Difference, ...] = ()
    inventory: tuple[InventoryGpu, ...] = ()


@dataclass(frozen=True, slots=True)
class RebuildReport:
    into: Path
    batches: int
    messages: int
    differences: tuple[Difference, ...]

    @property
    def identical(self) -> bool:
        return not self.differences


# ---------------------------------------------------------------------------- reading


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _archive_files(data_dir: Path) -> list[Path]:
    from ledger.store.union import is_union, union_shards

    if is_union(data_dir):  # each shard numbers its own batches: one archive cannot be replayed
        raise SegmentError(
            f"{data_dir} is the union of the shards {', '.join(union_shards(data_dir))}; a "
            "rebuild replays one ledger's archive: replay each shard's, "
            f"{data_dir / 'shards' / '<name>'} (as `tally ledger rebuild` does)"
        )
    return Manifest(data_dir / ARCHIVE_DIR).files()


def archive_batch_count(data_dir: Path | str) -> tuple[int, int]:
    """(batches, messages) in the sealed archive."""
    files = _archive_files(Path(data_dir))
    if not files:
        return 0, 0
    con = duckdb.connect(":memory:")
    try:
        row = con.execute(
            f"SELECT count(DISTINCT batch_seq), count(*) FROM read_parquet({_sql_list(files)})"
        ).fetchone()
    finally:
        con.close()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def archive_batches(data_dir: Path | str, after_seq: int = 0) -> Iterator[ArchivedBatch]:
    """The sealed archive's batches in sequence order, each in its folded order (streamed);
    only those numbered after `after_seq` (a snapshot's last batch: `ledger.store.snapshot`)."""
    files = _archive_files(Path(data_dir))
    if not files:
        return
    con = duckdb.connect(":memory:")
    try:
        window = con.execute(  # archives from before the per-scope prune lack the column
            f"SELECT count(*) FROM parquet_schema({_sql_list(files)}) "
            "WHERE name = 'prune_window_us'"
        ).fetchall()[0][0]
        reader = con.sql(
            "SELECT batch_seq, incarnation, pruned_before_us, "
            + ("prune_window_us, " if window else "NULL, ")
            + 'topic, "partition", "offset", "value", value_codec, value_size, "key" '
            f"FROM read_parquet({_sql_list(files)}, union_by_name = true) "
            f"WHERE batch_seq > {int(after_seq)} ORDER BY batch_seq, batch_index"
        ).to_arrow_reader(_FETCH_ROWS)
        seq: int | None = None
        head: tuple[str, int | None, int | None] = ("", None, None)
        messages: list[ConsumedMessage] = []
        for chunk in reader:
            columns = [chunk.column(i).to_pylist() for i in range(chunk.num_columns)]
            for row in zip(*columns, strict=True):
                s, inc, pruned, window, topic, part, offset, value, codec, size, key = row
                if s != seq:
                    if seq is not None:
                        yield ArchivedBatch(seq, head[0], head[1], tuple(messages), head[2])
                    seq, head, messages = s, (inc, pruned, window), []
                value = archived_value(value, codec, size)
                messages.append(ConsumedMessage(topic, part, offset, value, key))
        if seq is not None:
            yield ArchivedBatch(seq, head[0], head[1], tuple(messages), head[2])
    finally:
        con.close()


def batches_from_messages(
    batches: Iterable[ArchivedBatch],
    fetched: Mapping[MessageKey, tuple[bytes | None, bytes | None]],
    found: list[Difference],
) -> Iterator[ArchivedBatch]:
    """`batches` with each message's key and value as `fetched` (from the topics) holds them.

    A message `fetched` lacks, or holds with other bytes than the archive, is appended to
    `found` as a difference; the archive's bytes are replayed for a missing one.
    """
    for batch in batches:
        messages = []
        for m in batch.messages:
            got = fetched.get((batch.incarnation, m.topic, m.partition, m.offset))
            where = f"{m.topic}[{m.partition}]@{m.offset}"
            if got is None:
                found.append(
                    Difference(
                        DifferenceKind.ARCHIVE,
                        where,
                        note=f"the broker no longer holds it (broker {batch.incarnation})",
                    )
                )
                messages.append(m)
                continue
            key, value = got
            if (key, value) != (m.key, m.value):
                found.append(
                    Difference(
                        DifferenceKind.ARCHIVE,
                        where,
                        note="the broker's message differs from the archive's",
                    )
                )
            messages.append(ConsumedMessage(m.topic, m.partition, m.offset, value, key))
        yield replace(batch, messages=tuple(messages))


# ---------------------------------------------------------------------------- replay


def replay(
    batches: Iterable[ArchivedBatch],
    into: Path | str,
    settings: ReplaySettings,
    progress: Progress | None = None,
) -> ReplayResult:
    """Fold `batches` into a fresh ledger in `into` (a directory that is missing or empty, so a
    rebuild never writes into a ledger), and seal it."""
    target = Path(into)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise StoreError(f"{target} is not an empty directory: a rebuild needs a fresh one")
    problems: list[Difference] = []
    claim_zone(target, settings.zone)
    with DuckDBStore(target) as store:
        count, messages = fold_batches(store, batches, settings, problems, progress, seal=True)
        store.seal()
        return ReplayResult(
            count,
            messages,
            tuple(store.balance_rows()),
            tuple(store.closed_periods()),
            tuple(problems),
            tuple(store.inventory().values()),
        )


def fold_batches(
    store: DuckDBStore,
    batches: Iterable[ArchivedBatch],
    settings: ReplaySettings,
    problems: list[Difference],
    progress: Progress | None = None,
    seal: bool = True,
) -> tuple[int, int]:
    """Fold `batches` into `store`, each after the prunes recorded with it, as its writer did
    (the module docstring); with `seal`, sealing every `settings.seal_every` batches. A batch
    that was applied before is appended to `problems`; (batches, messages) folded."""
    count = messages = 0
    ingestor: Ingestor | None = None
    for batch in batches:
        if batch.pruned_before_us is not None:
            store.prune_seen_before(batch.pruned_before_us)
        if batch.prune_window_us is not None:
            store.prune_seen_events(batch.prune_window_us)
        if ingestor is None or ingestor.incarnation != batch.incarnation:
            ingestor = Ingestor(
                store,
                batch.incarnation,
                settings.prices,
                settings.cost_centres,
                settings.idle_policy,
                OutputTopics(balances=None),
                settings.inputs,
                settings.zone,
                settings.role,
            )
        result = ingestor.apply(batch.messages)
        if result.skipped_messages:
            problems.append(
                Difference(
                    DifferenceKind.REPLAY,
                    f"batch {batch.seq}",
                    note=f"{result.skipped_messages} message(s) were applied before",
                )
            )
        count += 1
        messages += len(batch.messages)
        if seal and count % settings.seal_every == 0:
            store.seal()
        if progress is not None:
            progress(1)
    return count, messages


# ---------------------------------------------------------------------------- snapshots

_ROW = ", ".join(f'"{name}" := "{name}"' for name in POSTINGS_SCHEMA.names)
DIGEST_SQL = (
    "SELECT account, unit, period, count(*), sum(amount), "
    f"sum(hash(struct_pack({_ROW}))::HUGEINT) FROM {{source}} GROUP BY ALL"
)


def sealed_snapshot(
    data_dir: Path | str,
    balances: Iterable[BalanceRow] | None = None,
    closed: Iterable[ClosedPeriod] | None = None,
    inventory: Iterable[InventoryGpu] | None = None,
) -> LedgerSnapshot:
    """The sealed ledger in `data_dir`, read with a connection of its own. `balances`,
    `closed` and `inventory` default to the fold of the sealed postings, the closed-period
    records and the inventory the last seal wrote."""
    root = Path(data_dir) / SEGMENTS_DIR
    files = Manifest(root).files()
    digests: dict[BalanceKey, PostingsDigest] = {}
    folded: list[BalanceRow] = []
    if files:
        source = f"read_parquet({_sql_list(files)})"
        con = duckdb.connect(":memory:")
        try:
            for account, unit, period, n, total, mark in con.execute(
                DIGEST_SQL.format(source=source)
            ).fetchall():
                digests[(account, unit, period)] = PostingsDigest(int(n), int(total), int(mark))
            if balances is None:
                folded = fold_rows(con.execute(FOLD_SQL.format(source=source)).fetchall())
        finally:
            con.close()
    rows = folded if balances is None else balances
    records = load_closed_periods(root) if closed is None else closed
    return LedgerSnapshot(
        digests,
        {(r.account, r.unit, r.period): r.balance for r in rows},
        {c.period: c for c in records},
        {g.uuid: g for g in (load_inventory(root) if inventory is None else inventory)},
        tuple(load_audit_file(root)),
    )


# ---------------------------------------------------------------------------- comparison


def compare(live: LedgerSnapshot, rebuilt: LedgerSnapshot) -> tuple[Difference, ...]:
    """Every difference between two ledgers, postings first, each kind in key order."""
    found: list[Difference] = []
    for key in sorted(live.postings.keys() | rebuilt.postings.keys()):
        a, b = live.postings.get(key), rebuilt.postings.get(key)
        if a == b:
            continue
        if a is None or b is None:
            present = a or b
            assert present is not None
            note = f"{present.postings} posting(s) only in the {'live' if a else 'rebuilt'} ledger"
        elif (a.postings, a.amount) == (b.postings, b.amount):
            note = "same count and sum, different postings"
        else:
            note = f"{a.postings} posting(s) live, {b.postings} rebuilt"
        found.append(
            Difference(
                DifferenceKind.POSTINGS,
                key[0],
                key[1],
                key[2],
                None if a is None else a.amount,
                None if b is None else b.amount,
                note,
            )
        )
    for key in sorted(live.balances.keys() | rebuilt.balances.keys()):
        x, y = live.balances.get(key), rebuilt.balances.get(key)
        if x != y:
            found.append(Difference(DifferenceKind.BALANCE, key[0], key[1], key[2], x, y))
    for period in sorted(live.closed.keys() | rebuilt.closed.keys()):
        c, d = live.closed.get(period), rebuilt.closed.get(period)
        if c == d:
            continue
        if c is None or d is None:
            note = f"closed only in the {'live' if c else 'rebuilt'} ledger"
        elif (c.rows, c.sha256) != (d.rows, d.sha256):
            note = f"checksum {c.sha256[:12]}… live, {d.sha256[:12]}… rebuilt"
        else:
            note = "closed by another event, actor or reason"
        found.append(
            Difference(
                DifferenceKind.CLOSED_PERIOD,
                period,
                period=period,
                live=None if c is None else c.rows,
                rebuilt=None if d is None else d.rows,
                note=note,
            )
        )
    for uuid in sorted(live.inventory.keys() | rebuilt.inventory.keys()):
        g, h = live.inventory.get(uuid), rebuilt.inventory.get(uuid)
        if g != h:
            where = "only in the live" if h is None else "only in the rebuilt" if g is None else ""
            note = f"{where} inventory" if where else "the GPU's records differ"
            found.append(Difference(DifferenceKind.INVENTORY, uuid, note=note))
    found.extend(_audit_differences(live.audit, rebuilt.audit))
    return tuple(found)


def _audit_differences(
    live: Sequence[AuditRecord], rebuilt: Sequence[AuditRecord]
) -> list[Difference]:
    """The first audit record that differs (the chain differs from there on), if any."""
    for index in range(max(len(live), len(rebuilt))):
        a = live[index] if index < len(live) else None
        b = rebuilt[index] if index < len(rebuilt) else None
        if a == b:
            continue
        if a is None or b is None:
            note = f"{abs(len(live) - len(rebuilt))} record(s) only in the "
            note += "live" if a else "rebuilt"
            note += " trail"
        else:
            fields = [
                n
                for n in ("event_id", "kind", "actor", "subject")
                if getattr(a.entry, n) != getattr(b.entry, n)
            ]
            note = "different " + (", ".join(fields) if fields else "content or chain")
        return [
            Difference(
                DifferenceKind.AUDIT,
                f"audit record {index + 1}",
                live=len(live),
                rebuilt=len(rebuilt),
                note=note,
            )
        ]
    return []


def coverage_differences(data_dir: Path | str) -> tuple[Difference, ...]:
    """Where the archive and the sealed postings cover different offsets."""
    data = Path(data_dir)
    gaps = archive_coverage(
        Manifest(data / SEGMENTS_DIR).load(), Manifest(data / ARCHIVE_DIR).load()
    )
    return tuple(
        Difference(
            DifferenceKind.ARCHIVE,
            f"{g.topic}[{g.partition}]@{g.incarnation}",
            note=g.describe(),
        )
        for g in gaps
    )


def rebuild(
    data_dir: Path | str,
    into: Path | str,
    settings: ReplaySettings,
    batches: Iterable[ArchivedBatch] | None = None,
    progress: Progress | None = None,
    source_differences: Sequence[Difference] = (),
) -> RebuildReport:
    """Replay `batches` (default: the sealed archive of `data_dir`) into `into` and compare the
    result with the sealed ledger in `data_dir`.

    `source_differences` is read after the replay, so a source that finds differences while it
    is consumed (`batches_from_messages`) reports them all.
    """
    coverage = coverage_differences(data_dir)
    result = replay(
        archive_batches(data_dir) if batches is None else batches, into, settings, progress
    )
    live = sealed_snapshot(data_dir)
    rebuilt = sealed_snapshot(into, result.balances, result.closed, result.inventory)
    differences = (
        *coverage,
        *source_differences,
        *result.problems,
        *compare(live, rebuilt),
    )
    return RebuildReport(Path(into), result.batches, result.messages, tuple(differences))
