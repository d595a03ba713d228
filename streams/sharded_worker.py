"""The worker of a sharded ledger (`ledger.sharded: true`): several `tally worker`s in one
consumer group maintain one ledger, each writing the shards of the samples partitions it is
assigned (`streams.shards`: which, and how a shard is taken up, handed over or dropped).

What differs from the whole-ledger worker (`streams.worker.LedgerWorker`, whose batching,
outbox, metrics and sealing health it keeps):

- *Ownership.* The samples consumer's group decides it (aiokafka's rebalances are eager:
  every partition is revoked, then the whole new assignment assigned). On revocation the
  worker first seals and publishes every shard it holds, then closes them, so a planned move
  refolds nothing. On assignment the listener only records the shards to take up
  (`shards_for`) and leaves their partitions paused: a restore can take longer than the
  session may wait for the listener. A task of its own takes each up (`open_shard`: kept, or
  restored from the published head when another worker wrote it since; claimed with a
  conditional put of the head) outside the worker's lock, so a revocation meanwhile does not
  wait for a restore (a shard taken up for a revoked assignment is closed as claimed, not
  held), and resumes its partition from the shard's applied offset. A
  samples batch that starts past that offset (fetched before the seek) is not applied: the
  partition is sought back to it, unless the broker no longer holds the offsets between.
- *Inputs.* Samples go to their partition's shard. The admin, jobs and inventory-reports
  topics are not consumed by Faust agents (their group could give them to one worker while the
  samples group gives partition 0 to another): one `ViewFeed` per worker reads them outside any
  group, each from the lowest offset a shard of this worker still needs, and hands every shard
  what its role folds (admin and jobs to all, inventory reports to the global shard) — only
  the shards it was positioned for: one taken up during the fetch waits for the next. This is
  the simplest correct way: a shard's admin and jobs offsets are in its own store (its archive
  after a restore), so it reads them exactly once whichever worker held it before, and no
  worker depends on another's group to see the events its views need.
- *Fencing.* A shard whose publish is fenced (`WriterFenced`: another worker claimed it, so
  this one was paused or cut off past its session) is dropped — closed, its directory deleted —
  and the worker goes on with its other shards; it takes the shard up again from the head if the
  group assigns it again. The process does not exit: its other shards are still its own.
- *Balances.* Every shard publishes its own balances on the balances topic, stamped with its
  claim (`ShardStamp(name, epoch)`, set by `open_shard`): keyed by (account, shard), so a
  samples shard's usage and the global shard's grants and holds do not replace each other. The
  scheduler and the alert watch sum them per account (`ledger.shard_balances`).
- *The shards' watermark.* After each seal of the global shard — every seal interval, also
  with nothing new to seal, since the samples shards (this worker's or others') may have sealed
  further — its holder publishes `ShardsSealedThrough` (`streams.sealed_through`, from the
  shards' heads, with the global shard's open-hold jobs) when its watermark passed the newest
  the global shard folded (or this worker published); it is not read again while no samples
  shard's head changed. A samples shard that has sealed no usage is waited for only while its
  partition holds samples it has not sealed (the samples consumer's end offsets): one no GPU
  writes to would hold the watermark back for ever. The event comes back through the view
  feed like any admin event; the global shard settles the holds that ended by it and grants
  the allowances that need the union's spending (`ledger.ingest.sealed`).
- *Incarnation.* Every batch it applies, samples or admin/jobs/inventory from the view feed,
  is checked against the broker's incarnation as the whole-ledger worker checks its batches
  (`_checked_batch`: one question per fetched batch, which each shard's commit of it waits
  for); a batch fetched from another broker commits nothing and ends the worker (75).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import duckdb
import faust
from aiokafka.errors import KafkaError

from ledger.admin import ShardsSealedThrough
from ledger.errors import SealError, SegmentError
from ledger.excerpts import TEXT_LIMIT, bounded
from ledger.ingest import ConsumedMessage, InputTopics, OutputTopics, ShardRole
from ledger.store.head import Head, WriterFenced
from ledger.store.hot import DuckDBStore
from ledger.store.objects import ObjectStore
from ledger.store.rebuild import ReplaySettings
from ledger.store.union import shard_heads
from ledger.store.union_rules import GLOBAL_SHARD
from streams.incarnation_gate import IncarnationGate
from streams.kafka import fetch_cluster_id
from streams.sample_batches import PartitionHooks
from streams.sealed_through import AdminSender, publish_sealed_through
from streams.shards import (
    Shard,
    ShardSettings,
    ShardSpec,
    close_shard,
    drop_shard,
    open_shard,
    samples_shard,
    shards_for,
)
from streams.view_feed import PartitionKey, ViewFeed
from streams.worker import INCARNATION_CHANGED_EXIT, LedgerWorker, _apply_batch, _die

log = logging.getLogger("tally.worker")
RETRY_S = 1.0
WATERMARK_CACHE = "watermark"  # under the data directory: the shards pulled for the watermark


class AppSender:
    """An `AdminSender` over the Faust app's producer (the worker's own, acks from all)."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    async def send_and_wait(self, topic: str, value: bytes, key: bytes) -> object:
        producer = await self._app.maybe_start_producer()
        return await producer.send_and_wait(topic, key, value, None, None, None)


