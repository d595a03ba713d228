"""What every route's fold shares: the rules it applies, the value it returns, decoding a batch's
messages into events located at their source, and the period booker."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import TypeVar

from ledger.closing import booking_period
from ledger.events import DeadLetter
from ledger.fleet_alerts import FleetAlert
from ledger.holds import BookPeriod
from ledger.idle import GpuIdleState, IdleAlert, IdlePolicy
from ledger.periods import period_label
from ledger.posting_columns import PostingColumns
from ledger.postings import Transaction
from ledger.pricing import PriceBook
from ledger.store.port import ConsumedMessage, SourcedTransaction, StateChanges

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class FoldRules:
    """What a fold applies besides the ledger's own state: prices and cost centres (the
    configuration's, plus the applied admin events'), the idle policy and the ledger's time
    zone."""

    prices: PriceBook
    cost_centres: Mapping[str, str]
    idle_policy: IdlePolicy = field(default_factory=IdlePolicy)
    zone: tzinfo = UTC  # the ledger's time zone: which month a time is booked into


@dataclass(frozen=True, slots=True)
class Folded:
    """One route's batch, folded: what to commit.

    `transactions[derived_from:]` are the transactions the ledger derived itself (hold
    settlements and expiries), whose ids must not collide with applied ones; `columns` holds
    more usage transactions, built column by column.
    """

    transactions: tuple[SourcedTransaction, ...] = ()
    dead: tuple[DeadLetter, ...] = ()
    changes: StateChanges = field(default_factory=StateChanges)
    idle_states: tuple[GpuIdleState, ...] = ()
    alerts: tuple[IdleAlert, ...] = ()
    duplicates: int = 0
    derived_from: int = 0
    columns: PostingColumns | None = None  # usage built column by column (the common case)
    fleet_alerts: tuple[FleetAlert, ...] = ()  # other alerts for the alerts topic (GPU health)


def decode_all(
    messages: Sequence[ConsumedMessage],
    decode: Callable[[bytes | None], tuple[Sequence[E], Sequence[DeadLetter]]],
) -> tuple[list[tuple[E, ConsumedMessage]], list[DeadLetter]]:
    """Each message's events paired with it, and its undecodable parts as located letters."""
    decoded: list[tuple[E, ConsumedMessage]] = []
    dead: list[DeadLetter] = []
    for message in messages:
        events, bad = decode(message.value)
        dead.extend(located(letter, message) for letter in bad)
        decoded.extend((event, message) for event in events)
    return decoded, dead


def located(letter: DeadLetter, message: ConsumedMessage) -> DeadLetter:
    """`letter` at the coordinates of the message it came from."""
    return DeadLetter(
        reason=letter.reason,
        payload=letter.payload,
        event_id=letter.event_id,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
    )


def refused(reason: str, event_id: str, message: ConsumedMessage) -> DeadLetter:
    return located(DeadLetter(reason=reason, payload="", event_id=event_id), message)


def sourced(txns: Sequence[Transaction], message: ConsumedMessage) -> list[SourcedTransaction]:
    return [SourcedTransaction(t, message.topic, message.partition, message.offset) for t in txns]


def booker(closed: frozenset[str], zone: tzinfo) -> BookPeriod:
    """Books a time into its month (in `zone`), or the next open one when that month is
    closed."""

    def book(time_us: int) -> str:
        return booking_period(period_label(time_us, zone), closed)

    return book
