"""Hostile input for every topic Tally reads: Hypothesis strategies of message values that are
garbage by construction, and of valid envelopes carrying hostile data.

Two kinds, because they promise different things:
- `garbage(family)`: values no decoder may accept — not JSON (raw `NaN` / `Infinity`, 10,000
  levels of nesting, bytes that are not UTF-8), JSON of the wrong shape, an envelope with a
  broken attribute (unknown or foreign type, newer schema, wrong id or time, `data` not an
  object) or a required field of `data` missing, of the wrong type or out of range (2⁷⁰ reads
  as a float, strings of 1 MiB or with control characters). Each such value is exactly
  `letters(value)` dead letters;
- `hostile_samples()` / `hostile_holds()` / `hostile_admin()`: well-formed envelopes whose
  content is hostile (negative and huge durations, memory above capacity, unknown GPUs, year
  9999, ids with control characters): the ledger may book them or refuse them, never crash.

The values are encoded with the standard library's `json` (which writes integers of any size
and `NaN` / `Infinity`), never with the codecs under test.
"""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import orjson
from hypothesis import strategies as st

from ledger.admin import BudgetGranted, admin_envelope, admin_envelope_to_dict
from ledger.envelope import family_to_dict
from ledger.events import encode_envelope, envelope_for, envelope_to_dict
from ledger.holds import HOLDS, HoldPlaced, HoldReleased, hold_envelope
from ledger.job_events import JOBS, GpuAssigned, job_envelope
from ledger.units import Unit
from tests.builders import T0_US, a_process, a_sample, an_envelope, an_owner

MIB = 1 << 20
DEEP = 10_000  # levels of nesting: far beyond orjson's limit (1,024)
YEAR_9999_US = 253_402_300_799_000_000

# values of every JSON type a field may wrongly hold; the integers straddle the 63- and 64-bit
# edges, and 2⁷⁰ and -2⁷⁰ (orjson reads them as floats)
NASTY_INTS = (-1, -(2**63) - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**70))
NASTY_STRINGS = ("", " ", "\x00\x01\x1f\x7f", "\u202e\ufeff", "ü" * 30 + "\U0001f4a3")
NASTY_OTHERS: tuple[Any, ...] = (None, True, False, 1.5, -0.0, 1e308, [], {}, [1, "a"], {"a": 1})
NOT_FINITE = ("NaN", "Infinity", "-Infinity")


def huge_text(char: str = "x") -> st.SearchStrategy[str]:
    """A string of 1 MiB (built when drawn: a strategy holding it would print it whole)."""
    return st.just(MIB).map(lambda size: char * size)


def nasty_text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY_STRINGS), huge_text())


def dumps(value: Any) -> bytes:
    """JSON text of `value`, integers of any size included (not orjson: it refuses them)."""
    return json.dumps(value, allow_nan=True).encode()


def nested(depth: int, inner: str = "") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


# ---------------------------------------------------------------------------- not JSON

NOT_JSON_LITERALS: tuple[bytes, ...] = (
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b'{"time": NaN}',
    b'{"time": Infinity}',
    b"1e400",
    b"[1, 2",
    b"\xff\xfe\x00",
    b'{"id": "\xc3\x28"}',
    b"{'single': 'quotes'}",
    b"\x00",
)


def _deep(shape: str) -> bytes:
    if shape == "arrays":
        return nested(DEEP)
    if shape == "objects":
        return ('{"a":' * DEEP + "1" + "}" * DEEP).encode()
    return b"[" * DEEP  # never closed


def not_json() -> st.SearchStrategy[bytes]:
    """Bytes orjson refuses: fixed nasties, and random bytes that do not parse."""

    def refused(value: bytes) -> bool:
        try:
            json.loads(value, parse_constant=_not_json)
        except (ValueError, RecursionError):
            return True
        return False

    return st.one_of(
        st.sampled_from(NOT_JSON_LITERALS),
        st.sampled_from(("arrays", "objects", "open")).map(_deep),
        st.binary(min_size=1, max_size=64).filter(refused),
    )


# ---------------------------------------------------------------------------- wrong shapes


