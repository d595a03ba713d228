"""The strict codec of admin events: encoding (`admin_envelope`, `encode_admin`, with the
content-derived id), decoding and validation (`admin_event_from_dict`, `validate_admin`), the v0
upcast (`admin_v0_to_v1`) and the `ADMIN` family registered with the generic codec
(`ledger.envelope`).

Decoding is strict and never raises at the message level: bad input becomes a `DeadLetter`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import orjson

from ledger.accounts import account_kind
from ledger.admin.events import (
    ADJUSTABLE,
    ADMIN_SOURCE,
    BUDGET_UNITS,
    CURRENT_ADMIN_SCHEMA,
    EVENT_CLASSES,
    MAX_AMOUNT,
    MAX_REASON,
    V0_REASON,
    AdjustmentRecorded,
    AdminEnvelope,
    AdminEvent,
    BudgetAllowanceGranted,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
)
from ledger.admin.kinds import AdminKind
from ledger.admin.request_events import RequestKind, RequestOpened
from ledger.admin.sealed_events import (
    ShardsSealedThrough,
    read_covers,
    read_job_usage,
    read_shard_names,
    read_team_usage,
    usage_lines_to_data,
)
from ledger.envelope import (
    REGISTRY,
    DeadLetter,
    Envelope,
    Family,
    decode,
    decode_envelope,
    event_id,
    family_to_dict,
)
from ledger.errors import EventError
from ledger.events import MAX_TIME_US
from ledger.excerpts import shown
from ledger.periods import Period
from ledger.roles import Role
from ledger.units import Unit

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_UNITS = frozenset(u.value for u in Unit)


def admin_event_to_dict(event: AdminEvent) -> dict[str, Any]:
    """The JSON object of an event's data (enums as their values, tuples as arrays)."""
    out: dict[str, Any] = {}
    for name, _, _ in _FIELDS[event.KIND]:
        value = getattr(event, name)
        out[name] = value.value if isinstance(value, StrEnum) else value
    if out.get("role") is None:  # an event without a role encodes (and is identified) as before
        out.pop("role", None)
    if isinstance(event, ShardsSealedThrough):
        out.pop("covers", None)  # written by `usage_lines_to_data` when set
        out.update(usage_lines_to_data(event), shards=list(event.shards))
    return out


def _digest(data: Mapping[str, Any]) -> str:
    canonical = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


def admin_envelope(event: AdminEvent, source: str = ADMIN_SOURCE) -> AdminEnvelope:
    """Wrap an event in its envelope with its content-derived id."""
    data = admin_event_to_dict(event)
    subject = event.entity
    return Envelope(
        id=event_id(source, f"{event.KIND}/{subject}/{_digest(data)}", event.effective_us),
        type=event.KIND,
        source=source,
        subject=subject,
        time_us=event.effective_us,
        schema=CURRENT_ADMIN_SCHEMA,
        data=event,
    )


def admin_envelope_to_dict(envelope: AdminEnvelope) -> dict[str, Any]:
    return family_to_dict(ADMIN, envelope)


def encode_admin(envelope: AdminEnvelope) -> tuple[bytes, bytes]:
    """(key, value) of the admin-topic message: keyed by the event's entity."""
    return envelope.subject.encode(), orjson.dumps(family_to_dict(ADMIN, envelope))


# ---------------------------------------------------------------------------- decoding

Decoder = Callable[[str, Any], Any]


def _text(max_len: int) -> Decoder:
    def decode(name: str, value: Any) -> str:
        if type(value) is not str or not value.strip():
            raise EventError(f"{name}: expected a non-empty string")
        if len(value) > max_len:
            raise EventError(f"{name}: longer than {max_len} characters")
        return value

    return decode


def _name(name: str, value: Any) -> str:
    if type(value) is not str or not _NAME.match(value):
        raise EventError(
            f"{name}: expected a name of letters, digits, '.', '_' and '-' (at most 64)"
        )
    return value


