"""Ingest: fold a batch of consumed sample messages into the ledger store, exactly once.

`Ingestor.apply` is what a stream agent calls with the messages of one batch. It
1. skips messages at offsets the store has already applied for this broker incarnation,
2. decodes each message (bad input becomes a dead letter, never an exception),
3. attributes each sample to a usage transaction (unpriced models become dead letters),
4. commits transactions, offset ranges and dead letters in one store transaction; the store
   drops events whose id it has applied before.

The broker incarnation (the Kafka cluster id) scopes offsets: an embedded broker restarted with
empty partitions is a new incarnation, so its offset 0 is new data, not something already seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger.attribution import attribute_sample
from ledger.errors import PricingError
from ledger.events import DeadLetter, decode_message
from ledger.pricing import PriceBook
from ledger.store import (
    CommitResult,
    LedgerStore,
    PartitionKey,
    SourcedTransaction,
    ranges_from_offsets,
)


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


class Ingestor:
    """Applies batches of sample messages from one broker incarnation to one store."""

    def __init__(
        self,
        store: LedgerStore,
        incarnation: str,
        prices: PriceBook,
        cost_centres: Mapping[str, str],
    ) -> None:
        self.store = store
        self.incarnation = incarnation
        self.prices = prices
        self.cost_centres = dict(cost_centres)
        self._next: dict[PartitionKey, int] = store.applied_offsets(incarnation)

    def next_offset(self, topic: str, partition: int) -> int:
        return self._next.get((topic, partition), 0)

    def apply(self, messages: Sequence[ConsumedMessage]) -> IngestResult:
        fresh = [m for m in messages if m.offset >= self._next.get((m.topic, m.partition), 0)]
        transactions: list[SourcedTransaction] = []
        dead: list[DeadLetter] = []
        samples = 0
        for message in fresh:
            envelopes, bad = decode_message(message.value)
            for letter in bad:
                dead.append(_located(letter, message))
            for envelope in envelopes:
                samples += 1
                try:
                    txn = attribute_sample(envelope, self.prices, self.cost_centres)
                except PricingError as exc:
                    dead.append(
                        _located(
                            DeadLetter(reason=str(exc), payload="", event_id=envelope.id), message
                        )
                    )
                    continue
                transactions.append(
                    SourcedTransaction(txn, message.topic, message.partition, message.offset)
                )
        ranges = ranges_from_offsets((m.topic, m.partition, m.offset) for m in fresh)
        commit = self.store.commit(self.incarnation, ranges, transactions, dead)
        for r in ranges:
            self._next[(r.topic, r.partition)] = r.last + 1
        return IngestResult(
            messages=len(messages),
            skipped_messages=len(messages) - len(fresh),
            samples=samples,
            commit=commit,
            dead_letters=tuple(dead),
        )


def _located(letter: DeadLetter, message: ConsumedMessage) -> DeadLetter:
    return DeadLetter(
        reason=letter.reason,
        payload=letter.payload,
        event_id=letter.event_id,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
    )
