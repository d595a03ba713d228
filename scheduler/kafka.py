"""The service's Kafka adapters (aiokafka, imported only when one is used).

- `read_topic`: every message of a topic up to its end offsets at the time of the call (the
  replay of `jobs` at start);
- `KafkaPublisher`: the `Publisher` port (`scheduler.ports`) on the `jobs` topic, `acks=all`;
- `Feeds`: the `balances`, `alerts`, `admin` (price changes) and (when the service follows one)
  `inventory` consumers, read from the start without a consumer group (every instance folds
  all of them into its dispatcher and inventory), and the ledger group's committed
  `jobs` offsets, which move the scheduler's holds towards acknowledgement
  (`scheduler.hold_acks`).

aiokafka's errors (and socket errors) become `BrokerUnavailable` in one place, `_kafka`, or
`MessageRefused` when the broker refused a message for its content (`streams.kafka.
content_refusal`: resending cannot help); the publisher answers such a refusal with `Refused`
in the message's slot instead (`scheduler.ports`). Nothing else of aiokafka's escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.balances import decode_balance_update
from ledger.errors import EventError
from ledger.excerpts import bounded
from ledger.pricing import PriceBook
from scheduler.applied_quotas import with_applied
from scheduler.dispatcher import Dispatcher
from scheduler.errors import BrokerUnavailable, MessageRefused
from scheduler.inventory import FleetInventory
from scheduler.jobs_topic import Consumed, Outgoing, seq_of
from scheduler.ports import Placement, Refused
from scheduler.price_feed import PriceFeed
from scheduler.requests import RequestDesk

if TYPE_CHECKING:
    from scheduler.service import ServiceSettings

log = logging.getLogger("tally.scheduler")

T = TypeVar("T")


async def _kafka(what: str, call: Awaitable[T]) -> T:
    """The one place aiokafka's errors become `BrokerUnavailable` (or `MessageRefused`)."""
    from aiokafka.errors import KafkaError

    from streams.kafka import content_refusal

    try:
        return await call
    except (KafkaError, OSError) as exc:
        refusal = content_refusal(exc)
        if refusal is not None:
            why = f"{type(refusal).__name__}: {refusal}"
            raise MessageRefused(bounded(f"{what}: the broker refused a message: {why}")) from exc
        raise BrokerUnavailable(bounded(f"{what}: {exc}")) from exc


