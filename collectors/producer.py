"""The sample producer: carries sample envelopes to the samples topic, keyed by GPU UUID, and
loses nothing while the broker is away.

Samples are buffered per GPU between `flush()` calls and each GPU's buffer goes out as one
message (a CloudEvents JSON batch), so a collector that packs several rounds per flush sends
few large messages instead of many small ones. Other messages (GPU health events for the alerts
topic) are buffered with `topic_sender(topic)` and travel the same way.

Delivery:
- aiokafka with `acks=all`, idempotence, batching (`linger_ms`) and compression (gzip by
  default: always available; lz4, zstd and snappy need `cramjam`).
- Without a spool, `flush()` returns once the broker acknowledged every message, or raises
  `ProducerError` and keeps the messages for the next flush.
- With a spool (`collectors.spool.Spool`), `flush()` never fails for the broker's sake: a
  message the broker did not acknowledge within `send_timeout_s` is written to the spool, the
  connection is dropped and re-made in the background (backoff up to `max_backoff_s`). While
  the spool holds anything, new messages are appended behind it, and every flush on a live
  connection replays the spool oldest first (for at most `replay_budget_s`); a record leaves
  the spool only after the broker acknowledged it. Anything resent (a crash mid-replay, an
  acknowledgement lost with the connection) is the same event again: ids are content-derived
  and the ledger drops duplicate ids, so at-least-once delivery is enough.
- A message the broker (or the client, over `max_request_size`) refuses for its content (too
  large, corrupt) is never sent again nor spooled: it is dropped, counted
  (`tally_collector_samples_dropped_total{reason="rejected"}`) and recorded in
  `undeliverable.jsonl` beside the spool (`collectors.undeliverable`); the others go on.

The aiokafka side (the producer's settings, the InitProducerId v3 workaround for tansu, closing
a producer whose broker is gone, which errors mean what) is `collectors.kafka`'s. A broker that
refuses idempotence gets ONE warning, `tally_collector_producer_idempotent 0`, and a producer
without idempotence for the rest of the process: resends are harmless (see above).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from collectors.errors import ProducerError, SpoolError
from collectors.kafka import (
    BROKER_ERRORS,
    CODECS,
    REJECTED,
    abandon,
    new_kafka_producer,
    refuses_idempotence,
)
from collectors.metrics import CollectorMetrics, ErrorKind
from collectors.spool import DropReason, Spool, SpoolRecord
from collectors.undeliverable import FILE_NAME as UNDELIVERABLE_FILE
from collectors.undeliverable import record_undeliverable
from ledger.events import SampleEnvelope, encode_batch

log = logging.getLogger("tally.collector.producer")

_REPLAY_BATCH = 512


def _cannot_connect(exc: BaseException) -> ProducerError:
    return ProducerError(f"cannot connect the producer: {exc}")


class Loss(StrEnum):
    """Why the producer itself dropped samples (the spool's reasons are `DropReason`)."""

    REJECTED = "rejected"  # the broker refuses the message itself (too large, corrupt)
    UNSPOOLABLE = "spool_error"  # the spool could not be written


class _Outcome(StrEnum):
    ACKED = "acked"
    REJECTED = "rejected"
    UNSENT = "unsent"


@dataclass(frozen=True, slots=True)
class _Session:
    kafka: AIOKafkaProducer
    idempotent: bool


class SampleProducer:
    """Buffers envelopes per GPU and sends each GPU's buffer as one message on `flush()`."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        client_id: str = "tally-collector",
        linger_ms: int = 5,
        max_message_bytes: int = 900_000,
        *,
        spool: Spool | None = None,
        undeliverable: Path | None = None,
        metrics: CollectorMetrics | None = None,
        compression: str | None = "gzip",
        idempotence: bool = True,
        send_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        replay_budget_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        kafka_options: Mapping[str, Any] | None = None,
    ) -> None:
        if compression is not None and compression not in CODECS:
            raise ProducerError(f"unknown compression {compression!r}: use one of {[*CODECS]}")
        if compression is not None and not CODECS[compression]():
            raise ProducerError(
                f"compression {compression!r} needs the cramjam package; gzip needs nothing"
            )
        self.bootstrap = bootstrap
        self.topic = topic
        self.client_id = client_id
        self.kafka_options = dict(kafka_options or {})  # security: SASL, TLS
        self.linger_ms = linger_ms
        self.max_message_bytes = max_message_bytes
        self.compression = compression
        self.spool = spool
        if undeliverable is None and spool is not None:
            undeliverable = spool.directory / UNDELIVERABLE_FILE
        self.undeliverable = undeliverable
        self.metrics = metrics or CollectorMetrics()
        self.send_timeout_s = send_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.replay_budget_s = replay_budget_s
        self._monotonic = monotonic
        self._idempotence = idempotence
        self._idempotence_refused = False
        self._buffers: dict[str, list[SampleEnvelope]] = {}
        self._others: list[SpoolRecord] = []
        self._retry: list[SpoolRecord] = []  # unsent messages of a failed flush (no spool)
        self._session: _Session | None = None
        self._connecting: asyncio.Task[_Session] | None = None
        self._backoff_s = min_backoff_s
        self._next_attempt = 0.0
        self._outage_logged = False
        self.sent_messages = 0
        self.sent_samples = 0  # acknowledged by the broker, first send and replay together
        self.spooled_samples = 0
        self.replayed_samples = 0
        self.dropped_samples = 0
        self.metrics.producer_idempotent.set(1 if idempotence else 0)
        if spool is not None:
            spool.on_drop = self._spool_dropped
            if spool.recovery.truncated_bytes:
                self.metrics.error(ErrorKind.SPOOL_RECOVERY)
            self._update_gauges()

    # -------------------------------------------------------------------------- lifecycle

    @property
    def connected(self) -> bool:
        return self._session is not None

    @property
    def idempotent(self) -> bool:
        return self._idempotence and not self._idempotence_refused

    async def start(self) -> None:
        """Connect. Without a spool a broker that cannot be reached raises `ProducerError`;
        with one, the producer starts spooling and keeps trying in the background."""
        try:
            session = await self._connect()
        except BROKER_ERRORS as exc:
            if self.spool is None:
                raise _cannot_connect(exc) from exc
            self.metrics.error(ErrorKind.CONNECT)
            self._lost(f"cannot reach the broker at {self.bootstrap}: {exc}")
            return
        self._up(session)

    async def stop(self) -> None:
        """Close the connection; buffered messages not flushed stay unsent."""
        task, self._connecting = self._connecting, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is None:
                with contextlib.suppress(KafkaError, OSError):
                    await task.result().kafka.stop()
        session, self._session = self._session, None
        self.metrics.broker_up.set(0)
        if session is not None:
            try:
                await asyncio.wait_for(session.kafka.stop(), self.send_timeout_s)
            except BROKER_ERRORS:
                await abandon(session.kafka)

    async def _connect(self) -> _Session:
        idempotent = self.idempotent
        kafka = new_kafka_producer(
            self.bootstrap,
            self.client_id,
            self.linger_ms,
            self.compression,
            idempotent,
            self.kafka_options,
        )
        try:
            await asyncio.wait_for(kafka.start(), self.connect_timeout_s)
        except BaseException as exc:
            with contextlib.suppress(*BROKER_ERRORS):
                await asyncio.wait_for(kafka.stop(), 5.0)
            if idempotent and refuses_idempotence(exc):
                self._refuse_idempotence(exc)
                return await self._connect()
            raise
        return _Session(kafka, idempotent)

    def _refuse_idempotence(self, exc: BaseException) -> None:
        self._idempotence_refused = True
        self.metrics.producer_idempotent.set(0)
        log.warning(
            "the broker at %s refused an idempotent producer (%s: %s); producing without "
            "idempotence. Nothing is lost or double-counted: a resent sample has the same "
            "content-derived event id and the ledger drops duplicate ids",
            self.bootstrap,
            type(exc).__name__,
            exc,
        )

    def _up(self, session: _Session) -> None:
        self._session = session
        self._backoff_s = self.min_backoff_s
        self.metrics.broker_up.set(1)
        waiting = self.spool.records if self.spool is not None else 0
        if self._outage_logged or waiting:
            log.info(
                "connected to the broker at %s; %d spooled records to replay",
                self.bootstrap,
                waiting,
            )
        self._outage_logged = False

    def _lost(self, why: str) -> None:
        self._session = None
        self.metrics.broker_up.set(0)
        self._next_attempt = self._monotonic() + self._backoff_s
        self._backoff_s = min(self.max_backoff_s, self._backoff_s * 2)
        if not self._outage_logged:
            self._outage_logged = True
            where = f"spooling to {self.spool.directory}" if self.spool is not None else "no spool"
            log.warning("%s; %s until it is back", why, where)

    async def _poll_connection(self) -> None:
        """Take the result of a background connect; start one when it is due."""
        if self._session is not None:
            return
        task = self._connecting
        if task is not None and task.done():
            self._connecting = None
            try:
                self._up(task.result())
                return
            except Exception as exc:  # the boundary of a background task: keep collecting
                self.metrics.error(ErrorKind.CONNECT)
                log.debug("reconnecting to %s failed: %s", self.bootstrap, exc)
                self._lost(f"cannot reach the broker at {self.bootstrap}: {exc}")
        if self._connecting is None and self._monotonic() >= self._next_attempt:
            self._connecting = asyncio.create_task(self._connect())

    # -------------------------------------------------------------------------- buffering

    def add(self, envelopes: Iterable[SampleEnvelope]) -> None:
        for envelope in envelopes:
            self._buffers.setdefault(envelope.data.gpu_uuid, []).append(envelope)

    def topic_sender(self, topic: str) -> Callable[[bytes, bytes], None]:
        """A function that buffers one message (key, value) for `topic` until the next flush."""

        def send(key: bytes, value: bytes) -> None:
            self._others.append(SpoolRecord(topic, key, value, 0))

        return send

    def pending(self) -> int:
        """Samples buffered and not yet flushed."""
        return sum(len(b) for b in self._buffers.values()) + sum(m.samples for m in self._retry)

    def _take(self) -> list[SpoolRecord]:
        buffers, self._buffers = self._buffers, {}
        messages, self._retry = self._retry, []
        for key, envelopes in buffers.items():
            messages.extend(
                SpoolRecord(self.topic, key.encode(), value, samples)
                for value, samples in self._chunks(envelopes)
            )
        messages.extend(self._others)
        self._others = []
        return messages

    def _chunks(self, envelopes: list[SampleEnvelope]) -> Iterable[tuple[bytes, int]]:
        value = encode_batch(envelopes)
        if len(value) <= self.max_message_bytes or len(envelopes) == 1:
            yield value, len(envelopes)
            return
        half = len(envelopes) // 2
        yield from self._chunks(envelopes[:half])
        yield from self._chunks(envelopes[half:])

    # -------------------------------------------------------------------------- flushing

    async def flush(self) -> int:
        """Send what is buffered; returns the samples the broker acknowledged in this call.

        Without a spool it waits for the acknowledgement of every message or raises
        `ProducerError`. With a spool, what is not acknowledged is spooled and replayed later.
        """
        messages = self._take()
        if self.spool is None:
            return await self._flush_direct(messages)
        spool = self.spool
        await self._poll_connection()
        acked = 0
        if self._session is not None and not spool.records:
            outcomes = await self._deliver(messages)
            acked = self._settle(messages, outcomes, replay=False)
            self._to_spool(
                [m for m, o in zip(messages, outcomes, strict=True) if o is _Outcome.UNSENT]
            )
        else:
            self._to_spool(messages)
            if self._session is not None:
                acked = await self._replay(spool)
        self._update_gauges()
        return acked

    async def _flush_direct(self, messages: list[SpoolRecord]) -> int:
        if self._session is None:
            try:
                self._up(await self._connect())
            except BROKER_ERRORS as exc:
                self._retry = messages + self._retry
                self.metrics.error(ErrorKind.CONNECT)
                raise _cannot_connect(exc) from exc
        outcomes = await self._deliver(messages)
        acked = self._settle(messages, outcomes, replay=False)
        unsent = [m for m, o in zip(messages, outcomes, strict=True) if o is _Outcome.UNSENT]
        if unsent:
            self._retry = unsent + self._retry
            raise ProducerError(
                f"the broker did not take {sum(m.samples for m in unsent)} samples "
                f"within {self.send_timeout_s:g}s"
            )
        return acked

    async def _replay(self, spool: Spool) -> int:
        deadline = self._monotonic() + self.replay_budget_s
        acked = 0
        while spool.records and self._session is not None:
            batch = self._read_spool(spool)
            if not batch:
                break
            outcomes = await self._deliver(batch)
            # Only a prefix leaves the spool, so what stays is still in order.
            done = next((i for i, o in enumerate(outcomes) if o is _Outcome.UNSENT), len(batch))
            acked += self._settle(batch[:done], outcomes[:done], replay=True)
            try:
                spool.remove(done)
            except SpoolError as exc:
                self.metrics.error(ErrorKind.SPOOL)
                log.error("%s", exc)
                break
            if done < len(batch) or self._monotonic() >= deadline:
                break
        if not spool.records and self._session is not None:
            log.info("spool replayed: the collector is live again")
        return acked

    def _read_spool(self, spool: Spool) -> list[SpoolRecord]:
        try:
            return spool.peek(_REPLAY_BATCH)
        except SpoolError as exc:
            self.metrics.error(ErrorKind.SPOOL)
            log.error("%s", exc)
            return []

    async def _deliver(self, messages: Sequence[SpoolRecord]) -> list[_Outcome]:
        """Send `messages`; on any unsent one the connection is dropped (`_lost`)."""
        session = self._session
        if not messages or session is None:
            return [_Outcome.UNSENT] * len(messages)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(self.send_timeout_s):
                for m in messages:
                    try:
                        futures.append(await session.kafka.send(m.topic, m.value, key=m.key))
                    except REJECTED as exc:
                        refused: asyncio.Future[Any] = loop.create_future()
                        refused.set_exception(exc)
                        futures.append(refused)
                await asyncio.wait(futures)
        except BROKER_ERRORS as exc:
            failure = exc
        outcomes = [
            self._outcome(futures[i] if i < len(futures) else None) for i in range(len(messages))
        ]
        if _Outcome.UNSENT in outcomes:
            self.metrics.error(ErrorKind.SEND)
            if failure is None:
                failure = next(
                    (f.exception() for f in futures if f.done() and f.exception() is not None),
                    None,
                )
            kind = type(failure).__name__ if failure is not None else "error"
            self._lost(f"the broker at {self.bootstrap} did not acknowledge a flush ({kind})")
            await abandon(session.kafka)
        return outcomes

    @staticmethod
    def _outcome(future: asyncio.Future[Any] | None) -> _Outcome:
        if future is None or not future.done() or future.cancelled():
            return _Outcome.UNSENT
        exc = future.exception()
        if exc is None:
            return _Outcome.ACKED
        if isinstance(exc, REJECTED):
            return _Outcome.REJECTED
        return _Outcome.UNSENT

    def _record_refused(self, message: SpoolRecord) -> None:
        if self.undeliverable is None:
            return
        try:
            record_undeliverable(self.undeliverable, message, "refused for its content")
        except OSError as exc:
            log.error("cannot record the refused message in %s: %s", self.undeliverable, exc)

    def _settle(
        self, messages: Sequence[SpoolRecord], outcomes: Sequence[_Outcome], *, replay: bool
    ) -> int:
        """Count acknowledged and refused messages; returns the samples acknowledged."""
        acked = 0
        for message, outcome in zip(messages, outcomes, strict=True):
            if outcome is _Outcome.ACKED:
                self.sent_messages += 1
                acked += message.samples
                if message.topic != self.topic:
                    self.metrics.health_events.inc()
            elif outcome is _Outcome.REJECTED:
                log.error(
                    "the broker refused a %d-byte message for %s (%d samples) for its content "
                    "(too large or corrupt): dropped%s",
                    len(message.value),
                    message.topic,
                    message.samples,
                    f", recorded in {self.undeliverable}" if self.undeliverable else "",
                )
                self._count_drop(Loss.REJECTED, message.samples)
                self._record_refused(message)
        self.sent_samples += acked
        if replay:
            self.replayed_samples += acked
            self.metrics.samples_replayed.inc(acked)
        else:
            self.metrics.samples_sent.inc(acked)
        return acked

    def _to_spool(self, messages: list[SpoolRecord]) -> None:
        if not messages or self.spool is None:
            return
        samples = sum(m.samples for m in messages)
        try:
            self.spool.append(messages)
        except SpoolError as exc:
            self.metrics.error(ErrorKind.SPOOL)
            log.error("%s: %d samples lost", exc, samples)
            self._count_drop(Loss.UNSPOOLABLE, samples)
            return
        self.spooled_samples += samples
        self.metrics.samples_spooled.inc(samples)

    def _spool_dropped(self, reason: DropReason, records: int, samples: int) -> None:
        why = {
            DropReason.FULL: "the spool is full: the oldest records make room",
            DropReason.TOO_LARGE: "a record is larger than the whole spool",
            DropReason.CORRUPT: "a record fails its CRC check",
        }[reason]
        log.warning(
            "spool %s dropped %d records (%d samples): %s",
            self.spool.directory if self.spool is not None else "",
            records,
            samples,
            why,
        )
        self._count_drop(reason, samples)

    def _count_drop(self, reason: str, samples: int) -> None:
        self.dropped_samples += samples
        self.metrics.samples_dropped.labels(reason=reason).inc(samples)

    def _update_gauges(self) -> None:
        if self.spool is None:
            return
        self.metrics.spool_bytes.set(self.spool.live_bytes)
        self.metrics.spool_records.set(self.spool.records)
        self.metrics.spool_samples.set(self.spool.samples)
