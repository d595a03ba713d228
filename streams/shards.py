"""The worker's shards (`ledger.sharded`): which ones it owns, and how it takes one up and gives
one back (`docs/design/several-workers.md`).

A worker in a group of several is assigned some partitions of `samples` (its samples consumer
group decides: `streams.sample_batches`). It writes one shard per assigned partition `p`,
`samples-<p>` (`ShardRole.SAMPLES`), and, when it holds partition 0, the global shard `global`
(`ShardRole.GLOBAL`: the admin, jobs and inventory topics): `shards_for`. One group decides all
ownership, so the global shard moves in the same rebalances as the samples shards, with the same
handover (partition 0 of `samples` stands for partition 0 of `admin` in the design: the admin
topic is read outside any group, below, so no second group has to agree with the first). Each
shard is a data directory of its own under `<data_dir>/shards/<name>/`, a cache of the shard
published under `shards/<name>/` of the segments store, which only its owner reads.

Taking a shard up (`open_shard`), on assignment:
1. *Start from what is sealed.* The local directory is kept only when its sealed ledger is the
   one the shard's head names (its manifests are the head's versions: `local_manifests`,
   `published_manifests`): its hot rows are then this worker's own unsealed work on top of it
   (a restart on the same partitions). Otherwise — the shard was written by another worker
   since, or never here — the directory is replaced by the published shard's state
   (`restore`): the shard is pulled with the snapshot its head names, the fold state the seal
   left (`ledger.store.snapshot`), which becomes the hot database, and the archived batches
   after it (normally none) are folded on top; so dedupe ids, idle states, views and applied
   offsets are those the head's segments were folded with, at a cost that does not grow with
   the shard's history. A head that names no snapshot (sealed before snapshots), or one that
   does not fit its sealed ledger (logged with the reason), is restored by replaying the
   shard's raw-event archive into a fresh hot database with the shard's role, the fold
   `tally ledger rebuild` runs, which then takes the snapshot its next seal publishes. The
   outbox a fold fills (alerts, dead letters the previous owner already published) is
   dropped, not sent again.
2. *Claim the head* (`Publisher.claim`: a conditional put of the head with epoch + 1). The
   epoch is the head's own plus one, not the group generation: it never goes backwards whatever
   the group does (a group re-created from scratch starts its generations at 1 again), and a
   claim is one conditional write either way. From then on a previous owner's publish fails
   (`WriterFenced`), so nothing it seals later is read. A head a previous owner published
   between step 1 and the claim is the one claimed (the claim keeps the files the head names):
   the shard is then restored again, from it, and claimed again — publishing the state of
   step 1 over it would take that seal's rows from the readers until they were folded again,
   and for good where the topic no longer holds them. The shard's ingestor stamps its
   balances with the claim (`ShardStamp(name, epoch)`): readers sum an account over the
   shards and ignore a shard's messages of an older epoch (`ledger.shard_balances`).
3. The samples partition is fetched from the shard's applied offset (`Shard.next_offset`): the
   sealed one after a restore, never Kafka's committed offset. What the previous owner had
   committed but not sealed is folded again from the topic.

Giving one back (`close_shard`), on revocation: seal and publish (with its snapshot), then
close, so a planned move refolds nothing. A shard whose publish is fenced is dropped
(`drop_shard`: closed, its directory deleted); the worker goes on with its other shards, and
takes the shard up again from its head if the group assigns it again.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import tzinfo
from pathlib import Path

from ledger.balances import ShardStamp
from ledger.errors import SealError
from ledger.ingest import Ingestor, OutputTopics, ShardRole
from ledger.store.hot import DuckDBStore
from ledger.store.identity import claim_zone, recorded_zone
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR, SNAPSHOT_NAME
from ledger.store.objects import ObjectStore, PrefixedStore
from ledger.store.published import PublishedStore
from ledger.store.rebuild import ReplaySettings, archive_batches, replay
from ledger.store.replica import Publisher, pull_ledger_with, read_published
from ledger.store.segments import MANIFEST_NAME
from ledger.store.snapshot import SnapshotMismatch, manifest_offsets, take_up, write_snapshot_of
from ledger.store.union_rules import GLOBAL_SHARD, SHARDS_PREFIX, shard_prefix

log = logging.getLogger("tally.worker")
GLOBAL_PARTITION = 0  # the owner of this samples partition writes the global shard
CLAIM_TRIES = 3


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard: its name (`samples-<p>`, `global`), its role and its samples partition
    (None: the global shard)."""

    name: str
    role: ShardRole
    partition: int | None = None


