"""The one envelope, codec and schema registry every event family goes through.

Every Tally event travels in the same CloudEvents-style envelope:

    {"specversion": "1.0", "id": …, "type": …, "source": …, "subject": …, "time": µs,
     "schema": version of `data`, "data": {…}}

and one Kafka message value is one envelope or an array of them (a batch). An event *family*
(`Family`: GPU samples, admin events, holds, job events) says which `type`s it owns, how its
events map to and from the current shape of `data`, and how an event is wrapped in its
envelope (its content-derived `id`, its `subject`, its `time`). The `SchemaRegistry` knows, per
type, the current schema version and the upcasters from each older version to the next; decoding
any family is: parse → find the type in the family → upcast `data` to the current version →
decode it with the family → check the envelope against the content.

Invariants:
- one envelope class, `Envelope[T]`, frozen and slotted; families name aliases of it;
- `schema` versions `data` only: the envelope attributes (`time` in µs, `subject`, `source`)
  have one meaning in every version;
- a current-version message's `id`, `subject` and `time` must be the ones its content derives;
  an upcast message keeps `subject` and `time` checks, and gets the id its current form derives
  (the id an older producer wrote hashed a shape this build no longer reads, so it is not
  checked);
- decoding a message never raises on bad input: each bad message or element becomes a
  `DeadLetter`; decoding one envelope raises `EventError` (`UnknownSchemaError` for a type the
  family does not own or a version no upcaster leads from);
- pure: no I/O; the registry is filled when the family modules are imported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

import orjson

from ledger.errors import EventError, UnknownSchemaError
from ledger.excerpts import ID_LIMIT, TEXT_LIMIT, bounded, bounded_or_none, shown

SPEC_VERSION = "1.0"
MAX_SOURCE = 256
MAX_EXCERPT = TEXT_LIMIT

T = TypeVar("T")
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Envelope(Generic[T]):
    """A CloudEvents-style envelope around one event of any family.

    `type` is the family's enum member for the event type, `time_us` the event's time (the
    `time` attribute), `schema` the version of `data` (always the current one once decoded).
    """

    id: str
    type: StrEnum
    source: str
    subject: str
    time_us: int
    schema: int
    data: T


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input that could not be turned into an event, with why and where it came from.

    Every text field is a bounded excerpt (`ledger.excerpts`), whoever made the letter: `reason`
    and `payload` at most `TEXT_LIMIT` characters, `event_id` and `topic` at most `ID_LIMIT`;
    a cut field names the original's length and SHA-256 prefix. One oversized input never makes
    an oversized letter.
    """

    reason: str
    payload: str
    event_id: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __post_init__(self) -> None:
        # Frozen: bound the fields in place, once, as the letter is made.
        object.__setattr__(self, "reason", bounded(self.reason, TEXT_LIMIT))
        object.__setattr__(self, "payload", bounded(self.payload, TEXT_LIMIT))
        object.__setattr__(self, "event_id", bounded_or_none(self.event_id, ID_LIMIT))
        object.__setattr__(self, "topic", bounded_or_none(self.topic, ID_LIMIT))


def event_id(source: str, subject: str, time_us: int) -> str:
    """Content-derived id: the same source, subject and time always give the same id."""
    digest = hashlib.blake2b(
        f"{source}\x1f{subject}\x1f{time_us}".encode(), digest_size=16
    ).hexdigest()
    return digest


@dataclass(frozen=True, slots=True)
class Family(Generic[T]):
    """One event family: the types it owns and how its events meet the wire.

    - `kinds`: wire `type` → the family's enum member;
    - `to_data(event)`: the current-version `data` (anything orjson encodes);
    - `from_data(kind, data)`: decode and validate current-version `data`; raises EventError;
    - `wrap(event, source)`: the event's envelope, with its content-derived id;
    - `label`, `subject_is`, `time_is`: words for error messages.
    """

    name: str
    kinds: Mapping[str, StrEnum]
    to_data: Callable[[T], Any]
    from_data: Callable[[Any, dict[str, Any]], T]
    wrap: Callable[[T, str], Envelope[T]]
    schema: int = 1
    label: str = "event type"
    subject_is: str = "subject"
    time_is: str = "time"


