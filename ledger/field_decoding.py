"""Decoders built from a frozen dataclass's type hints and field metadata: each field's JSON
value is checked against its type (strings bounded by `max_len`, `empty` allowed or not;
integers within `min`/`max`, times in µs within `MAX_TIME_US`; booleans; `StrEnum` members;
optional fields; tuples of strings; nested dataclasses) and unknown or missing fields are
refused with an `EventError` naming the field. The job events (`ledger.job_events`) are
decoded with them; a type no decoder knows is a programming error, raised at import.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from enum import StrEnum
from typing import Any

from ledger.errors import EventError
from ledger.events import MAX_TIME_US

MAX_TEXT = 256  # a text field's bound unless its metadata names another (`max_len`)
MAX_ITEMS = 65_536  # the most items a tuple field may hold

Decoder = Callable[[str, Any], Any]


def _text(max_len: int, empty: bool) -> Decoder:
    def decode(name: str, value: Any) -> str:
        if type(value) is not str or (not value and not empty):
            raise EventError(f"{name}: expected a non-empty string")
        if len(value) > max_len:
            raise EventError(f"{name}: longer than {max_len} characters")
        return value

    return decode


def _integer(lo: int | None, hi: int | None) -> Decoder:
    def decode(name: str, value: Any) -> int:
        if type(value) is not int:
            raise EventError(f"{name}: expected an integer, got {type(value).__name__}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise EventError(f"{name}: {value} is out of range [{lo}, {hi}]")
        return value

    return decode


def _boolean(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise EventError(f"{name}: expected true or false")
    return value


def _enum(cls: type[StrEnum]) -> Decoder:
    def decode(name: str, value: Any) -> StrEnum:
        if type(value) is not str:
            raise EventError(f"{name}: expected a string")
        try:
            return cls(value)
        except ValueError as exc:
            raise EventError(f"{name}: unknown value {value!r}") from exc

    return decode


def _optional(inner: Decoder) -> Decoder:
    def decode(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)

    return decode


def _text_tuple(item: Decoder) -> Decoder:
    def decode(name: str, value: Any) -> tuple[str, ...]:
        if type(value) is not list:
            raise EventError(f"{name}: expected an array")
        if len(value) > MAX_ITEMS:
            raise EventError(f"{name}: more than {MAX_ITEMS} items")
        return tuple(item(name, v) for v in value)

    return decode


def _decoder_for(hint: Any, meta: Mapping[str, Any], name: str) -> Decoder:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return _optional(_decoder_for(inner, meta, name))
    if hint is str:
        return _text(meta.get("max_len", MAX_TEXT), meta.get("empty", False))
    if hint is bool:
        return _boolean
    if hint is int:
        hi = meta.get("max", MAX_TIME_US if name.endswith("_us") else None)
        return _integer(meta.get("min", 0), hi)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return _enum(hint)
    if typing.get_origin(hint) is tuple and args == (str, Ellipsis):
        return _text_tuple(_text(MAX_TEXT, False))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return object_decoder(hint)
    raise TypeError(f"no decoder for {name}: {hint!r}")  # a programming error, at import


def object_decoder(cls: type[Any]) -> Decoder:
    """A decoder of `cls` from a JSON object: every field by its type and metadata."""
    hints = typing.get_type_hints(cls)
    plan: list[tuple[str, Decoder, bool]] = []
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        plan.append((f.name, _decoder_for(hints[f.name], f.metadata, f.name), required))
    known = frozenset(name for name, _, _ in plan)

    def decode(where: str, value: Any) -> Any:
        if type(value) is not dict:
            raise EventError(f"{where}: expected an object")
        unknown = value.keys() - known
        if unknown:
            raise EventError(f"{where}: unknown fields {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for name, decoder, required in plan:
            if name in value:
                kwargs[name] = decoder(f"{where}.{name}", value[name])
            elif required:
                raise EventError(f"{where}.{name}: missing")
        return cls(**kwargs)

    return decode
