"""`replaced` makes what `dataclasses.replace` makes, for the records the scheduler folds and
for classes it leaves to `replace` (keyword-only, `init=False`, `InitVar` fields)."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

from ledger.job_events import WaitReason
from scheduler.frozen_copy import replaced
from scheduler.model import PendingJob
from scheduler.records import JobRecord, JobState
from tests.scheduler_builders import a_spec

SPEC = a_spec("j-1", gpus=2)


@dataclass(frozen=True, slots=True)
class Checked:
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError("low above high")


@dataclass(frozen=True, slots=True)
class KeywordOnly:
    a: int
    b: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class Derived:
    a: int
    twice: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "twice", 2 * self.a)


@dataclass(frozen=True, slots=True)
class WithInitVar:
    floor: InitVar[int]
    a: int
    b: int

    def __post_init__(self, floor: int) -> None:
        if min(self.a, self.b) < floor:
            raise ValueError("below the floor")


CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("record-one-field", JobRecord(SPEC), {"started_us": 5}),
    (
        "record-several-fields",
        JobRecord(SPEC),
        {"state": JobState.RUNNING, "gpu_uuids": ("g1", "g2"), "attempt": 2, "placement": "x"},
    ),
    ("record-no-change", JobRecord(SPEC, reason="quota"), {}),
    ("pending-job", PendingJob(SPEC), {"last_wait": WaitReason.QUOTA_EXHAUSTED}),
    ("post-init-runs", Checked(1, 3), {"high": 2}),
    ("keyword-only-left-to-replace", KeywordOnly(1, b=2), {"b": 3}),
    ("init-false-left-to-replace", Derived(2), {"a": 5}),
    ("init-var-left-to-replace", WithInitVar(0, 2, 3), {"floor": 1, "a": 5}),
]


@pytest.mark.parametrize(("obj", "changes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_replaced_equals_dataclasses_replace(obj: Any, changes: dict[str, Any]) -> None:
    got = replaced(obj, **changes)
    assert got == dataclasses.replace(obj, **changes)
    assert type(got) is type(obj) and got is not obj


@pytest.mark.parametrize(
    ("obj", "changes", "error"),
    [
        (JobRecord(SPEC), {"no_such_field": 1}, TypeError),
        (Checked(1, 3), {"low": 4}, ValueError),
    ],
    ids=["unknown-field", "post-init-refuses"],
)
def test_replaced_raises_as_replace_does(
    obj: Any, changes: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        dataclasses.replace(obj, **changes)
    with pytest.raises(error):
        replaced(obj, **changes)
