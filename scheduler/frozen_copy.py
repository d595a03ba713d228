"""`replaced`: a frozen dataclass with some fields changed, as `dataclasses.replace` makes it,
for the records the scheduler folds several times per job (`JobRecord`, `RunningJob`,
`PendingJob`).

`dataclasses.replace` walks the class's `Field`s and reads each value by name on every call
(~7 µs for an 18-field `JobRecord`, four or five times per job); this reads them all at once
with an `operator.attrgetter` made once per class and calls the class with them in order, so
`__init__` and `__post_init__` run exactly as for `replace`. A class with keyword-only,
`init=False` or `InitVar` fields is left to `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")

Layout = tuple[Callable[[Any], tuple[Any, ...]], Mapping[str, int]]
# a class → (all its fields' values at once, each field's position); None: left to `replace`
_LAYOUTS: dict[type[Any], Layout | None] = {}


def _layout(cls: type[Any]) -> Layout | None:
    if cls in _LAYOUTS:
        return _LAYOUTS[cls]
    every = dataclasses.fields(cls)
    layout = None
    positional = all(f.init and not f.kw_only for f in every)
    # an InitVar is an __init__ parameter that `fields` leaves out: positions would shift
    if len(every) >= 2 and positional and len(every) == len(cls.__dataclass_fields__):
        names = tuple(f.name for f in every)
        layout = (attrgetter(*names), {name: i for i, name in enumerate(names)})
    _LAYOUTS[cls] = layout
    return layout


def replaced(obj: T, /, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)` for a dataclass instance: an unknown field name is
    a TypeError, as there."""
    layout = _layout(type(obj))
    if layout is None:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    values_of, position = layout
    values = list(values_of(obj))
    for name, value in changes.items():
        at = position.get(name)
        if at is None:
            raise TypeError(f"{type(obj).__name__}.__init__() got an unexpected keyword {name!r}")
        values[at] = value
    return type(obj)(*values)
