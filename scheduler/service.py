"""The scheduler as a running service: the pure core (`scheduler.cycle`, `scheduler.state`)
between Kafka, an executor and the HTTP API (`scheduler.api`).

It is three layers, each testable without the next:

- `Dispatcher` (`scheduler.dispatcher`, synchronous, no I/O but the executor's): the state, the
  jobs' records and histories, the holds it placed, the ledger's budgets and open idle alerts.
  Every decision is an event applied to the state as it is made and queued, in order, as a
  message for the `jobs` topic (`scheduler.jobs_topic`);
- `SchedulerService` (here, asyncio): decide → publish → enact through its `Pipeline`
  (`scheduler.pipeline`). A decision reaches the executor only after the broker acknowledged
  its events, so what runs is on the topic (unless the broker refused a message for its
  content: see Errors); submit and cancel answer once their events are published (submits
  that arrive together are published together in one round: group commit). Decisions are made
  in synchronous steps on the loop; only the uses of the executor are serialised (enactment,
  a cancel's stop), so a submit never waits for a tick's executor calls, and a tick decides
  (polling the executor only when no enactment is in flight) while the previous tick's
  decisions are being enacted: `run` enacts behind its ticks in a task of its own;
- `run_service` (here): the Kafka adapters (`scheduler.kafka`) and the API server around it.

Monitoring goes through the `SchedulerObserver` port (`scheduler.ports`): admissions and
preemptions per queue as decided, and pending jobs per queue.

Consumes
    jobs      (at start) the whole topic, to rebuild the state: the service is a projection of
              it. Messages are applied in publication order (the `tally-seq` header), since job
              and GPU events are keyed differently and land in different partitions.
    balances  compacted, read from the start: `budget:<team>` → the team's budget, and
              `consumer:<team>/…` GPU-ms totals → metered usage for fair share.
    alerts    `IdleGpuDetected`/`IdleGpuResolved`, read from the start: the open alerts drive
              idle reclaim by queue policy (`scheduler.reclaim`); its own `tally.job.*` alerts
              rebuild what `scheduler.job_alerts` has open.
    inventory compacted, read to its end at start (before the jobs topic) and followed after:
              the GPUs the collectors report (`scheduler.inventory`). Before every decision the
              placeable ones — not unhealthy, not cordoned, not stale at that moment — become
              the state's fleet; a GPU no collector reported is never placed on. A job running
              on a GPU gone unhealthy is preempted (`gpu_unhealthy`) and requeued
              (`scheduler.health`), before each tick's decisions.
Produces, on `alerts` (when the dispatcher has a `JobAlertWatch`)
    `tally.job.idle` / `tally.job.pending` and their resolutions, keyed by job id, after each
    tick; best effort: kept for the next tick while the broker does not take them.
Produces, on `jobs`
    JobSubmitted, JobAdmitted, JobWaiting{reason}, JobStarted, JobPreempted{by, reason},
    JobReclaimed, JobFinished, JobFailed — keyed by job id; GpuAssigned/GpuReleased keyed by GPU
    UUID; HoldPlaced after an admission with a hold, HoldReleased after the end of a held run —
    keyed by job id (`ledger.holds`). Each hold is counted once between the scheduler and the
    ledger (`scheduler.hold_acks`).

Restart: the state is rebuilt from the `jobs` topic; the jobs' commands are kept in `work_dir`
(`scheduler.work_store`); jobs the topic says are running but the executor does not know fail
with `executor_lost`, retried per their queue. On a clean stop the service stops the local jobs
it runs the same way.

Errors (`scheduler.errors`): `BrokerUnavailable` when Kafka cannot be reached (the messages
wait in the outbox and are sent again), `Rejected` for requests the scheduler refuses. A
message the broker refuses for its content (the publisher's `Refused`: too large, corrupt) is
never sent again and never holds up the messages behind it: it leaves the outbox, is recorded
as undeliverable (`scheduler.undeliverable`, `SchedulerService.undeliverable`, the observer's
`scheduler_undeliverable`: `tally_scheduler_undeliverable_total`) and logged, and its decision
is enacted like the others — the topic, and so a replay, will not know it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.admin.requests import ApprovalPolicy
from ledger.excerpts import bounded
from ledger.job_events import JobAdmitted, JobEvent, JobPreempted
from ledger.units import US_PER_HOUR
from scheduler.dispatcher import DEFAULT_POLICY, Dispatcher
from scheduler.errors import BrokerUnavailable, MessageRefused, Rejected, RejectKind
from scheduler.health import unhealthy_decisions
from scheduler.interpreter import DEFAULT_SWITCH_INTERVAL_S, serving_tuned
from scheduler.inventory import FleetInventory
from scheduler.jobs_topic import Outgoing
from scheduler.kafka import Feeds, KafkaPublisher, read_topic
from scheduler.model import Policy
from scheduler.pipeline import Pipeline
from scheduler.ports import AlertPublisher, Publisher, SchedulerObserver
from scheduler.records import JobRecord, SubmitRequest
from scheduler.requests import RequestDesk
from scheduler.undeliverable import FILE_NAME as UNDELIVERABLE_FILE
from scheduler.undeliverable import UndeliverableLog

log = logging.getLogger("tally.scheduler")
MAX_WAITING_ALERTS = 10_000


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    bootstrap: tuple[str, ...]
    jobs_topic: str
    balances_topic: str
    alerts_topic: str
    ledger_group: str  # the ledger worker's consumer group (hold acknowledgements)
    work_dir: Path
    client_id: str = "tally"
    cycle_interval_s: float = 2.0
    policy: Policy = DEFAULT_POLICY
    half_life_us: int = 7 * 24 * US_PER_HOUR
    default_estimate_us: int = US_PER_HOUR
    api_host: str = "127.0.0.1"
    api_port: int = 8600
    max_body_bytes: int = 64 * 1024
    stop_jobs_on_exit: bool = True
    publish_timeout_s: float = 30.0
    kafka_options: Mapping[str, Any] = field(default_factory=dict)  # security: SASL, TLS
    inventory_topic: str = "tally.inventory"
    admin_topic: str | None = None  # price changes (`scheduler.price_feed`); None: config only
    # what new requests record (`scheduler.requests`)
    approvals: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    gil_switch_interval_s: float = DEFAULT_SWITCH_INTERVAL_S  # while serving (`.interpreter`)


@dataclass(frozen=True, slots=True)
class Accepted:
    """A submit or cancel the service took: the job, and whether its events are on the topic
    yet (False: the broker did not take them in time; they are published, and carried out,
    when it does)."""

    record: JobRecord
    published: bool
    replayed: bool = False  # the answer to an earlier request with the same Idempotency-Key


class SchedulerService:
    """The asyncio side: decide → publish → enact (`scheduler.pipeline`), the tick timer, and
    what the API calls.

    Invariant: a decision is enacted only after the broker acknowledged its events (or refused
    one for its content: never retried, it is set aside as undeliverable). Decisions
    whose publication did not finish wait in the dispatcher's outbox, and their enactment in
    the pipeline's queue, for the next attempt (each tick tries again); nothing is lost or
    reordered. Decisions are made in synchronous steps on the loop; the executor lock
    (`pipeline.executor`) serialises the uses of the executor — enactments, a cancel's stop,
    recovery, the clean stop — and neither a tick's decide (which polls the executor only
    while the lock is free) nor a submit takes it: a submit waits only for the publishing
    round that carries its `JobSubmitted`.

    The `observer` hears the admissions and preemptions of every decision in the step that
    makes it, and every queue's length after each tick, submit and cancel; it never affects a
    decision, and an observer that raises is logged and ignored.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        publisher: Publisher,
        *,
        cycle_interval_s: float = 2.0,
        publish_timeout_s: float = 30.0,
        tick_publish_timeout_s: float = 5.0,
        observer: SchedulerObserver | None = None,
        undeliverable_log: UndeliverableLog | None = None,
        alert_publisher: AlertPublisher | None = None,
        inventory: FleetInventory | None = None,
        requests: RequestDesk | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self.requests = requests  # None: no admin topic, no requests API
        self.publisher = publisher
        self.alert_publisher = alert_publisher
        self.observer = observer
        self.undeliverable_log = undeliverable_log
        self.undeliverable = 0  # messages the broker refused for their content
        self.inventory = inventory
        self.cycle_interval_s = cycle_interval_s
        self.publish_timeout_s = publish_timeout_s
        self.tick_publish_timeout_s = tick_publish_timeout_s
        self.pipeline = Pipeline(dispatcher, publisher, self._undeliverable)
        self.lock = self.pipeline.executor  # the uses of the executor, one at a time
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._enactor: asyncio.Task[None] | None = None  # `run`'s enactment, behind its ticks
        self.ticks = 0

    @property
    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher: Dispatcher) -> None:
        """Another dispatcher (a test's): the pipeline publishes and enacts its decisions."""
        self._dispatcher = self.pipeline.dispatcher = dispatcher

    def _undeliverable(self, message: Outgoing, reason: str) -> None:
        """Set aside a message the broker refused for its content: counted, recorded, logged."""
        self.undeliverable += 1
        log.error(
            "the broker refused jobs message %d (%s, %d bytes): %s; recorded as undeliverable, "
            "the messages behind it go on",
            message.seq,
            type(message.event).__name__,
            len(message.value),
            bounded(reason),
        )
        try:
            if self.undeliverable_log is not None:
                self.undeliverable_log.record(message, reason, self.dispatcher.clock.now_us())
        except OSError:
            log.exception("the undeliverable message could not be recorded")
        try:
            if self.observer is not None:
                self.observer.scheduler_undeliverable(1)
        except Exception:  # monitoring must never stop scheduling
            log.exception("the scheduler observer failed")

    async def _commit(self, deadline_s: float) -> bool:
        """Publish everything decided so far, then enact what is published, until nothing
        waits (starts that fail come back as events, committed in turn); the caller holds the
        executor lock. False when publishing gave up: the rest waits for the next try."""
        while True:
            if not await self.pipeline.publish(self.dispatcher.last_seq, deadline_s):
                return False
            if not self.pipeline.ready():
                return True
            await self.pipeline.enact()

    def _report(self, events: Sequence[JobEvent]) -> None:
        observer = self.observer
        if observer is None:
            return
        admissions: Counter[str] = Counter()
        preemptions: Counter[str] = Counter()
        for event in events:
            if isinstance(event, JobAdmitted | JobPreempted):
                queue = self.dispatcher.queue_of(event.job_id)
                if queue is not None:
                    counts = admissions if isinstance(event, JobAdmitted) else preemptions
                    counts[queue] += 1
        try:
            for queue, count in admissions.items():
                observer.admitted(queue, count)
            for queue, count in preemptions.items():
                observer.preempted(queue, count)
            for queue, length in self.dispatcher.queue_lengths().items():
                observer.scheduler_queue_length(queue, length)
        except Exception:  # monitoring must never stop scheduling
            log.exception("the scheduler observer failed")

    def sync_fleet(self) -> None:
        """Make the inventory's GPUs placeable at this moment the state's fleet (a GPU gone
        stale since the last decision is placed on no more)."""
        if self.inventory is not None:
            self.inventory.sync(self.dispatcher.state, self.dispatcher.clock.now_us())

    def stop_on_unhealthy(self) -> list[JobEvent]:
        """Preempt the jobs running on GPUs the inventory calls unhealthy (`gpu_unhealthy`)."""
        if self.inventory is None:
            return []
        bad = self.inventory.unhealthy()
        if not bad:
            return []
        snap = self.dispatcher.state.snapshot(self.dispatcher.clock.now_us(), 1)
        return self.dispatcher.apply(unhealthy_decisions(bad, snap))

    async def tick(self) -> list[JobEvent]:
        """One tick, carried out to its end: decide and publish (`decide`), then enact (under
        the executor lock, after any enactment in flight)."""
        events = await self.decide()
        await self.enact()
        return events

    async def decide(self) -> list[JobEvent]:
        """A tick's decisions, without the executor lock: the executor's news (polled here
        only when no enactment is in flight — one in flight polls it itself when its starts
        are made), then the decisions, applied and queued for enactment in the synchronous
        step that made them; then published (group commit)."""
        news = None if not self.lock.locked() else ()  # None: `decide` polls, on the loop
        if news is not None:  # the enactment in flight, or the next one, polls instead
            self.pipeline.poll_owed = True
        self.sync_fleet()
        events = self.stop_on_unhealthy()
        events += self.dispatcher.decide(news)
        self._report(events)
        self.pipeline.decided(events)  # in the step that decided them: in decision order
        await self.pipeline.publish(self.dispatcher.last_seq, self.tick_publish_timeout_s)
        await self._publish_alerts()
        self.ticks += 1
        return events

    async def enact(self) -> None:
        """Under the executor lock: the run files' pending changes, then publish and enact
        until nothing published waits for its enactment."""
        async with self.lock:
            await self.pipeline.flush_runs()
            await self._commit(self.tick_publish_timeout_s)

    async def _enact_in_background(self) -> None:
        try:
            await self.enact()
        except Exception:  # a bug in one enactment must not stop the scheduler
            log.exception("an enactment failed")

    def _enacting(self) -> None:
        """Start enacting what the ticks decided, unless an enactment task runs (it enacts
        every batch that becomes ready before it ends)."""
        task = self._enactor
        if (task is None or task.done()) and not self._stopping.is_set():
            self._enactor = asyncio.create_task(self._enact_in_background(), name="enact")

    async def _publish_alerts(self) -> None:
        """The job alerts the tick raised, on the alerts topic; kept for the next tick when the
        broker does not take them (at most `MAX_WAITING_ALERTS`, the oldest dropped)."""
        watch = self.dispatcher.job_alerts
        if watch is None or self.alert_publisher is None or not watch.outbox:
            return
        messages = watch.take()
        try:
            await self.alert_publisher.publish_alerts(messages)
        except (BrokerUnavailable, MessageRefused) as exc:
            watch.outbox[:0] = messages[-MAX_WAITING_ALERTS:]
            log.warning("job alerts not published (%s); %d wait", exc, len(watch.outbox))

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Recover after a replay: lost jobs fail; their events are published."""
        async with self.lock:
            self.sync_fleet()
            events = self.dispatcher.recover()
            self._report(events)
            self.pipeline.decided(events)
            await self._commit(self.publish_timeout_s)

    async def run(self) -> None:
        """Tick every `cycle_interval_s`, or sooner when woken, until `stop`."""
        while not self._stopping.is_set():
            # Cleared before deciding: a submit applied after this tick's decisions, whose
            # publish ends while the tick still awaits its own, wakes the next tick at once.
            self._wake.clear()
            try:  # the next tick decides while this one's enactment is under way
                await self.decide()
                self._enacting()
            except Exception:  # a bug in one tick must not stop the scheduler
                log.exception("a scheduling tick failed")
            if self.dispatcher.capped:  # what the cap left out is the next tick's, at once
                await asyncio.sleep(0)  # (submits and cancels first)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.cycle_interval_s)

    async def stop(self, stop_jobs: bool) -> None:
        self._stopping.set()
        self._wake.set()
        try:
            if self._enactor is not None:  # what was decided is carried out (or waits: replay)
                await self._enactor
            if not stop_jobs:
                return
            async with self.lock:
                await asyncio.to_thread(self.dispatcher.stop_all, "the scheduler stopped")
                if self.dispatcher.runs is not None:
                    await asyncio.to_thread(self.dispatcher.runs.flush)
                await self.pipeline.publish(self.dispatcher.last_seq, deadline_s=5.0)
        finally:
            self.pipeline.starts.close()  # the start threads end

    # ------------------------------------------------------------------ what the API calls

    async def submit(self, request: SubmitRequest) -> Accepted:
        """Submit, once per idempotency key: a repeat (same key and request) answers with the
        job the first made, publishing what of it still waits. Decided in one synchronous step
        (checked against the key, applied, queued); then it waits for a publishing round to
        carry its message (group commit with the other submits, the ticks' decisions and their
        enactment going on meanwhile)."""
        earlier = self.dispatcher.keys.submitted(request)
        if earlier is None:
            job_id = self.dispatcher.submit(request).job_id
            self._report(())
        else:
            job_id = earlier
        seq = self.dispatcher.last_seq
        published = await self.pipeline.publish(seq, self.publish_timeout_s)
        self.wake()
        return Accepted(self.dispatcher.records[job_id], published, replayed=earlier is not None)

    async def cancel(
        self,
        job_id: str,
        team: str | None,
        idempotency_key: str | None = None,
        client: str | None = None,
        caller: str | None = None,
    ) -> Accepted:
        """Cancel a job `team` (None: every team) may see. The same idempotency key again answers
        with the cancelled job (a repeat), not a conflict. `client` (the caller's address) goes
        in the event with who cancelled (`caller`, else `admin` or `team:<name>`), for the audit
        trail. Decided in one synchronous step; answered once its events are published and its
        stop carried out (after any enactment in flight, e.g. the job's own start)."""
        record = self.dispatcher.visible(job_id, team)
        if record is None:
            raise Rejected(RejectKind.NOT_FOUND, f"no job {job_id}")
        key = None
        who = caller or ("admin" if team is None else f"team:{team}")
        if idempotency_key is not None:
            key = (who, idempotency_key)
            if self.dispatcher.keys.cancelled(*key, job_id):
                seq = self.dispatcher.last_seq
                published = await self.pipeline.publish(seq, self.publish_timeout_s)
                return Accepted(record, published, replayed=True)
        by = None if client is None else (who, client)
        record, events = self.dispatcher.cancel(job_id, key=key, by=by)
        self._report(events)
        self.pipeline.decided(events)
        published = await self.pipeline.publish(self.dispatcher.last_seq, self.publish_timeout_s)
        if published:
            async with self.pipeline.executor:
                published = await self._commit(self.publish_timeout_s)
        self.wake()
        return Accepted(self.dispatcher.records[record.job_id], published)


@dataclass(slots=True)
class ServiceStatus:
    """How far `run_service` got, for health checks (read from other threads): the jobs topic
    replayed, the API serving, and the feeds whose latest read may have failed."""

    replayed: bool = False
    serving: bool = False
    feeds: Feeds | None = None

    @property
    def feed_error(self) -> str | None:
        return None if self.feeds is None else self.feeds.error


class WallClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


async def run_service(
    settings: ServiceSettings,
    dispatcher: Dispatcher,
    serve_api: Callable[[SchedulerService], Awaitable[Callable[[], Awaitable[None]]]],
    *,
    ready: Callable[[], None] | None = None,
    stop_event: asyncio.Event | None = None,
    observer: SchedulerObserver | None = None,
    status: ServiceStatus | None = None,
    inventory: FleetInventory | None = None,
) -> None:
    """Replay the jobs topic, recover, then run feeds, ticks and the API until stopped
    (SIGTERM/SIGINT, or `stop_event`). `serve_api` starts the API and returns its closer;
    `observer` hears the service's decisions and queue lengths (see `SchedulerService`);
    `status` follows the start-up (health checks); `inventory`, when given, is read from the
    inventory topic first and followed after (the GPUs to place on). From the replay's end until
    the service stops, the interpreter is tuned for serving (`scheduler.interpreter`: what the
    replay built frozen out of the cyclic collector's passes, the GIL switched every
    `settings.gil_switch_interval_s`); then as before."""
    status = status if status is not None else ServiceStatus()
    bootstrap = settings.bootstrap[0]
    if inventory is not None:
        reported = await read_topic(
            bootstrap,
            settings.inventory_topic,
            f"{settings.client_id}-inventory",
            settings.kafka_options,
        )
        for message in reported:
            inventory.on_record(message.value)
        log.info("read %d GPUs from %s", len(inventory.gpus), settings.inventory_topic)
    messages = await read_topic(
        bootstrap, settings.jobs_topic, f"{settings.client_id}-replay", settings.kafka_options
    )
    applied = dispatcher.replay(messages)
    log.info(
        "replayed %d events from %s (%d refused); %d pending, %d running",
        applied,
        settings.jobs_topic,
        dispatcher.replay_errors,
        dispatcher.state.pending_count,
        dispatcher.state.running_count,
    )
    status.replayed = True
    with serving_tuned(settings.gil_switch_interval_s):
        await _serve(
            settings, dispatcher, serve_api, ready, stop_event, observer, status, inventory
        )


async def _serve(
    settings: ServiceSettings,
    dispatcher: Dispatcher,
    serve_api: Callable[[SchedulerService], Awaitable[Callable[[], Awaitable[None]]]],
    ready: Callable[[], None] | None,
    stop_event: asyncio.Event | None,
    observer: SchedulerObserver | None,
    status: ServiceStatus,
    inventory: FleetInventory | None,
) -> None:
    """`run_service` after the replay: the publisher, feeds, ticks and API until stopped."""
    publisher = KafkaPublisher(settings)
    await publisher.start()
    desk = RequestDesk(settings.approvals, publisher) if settings.admin_topic else None
    feeds = Feeds(settings, dispatcher, inventory, desk)
    status.feeds = feeds
    service = SchedulerService(
        dispatcher,
        publisher,
        cycle_interval_s=settings.cycle_interval_s,
        publish_timeout_s=settings.publish_timeout_s,
        observer=observer,
        undeliverable_log=UndeliverableLog(settings.work_dir / UNDELIVERABLE_FILE),
        alert_publisher=publisher,
        inventory=inventory,
        requests=desk,
    )
    stopping = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopping.set)
    close_api: Callable[[], Awaitable[None]] | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        await feeds.start()
        await feeds.poll(timeout_ms=500)  # balances first, so the first cycle knows budgets
        await service.start()
        close_api = await serve_api(service)
        status.serving = True
        tasks = [
            asyncio.create_task(feeds.run(stopping), name="feeds"),
            asyncio.create_task(service.run(), name="ticks"),
        ]
        if ready is not None:
            ready()
        await stopping.wait()
    finally:
        status.serving = False
        if close_api is not None:
            await close_api()
        await service.stop(settings.stop_jobs_on_exit)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await feeds.stop()
        await publisher.stop()
