"""`ledger.fast_build.builder` makes exactly the value the dataclass's own constructor makes
(equal, same type and hash, still frozen, pickled alike) for every class the ingest builds
with it, and refuses classes it cannot build safely."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from ledger.envelope import DeadLetter, Envelope
from ledger.events import GpuSample, Owner, ProcessUsage
from ledger.fast_build import builder
from ledger.idle import GpuIdleState, IdleObservation
from tests.builders import a_mig, a_process, a_sample, an_envelope, an_owner


def _fields(value: Any) -> tuple[Any, ...]:
    return tuple(getattr(value, f.name) for f in dataclasses.fields(value))


VALUES = [
    pytest.param(a_sample(), id="sample"),
    pytest.param(
        a_sample(mig=a_mig(), owner=an_owner(), processes=(a_process(),)), id="mig-sample"
    ),
    pytest.param(a_process(), id="process"),
    pytest.param(an_envelope(), id="envelope"),
    pytest.param(GpuIdleState("GPU-1", 5, an_owner(), 1, None, 2, 30, 40), id="idle-state"),
    pytest.param(
        IdleObservation("GPU-1/gi1", "GPU-1", "n", "p", "A100", None, 3, 1, 2, 5, 7),
        id="idle-observation",
    ),
    pytest.param(Owner("vision", None, "ann", "job-1"), id="owner"),
]


@pytest.mark.parametrize("value", VALUES)
def test_builds_what_the_constructor_builds(value: Any) -> None:
    cls = type(value)
    built = builder(cls)(*_fields(value))
    assert type(built) is cls
    assert built == value and hash(built) == hash(value)
    assert pickle.loads(pickle.dumps(built)) == value
    assert dataclasses.replace(built) == value
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, first, None)
    assert not hasattr(built, "__dict__")


def test_missing_field_is_an_error() -> None:
    with pytest.raises(TypeError):
        builder(ProcessUsage)(1, 2, 3)


@dataclass(slots=True)
class _Mutable:
    a: int


@dataclass(frozen=True)
class _NoSlots:
    a: int


class _Plain:
    __slots__ = ("a",)


@pytest.mark.parametrize(
    "cls",
    [
        pytest.param(_Mutable, id="not-frozen"),
        pytest.param(_NoSlots, id="no-slots"),
        pytest.param(DeadLetter, id="post-init"),
        pytest.param(_Plain, id="not-a-dataclass"),
    ],
)
def test_refuses_what_it_cannot_build(cls: type) -> None:
    with pytest.raises(TypeError):
        builder(cls)


def test_generic_envelope_keeps_its_data() -> None:
    envelope: Envelope[GpuSample] = an_envelope()
    built = builder(Envelope)(*_fields(envelope))
    assert built.data is envelope.data
