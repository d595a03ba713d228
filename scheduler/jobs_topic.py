"""The scheduler's messages on the `jobs` topic: what it publishes and how it reads them back.

The topic carries the scheduler's job events (`ledger.job_events`: keyed by job id; GPU events
keyed by GPU UUID) and hold events (`ledger.holds`: keyed by job id), all sent by
`tally://scheduler`. Keys put a job's events and a GPU's events in different partitions, so the
order between partitions is in each message's `tally-seq` header: strictly increasing across
the scheduler's publications, and at least the publication time in µs × 1000. A replay applies
messages in that order (`replay_order`); a message sent twice (the same seq) counts once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from ledger.errors import EventError
from ledger.holds import (
    HoldEvent,
    HoldKind,
    encode_hold,
    hold_envelope,
    hold_envelope_from_dict,
)
from ledger.job_events import (
    JobEvent,
    JobEventType,
    encode_job_event,
    job_envelope_from_dict,
    subject_of,
)

SOURCE = "tally://scheduler"
SEQ_HEADER = "tally-seq"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One `jobs` message: key, value, publication order, and what it carries."""

    key: bytes
    value: bytes
    seq: int
    event: JobEvent | HoldEvent

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return [(SEQ_HEADER, str(self.seq).encode())]


@dataclass(frozen=True, slots=True)
class Consumed:
    """One `jobs` message read back (replay), with where it was."""

    partition: int
    offset: int
    value: bytes | None
    seq: int | None


def seq_of(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    for name, value in headers or ():
        if name == SEQ_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def decode_jobs_value(value: bytes | None) -> JobEvent | HoldEvent | None:
    """A `jobs` message as a job or hold event; None for anything else (never raises)."""
    if not value:
        return None
    try:
        obj = orjson.loads(value)
        kind = obj.get("type") if type(obj) is dict else None
        if kind in (HoldKind.PLACED, HoldKind.RELEASED):
            return hold_envelope_from_dict(obj).data
        if isinstance(kind, str) and kind in JobEventType._value2member_map_:
            return job_envelope_from_dict(obj).data
    except (orjson.JSONDecodeError, EventError, ValueError, TypeError):
        return None
    return None


def replay_order(messages: Iterable[Consumed]) -> list[tuple[int, JobEvent | HoldEvent]]:
    """Decoded events in publication order: by `tally-seq`, else by event time (× 1000, the
    same axis: a seq is at least the publication time in µs × 1000). A message sent twice (the
    same seq) counts once."""
    keyed: list[tuple[int, int, int, JobEvent | HoldEvent]] = []
    seen: set[int] = set()
    for m in messages:
        event = decode_jobs_value(m.value)
        if event is None or m.seq in seen:
            continue
        if m.seq is not None:
            seen.add(m.seq)
        order = m.seq if m.seq is not None else event.time_us * 1000
        keyed.append((order, m.partition, m.offset, event))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [(k[0], k[3]) for k in keyed]


def job_message(event: JobEvent, seq: int) -> Outgoing:
    """`event` as the scheduler publishes it, keyed by its subject (job id or GPU UUID)."""
    return Outgoing(subject_of(event).encode(), encode_job_event(event, SOURCE), seq, event)


def hold_message(event: HoldEvent, seq: int) -> Outgoing:
    """A hold event as the scheduler publishes it, keyed by its job id."""
    key, value = encode_hold(hold_envelope(event, SOURCE))
    return Outgoing(key, value, seq, event)
