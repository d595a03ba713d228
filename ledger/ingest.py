"""Ingest: fold a batch of consumed sample messages into the ledger store, exactly once.

`Ingestor.apply` is what a stream agent calls with the messages of one batch. It
1. skips messages at offsets the store has already applied for this broker incarnation,
2. decodes each message (bad input becomes a dead letter, never an exception),
3. drops events whose id the store has applied before (and repeats within the batch),
4. attributes each sample to a usage transaction (unpriced models become dead letters),
5. steps each GPU's idle detector in sample-time order (`ledger.idle`), flagging confirmed-idle
   usage and raising alerts,
6. commits transactions, offset ranges, detector states, dead letters and the outbox (alerts and
   dead letters to publish) in one store transaction.

The broker incarnation (the Kafka cluster id) scopes offsets: an embedded broker restarted with
empty partitions is a new incarnation, so its offset 0 is new data, not something already seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ledger.attribution import attribute_sample, owner_shares
from ledger.errors import PricingError
from ledger.events import DeadLetter, Envelope, decode_message, encode_dead_letter, event_id
from ledger.idle import GpuIdleState, IdleAlert, IdleObservation, IdlePolicy, encode_alert, step
from ledger.pricing import PriceBook
from ledger.store import (
    CommitResult,
    LedgerStore,
    OutboxMessage,
    PartitionKey,
    SourcedTransaction,
    ranges_from_offsets,
)
from ledger.units import Unit


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    topic: str
    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class IngestResult:
    messages: int
    skipped_messages: int
    samples: int
    commit: CommitResult
    dead_letters: tuple[DeadLetter, ...]
    alerts: tuple[IdleAlert, ...] = ()


@dataclass(frozen=True, slots=True)
class OutputTopics:
    """Where the ingest's own outputs go: idle alerts and dead letters."""

    alerts: str = "tally.alerts"
    deadletter: str = "tally.deadletter"


class Ingestor:
    """Applies batches of sample messages from one broker incarnation to one store."""

    def __init__(
        self,
        store: LedgerStore,
        incarnation: str,
        prices: PriceBook,
        cost_centres: Mapping[str, str],
        idle_policy: IdlePolicy | None = None,
        topics: OutputTopics | None = None,
    ) -> None:
        self.store = store
        self.incarnation = incarnation
        self.prices = prices
        self.cost_centres = dict(cost_centres)
        self.idle_policy = idle_policy or IdlePolicy()
        self.topics = topics or OutputTopics()
        self._next: dict[PartitionKey, int] = store.applied_offsets(incarnation)

    def next_offset(self, topic: str, partition: int) -> int:
        return self._next.get((topic, partition), 0)

    def apply(self, messages: Sequence[ConsumedMessage]) -> IngestResult:
        fresh = [m for m in messages if m.offset >= self._next.get((m.topic, m.partition), 0)]
        dead: list[DeadLetter] = []
        decoded: list[tuple[Envelope, ConsumedMessage]] = []
        for message in fresh:
            envelopes, bad = decode_message(message.value)
            dead.extend(_located(letter, message) for letter in bad)
            decoded.extend((envelope, message) for envelope in envelopes)
        seen = self.store.seen_ids([e.id for e, _ in decoded])
        transactions: list[SourcedTransaction] = []
        observed: list[tuple[Envelope, int]] = []
        duplicates = 0
        for envelope, message in decoded:
            if envelope.id in seen:
                duplicates += 1
                continue
            seen.add(envelope.id)
            try:
                txn = attribute_sample(envelope, self.prices, self.cost_centres)
            except PricingError as exc:
                letter = DeadLetter(reason=str(exc), payload="", event_id=envelope.id)
                dead.append(_located(letter, message))
                continue
            observed.append((envelope, len(transactions)))
            transactions.append(
                SourcedTransaction(txn, message.topic, message.partition, message.offset)
            )
        states, alerts = self._detect_idle(observed, transactions)
        outbox = [
            OutboxMessage(a.id, self.topics.alerts, a.gpu_uuid.encode(), encode_alert(a))
            for a in alerts
        ] + [
            OutboxMessage(
                event_id("tally://deadletter", f"{d.topic}/{d.partition}/{d.offset}", index),
                self.topics.deadletter,
                None,
                encode_dead_letter(d, self.incarnation),
            )
            for index, d in enumerate(dead)
        ]
        ranges = ranges_from_offsets((m.topic, m.partition, m.offset) for m in fresh)
        commit = self.store.commit(self.incarnation, ranges, transactions, dead, states, outbox)
        for r in ranges:
            self._next[(r.topic, r.partition)] = r.last + 1
        return IngestResult(
            messages=len(messages),
            skipped_messages=len(messages) - len(fresh),
            samples=len(decoded),
            commit=replace(commit, duplicates=commit.duplicates + duplicates),
            dead_letters=tuple(dead),
            alerts=tuple(alerts),
        )

    def _detect_idle(
        self, observed: list[tuple[Envelope, int]], transactions: list[SourcedTransaction]
    ) -> tuple[list[GpuIdleState], list[IdleAlert]]:
        """Step each GPU's idle detector in sample-time order; flag confirmed-idle usage."""
        if not observed:
            return [], []
        observed.sort(key=lambda item: (item[0].subject, item[0].time_us))
        states = self.store.idle_states(sorted({e.subject for e, _ in observed}))
        alerts: list[IdleAlert] = []
        for envelope, index in observed:
            item = transactions[index]
            txn = item.txn
            sample = envelope.data
            shares = owner_shares(sample)
            owner = shares[0][0] if shares else None
            gpu_ms = cost = 0
            for posting in txn.postings:
                if posting.amount > 0:
                    if posting.unit is Unit.GPU_MS:
                        gpu_ms += posting.amount
                    elif posting.unit is Unit.MONEY:
                        cost += posting.amount
            obs = IdleObservation(
                subject=envelope.subject,
                gpu_uuid=sample.gpu_uuid,
                node=sample.node,
                pool=sample.pool,
                model=sample.model,
                owner=owner,
                util_pct=sample.util_gpu_pct,
                start_us=sample.start_us,
                end_us=sample.sample_time_us,
                gpu_ms=gpu_ms,
                cost_micros=cost,
            )
            state, raised, flag = step(states.get(envelope.subject), obs, self.idle_policy)
            states[envelope.subject] = state
            alerts.extend(raised)
            if flag:
                transactions[index] = replace(item, txn=replace(txn, idle=True))
        return list(states.values()), alerts


def _located(letter: DeadLetter, message: ConsumedMessage) -> DeadLetter:
    return DeadLetter(
        reason=letter.reason,
        payload=letter.payload,
        event_id=letter.event_id,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
    )