@dataclass(slots=True)
class SchemaRegistry:
    """Per event type: its current schema version, its family, and upcasters from each older
    version to the next.

    `upcast` applies `upcasters[(type, v)]` for v = old … current-1, in order, so a family's
    decoder only ever sees the current shape.
    """

    current: dict[str, int] = field(default_factory=dict)
    upcasters: dict[tuple[str, int], Upcaster] = field(default_factory=dict)
    families: dict[str, Family[Any]] = field(default_factory=dict)

    def add(self, family: Family[Any], upcasters: Mapping[tuple[str, int], Upcaster]) -> None:
        """Register a family: its types at its current version, and its upcasters."""
        for kind in family.kinds.values():
            if kind in self.families and self.families[kind] is not family:
                raise ValueError(f"{kind} already belongs to {self.families[kind].name}")
            self.current[kind] = family.schema
            self.families[kind] = family
        for (event_type, version), upcaster in upcasters.items():
            if event_type not in family.kinds or version >= family.schema:
                raise ValueError(
                    f"upcaster {event_type} v{version}: not an older {family.name} schema"
                )
            self.register(event_type, version, upcaster)

    def register(self, event_type: str, from_version: int, upcaster: Upcaster) -> None:
        self.upcasters[(event_type, from_version)] = upcaster

    def upcast(self, event_type: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
        target = self.current.get(event_type)
        if target is None:
            raise UnknownSchemaError(f"unknown event type {event_type!r}")
        if version > target:
            raise UnknownSchemaError(
                f"{event_type} schema {version} is newer than this build reads ({target})"
            )
        while version < target:
            step = self.upcasters.get((event_type, version))
            if step is None:
                raise UnknownSchemaError(f"no upcaster from {event_type} schema {version}")
            data = step(data)
            version += 1
        return data


REGISTRY = SchemaRegistry()  # every family registers here when its module is imported


# ---------------------------------------------------------------------------- encoding


def to_dict(envelope: Envelope[Any], registry: SchemaRegistry = REGISTRY) -> dict[str, Any]:
    """The JSON object of an envelope of any registered family."""
    family = registry.families.get(envelope.type)
    if family is None:
        raise UnknownSchemaError(f"unknown event type {envelope.type!r}")
    return family_to_dict(family, envelope)


def family_to_dict(family: Family[T], envelope: Envelope[T]) -> dict[str, Any]:
    """The JSON object of an envelope of `family`: the one wire shape of every Tally event."""
    return {
        "specversion": SPEC_VERSION,
        "id": envelope.id,
        "type": envelope.type.value,
        "source": envelope.source,
        "subject": envelope.subject,
        "time": envelope.time_us,
        "schema": envelope.schema,
        "data": family.to_data(envelope.data),
    }


def encode_data(envelope: Envelope[Mapping[str, Any]]) -> bytes:
    """One message value for an event that is only ever written, never decoded here (balance
    updates, idle alerts, health events): its `data` is already its JSON object."""
    return orjson.dumps(
        {
            "specversion": SPEC_VERSION,
            "id": envelope.id,
            "type": envelope.type.value,
            "source": envelope.source,
            "subject": envelope.subject,
            "time": envelope.time_us,
            "schema": envelope.schema,
            "data": envelope.data,
        }
    )


def encode(envelope: Envelope[Any], registry: SchemaRegistry = REGISTRY) -> bytes:
    """One message value holding one envelope."""
    return orjson.dumps(to_dict(envelope, registry))


def encode_many(envelopes: Iterable[Envelope[Any]], registry: SchemaRegistry = REGISTRY) -> bytes:
    """One message value holding a CloudEvents JSON batch (its events share the message key)."""
    return orjson.dumps([to_dict(e, registry) for e in envelopes])


# ---------------------------------------------------------------------------- decoding


def _source(value: Any) -> str:
    if type(value) is not str or not value:
        raise EventError("source: expected a non-empty string")
    if len(value) > MAX_SOURCE:
        raise EventError(f"source: longer than {MAX_SOURCE} characters")
    return value


def decode_envelope(
    obj: Any, family: Family[T], registry: SchemaRegistry = REGISTRY
) -> Envelope[T]:
    """Decode one envelope of `family`, upcasting its data to the current schema; raises
    EventError (UnknownSchemaError for a type or version this build does not read)."""
    if type(obj) is not dict:
        raise EventError("event: expected a JSON object")
    raw_type = obj.get("type")
    kind = family.kinds.get(raw_type) if type(raw_type) is str else None
    if kind is None:
        raise UnknownSchemaError(f"type: unknown {family.label} {shown(raw_type)}")
    schema = obj.get("schema")
    if type(schema) is not int:
        raise EventError("schema: expected an integer version")
    data = obj.get("data")
    if type(data) is not dict:
        raise EventError("data: expected an object")
    current = registry.current.get(kind)
    if schema != current:
        data = registry.upcast(kind, schema, data)
    envelope = family.wrap(family.from_data(kind, data), _source(obj.get("source")))
    if schema == current and obj.get("id") != envelope.id:
        raise EventError("id: does not match the event's content")
    if obj.get("subject") != envelope.subject:
        raise EventError(f"subject: does not match the event's {family.subject_is}")
    if obj.get("time") != envelope.time_us:
        raise EventError(f"time: does not match the event's {family.time_is}")
    return envelope


def excerpt(raw: Any) -> str:
    """At most `MAX_EXCERPT` characters of a payload, for a dead letter (`ledger.excerpts`)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else repr(raw)
    return bounded(text, MAX_EXCERPT)


def dead_letter(item: Any, exc: Exception) -> DeadLetter:
    """The dead letter of one undecodable element of a message."""
    eid = item.get("id") if type(item) is dict and type(item.get("id")) is str else None
    try:
        payload = excerpt(orjson.dumps(item))
    except (TypeError, ValueError):  # beyond 64-bit integers, or 255 levels of nesting
        payload = shown(item, MAX_EXCERPT)
    return DeadLetter(reason=str(exc), payload=payload, event_id=eid)


def parse(value: bytes | None) -> tuple[list[Any], DeadLetter | None]:
    """The elements of one message value (an envelope or a batch), or why there are none."""
    if not value:
        return [], DeadLetter(reason="empty message", payload="")
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return [], DeadLetter(reason=f"not JSON: {exc}", payload=excerpt(value))
    items = parsed if type(parsed) is list else [parsed]
    if not items:
        return [], DeadLetter(reason="empty batch", payload=excerpt(value))
    return items, None


DECODE_ERRORS = (EventError, ValueError, TypeError)


def decode(
    value: bytes | None, family: Family[T], registry: SchemaRegistry = REGISTRY
) -> tuple[list[Envelope[T]], list[DeadLetter]]:
    """Decode one message value of `family` into envelopes and dead letters. Never raises on
    bad input."""
    if not value:
        return [], [DeadLetter(reason="empty message", payload="")]
    try:  # `parse`, inlined: the ingest hot path decodes every sample message here
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return [], [DeadLetter(reason=f"not JSON: {exc}", payload=excerpt(value))]
    items = parsed if type(parsed) is list else [parsed]
    if not items:
        return [], [DeadLetter(reason="empty batch", payload=excerpt(value))]
    envelopes: list[Envelope[T]] = []
    dead: list[DeadLetter] = []
    for item in items:
        try:
            envelopes.append(decode_envelope(item, family, registry))
        except DECODE_ERRORS as exc:
            dead.append(dead_letter(item, exc))
    return envelopes, dead


def decode_one(
    value: bytes | str | None, family: Family[T], registry: SchemaRegistry = REGISTRY
) -> Envelope[T]:
    """Decode a message value holding exactly one envelope; raises EventError."""
    if not value:
        raise EventError("empty message")
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"not JSON: {exc}") from exc
    return decode_envelope(parsed, family, registry)


MAX_DEAD_LETTER_BYTES = 64 * 1024  # an encoded dead letter never exceeds this, whatever the input


def encode_dead_letter(letter: DeadLetter, incarnation: str | None = None) -> bytes:
    """The JSON record published on the dead-letter topic: at most `MAX_DEAD_LETTER_BYTES`.

    The letter's fields are bounded excerpts already (`DeadLetter`); JSON escaping can grow a
    character to six bytes, so two text fields and three names stay far below the bound. The
    bound is still checked: a record over it keeps only a short reason and its coordinates.
    """
    record = {
        "reason": letter.reason,
        "event_id": letter.event_id,
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "incarnation": bounded_or_none(incarnation, ID_LIMIT),
        "payload": letter.payload,
    }
    try:
        value = orjson.dumps(record)
    except TypeError:  # a lone surrogate: not UTF-8, so not JSON either
        value = orjson.dumps({k: _utf8(v) for k, v in record.items()})
    if len(value) <= MAX_DEAD_LETTER_BYTES:
        return value
    record["reason"] = _utf8(bounded(str(record["reason"]), ID_LIMIT))
    record["payload"] = ""
    return orjson.dumps(record)


def _utf8(value: Any) -> Any:
    return value.encode("utf-8", "replace").decode() if type(value) is str else value
