"""Building instances of frozen slotted dataclasses on the ingest's hot path, fast.

A frozen dataclass's generated `__init__` sets each field through `object.__setattr__` (its own
`__setattr__` refuses), about 0.1 µs a field: a 21-field `GpuSample` costs ~2 µs, twelve times a
mutable one, and the ingest makes several such values per sample. `builder(cls)` returns a
function of all the fields, in order, that fills a plain slotted twin of `cls` (the same slots,
so the same memory layout) with ordinary attribute stores and then makes it a `cls`: the value
is exactly what `cls(*fields)` makes (equal, same hash, frozen), without the per-field calls.

Only for classes without `__post_init__` (nothing would run it) whose slots are their fields;
`builder` refuses any other class.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A function `(*fields) -> cls` equal to `cls(*fields)` (every field, positionally)."""
    params = getattr(cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    names = tuple(f.name for f in dataclasses.fields(cls))
    if getattr(cls, "__slots__", None) != names or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: slots must be its fields, without __post_init__")
    # The same bases and slots: the same layout, which `__class__` assignment requires.
    twin = types.new_class(
        f"_{cls.__name__}Being",
        getattr(cls, "__orig_bases__", cls.__bases__),  # Generic[T] stays Generic[T]
        exec_body=lambda body: body.update(__slots__=names),
    )
    arguments = ", ".join(names)
    stores = "".join(f"    made.{name} = {name}\n" for name in names)
    source = (
        f"def build({arguments}):\n    made = new(twin)\n{stores}    made.__class__ = cls\n"
        "    return made\n"
    )
    scope: dict[str, Any] = {"new": object.__new__, "twin": twin, "cls": cls}
    exec(source, scope)  # its only names are the dataclass's own field names
    build: Callable[..., T] = scope["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build
