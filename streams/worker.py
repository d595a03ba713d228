"""The ledger worker: a Faust app that folds batches of samples, admin events, holds and
inventory reports into the ledger store, and publishes what the commits queued (alerts, dead
letters, balances, inventory records).

Exactly-once effect:
- the samples topic is read in batches by a group consumer of its own
  (`streams.sample_batches`); the admin, jobs and inventory-reports topics by Faust agents
  taking batches (`take_events`). Each batch goes to `ledger.ingest.Ingestor`, which commits
  postings, event ids, source offsets and the projections they change in one DuckDB
  transaction; the routes take turns on the one store;
- a batch's offsets are committed to the broker (Faust acks its events) only after that commit
  returns, never before;
- offsets the store already holds for the broker incarnation are skipped, so a restarted worker
  that is handed messages again applies them once;
- the incarnation is the broker's cluster id, looked up again on every partition assignment, so
  a restarted embedded broker (offsets from 0 again) is recognised as new data; with each batch
  it is asked again (while the batch folds: `streams.incarnation_gate`; the batch's commit
  waits for the answer), and a batch fetched from a broker other than the ingestor's makes the
  worker exit (75) unapplied and unacked, to be restarted on the new broker from its start;
- each batch's messages (key and value bytes, offsets, batch order) are kept in the ledger's
  raw-event archive by the same commit, so `tally ledger rebuild` can replay them later: the
  embedded broker keeps nothing across restarts;
- after each batch the outbox is published: changed balances go to the compacted `balances`
  topic keyed by account, changed inventory records to the compacted `inventory` topic keyed by
  GPU UUID, at least once, after the commit that changed them;
- a message the broker refuses for its content (too large, corrupt: `content_refusal`) never
  stops the worker: it leaves the outbox, is kept in the store as undeliverable with the
  broker's reason, counted (`WorkerStats.undeliverable`, `tally_worker_undeliverable_total`) and
  logged in one bounded line, and the rest of the outbox goes on. Any other send error (the
  broker away) fails the publish as before, and the message is sent again later.

Sealing runs in the same process (one writer per data directory) on a timer, after batches,
and right after a batch that closed a period (which writes the period's checksum record).
A seal that cannot write its files (the segments volume is full: `SealError`) or finds a
manifest or segment damaged (`SegmentError`) does not stop the worker: it logs one error
(`sealing stopped: <file>: <reason>`; again only when the reason changes), counts the failure
(`tally_worker_seal_failures_total`), sets `tally_worker_sealing_blocked` to 1 and keeps
ingesting into the hot tables, where the committed rows stay; every seal interval it tries
again, and the first seal that succeeds logs `sealing resumed` and clears the gauge. (A batch
that closes a period must seal first: while sealing is blocked that batch fails like any failing
batch — the worker exits, to be restarted — and is applied once sealing works again.)

With the sealed ledger on an object store, a seal whose publish finds that another writer has
claimed the ledger since this one did (`WriterFenced`, `ledger.store.head`) ends the worker at
once (75, `FENCED_EXIT`), logging who holds the ledger now: nothing it published after that
claim is named by the store's head, so no reader reads it, and its committed rows stay in its
hot database, to be published when it is started again (and claims the ledger anew).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import faust

from ledger.errors import SealError, SegmentError
from ledger.excerpts import TEXT_LIMIT, bounded
from ledger.ingest import ConsumedMessage, Ingestor, IngestResult, InputTopics, OutputTopics
from ledger.store.head import WriterFenced
from ledger.store.hot import DuckDBStore
from ledger.store.identity import claim_zone
from ledger.store.port import OutboxMessage, SealResult
from streams.collector_pause import collector_paused, freeze_startup_objects
from streams.incarnation_gate import IncarnationChanged, IncarnationGate
from streams.jobs_first import JobsFirst
from streams.kafka import (
    ClusterIdentity,
    content_refusal,
    fetch_cluster_id,
)
from streams.progress import ConsumerProgress
from streams.sample_batches import PartitionHooks, SampleBatchConsumer
from streams.worker_memory import StoreThread, spare_memory
from streams.worker_settings import (
    SealingHealth,
    WorkerObserver,
    WorkerSettings,
    WorkerStats,
    faust_group_options,
)

__all__ = [  # the settings and what the worker reports live in `streams.worker_settings`
    "FENCED_EXIT",
    "INCARNATION_CHANGED_EXIT",
    "LedgerWorker",
    "SealingHealth",
    "WorkerObserver",
    "WorkerSettings",
    "WorkerStats",
    "faust_group_options",
]
log = logging.getLogger("tally.worker")
INCARNATION_CHANGED_EXIT = 75  # EX_TEMPFAIL: run it again
FENCED_EXIT = 75  # another writer claimed the published ledger: start again to claim it anew
HEARTBEAT_S = 1.0


def _consumed(event: Any) -> ConsumedMessage:
    """A Faust event as the ingest folds it and the archive keeps it (raw key and value)."""
    message = event.message
    return ConsumedMessage(
        message.topic, message.partition, message.offset, event.value, message.key
    )


AGENT_FAILED_EXIT = 70  # EX_SOFTWARE


async def _die(agent: Any, exc: BaseException) -> None:
    """An agent that fails must not leave a worker running that consumes nothing: exit, and let
    the supervisor start it again. Every batch commit is atomic, so nothing is half-applied."""
    log.critical(
        "agent %s failed: %s; exiting",
        getattr(agent, "name", agent),
        bounded(repr(exc)),
        exc_info=exc,
    )
    logging.shutdown()
    os._exit(AGENT_FAILED_EXIT)


def _apply_batch(
    ingestor: Ingestor, messages: list[ConsumedMessage], gate: IncarnationGate | None = None
) -> IngestResult:
    with collector_paused():
        return ingestor.apply(messages, None if gate is None else gate.confirm)


def _fenced(exc: WriterFenced) -> NoReturn:
    """Stop at once: another writer holds the published ledger (see the module docstring)."""
    log.critical("%s; exiting", bounded(str(exc), TEXT_LIMIT))
    logging.shutdown()
    os._exit(FENCED_EXIT)


class LedgerWorker:
    """Owns the Faust app, the store and the ingestor of one ledger data directory (a sharded
    worker, one per samples partition it is assigned: `streams.sharded_worker`)."""

    store: DuckDBStore

    def __init__(self, settings: WorkerSettings, observer: WorkerObserver | None = None) -> None:
        self.settings = settings
        self.observer = observer
        self.stats = WorkerStats()
        spare_memory()  # Arrow's allocator, pandas (`streams.worker_memory`)
        self._store_thread = StoreThread()  # every store call below runs on it
        self._open()
        self._lock = asyncio.Lock()
        self._identity = ClusterIdentity(settings.bootstrap[0], options=settings.kafka_options)
        self._publishing = asyncio.Lock()
        self._ingestor: Ingestor | None = None
        self._last_seal = time.monotonic()
        self.sealing = SealingHealth()
        self.ticked_at: float | None = None  # monotonic time of the loop's last heartbeat
        self.app = self._build_app()

    def _open(self) -> None:
        """Open the ledger the worker writes (a sharded worker opens its shards on assignment:
        `streams.sharded_worker`)."""
        s = self.settings
        claim_zone(s.data_dir, s.zone)  # before the store makes a new ledger
        if s.publisher is None:
            self.store = DuckDBStore(s.data_dir)
        else:  # imported when used: it brings snapshots, rebuild and verify with it
            from ledger.store.published import PublishedStore

            self.store = PublishedStore(s.data_dir, s.publisher)
        self.store.limit_memory(s.duckdb_memory_limit)

    @property
    def incarnation_known(self) -> bool:
        """Whether the broker's cluster id was read (the worker reached the broker)."""
        return self._ingestor is not None

    @property
    def samples_progress(self) -> ConsumerProgress:
        """The samples consumer's assignment, lag and latest fetch error (health checks)."""
        return self._samples.progress

    def _build_app(self) -> faust.App:
        s = self.settings
        app = faust.App(
            s.group_id,
            broker=[f"kafka://{server}" for server in s.bootstrap],
            store="memory://",
            datadir=str(s.data_dir / "faust"),
            autodiscover=False,
            web_enabled=False,
            topic_allow_declare=False,
            topic_disable_leader=True,
            consumer_auto_offset_reset="earliest",
            broker_credentials=s.faust_credentials,
            **faust_group_options(s.group_options),
            broker_commit_interval=1.0,
            broker_max_poll_records=max(500, s.batch_max_messages),
            stream_buffer_maxsize=max(4096, 2 * s.batch_max_messages),
            producer_acks=-1,
        )
        outputs = [s.deadletter_topic, s.alerts_topic]
        if s.balances_topic is not None:
            outputs.append(s.balances_topic)
        if s.inventory_topic is not None:
            outputs.append(s.inventory_topic)
        self._outputs = {
            name: app.topic(name, key_serializer="raw", value_serializer="raw") for name in outputs
        }

        async def _on_assigned(sender: Any, assigned: Any, **_: Any) -> None:
            await self._refresh_incarnation()

        app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]
        # Faust hands every agent its app's error hook: make a failing agent end the process.
        app._on_agent_error = _die  # type: ignore[method-assign]

        self._jobs_first = JobsFirst(
            s.bootstrap[0], s.jobs_topic, s.kafka_options, limit_s=max(1.0, 4 * s.batch_within_s)
        )
        self._samples = SampleBatchConsumer(
            s.bootstrap,
            s.group_id,
            s.samples_topic,
            s.batch_max_messages,
            s.batch_within_s,
            self._ingest_samples,
            self._refresh_incarnation,
            s.kafka_options,
            s.group_options,
            self._partition_hooks(),
        )

        @app.task  # type: ignore[untyped-decorator]
        async def ingest_samples() -> None:
            try:
                await self._samples.run()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # as for a failing agent: exit, to be restarted
                await _die("ledger-samples", exc)
            finally:
                await self._jobs_first.close()

        def batches(topic_name: str, agent_name: str, max_messages: int) -> None:
            source = app.topic(
                topic_name,
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
            )

            @app.agent(source, name=agent_name)
            async def fold(stream: Any) -> None:
                async for events in stream.take_events(max_messages, within=s.batch_within_s):
                    messages = [_consumed(e) for e in events]
                    await self._apply(messages)
                    await self.publish_outbox()

        self._add_inputs(app, batches)

        @app.timer(interval=HEARTBEAT_S)  # type: ignore[untyped-decorator]
        async def heartbeat() -> None:
            self.ticked_at = time.monotonic()

        @app.timer(interval=s.seal_interval_s)  # type: ignore[untyped-decorator]
        async def seal_timer() -> None:
            await self.publish_outbox()
            if time.monotonic() - self._last_seal >= s.seal_interval_s:
                await self.seal()

        return app

    def _add_inputs(self, app: faust.App, batches: Callable[[str, str, int], None]) -> None:
        """The admin, jobs and inventory-reports topics: Faust agents taking batches."""
        s = self.settings
        batches(s.admin_topic, "ledger-admin", 100)
        batches(s.jobs_topic, "ledger-jobs", s.batch_max_messages)
        batches(s.inventory_reports_topic, "ledger-inventory", 500)

    def _partition_hooks(self) -> PartitionHooks | None:
        """What the samples consumer tells of assignments (None: only that one happened)."""
        return None

    async def _ingest_samples(self, messages: list[ConsumedMessage]) -> None:
        ingestor, jobs = self._ingestor, self.settings.jobs_topic
        if ingestor is not None:  # the jobs published before these samples, folded first
            await self._jobs_first.wait(
                lambda p: ingestor.next_offset(jobs, p), self._samples.newest_ms
            )
        await self._apply(messages)
        await self.publish_outbox()
        if time.monotonic() - self._last_seal >= self.settings.seal_interval_s:
            await self.seal()

    async def _refresh_incarnation(self) -> None:
        incarnation = await fetch_cluster_id(
            self.settings.bootstrap[0], options=self.settings.kafka_options
        )
        async with self._lock:
            if self._ingestor is None or self._ingestor.incarnation != incarnation:
                if self._ingestor is not None:
                    log.warning(
                        "broker incarnation changed to %s: offsets start afresh", incarnation
                    )
                s = self.settings
                self._ingestor = await self._store_thread.run(
                    Ingestor,
                    self.store,
                    incarnation,
                    s.prices,
                    s.cost_centres,
                    s.idle_policy,
                    OutputTopics(
                        alerts=s.alerts_topic,
                        deadletter=s.deadletter_topic,
                        balances=s.balances_topic,
                        inventory=s.inventory_topic,
                    ),
                    InputTopics(
                        admin=s.admin_topic,
                        jobs=s.jobs_topic,
                        inventory=s.inventory_reports_topic,
                    ),
                    s.zone,
                )

    async def _apply(self, messages: list[ConsumedMessage]) -> None:
        if self._ingestor is None:
            await self._refresh_incarnation()
        assert self._ingestor is not None
        async with self._checked(self._ingestor.incarnation) as gate, self._lock:
            ingestor = self._ingestor
            assert ingestor is not None
            started = time.perf_counter()
            try:  # a batch that closes a period seals, and so publishes, first
                result = await self._store_thread.run(_apply_batch, ingestor, messages, gate)
            except WriterFenced as exc:
                _fenced(exc)
            elapsed = time.perf_counter() - started
            self.stats.last_commit_ms = elapsed * 1000
        self._count(result)
        self._observe(lambda o: o.observe_batch(result.messages, result.commit.postings, elapsed))
        if result.dead_letters:
            self._observe(lambda o: o.dead_letter(len(result.dead_letters)))
        if result.commit.closed:
            log.info("closed period(s) %s", ", ".join(result.commit.closed))
            await self.seal()

    @contextlib.asynccontextmanager
    async def _checked(self, applied: str) -> AsyncIterator[IncarnationGate]:
        """One fetched batch's broker-incarnation check (`_guard_incarnation`), the gate
        yielded for the batch's commits to wait on; a refusal ends the worker (75), also when
        the batch committed nothing (all of it applied before) or failed otherwise."""
        gate = self._guard_incarnation(applied)
        try:
            yield gate
        except IncarnationChanged as exc:
            self._incarnation_changed(exc)
        except Exception:  # fetched from another broker, it exits as a refused batch
            if (refused := await gate.verdict()) is not None:
                self._incarnation_changed(refused)
            raise
        else:
            if (refused := await gate.verdict()) is not None:  # a batch that committed nothing
                self._incarnation_changed(refused)
        finally:
            gate.close()

    def _guard_incarnation(self, applied: str) -> IncarnationGate:
        """Refuse a batch fetched from a broker other than the one the ingestor stands for.

        After a broker restart the consumer can fetch from the new broker before the group
        rebalances; applying those messages under the old incarnation would misfile them and
        make the new broker's first offsets look applied. The worker exits instead (nothing of
        the batch is applied or acked) and, restarted, starts the new incarnation at its
        beginning. The broker is asked now, as the batch is in hand; the gate returned holds
        the batch's commits until it answered (`streams.incarnation_gate`), and the worker
        exits on its refusal (`_incarnation_changed`).
        """
        return IncarnationGate(applied, self._identity.current())

    def _incarnation_changed(self, refused: IncarnationChanged) -> NoReturn:
        self._observe(lambda o: o.worker_error("incarnation_changed"))
        log.error(
            "the broker is now %s, not %s: exiting so a restart takes the new broker from "
            "its first offset",
            refused.current,
            refused.applied,
        )
        logging.shutdown()
        os._exit(INCARNATION_CHANGED_EXIT)

    def _observe(self, report: Callable[[WorkerObserver], None]) -> None:
        if self.observer is None:
            return
        try:
            report(self.observer)
        except Exception:  # the ledger goes on without its metrics
            log.exception("the worker observer failed")

    def _count(self, result: IngestResult) -> None:
        st = self.stats
        st.batches += 1
        st.messages += result.messages
        st.samples += result.samples
        st.duplicates += result.commit.duplicates
        st.dead_letters += len(result.dead_letters)
        st.alerts += len(result.alerts)
        st.admin_events += result.admin_events
        st.hold_events += result.hold_events
        st.balances_published += result.commit.balances_published
        log.info(
            "batch committed: %d messages (%d skipped), %d samples, %d admin events, "
            "%d hold events, %d postings, %d duplicates, %d dead letters, %d balances in %.1f ms",
            result.messages,
            result.skipped_messages,
            result.samples,
            result.admin_events,
            result.hold_events,
            result.commit.postings,
            result.commit.duplicates,
            len(result.dead_letters),
            result.commit.balances_published,
            st.last_commit_ms,
        )

    async def publish_outbox(self) -> None:
        """Send what committed batches queued (alerts, dead letters, balances), in order; forget
        each message once the broker acknowledged it, and set aside (`_undeliverable`) each one
        the broker refused for its content. Any other send error is raised, after what was
        acknowledged is forgotten: the rest stays queued for the next publish."""
        async with self._publishing:  # one publisher at a time, or a message could go out twice
            for store in self._outbox_stores():
                await self._publish_outbox_of(store)

    def _outbox_stores(self) -> list[DuckDBStore]:
        return [self.store]

    async def _publish_outbox_of(self, store: DuckDBStore) -> None:
        while True:
            async with self._lock:
                pending = await self._store_thread.run(store.pending_outbox)
            if not pending:
                return
            sent, refused, failure = await self._send(pending)
            async with self._lock:
                for message, why in refused:
                    await self._store_thread.run(store.mark_undeliverable, message.id, why)
                await self._store_thread.run(store.mark_sent, sent)
            for message, why in refused:
                self._undeliverable(message, why)
            if failure is not None:
                raise failure

    async def _send(
        self, pending: list[OutboxMessage]
    ) -> tuple[list[str], list[tuple[OutboxMessage, str]], BaseException | None]:
        """Send `pending`: the ids done with (acknowledged, or for a topic this worker does not
        publish), the messages refused for their content with why, and the first other error."""
        done: list[str] = []
        refused: list[tuple[OutboxMessage, str]] = []
        acks: list[tuple[OutboxMessage, Any]] = []
        failure: BaseException | None = None
        for m in pending:
            topic = self._outputs.get(m.topic)
            if topic is None:
                done.append(m.id)
                continue
            try:
                acks.append((m, await topic.send(key=m.key, value=m.value)))
            except Exception as exc:
                refusal = content_refusal(exc)
                if refusal is None:
                    failure = exc
                    break
                refused.append((m, f"{type(refusal).__name__}: {refusal}"))
        results = await asyncio.gather(*(a for _, a in acks), return_exceptions=True)
        for (m, _), result in zip(acks, results, strict=True):
            if not isinstance(result, BaseException):
                done.append(m.id)
                continue
            refusal = content_refusal(result)
            if refusal is not None:
                refused.append((m, f"{type(refusal).__name__}: {refusal}"))
            elif failure is None:
                failure = result
        return done, refused, failure

    def _undeliverable(self, message: OutboxMessage, why: str) -> None:
        self.stats.undeliverable += 1
        self._observe(lambda o: o.undeliverable(message.topic))
        log.error(
            "the broker refused outbox message %s (%d bytes for %s): %s; kept as undeliverable, "
            "the outbox goes on",
            bounded(message.id, 256),
            len(message.value),
            bounded(message.topic, 256),
            bounded(why, TEXT_LIMIT),
        )

    async def seal(self) -> None:
        """Seal what is committed; a seal that cannot write or finds the ledger damaged is
        recorded (`_seal_failed`) and tried again at the next interval."""
        s = self.settings
        async with self._lock:
            try:
                result = await self._store_thread.run(
                    self.store.seal, s.compact_below_rows, s.compact_min_segments
                )
            except (SealError, SegmentError) as exc:
                self._last_seal = time.monotonic()
                self._seal_failed(exc)
                return
            except WriterFenced as exc:
                _fenced(exc)
            await self._store_thread.run(self.store.prune_seen_events, s.dedupe_window_us)
            self._last_seal = time.monotonic()
        self._sealed(result)

    def _seal_failed(self, exc: SealError | SegmentError) -> None:
        self.stats.seal_failures += 1
        self._observe(lambda o: o.seal_failed())
        # the file differs from try to try (its range grows); what blocks sealing does not
        if self.sealing.failed(exc.reason if isinstance(exc, SealError) else str(exc)):
            self._observe(lambda o: o.sealing_blocked(True))
            log.error(
                "sealing stopped: %s; the committed rows stay in the hot database and ingest "
                "goes on; sealing is tried again every %.1f s",
                bounded(str(exc), TEXT_LIMIT),
                self.settings.seal_interval_s,
            )
        else:
            log.debug("sealing still blocked (%d tries): %s", self.sealing.failures, exc)

    def _sealed(self, result: SealResult) -> None:
        ended = self.sealing.succeeded()
        if ended:
            self._observe(lambda o: o.sealing_blocked(False))
            log.warning("sealing resumed after %d failed tries", ended)
        self.stats.segments_sealed += len(result.sealed)
        if result.sealed or result.compacted:
            log.info(
                "sealed %d segments, compacted into %d", len(result.sealed), len(result.compacted)
            )

    def run(self, loglevel: str = "warn", logging_config: dict[str, Any] | None = None) -> None:
        """Recover (seal what a previous run committed), then run until stopped. `loglevel` is
        Faust's (crit|error|warn|info|debug); `logging_config` (a `logging.config.dictConfig`)
        replaces Faust's own logging setup when given."""
        self._recover()
        freeze_startup_objects()
        worker = faust.Worker(
            self.app,
            loglevel=loglevel,
            logging_config=logging_config,
            quiet=True,
            redirect_stdouts=False,
        )
        worker.spinner = None  # it would re-level the root handler and draw on a terminal
        try:
            worker.execute_from_commandline()
        finally:
            self._close()

    def _recover(self) -> None:
        """Seal what a previous run committed."""
        s = self.settings
        try:
            self._sealed(self.store.seal(s.compact_below_rows, s.compact_min_segments))
        except (SealError, SegmentError) as exc:
            self._seal_failed(exc)
        except WriterFenced as exc:
            _fenced(exc)

    def _close(self) -> None:
        self.store.close()
        self._store_thread.close()