GLOBAL = ShardSpec(GLOBAL_SHARD, ShardRole.GLOBAL)


def samples_shard(partition: int) -> ShardSpec:
    return ShardSpec(f"samples-{partition}", ShardRole.SAMPLES, partition)


def shards_for(partitions: Iterable[int]) -> list[ShardSpec]:
    """The shards a worker assigned `partitions` of `samples` writes: one per partition, and
    the global shard with partition `GLOBAL_PARTITION` (first: it folds the admin events every
    samples shard reads too)."""
    owned = sorted(set(partitions))
    specs = [samples_shard(p) for p in owned]
    return [GLOBAL, *specs] if GLOBAL_PARTITION in owned else specs


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """What every shard of one worker is opened with."""

    data_dir: Path  # the worker's: shards live under `<data_dir>/shards/<name>/`
    store: ObjectStore  # the segments store: shard `<name>` is published under `shards/<name>/`
    replay: ReplaySettings  # prices, cost centres, idle policy, input topics, zone (role: each)
    outputs: OutputTopics
    samples_topic: str
    grace_s: float
    memory_limit: int | None


@dataclass(frozen=True, slots=True)
class Restored:
    """How a shard directory was restored: from the snapshot of the head (the epoch of its
    writer) and the archived batches after it, or (`snapshot` None) by replaying the whole
    archive (`batches`). Nothing published: neither."""

    batches: int = 0
    snapshot: int | None = None

    def describe(self) -> str:
        if self.snapshot is not None:
            return (
                f"restored from its snapshot of epoch {self.snapshot} and {self.batches} "
                "archived batches after it"
            )
        return f"restored from {self.batches} archived batches" if self.batches else ""


@dataclass(slots=True)
class Shard:
    """A shard this worker owns now: its store (publishing under the shard's prefix), its
    ingestor, and how its directory was restored (`Restored()`: kept or new)."""

    spec: ShardSpec
    store: PublishedStore
    ingestor: Ingestor
    restored: Restored = Restored()

    def next_offset(self, topic: str) -> int:
        """Where its samples partition is to be fetched from (0 for the global shard)."""
        if self.spec.partition is None:
            return 0
        return self.ingestor.next_offset(topic, self.spec.partition)


def shard_dir(data_dir: Path, name: str) -> Path:
    return data_dir / SHARDS_PREFIX / name


def remote_of(store: ObjectStore, name: str) -> ObjectStore:
    """The shard `name` of the segments store, as a store of its own."""
    return PrefixedStore(store, shard_prefix(name))


Manifests = tuple[bytes | None, ...]  # the postings and archive manifests (None: absent)


def _manifest_keys() -> list[str]:
    return [f"{root}/{MANIFEST_NAME}" for root in (ARCHIVE_DIR, SEGMENTS_DIR)]


def published_manifests(remote: ObjectStore) -> Manifests:
    """The manifests the head of `remote` names now."""
    return tuple(read_published(remote, key) for key in _manifest_keys())


def local_manifests(local: Path) -> Manifests:
    """The manifests of the sealed ledger in the shard directory `local`."""
    found: list[bytes | None] = []
    for key in _manifest_keys():
        try:
            found.append((local / key).read_bytes())
        except FileNotFoundError:
            found.append(None)
    return tuple(found)