def wrong_shapes() -> st.SearchStrategy[bytes]:
    """JSON that is no envelope: scalars, arrays of scalars, objects without the attributes,
    nesting just under orjson's limit (deep enough to defeat a naive repr), an empty array."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(NASTY_INTS),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=40),
        nasty_text(),
    )
    objects = st.dictionaries(st.text(max_size=8), scalars, max_size=5)
    return st.one_of(
        scalars.map(dumps),
        objects.map(dumps),
        st.lists(scalars, min_size=1, max_size=4).map(dumps),
        st.just(b"[]"),
        st.just(b"{}"),
        st.sampled_from((1000, 1020, 1023)).map(nested),
        st.sampled_from((300, 1000)).map(lambda d: b'{"type": ' + nested(d) + b"}"),
    )


# ---------------------------------------------------------------------------- broken envelopes


def _plain(obj: Any) -> dict[str, Any]:
    """The JSON object as it is on the wire (the codecs leave dataclasses to orjson)."""
    value: dict[str, Any] = orjson.loads(orjson.dumps(obj))
    return value


def _sample_base() -> dict[str, Any]:
    return _plain(envelope_to_dict(an_envelope(gpu_uuid="GPU-garbage-base")))


def _hold_base() -> dict[str, Any]:
    event = HoldPlaced("job-garbage", "vision", "detection", Unit.MONEY, 1000, T0_US + 60, T0_US)
    return _plain(family_to_dict(HOLDS, hold_envelope(event, "tally://scheduler")))


def _assignment_base() -> dict[str, Any]:
    event = GpuAssigned(
        "GPU-garbage-base", "node-01", "h100", "H100", "job-g", "vision", "detection", "ada", T0_US
    )
    return _plain(family_to_dict(JOBS, job_envelope(event, "tally://scheduler")))


def _admin_base() -> dict[str, Any]:
    event = BudgetGranted("vision", "2026-11", Unit.MONEY, 5_000_000, "ada", "garbage", T0_US)
    return _plain(admin_envelope_to_dict(admin_envelope(event)))


FAMILIES = ("samples", "jobs", "admin")
_BASES = {
    "samples": (_sample_base,),
    "jobs": (_hold_base, _assignment_base),
    "admin": (_admin_base,),
}
# types no decoder of the family owns; the jobs topic passes job events over, so none of those
_FOREIGN_TYPES = {
    "samples": ("tally.admin.budget_granted", "tally.hold.placed", "tally.gpu.health"),
    "jobs": ("tally.gpu.sample", "tally.admin.budget_granted", "tally.balance.updated"),
    "admin": ("tally.gpu.sample", "tally.hold.placed", "tally.job.submitted"),
}
# required `data` fields and a value wrong for each (type, range or length)
_REQUIRED = {
    "samples": {
        "node": "str",
        "gpu_uuid": "str",
        "model": "str",
        "pool": "str",
        "util_gpu_pct": "pct",
        "memory_used_bytes": "count",
        "memory_total_bytes": "count",
        "sample_time_us": "time",
        "interval_us": "time",
    },
    "jobs": {"job_id": "str", "time_us": "time"},
    "admin": {"team": "str", "amount": "int", "effective_us": "time", "actor": "str"},
}


def _wrong(kind: str) -> st.SearchStrategy[Any]:
    not_int = st.one_of(
        nasty_text(),
        st.sampled_from((None, True, 1.5, [], {}, 2**70, -(2**70))),
    )
    if kind == "str":
        return st.one_of(st.sampled_from((None, 1, 2**70, [], {}, True, "")), huge_text("y"))
    if kind == "pct":
        return st.one_of(not_int, st.sampled_from((-1, 101, 2**64 - 1)))
    if kind == "count":
        return st.one_of(not_int, st.sampled_from((-1, -(2**63))))
    if kind == "time":
        return st.one_of(not_int, st.sampled_from((0, -1, -(2**63), 2**64 - 1)))
    return not_int  # "int": anything but an integer


@st.composite
def broken_envelope(draw: st.DrawFn, family: str) -> dict[str, Any]:
    """A valid envelope of `family` with one thing broken that no decoder may accept."""
    obj = draw(st.sampled_from(_BASES[family]))()
    how = draw(
        st.sampled_from(("type", "schema", "id", "time", "data", "missing", "wrong", "subject"))
    )
    hostile_text = st.one_of(st.sampled_from(NASTY_STRINGS[1:] + ("id\x00\n",)), huge_text("z"))
    if how == "type":
        obj["type"] = draw(
            st.one_of(
                st.sampled_from(_FOREIGN_TYPES[family]),
                st.sampled_from(("", "tally.unknown")),
                huge_text(),
                st.sampled_from(NASTY_OTHERS + NASTY_INTS),
            )
        )
    elif how == "schema":
        obj["schema"] = draw(
            st.one_of(st.integers(2, 2**64 - 1), st.sampled_from(NASTY_OTHERS + ("1", 2**70)))
        )
    elif how == "id":
        obj["id"] = draw(st.one_of(hostile_text, st.sampled_from(NASTY_OTHERS + NASTY_INTS)))
    elif how == "time":
        obj["time"] = draw(
            st.one_of(
                st.sampled_from(NASTY_INTS + NASTY_OTHERS),
                st.sampled_from((YEAR_9999_US, -T0_US, obj["time"] + 1, str(obj["time"]))),
            )
        )
    elif how == "subject":
        obj["subject"] = draw(st.one_of(hostile_text, st.sampled_from(NASTY_OTHERS)))
    elif how == "data":
        obj["data"] = draw(
            st.one_of(
                st.sampled_from(NASTY_OTHERS[:7] + NASTY_STRINGS[:3] + NASTY_INTS), huge_text()
            )
        )
    else:
        field = draw(st.sampled_from(sorted(_REQUIRED[family])))
        data = obj["data"]
        if field not in data:  # an assignment has no `team`-less shape: pick one it has
            field = "time_us" if "time_us" in data else next(iter(data))
        if how == "missing":
            del data[field]
        else:
            data[field] = draw(_wrong(_REQUIRED[family].get(field, "str")))
    return obj


def garbage(family: str) -> st.SearchStrategy[bytes]:
    """A message value on `family`'s topic that no decoder may accept: one envelope broken, or
    a batch of broken ones, or no JSON at all, or JSON of the wrong shape."""
    one = broken_envelope(family)
    return st.one_of(
        not_json(),
        wrong_shapes(),
        one.map(dumps),
        one.map(dumps),
        st.lists(one, min_size=2, max_size=3).map(dumps),
        # NaN or Infinity where the time goes: JSON to Python's `json`, not to orjson
        one.map(lambda o: dumps({**o, "time": float("nan")})),
        one.map(lambda o: dumps([o, {**o, "time": float("-inf")}])),
    )


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def letters(value: bytes | None) -> int:
    """How many dead letters a garbage value is: one per element of a non-empty array, else
    one (computed from the text, not by the decoders under test). `NaN` and `Infinity` are
    not JSON (the standard library reads them; the wire's decoder must not)."""
    if not value:  # an empty message or a tombstone
        return 1
    try:
        parsed = json.loads(value, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return 1
    if type(parsed) is list and parsed:
        return len(parsed)
    return 1


# ---------------------------------------------------------------------------- hostile content

HOSTILE_IDS = ("job\x00\x1b[31m", "\u202etxet", "j" * 300, "a/b\\c", "ü" * 200)


@st.composite
def hostile_samples(draw: st.DrawFn) -> bytes:
    """A well-formed sample message whose content is hostile (it may be booked or refused)."""
    index = draw(st.integers(0, 5))
    sample = a_sample(
        gpu_uuid=draw(st.sampled_from((f"GPU-hostile-{index}", "GPU-\x00\n", "G" * 256))),
        model=draw(st.sampled_from(("NVIDIA H100 80GB HBM3", "Unknown GPU 9000", "m\x7f"))),
        memory_used_bytes=draw(st.sampled_from((0, 80 << 30, 2**63 - 1, 2**64 - 1))),
        memory_total_bytes=draw(st.sampled_from((0, 1, 80 << 30, 2**64 - 1))),
        sample_time_us=draw(
            st.sampled_from((T0_US + 10_000_000, 1, YEAR_9999_US, 4_102_444_800_000_000))
        ),
        interval_us=draw(st.sampled_from((1, 10_000_000, 86_400_000_000, 2**40))),
        energy_mj=draw(st.sampled_from((None, 0, 2**63 - 1, 2**64 - 1))),
        power_mw=draw(st.sampled_from((None, 2**64 - 1))),
        processes=draw(
            st.sampled_from(
                (
                    (),
                    (a_process(owner=an_owner(team=draw(st.sampled_from(HOSTILE_IDS)))),),
                    tuple(a_process(pid=p, memory_gib=2**30, sm=100) for p in range(3)),
                    (a_process(pid=2**64 - 1, memory_gib=0, sm=0, owner=an_owner()),),
                )
            )
        ),
    )
    return encode_envelope(envelope_for(sample, "sim://hostile"))


@st.composite
def hostile_holds(draw: st.DrawFn) -> bytes:
    """A well-formed hold placement or release with hostile content."""
    job = draw(st.sampled_from(HOSTILE_IDS + ("job-1",)))
    time_us = draw(st.sampled_from((T0_US, 1, YEAR_9999_US)))
    if draw(st.booleans()):
        event: HoldPlaced | HoldReleased = HoldPlaced(
            job,
            draw(st.sampled_from(("vision", "nobody", "t" * 256))),
            None,
            draw(st.sampled_from((Unit.MONEY, Unit.GPU_MS))),
            draw(st.sampled_from((1, 2**62, 2**63 - 1, 2**64 - 1))),
            draw(st.sampled_from((time_us - 1, time_us, time_us + 1, YEAR_9999_US, 2**63))),
            time_us,
        )
    else:
        event = HoldReleased(job, time_us, draw(st.sampled_from(("", "r" * 256, "\x00"))))
    return orjson.dumps(family_to_dict(HOLDS, hold_envelope(event, "tally://scheduler")))


@st.composite
def hostile_admin(draw: st.DrawFn) -> bytes:
    """A well-formed budget grant with hostile content."""
    event = BudgetGranted(
        draw(st.sampled_from(("vision", "nobody", "\u202e"))),
        draw(st.sampled_from(("2026-11", "9999-12", "0001-01"))),
        draw(st.sampled_from((Unit.MONEY, Unit.GPU_MS))),
        draw(st.sampled_from((1, -(2**62), 2**62, 2**63 - 1, 2**64 - 1))),
        "ada",
        draw(st.sampled_from(("", "\x00" * 3, "n" * 2000))),
        draw(st.sampled_from((T0_US, 1, YEAR_9999_US))),
    )
    return orjson.dumps(admin_envelope_to_dict(admin_envelope(event)))


# ---------------------------------------------------------------------------- fixed draws


def draw_many(strategy: st.SearchStrategy[Any], count: int, seed: int) -> list[Any]:
    """`count` values of `strategy`, the same ones on every run (`seed`): for an end-to-end
    test that sends them all at once rather than one example at a time."""
    found: list[Any] = []

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    return found[:count]
