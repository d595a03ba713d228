"""Exactly once without a window: once a prune forgot applied ids, an event older than the
prune's cutoff that the ledger cannot tell apart from one it applied is refused as a dead letter
(`too late to deduplicate`), never booked — however old the resend. Events after the cutoff
are deduplicated by id as before. Both stores, and a rebuild, agree."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.events import encode_batch
from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, IngestResult, OutputTopics
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import LedgerStore
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, an_envelope

DAY_US = 86_400_000_000
WINDOW_US = 7 * DAY_US
PRICES = PriceBook((Price("*", 3_600_000),))
SAMPLES, JOBS = "samples", "tally.jobs"


@pytest.fixture(params=["duckdb", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerStore]:
    made: LedgerStore = (
        DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    )
    yield made
    made.close()


class Feed:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.offsets: dict[str, int] = {}
        self.ingestor = Ingestor(store, "c", PRICES, {}, topics=OutputTopics("a", "dl", None))

    def send(self, topic: str, value: bytes) -> IngestResult:
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        return self.ingestor.apply([ConsumedMessage(topic, 0, offset, value)])

    def sample(self, end_us: int, gpu_index: int = 1) -> IngestResult:
        gpu = f"GPU-00000000-0000-0000-0000-00000000000{gpu_index}"
        return self.send(SAMPLES, encode_batch([an_envelope(sample_time_us=end_us, gpu_uuid=gpu)]))


def gpu_ms_booked(store: LedgerStore) -> int:
    return sum(
        r.balance
        for r in store.folded_balances()
        if r.account.startswith("capacity:") and r.unit == Unit.GPU_MS.value
    )


@pytest.mark.parametrize(
    ("days", "booked"),
    [
        pytest.param(0, False, id="a-resend-of-a-forgotten-sample"),
        pytest.param(1, False, id="a-new-sample-older-than-the-cutoff"),
        pytest.param(9, True, id="a-new-sample-after-the-cutoff"),
    ],
)
def test_an_event_older_than_what_the_ledger_forgot_is_refused(
    store: LedgerStore, days: int, booked: bool
) -> None:
    feed = Feed(store)
    feed.sample(T0_US + INTERVAL_US)
    feed.sample(T0_US + 10 * DAY_US)
    assert store.prune_seen_events(WINDOW_US) == 1
    assert store.forgotten_before() == T0_US + 3 * DAY_US
    before = gpu_ms_booked(store)

    result = feed.sample(T0_US + days * DAY_US + INTERVAL_US)

    if booked:
        assert result.commit.transactions == 1 and not result.dead_letters
        assert gpu_ms_booked(store) == before - INTERVAL_US // 1000
    else:
        assert result.commit.transactions == 0
        (letter,) = result.dead_letters
        assert letter.reason.startswith("too late to deduplicate")
        assert (letter.topic, letter.offset) == (SAMPLES, 2)
        assert gpu_ms_booked(store) == before


def test_a_resend_inside_the_window_is_still_a_duplicate(store: LedgerStore) -> None:
    feed = Feed(store)
    feed.sample(T0_US + INTERVAL_US)
    feed.sample(T0_US + 10 * DAY_US)
    store.prune_seen_events(WINDOW_US)

    again = feed.sample(T0_US + 10 * DAY_US)

    assert again.commit.duplicates == 1 and not again.dead_letters


def test_nothing_is_refused_before_anything_was_forgotten(store: LedgerStore) -> None:
    feed = Feed(store)
    feed.sample(T0_US + 10 * DAY_US)
    assert store.prune_seen_events(WINDOW_US) == 0
    assert store.forgotten_before() is None

    assert feed.sample(T0_US + INTERVAL_US).commit.transactions == 1


def test_a_hold_older_than_what_the_ledger_forgot_is_refused(store: LedgerStore) -> None:
    feed = Feed(store)
    feed.sample(T0_US + INTERVAL_US)
    feed.sample(T0_US + 10 * DAY_US)
    store.prune_seen_events(WINDOW_US)
    placed = HoldPlaced("job-9", "vision", "detection", Unit.GPU_MS, 1_000, T0_US + DAY_US, T0_US)
    _, value = encode_hold(hold_envelope(placed))

    result = feed.send(JOBS, value)

    (letter,) = result.dead_letters
    assert letter.reason.startswith("too late to deduplicate")
    assert store.open_holds() == {}


def test_the_forgotten_cutoff_survives_a_restart(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path / "ledger") as first:
        feed = Feed(first)
        feed.sample(T0_US + INTERVAL_US)
        feed.sample(T0_US + 10 * DAY_US)
        first.prune_seen_events(WINDOW_US)
    with DuckDBStore(tmp_path / "ledger") as again:
        assert again.forgotten_before() == T0_US + 3 * DAY_US