def _integer(lo: int, hi: int) -> Decoder:
    def decode(name: str, value: Any) -> int:
        if type(value) is not int:
            raise EventError(f"{name}: expected an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            raise EventError(f"{name}: {value} is out of range [{lo}, {hi}]")
        return value

    return decode


def _period(name: str, value: Any) -> str:
    if type(value) is not str:
        raise EventError(f"{name}: expected a month such as 2026-11")
    try:
        return Period.month(value).label
    except ValueError as exc:
        raise EventError(f"{name}: {exc}") from exc


def _unit(name: str, value: Any) -> Unit:
    if type(value) is str and value in _UNITS:
        return Unit(value)
    raise EventError(f"{name}: unknown unit {shown(value)}; one of {', '.join(sorted(_UNITS))}")


def _choice(kind: type[StrEnum]) -> Decoder:
    values = tuple(k.value for k in kind)

    def decode(name: str, value: Any) -> Any:
        if type(value) is str and value in values:
            return kind(value)
        raise EventError(f"{name}: expected one of {', '.join(values)}, got {value!r}")

    return decode


def _account(name: str, value: Any) -> str:
    text = str(_text(256)(name, value))
    try:
        kind = account_kind(text)
    except ValueError:
        raise EventError(f"{name}: {text!r} is not an account of a known kind") from None
    if kind not in ADJUSTABLE:
        raise EventError(
            f"{name}: {kind} accounts are not adjusted by hand "
            "(budgets change by grants, holds by hold events)"
        )
    return text


def _names(name: str, value: Any) -> tuple[str, ...]:
    if type(value) is not list:
        raise EventError(f"{name}: expected an array")
    if len(value) > 10_000:
        raise EventError(f"{name}: more than 10000 items")
    return tuple(_name(name, v) for v in value)


def _roles(name: str, value: Any) -> tuple[str, ...]:
    if type(value) is not list or not value or len(value) > len(Role):
        raise EventError(f"{name}: expected a non-empty array of roles")
    return tuple(str(_choice(Role)(name, v).value) for v in value)


def _optional(inner: Decoder) -> Decoder:
    def decode(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)

    return decode


_TIME = _integer(0, MAX_TIME_US)
_COUNT = _integer(0, 1_000_000)
_SIGNED = _integer(-MAX_AMOUNT, MAX_AMOUNT)
_META: tuple[tuple[str, Decoder, bool], ...] = (
    ("actor", _text(256), True),
    ("reason", _text(MAX_REASON), True),
    ("effective_us", _TIME, True),
)
_ROLE: tuple[str, Decoder, bool] = ("role", _optional(_choice(Role)), False)
# Per type: (field, decoder, required) in constructor order.
_FIELDS: Mapping[AdminKind, tuple[tuple[str, Decoder, bool], ...]] = {
    AdminKind.BUDGET_GRANTED: (
        ("team", _name, True),
        ("period", _period, True),
        ("unit", _unit, True),
        ("amount", _SIGNED, True),
        *_META,
        ("expected_total", _optional(_SIGNED), False),
        _ROLE,
    ),
    AdminKind.PRICE_SET: (
        ("model", _text(64), True),
        ("pool", _optional(_name), False),
        ("micros_per_gpu_hour", _integer(0, MAX_AMOUNT), True),
        *_META,
        _ROLE,
    ),
    AdminKind.TEAM_DEFINED: (
        ("team", _name, True),
        ("cost_centre", _name, True),
        ("projects", _names, True),
        ("users", _names, True),
        *_META,
        _ROLE,
    ),
    AdminKind.QUOTA_SET: (
        ("team", _name, True),
        ("pool", _name, True),
        ("model", _text(64), True),
        ("nominal_gpus", _COUNT, True),
        ("borrowing_limit", _optional(_COUNT), False),
        ("lending_limit", _optional(_COUNT), False),
        *_META,
        _ROLE,
    ),
    AdminKind.ADJUSTMENT_RECORDED: (
        ("account", _optional(_account), False),
        ("unit", _optional(_unit), False),
        ("amount", _SIGNED, True),
        ("period", _optional(_period), False),
        *_META,
        ("reverses_txn", _optional(_text(256)), False),
        ("counter_account", _optional(_account), False),
        ("team", _optional(_name), False),
        ("project", _optional(_name), False),
        ("user", _optional(_name), False),
        ("job_id", _optional(_text(256)), False),
        _ROLE,
    ),
    AdminKind.PERIOD_CLOSED: (("period", _period, True), *_META, _ROLE),
    AdminKind.BUDGET_POLICY_SET: (
        ("team", _name, True),
        ("unit", _unit, True),
        ("amount", _integer(0, MAX_AMOUNT), True),
        ("every", _choice(Cadence), True),
        ("start", _optional(_period), False),
        ("end", _optional(_period), False),
        ("carry_over", _choice(CarryOver), True),
        ("carry_limit", _optional(_integer(0, MAX_AMOUNT)), False),
        *_META,
        _ROLE,
    ),
    AdminKind.BUDGET_ALLOWANCE_GRANTED: (
        ("team", _name, True),
        ("unit", _unit, True),
        ("period", _period, True),
        ("allowance", _integer(0, MAX_AMOUNT), True),
        ("carried", _integer(0, MAX_AMOUNT), True),
        ("remainder", _optional(_SIGNED), False),
        ("policy", _text(256), True),
        ("every", _choice(Cadence), True),
        *_META,
        _ROLE,
    ),
    AdminKind.GPU_CORDONED: (("target", _text(256), True), *_META, _ROLE),
    AdminKind.GPU_UNCORDONED: (("target", _text(256), True), *_META, _ROLE),
    AdminKind.REQUEST_OPENED: (
        ("request_id", _name, True),
        ("team", _name, True),
        ("kind", _choice(RequestKind), True),
        ("approvers", _roles, True),
        ("expires_us", _TIME, True),
        *_META,
        ("period", _optional(_period), False),
        ("unit", _optional(_unit), False),
        ("amount", _optional(_SIGNED), False),
        ("pool", _optional(_name), False),
        ("model", _optional(_text(64)), False),
        ("nominal_gpus", _optional(_COUNT), False),
        ("borrowing_limit", _optional(_COUNT), False),
        ("lending_limit", _optional(_COUNT), False),
        _ROLE,
    ),
    AdminKind.REQUEST_APPROVED: (("request_id", _name, True), *_META, _ROLE),
    AdminKind.REQUEST_REJECTED: (("request_id", _name, True), *_META, _ROLE),
    AdminKind.REQUEST_EXPIRED: (("request_id", _name, True), *_META, _ROLE),
    AdminKind.SHARDS_SEALED_THROUGH: (
        ("through_us", _TIME, True),
        ("shards", read_shard_names, True),
        ("jobs", read_job_usage, True),
        ("teams", read_team_usage, True),
        *_META,
        _ROLE,
        ("covers", _optional(read_covers), False),
    ),
}

_BUDGET_FIELDS = ("period", "unit", "amount")
_QUOTA_FIELDS = ("pool", "model", "nominal_gpus")
_LIMIT_FIELDS = ("borrowing_limit", "lending_limit")


def _absent(event: RequestOpened, name: str) -> bool:
    return getattr(event, name) is None


def _set(event: RequestOpened, name: str) -> bool:
    return getattr(event, name) is not None


def _request_problems(event: RequestOpened) -> list[str]:
    """A budget request names period, unit and a non-zero amount; a quota request pool, model
    and GPUs (its limits optional: None is unlimited); neither names the other's fields."""
    needed: tuple[str, ...] = _QUOTA_FIELDS
    foreign: tuple[str, ...] = _BUDGET_FIELDS
    if event.kind is RequestKind.BUDGET:
        needed, foreign = _BUDGET_FIELDS, _QUOTA_FIELDS + _LIMIT_FIELDS
    problems = [f"{n}: a {event.kind} request needs one" for n in needed if _absent(event, n)]
    problems += [f"{n}: not part of a {event.kind} request" for n in foreign if _set(event, n)]
    if event.unit is not None and event.unit not in BUDGET_UNITS:
        problems.append(f"unit: budgets are in {' or '.join(BUDGET_UNITS)}, not {event.unit}")
    if event.amount == 0:
        problems.append("amount: a grant of zero changes nothing")
    return problems


def validate_admin(event: AdminEvent) -> tuple[str, ...]:
    """Rules an event breaks beyond its field types, as readable messages."""
    problems: list[str] = []
    if isinstance(event, BudgetGranted):
        if event.unit not in BUDGET_UNITS:
            problems.append(f"unit: budgets are in {' or '.join(BUDGET_UNITS)}, not {event.unit}")
        if event.amount == 0:
            problems.append("amount: a grant of zero changes nothing")
    elif isinstance(event, BudgetPolicySet):
        if event.unit not in BUDGET_UNITS:
            problems.append(f"unit: budgets are in {' or '.join(BUDGET_UNITS)}, not {event.unit}")
        limited = event.carry_over in (CarryOver.PERCENT, CarryOver.AMOUNT)
        if limited and event.carry_limit is None:
            problems.append(f"carry_limit: carry-over {event.carry_over} needs one")
        if not limited and event.carry_limit is not None:
            problems.append(f"carry_limit: carry-over {event.carry_over} takes none")
        if event.carry_over is CarryOver.PERCENT and (event.carry_limit or 0) > 100:
            problems.append("carry_limit: a percentage of at most 100")
        if event.start is not None and event.end is not None and event.end < event.start:
            problems.append(f"end: {event.end} is before the start {event.start}")
    elif isinstance(event, RequestOpened):
        problems.extend(_request_problems(event))
    elif isinstance(event, BudgetAllowanceGranted):
        if event.unit not in BUDGET_UNITS:
            problems.append(f"unit: budgets are in {' or '.join(BUDGET_UNITS)}, not {event.unit}")
    elif isinstance(event, AdjustmentRecorded):
        if event.reverses_txn is not None:
            extra = [
                name
                for name in ("account", "unit", "period", "counter_account", "team", "project")
                if getattr(event, name) is not None
            ]
            if extra or event.amount != 0:
                problems.append(
                    "a reversal names only the transaction it reverses, not "
                    + ", ".join(extra or ["an amount"])
                )
        else:
            for name in ("account", "unit", "period"):
                if getattr(event, name) is None:
                    problems.append(f"{name}: an adjustment needs one")
            if event.amount == 0:
                problems.append("amount: an adjustment of zero changes nothing")
            if event.account is not None and event.account == event.counter_account:
                problems.append("counter_account: must differ from the account")
    return tuple(problems)


def admin_event_from_dict(kind: AdminKind, data: Any) -> AdminEvent:
    """Decode and validate the data object of an event of `kind`; raises EventError."""
    if type(data) is not dict:
        raise EventError("data: expected an object")
    spec = _FIELDS[kind]
    unknown = data.keys() - {name for name, _, _ in spec}
    if unknown:
        raise EventError(f"data: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, read, required in spec:
        if name in data:
            kwargs[name] = read(f"data.{name}", data[name])
        elif required:
            raise EventError(f"data.{name}: missing")
        else:
            kwargs[name] = None
    event = EVENT_CLASSES[kind](**kwargs)
    problems = validate_admin(event)
    if problems:
        raise EventError("; ".join(problems))
    return event


def admin_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 admin data → v1: `by` becomes `actor`, and the missing `reason` is `V0_REASON`."""
    out = {k: v for k, v in data.items() if k != "by"}
    if "by" in data:
        out["actor"] = data["by"]
    out.setdefault("reason", V0_REASON)
    return out


ADMIN: Family[AdminEvent] = Family(
    name="admin",
    kinds={kind.value: kind for kind in AdminKind},
    to_data=admin_event_to_dict,
    from_data=admin_event_from_dict,
    wrap=admin_envelope,
    schema=CURRENT_ADMIN_SCHEMA,
    label="admin event type",
    subject_is="entity",
    time_is="effective_us",
)
# `ShardsSealedThrough` began at v1: no v0 to upcast from.
BEGAN_AT_V1 = frozenset({AdminKind.SHARDS_SEALED_THROUGH})
REGISTRY.add(ADMIN, {(kind, 0): admin_v0_to_v1 for kind in AdminKind if kind not in BEGAN_AT_V1})


def admin_envelope_from_dict(obj: Any) -> AdminEnvelope:
    """Decode one envelope and check that its id, subject and time match its content."""
    return decode_envelope(obj, ADMIN)


def decode_admin_message(value: bytes | None) -> tuple[list[AdminEnvelope], list[DeadLetter]]:
    """Decode one admin-topic message (an envelope or an array of them). Never raises."""
    return decode(value, ADMIN)
