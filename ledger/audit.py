"""The audit trail: who changed what, when, from where, as a tamper-evident hash chain.

Every state-changing action the ledger learns of is one `AuditEntry`: admin events applied
(grants, prices, teams, quotas, adjustments, reversals, closes) and the scheduler's job
submissions and cancellations. An entry names the `actor` (who: the admin event's actor, the
API token's name), the `role` the action ran with (`admin`, `team:<name>`), the `client` it
came from (the API caller's address; an admin event's source), the `kind` of action, its
`subject` (team, model, account, period, job) and what changed (`before` / `after`, canonical
JSON objects, either absent when there is nothing to say). Kinds not written yet (cordons,
approvals, requests) and roles beyond today's tokens slot into the same fields.

The store appends entries as `AuditRecord`s, numbered from 1 (`seq`), each carrying the hash of
the one before (`prev_hash`, `GENESIS` for the first) and its own:
`record_hash = sha256(prev_hash || canonical JSON of the record's other fields)`. Altering,
inserting, dropping or reordering a stored record breaks the chain at that record, and
`verify_chain` names the first record where it breaks. Entries come from the folds (pure), in
the order the batches were applied, so a rebuild from the archive chains the same records.

Pure: values in, values out; times are the events' own (µs), never the clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import orjson

from ledger.errors import EventError

GENESIS = "0" * 64  # the prev_hash of the first record
UNRECORDED = "unrecorded"  # who, for events written before they said


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One state-changing action, before the store numbers and chains it.

    `event_id` is the event the action is (the trail holds each at most once); `time_us` its
    time; `before` / `after` canonical JSON objects of what changed, or None."""

    event_id: str
    time_us: int
    kind: str
    actor: str
    role: str
    client: str
    subject: str
    reason: str = ""
    before: str | None = None
    after: str | None = None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An entry as stored: its place in the trail and its link in the chain."""

    seq: int
    entry: AuditEntry
    prev_hash: str
    record_hash: str


def changes(value: Mapping[str, Any] | None) -> str | None:
    """`value` as canonical JSON (sorted keys, no spaces), or None."""
    if value is None:
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


_ENTRY_FIELDS = tuple(f.name for f in fields(AuditEntry))
RECORD_FIELDS = ("seq", *_ENTRY_FIELDS, "prev_hash", "record_hash")


def record_to_dict(record: AuditRecord) -> dict[str, Any]:
    """The record's fields, flat, in `RECORD_FIELDS` order (the stored form)."""
    entry = record.entry
    return {
        "seq": record.seq,
        **{name: getattr(entry, name) for name in _ENTRY_FIELDS},
        "prev_hash": record.prev_hash,
        "record_hash": record.record_hash,
    }


def record_from_dict(obj: Any) -> AuditRecord:
    """A stored record back; raises EventError for anything but `record_to_dict`'s shape."""
    if type(obj) is not dict or set(obj) != set(RECORD_FIELDS):
        raise EventError(f"audit record: expected exactly the fields {', '.join(RECORD_FIELDS)}")
    for name in ("seq", "time_us"):
        if type(obj[name]) is not int:
            raise EventError(f"audit record: {name} must be an integer")
    for name in RECORD_FIELDS:
        value = obj[name]
        if name not in ("seq", "time_us") and not (
            type(value) is str or (value is None and name in ("before", "after"))
        ):
            raise EventError(f"audit record: {name} must be a string")
    entry = AuditEntry(**{name: obj[name] for name in _ENTRY_FIELDS})
    return AuditRecord(obj["seq"], entry, obj["prev_hash"], obj["record_hash"])


def content_hash(seq: int, entry: AuditEntry, prev_hash: str) -> str:
    """sha256(prev_hash || canonical JSON of seq, the entry's fields and prev_hash)."""
    body = {"seq": seq, **{n: getattr(entry, n) for n in _ENTRY_FIELDS}, "prev_hash": prev_hash}
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(prev_hash.encode() + canonical).hexdigest()


def chain(last: AuditRecord | None, entries: Iterable[AuditEntry]) -> list[AuditRecord]:
    """`entries` as the records that follow `last` (None: the trail is empty)."""
    seq, prev = (0, GENESIS) if last is None else (last.seq, last.record_hash)
    records = []
    for entry in entries:
        seq += 1
        digest = content_hash(seq, entry, prev)
        records.append(AuditRecord(seq, entry, prev, digest))
        prev = digest
    return records


def new_entries(entries: Iterable[AuditEntry], held: Collection[str]) -> Iterator[AuditEntry]:
    """`entries` less those whose event the trail holds (`held`) or that repeat one before."""
    taken = set()
    for entry in entries:
        if entry.event_id not in held and entry.event_id not in taken:
            taken.add(entry.event_id)
            yield entry


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """Where a trail stops being the chain it claims: the first broken record (its position,
    from 1, and the `seq` it states) and what differs."""

    position: int
    seq: int
    problem: str

    def __str__(self) -> str:
        return f"audit record {self.seq} (position {self.position}): {self.problem}"


def verify_chain(records: Sequence[AuditRecord]) -> ChainBreak | None:
    """The first record that breaks the chain, or None when every link holds."""
    prev = GENESIS
    for position, record in enumerate(records, start=1):
        if record.seq != position:
            return ChainBreak(position, record.seq, f"its seq is {record.seq}, not {position}")
        if record.prev_hash != prev:
            return ChainBreak(
                position,
                record.seq,
                f"its prev_hash {record.prev_hash[:16]}… is not the hash of the record before "
                f"({prev[:16]}…): a record before it was altered, dropped or inserted",
            )
        computed = content_hash(record.seq, record.entry, record.prev_hash)
        if computed != record.record_hash:
            return ChainBreak(
                position,
                record.seq,
                f"its content does not match its record_hash (stored "
                f"{record.record_hash[:16]}…, computed {computed[:16]}…): it was altered",
            )
        prev = record.record_hash
    return None


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which records a reader wants: each given criterion must hold (times inclusive from
    `since_us`, exclusive at `until_us`; `kind` matches a kind or its prefix up to a dot)."""

    actor: str | None = None
    kind: str | None = None
    since_us: int | None = None
    until_us: int | None = None

    def accepts(self, record: AuditRecord) -> bool:
        entry = record.entry
        if self.actor is not None and entry.actor != self.actor:
            return False
        if self.kind is not None and not (
            entry.kind == self.kind or entry.kind.startswith(self.kind.rstrip(".") + ".")
        ):
            return False
        if self.since_us is not None and entry.time_us < self.since_us:
            return False
        return self.until_us is None or entry.time_us < self.until_us


def select(records: Iterable[AuditRecord], where: AuditFilter) -> list[AuditRecord]:
    return [r for r in records if where.accepts(r)]
