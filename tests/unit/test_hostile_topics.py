"""Hostile input on every topic the ledger reads (samples, jobs, admin), through the real
`Ingestor` into the in-memory store and the DuckDB store.

- Garbage (`tests.hostile.garbage`: not JSON, wrong shapes, broken envelopes) interleaved with
  valid messages: `apply` never raises; each garbage message is exactly its dead letters, at
  its offset, each with a reason and encoded within `MAX_DEAD_LETTER_BYTES`; the valid messages
  are booked exactly as when sent alone (balances, open holds, admin log).
- Well-formed envelopes with hostile content (year 9999, 2⁶⁴-1 bytes, negative hold spans,
  unknown GPUs and teams, control characters): each message is applied or refused with a dead
  letter, never an exception; what is committed balances (the stored balances equal the fold of
  the postings), the DuckDB store seals it and `verify` passes.

How many messages each boundary is tried with: the named constants below (examples per topic
× messages per example).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.admin import BudgetGranted, admin_envelope, encode_admin
from ledger.events import MAX_DEAD_LETTER_BYTES, encode_batch, encode_dead_letter
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics
from ledger.job_events import GpuAssigned, encode_job_event
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.hostile import garbage, hostile_admin, hostile_holds, hostile_samples, letters

GARBAGE_EXAMPLES = 60  # per topic; each example sends 1-6 garbage messages
HOSTILE_EXAMPLES = 40  # per topic, in memory
DUCKDB_EXAMPLES = 8  # per topic, each a fresh DuckDB store sealed and verified
MAX_GARBAGE = 6
PRICES = PriceBook((Price("*", 3_600_000),))
INPUTS = InputTopics("admin", "jobs")
TOPIC = {"samples": "samples", "jobs": "jobs", "admin": "admin"}


def _valid(family: str) -> list[bytes]:
    """A few valid messages of `family` that change balances, holds or the admin log."""
    if family == "samples":
        return [
            encode_batch(
                [
                    an_envelope(
                        gpu_uuid=f"GPU-{gpu}",
                        sample_time_us=T0_US + t * INTERVAL_US,
                        processes=(a_process(owner=an_owner(job_id=f"job-{gpu}")),),
                    )
                ]
            )
            for gpu in (1, 2)
            for t in (1, 2)
        ]
    if family == "jobs":
        placed = HoldPlaced("job-1", "vision", "detection", Unit.MONEY, 5_000, T0_US + 10**9, T0_US)
        assigned = GpuAssigned(
            "GPU-9", "node-01", "h100", "H100", "job-1", "vision", "detection", "ada", T0_US
        )
        released = HoldReleased("job-2", T0_US + 5, "completed")
        placed2 = HoldPlaced("job-2", "vision", None, Unit.GPU_MS, 700, T0_US + 10**9, T0_US + 1)
        return [
            encode_hold(hold_envelope(placed))[1],
            encode_job_event(assigned, "tally://scheduler"),
            encode_hold(hold_envelope(placed2))[1],
            encode_hold(hold_envelope(released))[1],
        ]
    return [
        encode_admin(
            admin_envelope(
                BudgetGranted("vision", "2026-11", unit, amount, "ada", "q4", T0_US + amount)
            )
        )[1]
        for unit, amount in ((Unit.MONEY, 9_000_000), (Unit.GPU_MS, 3_600_000))
    ]


def _messages(family: str, values: list[bytes]) -> list[ConsumedMessage]:
    return [ConsumedMessage(TOPIC[family], 0, i, v) for i, v in enumerate(values)]


def _ingestor(store: MemoryStore | DuckDBStore) -> Ingestor:
    return Ingestor(store, "inc", PRICES, {"vision": "research"}, inputs=INPUTS)


def _ledger(store: MemoryStore | DuckDBStore) -> tuple[object, ...]:
    return (
        sorted(store.balance_rows(), key=repr),
        sorted(store.open_holds().items()),
        [(e.envelope.id, e.outcome) for e in store.admin_entries()],
    )


def _interleave(data: st.DataObject, valid: list[bytes], bad: list[bytes]) -> list[bool]:
    """Where the garbage goes among the valid messages: True marks a garbage slot."""
    slots = [False] * len(valid) + [True] * len(bad)
    return data.draw(st.permutations(slots))


@pytest.mark.parametrize("family", ["samples", "jobs", "admin"])
@settings(
    max_examples=GARBAGE_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_garbage_is_dead_letters_and_the_valid_messages_count_exactly(family, data):
    valid = _valid(family)
    bad = data.draw(st.lists(garbage(family), min_size=1, max_size=MAX_GARBAGE), label="garbage")
    order = _interleave(data, valid, bad)
    values, garbage_at = [], {}
    good, rest = iter(valid), iter(bad)
    for i, is_bad in enumerate(order):
        value = next(rest) if is_bad else next(good)
        values.append(value)
        if is_bad:
            garbage_at[i] = letters(value)
    messages = _messages(family, values)
    cut = data.draw(st.integers(0, len(messages)), label="batch split")

    mixed = MemoryStore()
    ingestor = _ingestor(mixed)
    results = [ingestor.apply(part) for part in (messages[:cut], messages[cut:]) if part]
    dead = [d for r in results for d in r.dead_letters]

    per_offset: dict[int, int] = {}
    for letter in dead:
        assert letter.topic == TOPIC[family] and letter.reason
        assert len(encode_dead_letter(letter, "inc")) <= MAX_DEAD_LETTER_BYTES
        per_offset[letter.offset] = per_offset.get(letter.offset, 0) + 1
    assert per_offset == garbage_at

    alone = MemoryStore()
    result = _ingestor(alone).apply(_messages(family, valid))
    assert result.dead_letters == ()
    assert _ledger(mixed) == _ledger(alone)
    assert sorted(mixed.balance_rows(), key=repr) == sorted(mixed.folded_balances(), key=repr)


HOSTILE = {"samples": hostile_samples, "jobs": hostile_holds, "admin": hostile_admin}


def _hostile_run(store: MemoryStore | DuckDBStore, family: str, hostile: list[bytes]) -> None:
    valid = _valid(family)
    values = [v for pair in zip(hostile, valid, strict=False) for v in pair]
    values += hostile[len(valid) :] + valid[len(hostile) :]
    result = _ingestor(store).apply(_messages(family, values))
    # every message is accounted for: its event decoded (then booked, dropped as a duplicate or
    # refused by the fold with a dead letter) or refused with a dead letter
    decoded = result.samples + result.hold_events + result.admin_events
    refused = {d.offset for d in result.dead_letters}
    assert decoded + len(refused) >= len(values)
    for letter in result.dead_letters:
        assert letter.reason and letter.topic == TOPIC[family]
        assert len(encode_dead_letter(letter, "inc")) <= MAX_DEAD_LETTER_BYTES
    assert sorted(store.balance_rows(), key=repr) == sorted(store.folded_balances(), key=repr)
    if family == "samples":  # the valid samples are booked whatever came between them
        for value in valid:
            assert store.find_transaction(orjson.loads(value)[0]["id"]) is not None


@pytest.mark.parametrize("family", ["samples", "jobs", "admin"])
@settings(max_examples=HOSTILE_EXAMPLES, deadline=None, derandomize=True)
@given(data=st.data())
def test_hostile_content_is_booked_or_refused_never_a_crash_in_memory(family, data):
    hostile = data.draw(st.lists(HOSTILE[family](), min_size=1, max_size=4))
    _hostile_run(MemoryStore(), family, hostile)


@pytest.mark.parametrize("family", ["samples", "jobs", "admin"])
@settings(
    max_examples=DUCKDB_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_hostile_content_commits_seals_and_verifies_in_duckdb(family, data, tmp_path_factory):
    hostile = data.draw(st.lists(HOSTILE[family](), min_size=1, max_size=4))
    root: Path = tmp_path_factory.mktemp("hostile")
    with DuckDBStore(root / "ledger") as store:
        _hostile_run(store, family, hostile)
        store.seal()
    report = verify_ledger(root / "ledger")
    assert report.ok, report


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"[" * 1000 + b"]" * 1000, id="nested-array"),
        pytest.param(b'{"type": ' + b"[" * 1000 + b"]" * 1000 + b"}", id="nested-type"),
        pytest.param(
            b'{"type": "tally.gpu.sample", "schema": 1, "data": {"source": '
            + b"[" * 1000
            + b"]" * 1000
            + b"}}",
            id="nested-sample-source",
        ),
    ],
)
def test_a_deeply_nested_envelope_is_one_dead_letter_on_every_topic(value):
    """Regression: an element nested 1,000 levels deep (orjson reads up to 1,024) made the dead
    letter a `repr` that raised RecursionError, so the whole batch failed, and with it the
    worker, again on every restart. (Hypothesis raises the recursion limit while it runs, so
    this is a plain test.)"""
    for family in ("samples", "jobs", "admin"):
        result = _ingestor(MemoryStore()).apply(_messages(family, [value]))
        [letter] = result.dead_letters
        assert letter.offset == 0 and letter.reason
        assert orjson.loads(encode_dead_letter(letter))["payload"]
