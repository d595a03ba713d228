"""The scheduler service's path from a decision to the broker and then to the executor
(`Pipeline`), kept off the path of submits: a submit waits for its own publication, never for
a tick's executor calls.

Decisions are made and applied on the event loop in synchronous steps (`Dispatcher`: no await
between reading the state and changing it, so two never interleave), each queuing its
messages in the dispatcher's outbox in `tally-seq` order. Then:

- **Publishing** (`publish`): one round at a time (the `publishing` lock) takes the whole
  outbox, writes the works of the submits in it as one fsynced batch file (`WorkStore.detach`,
  off the loop), hands
  every message to the publisher, which sends them all before it waits for their
  acknowledgements (`KafkaPublisher`: no await per delivery), and retries with backoff for the
  caller's deadline while the broker is unavailable. A caller waits until every message up to
  its own seq is acknowledged (or set aside as undeliverable): the callers that arrive while a
  round is in flight are served together by the next one (group commit). Messages leave the
  outbox in order and a failed round puts its messages back at the outbox's front, so "up to
  seq" holds exactly when no message at or before seq is in the outbox or in the round in
  flight (`published`). A submit answered 201 is therefore on the topic (acks=all), its work on
  disk; one answered 202 (the broker did not take the round in time, or its work could not be
  written: nothing of that round is sent) stays in the outbox, its work in the store's memory,
  and goes out with a later round.
- **Enactment** (`enact`): the decisions that need the executor are queued in decision order
  as batches (`decided`, with the seq of their last message, in the synchronous step that made
  them — no await between — so batches are in seq order) and carried out in that order once
  that seq is published — by whoever holds `executor`, the lock around every use of the
  executor (enactment, with the run files' pending changes before it; recovery; the clean
  stop). A tick decides without it: it polls the executor only when no enactment is in flight
  (one in flight polls an executor that `PollsCheaply` itself, once its starts are made, and
  its starts are reported — `JobStarted`, applied and queued — as it ends; a tick that skipped
  its poll leaves it owed, `poll_owed`, to the next enactment, whatever the executor). A
  batch leaves the queue when it is taken, under that lock, so each decision is carried out
  once; the jobs whose stops and starts are under way are `in_flight`. The executor's calls run in a
  thread (`scheduler.enactment`: planned and followed up on the loop); a job cancelled or
  preempted meanwhile is stopped by its own later batch, after its start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ledger.job_events import JobEvent
from scheduler.dispatcher import Dispatcher
from scheduler.enactment import StartPool, carry_out, failures, plan
from scheduler.errors import BrokerUnavailable, MessageRefused
from scheduler.jobs_topic import Outgoing
from scheduler.ports import Placement, Publisher, Refused
from scheduler.work_store import Unwritten

log = logging.getLogger("tally.scheduler")


@dataclass(frozen=True, slots=True)
class Batch:
    """Applied decisions waiting for their enactment: their last message's seq, and them."""

    seq: int
    events: tuple[JobEvent, ...]