async def topic_partitions(
    bootstrap: str, topics: Sequence[str], options: Mapping[str, Any] | None = None
) -> dict[str, list[int]]:
    """The partitions of each topic, asked of the broker (a consumer's metadata cache narrows to
    the topics it is assigned, so it cannot be relied on for others). `options`: the security
    keywords (SASL, TLS) of every client."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=10_000, **(options or {})
    )

    async def ask() -> dict[str, list[int]]:
        await admin.start()
        described = await admin.describe_topics(list(topics))
        return {
            str(t["topic"]): sorted(int(p["partition"]) for p in t["partitions"])
            for t in described
            if t.get("error_code", 0) == 0
        }

    try:
        return await _kafka(f"describing {', '.join(topics)}", ask())
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


KEY_HASHES_KEPT = 100_000  # keys whose hash `KeyPartitioner` keeps, at most
BATCH_BYTES = 512 * 1024  # a record batch of the publisher's, at most (and max_request_size)


class KeyPartitioner:
    """aiokafka's default partitioner — the murmur2 hash of the key, as every Kafka client, so
    a key lands where any client would put it — with each key's hash computed once: a job's
    messages share its id as their key and a GPU's its UUID, and aiokafka's murmur2 is pure
    Python (about 14 µs a message). At most `KEY_HASHES_KEPT` hashes are kept (then forgotten
    all at once). A message without a key goes to the default partitioner."""

    def __init__(self) -> None:
        from aiokafka.partitioner import DefaultPartitioner, murmur2

        self._default = DefaultPartitioner()
        self._murmur2 = murmur2
        self._hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(self._default(key, all_partitions, available))
        found = self._hashes.get(key)
        if found is None:
            if len(self._hashes) >= KEY_HASHES_KEPT:
                self._hashes.clear()
            found = self._hashes[key] = self._murmur2(key) & 0x7FFFFFFF
        return all_partitions[found % len(all_partitions)]


class KafkaPublisher:
    """Sends `jobs` messages in order and waits for every acknowledgement: a call's messages go
    as one record batch per partition (up to `BATCH_BYTES`, built with aiokafka's batch
    builder: no future, metadata wait and partitioner call per message — what `send` costs),
    each message in the partition its key hashes to, as any Kafka client puts it. Not an idempotent
    producer (tansu needs a newer InitProducerId than aiokafka sends): a retried send may land
    twice, which is harmless — a replay skips a repeated `tally-seq`, the ledger drops a
    repeated event id.

    A message refused for its content is `Refused` in its slot and the others are still sent:
    the client refuses one over `max_request_size` before sending it; a broker refuses a whole
    batch, so each message of a refused batch is sent again alone, and only one refused alone
    is `Refused` (those land after the rest of the call)."""

    def __init__(self, settings: ServiceSettings, max_request_size: int = 1 << 20) -> None:
        from aiokafka import AIOKafkaProducer

        self.topic = settings.jobs_topic
        self.max_request_size = max_request_size
        self.partitioner = KeyPartitioner()
        self.alerts_topic = settings.alerts_topic
        self.admin_topic = settings.admin_topic
        self.producer = AIOKafkaProducer(
            bootstrap_servers=",".join(settings.bootstrap),
            client_id=f"{settings.client_id}-scheduler",
            acks="all",
            request_timeout_ms=10_000,
            max_request_size=max_request_size,
            max_batch_size=min(BATCH_BYTES, max_request_size),
            partitioner=self.partitioner,
            **settings.kafka_options,
        )

    async def start(self) -> None:
        await _kafka("starting the producer", self.producer.start())

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.producer.stop()

    async def publish(self, messages: Sequence[Outgoing]) -> list[Placement]:
        return await _kafka(f"publishing to {self.topic}", self._publish(messages))

    async def _send(self, message: Outgoing) -> asyncio.Future[Any] | Refused:
        """Hand `message` to the producer: its acknowledgement, or `Refused` by the client."""
        from aiokafka.errors import KafkaError

        try:
            ack: asyncio.Future[Any] = await self.producer.send(
                self.topic, message.value, key=message.key, headers=message.headers
            )
        except KafkaError as exc:
            return _refused(exc)
        return ack

    async def _publish(self, messages: Sequence[Outgoing]) -> list[Placement]:
        """Each message in its key's partition's batch (`_batches`), every batch handed over
        before any acknowledgement is awaited; a message's offset is its batch's base offset
        plus its place in the batch."""
        out: list[Placement] = [Refused("")] * len(messages)
        batches = await self._batches(messages, out)
        sent = [
            (await self.producer.send_batch(builder, self.topic, partition=p), p, indices)
            for p, builder, indices in batches
        ]
        acks = await _outcomes([ack for ack, _, _ in sent])
        again: list[int] = []  # refused with their batch: each is sent alone
        for answer, (_, partition, indices) in zip(acks, sent, strict=True):
            if isinstance(answer, BaseException):
                _refused(answer)  # raises unless the batch was refused for its content
                again.extend(indices)
                continue
            for place, i in enumerate(indices):
                out[i] = (partition, answer.offset + place)
        for i in sorted(again):
            alone = await self._send(messages[i])
            if isinstance(alone, Refused):
                out[i] = alone
                continue
            try:
                sent_alone = await alone
            except Exception as exc:
                out[i] = _refused(exc)
            else:
                out[i] = (sent_alone.partition, sent_alone.offset)
        return out

    async def _batches(
        self, messages: Sequence[Outgoing], out: list[Placement]
    ) -> list[tuple[int, Any, list[int]]]:
        """`messages` in record batches, in order, each message in its key's partition (where
        `send` would put it: `KeyPartitioner` over the sorted partitions) — (partition, batch,
        the messages' indices) — a batch at most the producer's `max_batch_size`. A message
        over `max_request_size` is refused here, as `send` refuses it (its slot in `out`)."""
        from aiokafka.errors import MessageSizeTooLargeError
        from aiokafka.record.default_records import DefaultRecordBatchBuilder

        partitions = sorted(await self.producer.partitions_for(self.topic))
        open_batches: dict[int, tuple[Any, list[int]]] = {}
        batches: list[tuple[int, Any, list[int]]] = []
        for i, message in enumerate(messages):
            headers = message.headers
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(
                message.key, message.value, headers
            )
            if size > self.max_request_size:
                out[i] = _refused(
                    MessageSizeTooLargeError(
                        f"The message is {size} bytes when serialized which is larger than the "
                        "maximum request size you have configured with the max_request_size "
                        "configuration"
                    )
                )
                continue
            partition = self.partitioner(message.key, partitions, partitions)
            current = open_batches.get(partition)
            if (
                current is not None
                and current[0].append(
                    timestamp=None, key=message.key, value=message.value, headers=headers
                )
                is not None
            ):
                current[1].append(i)
                continue
            builder = self.producer.create_batch()
            builder.append(timestamp=None, key=message.key, value=message.value, headers=headers)
            current = open_batches[partition] = (builder, [i])
            batches.append((partition, *current))
        return batches

    async def publish_alerts(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Job alerts (`scheduler.job_alerts`) on the alerts topic, keyed by job id."""

        async def send() -> None:
            futures = [
                await self.producer.send(self.alerts_topic, value, key=key)
                for key, value in messages
            ]
            await asyncio.gather(*futures)

        await _kafka(f"publishing to {self.alerts_topic}", send())

    async def publish_admin(self, messages: Sequence[tuple[bytes, bytes]]) -> None:
        """Request steps (`scheduler.requests`) on the admin topic, keyed by request id."""
        topic = self.admin_topic
        if topic is None:
            raise BrokerUnavailable("no admin topic is configured")

        async def send() -> None:
            for key, value in messages:  # in order: one request's steps share a partition
                await self.producer.send_and_wait(topic, value, key=key)

        await _kafka(f"publishing to {topic}", send())


async def _outcomes(acks: Sequence[asyncio.Future[Any]]) -> list[Any]:
    """Each acknowledgement's result, or its exception, in order (what `asyncio.gather` with
    `return_exceptions` gives), awaited one after the other: the messages of a batch are
    acknowledged together, so most are done when their turn comes, and no callback and wake-up
    is added per message."""
    out: list[Any] = []
    for ack in acks:
        try:
            out.append(await ack)
        except Exception as exc:
            out.append(exc)
    return out


def _refused(exc: BaseException) -> Refused:
    """`exc` as `Refused` if it refuses a message for its content; else it is raised again."""
    from streams.kafka import content_refusal

    refusal = content_refusal(exc)
    if refusal is None:
        raise exc
    return Refused(bounded(f"{type(refusal).__name__}: {refusal}"))


async def read_topic(
    bootstrap: str, topic: str, client_id: str, options: Mapping[str, Any] | None = None
) -> list[Consumed]:
    """Every message of `topic` up to its end offsets at the time of the call."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        enable_auto_commit=False,
        group_id=None,
        **(options or {}),
    )
    out: list[Consumed] = []

    async def read() -> None:
        await consumer.start()
        parts = (await topic_partitions(bootstrap, [topic], options)).get(topic, [])
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for messages in batch.values():
                for m in messages:
                    headers = [(k, bytes(v)) for k, v in (m.headers or ())]
                    out.append(Consumed(m.partition, m.offset, m.value, seq_of(headers)))
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)

    try:
        await _kafka(f"reading {topic}", read())
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
    return out


class Feeds:
    """The `balances`, `alerts`, `admin` and `inventory` consumers (no consumer group: every
    instance reads all of them from the start; `admin` for price changes,
    `scheduler.price_feed`; `inventory` when the service follows one) and the ledger group's
    committed `jobs` offsets."""

    def __init__(
        self,
        settings: ServiceSettings,
        dispatcher: Dispatcher,
        inventory: FleetInventory | None = None,
        requests: RequestDesk | None = None,
    ) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.requests = requests
        self.settings = settings
        self.dispatcher = dispatcher
        self.inventory = inventory
        servers = ",".join(settings.bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=servers,
            client_id=f"{settings.client_id}-scheduler-feeds",
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
            **settings.kafka_options,
        )
        self.admin = AIOKafkaAdminClient(
            bootstrap_servers=servers, request_timeout_ms=5_000, **settings.kafka_options
        )
        self.prices = PriceFeed(dispatcher.state.prices or PriceBook(()))
        self._configured_teams = tuple(dispatcher.state.quotas.teams.values())
        self._balance_parts: list[Any] = []
        self._jobs_parts: list[Any] = []
        self._last_ack_check = 0.0
        self._ack_warned = -60.0
        self.balance_messages = 0
        self.alert_messages = 0
        self.error: str | None = None  # why the latest read failed; None once one succeeds

    async def start(self) -> None:
        from aiokafka import TopicPartition

        s = self.settings
        followed = [s.balances_topic, s.alerts_topic, *([s.admin_topic] if s.admin_topic else [])]
        if self.inventory is not None:
            followed.append(s.inventory_topic)

        async def go() -> None:
            await self.consumer.start()
            await self.admin.start()
            parts = await topic_partitions(
                ",".join(s.bootstrap), [*followed, s.jobs_topic], s.kafka_options
            )
            tps = [TopicPartition(topic, p) for topic in followed for p in parts.get(topic, [])]
            self.consumer.assign(tps)
            await self.consumer.seek_to_beginning(*tps)
            self._balance_parts = [tp for tp in tps if tp.topic == s.balances_topic]
            self._jobs_parts = [
                TopicPartition(s.jobs_topic, p) for p in parts.get(s.jobs_topic, [])
            ]

        await _kafka("starting the balances and alerts consumer", go())

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.consumer.stop()
        with contextlib.suppress(Exception):
            await self.admin.close()

    async def poll(self, timeout_ms: int = 200) -> int:
        """Fold what arrived; returns how many messages."""
        batch = await _kafka(
            "reading balances and alerts",
            self.consumer.getmany(timeout_ms=timeout_ms, max_records=5000),
        )
        count = 0
        for tp, messages in batch.items():
            for m in messages:
                count += 1
                if tp.topic == self.settings.admin_topic:
                    if self.prices.on_admin(m.value):
                        self.dispatcher.state.prices = self.prices.book
                    if self.requests is not None:
                        self._on_requests(self.requests.on_admin, m.value)
                elif tp.topic == self.settings.balances_topic:
                    self.balance_messages += 1
                    if m.value is None:
                        continue
                    try:
                        self.dispatcher.on_balance(decode_balance_update(m.value))
                    except EventError as exc:
                        log.warning("ignored a balances message: %s", exc)
                elif tp.topic == self.settings.inventory_topic:
                    if self.inventory is not None:
                        self.inventory.on_record(m.value)
                else:
                    self.alert_messages += 1
                    self.dispatcher.on_alert(m.value)
                    if self.requests is not None:  # the ledger's refusals of request steps
                        self._on_requests(self.requests.on_alert, m.value)
        await self._acknowledge()
        return count

    def _on_requests(self, fold: Callable[[bytes | None], None], value: bytes | None) -> None:
        """Fold one message into the request desk; hand the scheduler the applied quotas when
        that changed them."""
        assert self.requests is not None
        before = self.requests.quota_changes
        fold(value)
        if self.requests.quota_changes != before:
            self.dispatcher.state.set_quotas(
                with_applied(self._configured_teams, self.requests.quotas)
            )

    async def _acknowledge(self) -> None:
        """Move holds along: committed by the ledger → barrier; barrier reached → counted by
        the ledger (see `scheduler.hold_acks`)."""
        holds = self.dispatcher.hold_acks
        if self._balance_parts:
            positions = {}
            for tp in self._balance_parts:
                with contextlib.suppress(Exception):
                    positions[tp.partition] = await self.consumer.position(tp)
            holds.caught_up(positions)
        if not holds.awaiting_commit() or time.monotonic() - self._last_ack_check < 0.5:
            return
        if not self._jobs_parts:
            return
        self._last_ack_check = time.monotonic()
        try:
            offsets = await _kafka(
                "reading the ledger's committed offsets",
                # with the partitions named: tansu answers that form of OffsetFetch
                self.admin.list_consumer_group_offsets(
                    self.settings.ledger_group, partitions=self._jobs_parts
                ),
            )
            committed = {
                tp.partition: meta.offset
                for tp, meta in offsets.items()
                if tp.topic == self.settings.jobs_topic and meta.offset >= 0
            }
            if not committed:
                return
            ends = await _kafka(
                "reading the balances end offsets", self.consumer.end_offsets(self._balance_parts)
            )
        except BrokerUnavailable as exc:
            if time.monotonic() - self._ack_warned > 60:
                self._ack_warned = time.monotonic()
                log.warning(
                    "cannot see the ledger's progress (holds count twice meanwhile): %s", exc
                )
            return
        holds.committed(committed, {tp.partition: off for tp, off in ends.items()})

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 0.2
        while not stopping.is_set():
            try:
                await self.poll()
                delay = 0.2
                self.error = None
            except BrokerUnavailable as exc:
                self.error = str(exc)
                log.warning("%s; retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception:  # a bad message must not stop budgets and alerts arriving
                log.exception("reading balances and alerts failed")
                await asyncio.sleep(1.0)