def samples_heads(store: ObjectStore) -> dict[str, Head]:
    """The heads of the samples shards `store` holds: while none changes, the watermark
    cannot move (the global shard's seals do not move it)."""
    return {name: head for name, head in shard_heads(store).items() if name != GLOBAL_SHARD}


def hold_jobs_and_watermark(store: DuckDBStore) -> tuple[list[str], int | None]:
    """The jobs with holds open in the global shard `store`, and its newest folded watermark."""
    jobs = sorted({job for job, _ in store.open_holds()})
    sealed = store.admin_view().sealed
    return jobs, None if sealed is None else sealed.through_us


class ShardedWorker(LedgerWorker):
    """A worker writing the shards of its samples partitions (module docstring)."""

    def _open(self) -> None:
        s = self.settings
        if s.segments_store is None:
            raise ValueError("a sharded worker needs the segments store its shards live in")
        s.data_dir.mkdir(parents=True, exist_ok=True)
        inputs = InputTopics(
            admin=s.admin_topic, jobs=s.jobs_topic, inventory=s.inventory_reports_topic
        )
        self.shard_settings = ShardSettings(
            data_dir=s.data_dir,
            store=s.segments_store,
            replay=ReplaySettings(s.prices, s.cost_centres, s.idle_policy, inputs, zone=s.zone),
            outputs=OutputTopics(
                alerts=s.alerts_topic,
                deadletter=s.deadletter_topic,
                balances=s.balances_topic,  # stamped per shard (module docstring)
                inventory=s.inventory_topic,
            ),
            samples_topic=s.samples_topic,
            grace_s=s.grace_s,
            memory_limit=s.duckdb_memory_limit,
        )
        self.shards: dict[str, Shard] = {}
        self._pending: list[ShardSpec] = []  # assigned, not taken up yet
        self._revocations = 0  # a take-up begun before the latest revocation is void
        self._to_take_up = asyncio.Event()
        self._incarnation: str | None = None
        self.admin_sender: AdminSender | None = None  # the app's producer (`_add_inputs`)
        self._published_through: int | None = None  # the newest watermark this worker sent
        self._watermark_heads: dict[str, Head] | None = None  # the samples heads it was read at
        self._views = ViewFeed(
            s.bootstrap,
            (s.admin_topic, s.jobs_topic, s.inventory_reports_topic),
            s.kafka_options,
        )

    @property
    def incarnation_known(self) -> bool:
        return self._incarnation is not None

    def _partition_hooks(self) -> PartitionHooks | None:
        return self

    def _outbox_stores(self) -> list[DuckDBStore]:
        return [shard.store for shard in self.shards.values()]

    async def _publish_outbox_of(self, store: DuckDBStore) -> None:
        try:
            await super()._publish_outbox_of(store)
        except duckdb.Error:
            if any(shard.store is store for shard in self.shards.values()):
                raise
            # its shard was dropped meanwhile (fenced): what it had queued goes with it

    def _add_inputs(self, app: faust.App, batches: Callable[[str, str, int], None]) -> None:
        # Faust's consumer needs a topic to subscribe to: the admin topic, dropped here (the
        # view feed folds it into each shard from the shard's own offset)
        idle = app.topic(self.settings.admin_topic, value_serializer="raw")

        @app.agent(idle, name="ledger-admin-unused")
        async def drop(stream: Any) -> None:
            async for _ in stream:
                pass

        def task(name: str, run: Callable[[], Awaitable[None]]) -> None:
            @app.task  # type: ignore[untyped-decorator]
            async def supervised() -> None:
                try:
                    await run()
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # as for a failing agent: exit, to be restarted
                    await _die(name, exc)

        self.admin_sender = AppSender(app)
        task("ledger-views", self._follow_views)
        task("ledger-shards", self._take_up_shards)

    # ------------------------------------------------------------------ ownership

    async def revoked(self, partitions: set[int]) -> None:
        """Seal, publish and close every shard this worker holds (the rebalance revokes all)."""
        s = self.settings
        self._revocations += 1  # before the lock: a take-up in progress gives its shard back
        self._pending = []
        async with self._publishing, self._lock:
            self._pending = []
            for name, shard in list(self.shards.items()):
                del self.shards[name]
                try:
                    await asyncio.to_thread(
                        close_shard, shard, s.compact_below_rows, s.compact_min_segments
                    )
                    log.info("shard %s sealed and handed over", name)
                except WriterFenced as exc:
                    await asyncio.to_thread(drop_shard, s.data_dir, shard)
                    self._fenced_shard(name, exc)
                except (SealError, SegmentError) as exc:  # its next owner refolds what is hot
                    self._seal_failed(exc)

    async def assigned(self, partitions: set[int]) -> None:
        """The shards of `partitions` are to be taken up: by `_take_up_shards`, outside the
        rebalance (a restore takes longer than a session may wait); their partitions stay
        paused until then."""
        self._pending = shards_for(partitions)
        self._to_take_up.set()
        log.info("samples partitions %s assigned", sorted(partitions))

    async def _take_up_shards(self) -> None:
        """Take up each assigned shard in turn, then fetch its partition from its applied
        offset (module docstring)."""
        while True:
            await self._to_take_up.wait()
            self._to_take_up.clear()
            if self._incarnation is None:
                await self._refresh_incarnation()
            incarnation = self._incarnation
            assert incarnation is not None
            while self._pending:
                spec = self._pending.pop(0)
                revocations = self._revocations
                shard = self.shards.get(spec.name)
                if shard is None:  # outside the lock: a revocation does not wait for a restore
                    shard = await self._take_up(spec, incarnation, revocations)
                async with self._lock:
                    if shard is None:
                        continue  # revoked while the store was away
                    if revocations != self._revocations:  # revoked while it was taken up
                        await asyncio.to_thread(shard.store.close)  # its head is as claimed
                        log.info("shard %s given back as it was taken up", spec.name)
                        continue
                    self.shards[spec.name] = shard
                    if spec.partition is not None:
                        start = shard.next_offset(self.settings.samples_topic)
                        self._samples.resume_at(spec.partition, start)
            log.info("holding shards %s", ", ".join(sorted(self.shards)) or "none")

    async def _take_up(self, spec: ShardSpec, incarnation: str, revocations: int) -> Shard | None:
        """The shard `spec`, taken up; None when revoked meanwhile (`revocations` moved on)."""
        while revocations == self._revocations:
            try:
                return await asyncio.to_thread(open_shard, self.shard_settings, spec, incarnation)
            except (SealError, OSError) as exc:  # the store away: the partition waits
                log.warning("cannot take shard %s up yet: %s", spec.name, exc)
                await asyncio.sleep(RETRY_S)
        return None

    def _fenced_shard(self, name: str, exc: WriterFenced) -> None:
        self._observe(lambda o: o.worker_error("fenced"))
        log.error(
            "shard %s dropped: %s",
            name,
            bounded(str(exc).replace("; stop, and start again to claim it anew", ""), TEXT_LIMIT),
        )

    async def _refresh_incarnation(self) -> None:
        incarnation = await fetch_cluster_id(
            self.settings.bootstrap[0], options=self.settings.kafka_options
        )
        if self._incarnation is None:
            self._incarnation = incarnation
        elif incarnation != self._incarnation:
            log.error("the broker is now %s, not %s: exiting", incarnation, self._incarnation)
            logging.shutdown()
            os._exit(INCARNATION_CHANGED_EXIT)

    # ------------------------------------------------------------------ folding

    @contextlib.asynccontextmanager
    async def _checked_batch(self) -> AsyncIterator[IncarnationGate]:
        """One fetched batch's broker-incarnation check (`LedgerWorker._checked`),
        samples or views: one question for all the shards the batch goes to, each shard's commit
        waiting for its answer (the gate yielded); a refusal ends the worker (75), also when the
        batch committed nothing (all of it applied before) or failed otherwise."""
        if self._incarnation is None:
            await self._refresh_incarnation()
        assert self._incarnation is not None
        async with self._checked(self._incarnation) as gate:
            yield gate

    async def _apply(self, messages: list[ConsumedMessage]) -> None:
        """Apply a samples batch: each partition's messages to its shard (a partition whose
        shard was dropped as fenced is skipped: its next owner folds it)."""
        by_shard: dict[str, list[ConsumedMessage]] = {}
        for m in messages:
            by_shard.setdefault(samples_shard(m.partition).name, []).append(m)
        async with self._checked_batch() as gate:
            for name, part in by_shard.items():
                await self._apply_to(name, part, gate=gate)

    async def _apply_to(
        self,
        name: str,
        messages: list[ConsumedMessage],
        expected: Shard | None = None,
        gate: IncarnationGate | None = None,
    ) -> None:
        """Apply `messages` to the shard `name` if this worker holds it (and it is `expected`,
        when given: not one taken up again since); `gate`: the batch's incarnation check, which
        its commit waits for."""
        async with self._lock:
            shard = self.shards.get(name)
            if shard is None or (expected is not None and shard is not expected):
                return
            ingestor = shard.ingestor
            fresh = [m for m in messages if m.offset >= ingestor.next_offset(m.topic, m.partition)]
            if not fresh or await self._gap(shard, fresh[0]):
                return
            started = time.monotonic()
            try:
                result = await asyncio.to_thread(_apply_batch, ingestor, fresh, gate)
            except WriterFenced as exc:  # a batch that closes a period seals first
                del self.shards[name]
                await asyncio.to_thread(drop_shard, self.settings.data_dir, shard)
                self._fenced_shard(name, exc)
                return
            elapsed = time.monotonic() - started
            self.stats.last_commit_ms = elapsed * 1000
        self._count(result)
        self._observe(lambda o: o.observe_batch(result.messages, result.commit.postings, elapsed))
        if result.dead_letters:
            self._observe(lambda o: o.dead_letter(len(result.dead_letters)))
        if result.commit.closed:
            log.info("shard %s closed period(s) %s", name, ", ".join(result.commit.closed))
            await self.seal()

    async def _gap(self, shard: Shard, first: ConsumedMessage) -> bool:
        """Whether a samples batch starts past its shard's applied offset (fetched before the
        partition was sought to it) while the broker still holds the offsets between: then it
        is fetched again from there, not applied."""
        if shard.spec.partition is None or first.topic != self.settings.samples_topic:
            return False
        applied = shard.ingestor.next_offset(first.topic, first.partition)
        if first.offset == applied or await self._samples.log_start(first.partition) > applied:
            return False
        log.info("shard %s: fetched from %d, applied to %d", shard.spec.name, first.offset, applied)
        self._samples.resume_at(first.partition, applied)
        return True

    def _view_starts(self, shards: Iterable[Shard]) -> dict[PartitionKey, int]:
        """Per admin/jobs/inventory partition, the lowest offset one of `shards` still needs."""
        s = self.settings
        starts: dict[PartitionKey, int] = {}
        for shard in shards:
            for topic, partition in self._views.partitions:
                if topic == s.inventory_reports_topic and shard.spec.role is not ShardRole.GLOBAL:
                    continue
                offset = shard.ingestor.next_offset(topic, partition)
                key = (topic, partition)
                starts[key] = min(offset, starts.get(key, offset))
        return starts

    async def _follow_views(self) -> None:
        s = self.settings
        while True:
            try:
                await self._views.start()
                break
            except KafkaError as exc:
                log.warning("admin and jobs reader cannot start yet: %s", exc)
                await asyncio.sleep(RETRY_S)
        within_ms = max(1, int(s.batch_within_s * 1000))
        try:
            while True:
                async with self._lock:
                    holders = dict(self.shards)
                    starts = self._view_starts(holders.values())
                if not starts:
                    await asyncio.sleep(s.batch_within_s)
                    continue
                try:
                    messages = await self._views.fetch(starts, s.batch_max_messages, within_ms)
                except KafkaError as exc:
                    log.warning("reading admin and jobs failed: %s", exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                if messages:
                    await self._hand_views(messages, holders)
                    await self.publish_outbox()
        finally:
            await self._views.stop()

    async def _hand_views(
        self, messages: list[ConsumedMessage], holders: Mapping[str, Shard]
    ) -> None:
        """Hand each shard what its role folds of `messages` (admin and jobs to all, inventory
        reports to the global shard; the global shard first) — only the `holders`, the shards
        the fetch was positioned for: one taken up since may need offsets before the fetch's
        start, and handed these it would skip the events between for good. Checked against the
        broker's incarnation as a samples batch is (`_checked_batch`)."""
        inventory = self.settings.inventory_reports_topic
        async with self._checked_batch() as gate:  # as a samples batch: one question for all
            for name in sorted(holders, key=lambda n: n != GLOBAL_SHARD):
                shard = holders[name]
                glob = shard.spec.role is ShardRole.GLOBAL
                mine = [m for m in messages if glob or m.topic != inventory]
                if mine:
                    await self._apply_to(name, mine, expected=shard, gate=gate)

    # ------------------------------------------------------------------ sealing

    async def seal(self) -> None:
        """Seal every shard held; a fenced one is dropped, a failing one recorded and tried
        again at the next interval."""
        s = self.settings
        async with self._lock:
            for name, shard in list(self.shards.items()):
                try:
                    result = await asyncio.to_thread(
                        shard.store.seal, s.compact_below_rows, s.compact_min_segments
                    )
                except (SealError, SegmentError) as exc:
                    self._seal_failed(exc)
                    continue
                except WriterFenced as exc:
                    del self.shards[name]
                    await asyncio.to_thread(drop_shard, s.data_dir, shard)
                    self._fenced_shard(name, exc)
                    continue
                await asyncio.to_thread(shard.store.prune_seen_events, s.dedupe_window_us)
                self._sealed(result)
            self._last_seal = time.monotonic()
        await self.publish_watermark()

    async def publish_watermark(self) -> ShardsSealedThrough | None:
        """Put the shards' watermark on the admin topic when this worker holds the global shard
        and the watermark passed the newest it folded or this worker sent (module docstring);
        the event sent, or None. A failure is logged and tried again at the next seal."""
        s = self.settings
        sender, store = self.admin_sender, s.segments_store
        if GLOBAL_SHARD not in self.shards or sender is None or store is None:
            return None
        cache = s.data_dir / WATERMARK_CACHE
        try:
            ends = await self._samples_ends()  # before the heads: what they are to have sealed
            heads = await asyncio.to_thread(samples_heads, store)
            if heads == self._watermark_heads:
                return None  # no samples shard published since: the same watermark
            async with self._lock:
                shard = self.shards.get(GLOBAL_SHARD)
                if shard is None:
                    return None  # revoked meanwhile
                jobs, folded = await asyncio.to_thread(hold_jobs_and_watermark, shard.store)
            seen = [t for t in (folded, self._published_through) if t is not None]
            known = max(seen, default=None)
            samples = None if ends is None else (s.samples_topic, ends)
            event = await publish_sealed_through(
                store, cache, sender, s.admin_topic, jobs, known, samples
            )
        except (KafkaError, SealError, SegmentError, OSError, duckdb.Error) as exc:
            log.warning("the shards' watermark not published: %s", bounded(str(exc), TEXT_LIMIT))
            return None
        self._watermark_heads = heads
        if event is not None:
            self._published_through = event.through_us
            log.info(
                "shards sealed through %d published (%d jobs with open holds)",
                event.through_us,
                len(jobs),
            )
        return event

    async def _samples_ends(self) -> dict[int, int] | None:
        """The samples partitions' end offsets (None: no samples consumer runs here)."""
        consumer = getattr(self, "_samples", None)
        return None if consumer is None else await consumer.end_offsets()

    def _recover(self) -> None:
        """Nothing to seal before the group assigns partitions: a shard kept from a previous
        run publishes what it committed at its first seal."""

    def _close(self) -> None:
        """A clean stop: seal, publish and close every shard held (as a revocation does)."""
        s = self.settings
        for name, shard in list(self.shards.items()):
            try:
                close_shard(shard, s.compact_below_rows, s.compact_min_segments)
                log.info("shard %s sealed at stop", name)
            except (WriterFenced, SealError, SegmentError) as exc:  # its next owner refolds
                log.warning("shard %s not sealed at stop: %s", name, bounded(str(exc), TEXT_LIMIT))
        self.shards.clear()