def restore(
    local: Path, remote: ObjectStore, settings: ReplaySettings, *, snapshot: bool = True
) -> Restored:
    """Replace the shard directory `local` by the state of the shard published in `remote`
    (module docstring, step 1): from the snapshot its head names, else (none, it does not
    match, or not `snapshot`) by replaying its archive. Nothing published: `local` is left
    empty."""
    pulled = local.with_name(f".{local.name}.pulled")
    fresh = local.with_name(f".{local.name}.restoring")
    for path in (local, pulled, fresh):
        shutil.rmtree(path, ignore_errors=True)
    local.parent.mkdir(parents=True, exist_ok=True)
    found, raw = pull_ledger_with(remote, pulled, SNAPSHOT_NAME)
    if not found:
        return Restored()
    settings = replace(settings, zone=recorded_zone(pulled))
    if snapshot and (raw is not None or manifest_offsets(pulled)):  # else: nothing sealed yet
        why = "its head names no snapshot (sealed before snapshots)"
        if raw is not None:
            try:
                taken = take_up(raw, pulled, settings)
            except SnapshotMismatch as exc:
                why = f"its snapshot does not match: {exc}"
            else:
                pulled.rename(local)  # a kill before this leaves no directory: restored again
                return Restored(taken.batches, taken.epoch)
        log.warning("restoring %s by replaying its archive: %s", local.name, why)
    result = replay(archive_batches(pulled), fresh, settings)
    for problem in result.problems:
        log.warning("restoring %s: %s %s", local.name, problem.subject, problem.note)
    with DuckDBStore(fresh) as store:  # what the previous owner published already
        while pending := store.pending_outbox():
            store.mark_sent([m.id for m in pending])
    write_snapshot_of(fresh, 0)  # published with the next seal, also one that seals nothing
    fresh.rename(local)  # a kill before this leaves no directory: the next start restores
    shutil.rmtree(pulled, ignore_errors=True)
    return Restored(result.batches)


def open_shard(settings: ShardSettings, spec: ShardSpec, incarnation: str) -> Shard:
    """Take the shard `spec` up (module docstring: start from what is sealed, claim the head)."""
    local = shard_dir(settings.data_dir, spec.name)
    remote = remote_of(settings.store, spec.name)
    zone: tzinfo = settings.replay.zone
    for attempt in range(CLAIM_TRIES):
        restored = Restored()
        named = published_manifests(remote)  # what the state taken up is to be
        if local_manifests(local) != named:
            restored = restore(local, remote, replace(settings.replay, role=spec.role))
        claim_zone(local, zone)
        publisher = Publisher(local, remote, grace_s=settings.grace_s)
        try:
            writer = publisher.claim()
        except SealError:  # a first head published since the check: take that one up
            if attempt == CLAIM_TRIES - 1:
                raise
            continue
        if published_manifests(remote) != named:  # the previous owner published since
            if attempt == CLAIM_TRIES - 1:
                raise SealError(remote.describe(), "its head kept changing while taken up")
            continue  # restored again from the head now claimed: no one else publishes it
        store = PublishedStore(local, publisher, snapshots=True)
        store.limit_memory(settings.memory_limit)
        r = settings.replay
        ingestor = Ingestor(
            store,
            incarnation,
            r.prices,
            r.cost_centres,
            r.idle_policy,
            settings.outputs,
            r.inputs,
            zone,
            spec.role,
            ShardStamp(spec.name, writer.epoch),
        )
        log.info(
            "shard %s taken up as %s%s",
            spec.name,
            writer.describe(),
            f", {restored.describe()}" if restored.describe() else "",
        )
        return Shard(spec, store, ingestor, restored)
    raise AssertionError("unreachable")


def close_shard(shard: Shard, compact_below_rows: int, compact_min_segments: int) -> None:
    """Give the shard back: seal and publish what it committed, then close it. A fenced
    publish (`WriterFenced`) or a failing one (`SealError`) is raised after the store is
    closed: the next owner starts from the head either way."""
    try:
        shard.store.seal(compact_below_rows, compact_min_segments)
    finally:
        shard.store.close()


def drop_shard(data_dir: Path, shard: Shard) -> None:
    """Forget a shard another writer claimed: close it and delete its directory (nothing in it
    is read by anyone: its next owner started from the head)."""
    try:
        shard.store.close()
    finally:
        shutil.rmtree(shard_dir(data_dir, shard.spec.name), ignore_errors=True)