class Pipeline:
    """Publish in order with group commit, then enact in decision order; see the module."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        publisher: Publisher,
        set_aside: Callable[[Outgoing, str], None],
    ) -> None:
        self.dispatcher = dispatcher
        self.publisher = publisher
        self._set_aside = set_aside  # a message the broker refused for its content
        self.publishing = asyncio.Lock()
        self.executor = asyncio.Lock()
        self.in_flight: frozenset[str] = frozenset()
        self.poll_owed = False  # a tick skipped its poll while an enactment was in flight
        self.rounds = 0  # publishing rounds that went through
        self._batches: deque[Batch] = deque()
        self.starts = StartPool()  # the enactments' start threads, kept between them
        self._round_first: int | None = None  # seq of the first message of the round in flight

    # ------------------------------------------------------------------ publishing

    def published(self, seq: int) -> bool:
        """Every message with a seq up to `seq` is acknowledged (or set aside)."""
        if self._round_first is not None and self._round_first <= seq:
            return False
        outbox = self.dispatcher.outbox
        return not outbox or outbox[0].seq > seq

    async def publish(self, seq: int, deadline_s: float) -> bool:
        """Wait until every message up to `seq` is published, running rounds as needed; False
        when a round gave up (the broker unavailable past `deadline_s`: the messages wait)."""
        while not self.published(seq):
            async with self.publishing:
                if self.published(seq):
                    break
                if not await self._round(deadline_s):
                    return False
        return True

    async def _round(self, deadline_s: float) -> bool:
        works = self.dispatcher.works
        sync = works.detach() if works.unsynced else None
        pending = self.dispatcher.take_outbox()  # finds no work left to sync
        if not pending:
            if sync is not None:  # work of a submit the state refused
                await self._write(sync, 0)
            return True
        self._round_first = pending[0].seq
        done = False
        try:
            # the submitted jobs' work is on disk before their events; if it cannot be
            # written, nothing is sent: the round gave up, its submits are answered 202
            if sync is not None and not await self._write(sync, len(pending)):
                return False
            placed = await self._send(pending, deadline_s)
            if placed is None:
                return False
            for message, placement in zip(pending, placed, strict=True):
                if isinstance(placement, Refused):
                    self._set_aside(message, placement.reason)
                else:
                    self.dispatcher.published(message, *placement)
            done = True
            self.rounds += 1
            return True
        finally:
            self._round_first = None
            if not done:  # failed, given up or cancelled: back in front, in order
                self.dispatcher.outbox[:0] = pending

    async def _write(self, sync: Unwritten, waiting: int) -> bool:
        """Write and fsync the works `sync` took; False (and they are taken back, for the next
        round) if the disk refused."""
        try:
            await asyncio.to_thread(sync)
        except OSError as exc:
            self.dispatcher.works.restore(sync)
            log.error("job commands not written (%s); %d message(s) wait", exc, waiting)
            return False
        except BaseException:
            self.dispatcher.works.restore(sync)
            raise
        return True

    async def _send(self, pending: Sequence[Outgoing], deadline_s: float) -> list[Placement] | None:
        delay = 0.1
        started = time.monotonic()
        while True:
            try:
                return list(await self.publisher.publish(pending))
            except MessageRefused as exc:  # a publisher that cannot say which: no retry loop
                log.error("publishing refused (%s); %d message(s) wait", exc, len(pending))
                return None
            except BrokerUnavailable as exc:
                if time.monotonic() - started + delay > deadline_s:
                    log.warning("publishing failed (%s); %d message(s) wait", exc, len(pending))
                    return None
                log.warning("publishing failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------------ enactment

    def decided(self, events: Sequence[JobEvent]) -> None:
        """Queue applied decisions (their messages just queued) for enactment."""
        if events:
            self._batches.append(Batch(self.dispatcher.last_seq, tuple(events)))

    @property
    def waiting(self) -> int:
        """Decisions applied and not yet enacted."""
        return sum(len(b.events) for b in self._batches)

    def ready(self) -> bool:
        """A batch is published and waits for its enactment."""
        return bool(self._batches) and self.published(self._batches[0].seq)

    async def enact(self) -> None:
        """Carry out, in order, every queued batch whose messages are published (the caller
        holds `executor`); the events of starts that could not happen are applied and queued
        in turn (to be published before they are enacted)."""
        todo: list[JobEvent] = []
        while self.ready():
            todo.extend(self._batches.popleft().events)
        if not todo:
            return
        d = self.dispatcher
        planned = plan(todo, d.state, d.works.get)
        runs = d.runs
        removals = runs.detach() if runs is not None and runs.pending else None
        self.in_flight = planned.job_ids
        poll, self.poll_owed = self.poll_owed, False
        try:
            done = await asyncio.to_thread(
                carry_out, planned, d.executor, runs, removals, poll, self.starts
            )
        finally:
            self.in_flight = frozenset()
        self.decided(d.apply(failures(planned, done.failed, d.state, d.now_us())))
        self.decided(d.observe(done.statuses))  # its starts reported: published next round

    async def flush_runs(self) -> None:
        """Carry out the run files' pending records and removals, off the loop (the caller
        holds `executor`: no start writes its file meanwhile)."""
        runs = self.dispatcher.runs
        if runs is not None and runs.pending:
            await asyncio.to_thread(runs.detach())
