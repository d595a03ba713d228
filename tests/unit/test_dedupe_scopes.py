"""Exactly once without a window: once a prune forgot a scope's old ids, an event of that scope
not seen before and older than the scope's cutoff is a dead letter (`too late to deduplicate`),
never booked and never a duplicate; a scope's cutoff follows its own newest event, so a GPU that
was silent (its collector replaying its spool) or a job of the scheduler's clock is not refused
for the rest of the fleet's time. Both stores, through the real `Ingestor`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from ledger.dedupe import TOO_LATE
from ledger.events import encode_batch
from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, IngestResult, InputTopics, OutputTopics
from ledger.job_events import GpuAssigned, encode_job_event, job_envelope
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import LedgerStore
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, an_envelope

DAY_US = 86_400_000_000
WINDOW_US = 7 * DAY_US
PRICES = PriceBook((Price("*", 3_600_000),))
SAMPLES, JOBS = "samples", "jobs"


def gpu(n: int) -> str:
    return f"GPU-00000000-0000-0000-0000-00000000000{n}"


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
        self.ingestor = Ingestor(
            store, "c", PRICES, {}, topics=OutputTopics("a", "dl"), inputs=InputTopics("ad", JOBS)
        )

    def send(self, topic: str, value: bytes) -> IngestResult:
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        return self.ingestor.apply([ConsumedMessage(topic, 0, offset, value)])

    def sample(self, day: float, on: int = 1) -> IngestResult:
        at = T0_US + int(day * DAY_US) + INTERVAL_US
        return self.send(SAMPLES, encode_batch([an_envelope(sample_time_us=at, gpu_uuid=gpu(on))]))


def gpu_ms_booked(store: LedgerStore) -> int:
    """GPU time off the capacity accounts (what usage credits)."""
    return -sum(
        r.balance
        for r in store.folded_balances()
        if r.account.startswith("capacity:") and r.unit == Unit.GPU_MS.value
    )


def pruned_feed(store: LedgerStore) -> Feed:
    """GPU 1 reported on day 0 and day 10, GPU 2 on day 0 only; then the worker pruned."""
    feed = Feed(store)
    feed.sample(0)
    feed.sample(0, on=2)
    feed.sample(10)
    assert store.prune_seen_events(WINDOW_US) == 1  # GPU 1's day 0; GPU 2 keeps its only id
    return feed


@pytest.mark.parametrize(
    ("day", "on", "booked"),
    [
        pytest.param(0, 1, False, id="a-resend-of-a-forgotten-sample"),
        pytest.param(1, 1, False, id="a-new-sample-older-than-its-gpus-cutoff"),
        pytest.param(9, 1, True, id="a-new-sample-after-its-gpus-cutoff"),
        pytest.param(1, 2, True, id="a-spool-replay-of-a-gpu-that-was-silent"),
        pytest.param(0.5, 3, True, id="a-gpu-never-seen-before"),
    ],
)
def test_an_unseen_sample_older_than_its_gpus_cutoff_is_refused(
    store: LedgerStore, day: float, on: int, booked: bool
) -> None:
    feed = pruned_feed(store)
    before, letters = gpu_ms_booked(store), len(store.dead_letters())

    result = feed.sample(day, on)

    assert result.commit.duplicates == 0  # a refusal is never counted as a duplicate
    if booked:
        assert result.commit.transactions == 1 and not result.dead_letters
        assert gpu_ms_booked(store) == before + INTERVAL_US // 1000
        return
    assert result.commit.transactions == 0
    (letter,) = result.dead_letters
    assert letter.reason.startswith(f"{TOO_LATE}: ")
    assert f"gpu:{gpu(1)}" in letter.reason
    assert (letter.topic, letter.offset) == (SAMPLES, 3)
    assert gpu_ms_booked(store) == before  # counted nowhere
    assert len(store.dead_letters()) == letters + 1
    assert store.seen_ids([letter.event_id or ""]) == set()  # and still not remembered


def test_a_resend_inside_the_window_is_still_a_duplicate(store: LedgerStore) -> None:
    feed = pruned_feed(store)
    again = feed.sample(10)
    assert (again.commit.duplicates, again.dead_letters) == (1, ())


def test_a_hold_and_an_assignment_resent_after_their_window_are_refused(
    store: LedgerStore,
) -> None:
    feed = Feed(store)
    placed = HoldPlaced("job-9", "vision", "detection", Unit.GPU_MS, 1_000, T0_US + DAY_US, T0_US)
    assigned = GpuAssigned(gpu(1), "n", "p", "m", "job-9", "vision", "detection", "ada", T0_US)
    hold = encode_hold(hold_envelope(placed))[1]
    assignment = encode_job_event(assigned, "tally://scheduler")
    assert feed.send(JOBS, hold).commit.transactions == 1
    feed.send(JOBS, assignment)
    at_10 = T0_US + 10 * DAY_US
    later = HoldPlaced("job-9", "vision", None, Unit.MONEY, 5, at_10 + DAY_US, at_10)
    assert not feed.send(JOBS, encode_hold(hold_envelope(later))[1]).dead_letters  # job-9 moves on
    moved = GpuAssigned(gpu(1), "n", "p", "m", "job-8", "vision", "x", "ada", T0_US + 9 * DAY_US)
    assert not feed.send(JOBS, encode_job_event(moved, "tally://scheduler")).dead_letters
    store.prune_seen_events(WINDOW_US)
    firsts = [hold_envelope(placed).id, job_envelope(assigned, "tally://scheduler").id]
    assert store.seen_ids(firsts) == set()
    holds = store.open_holds()

    results = [feed.send(JOBS, hold), feed.send(JOBS, assignment)]

    reasons = [d.reason for r in results for d in r.dead_letters]
    assert len(reasons) == 2 and all(r.startswith(TOO_LATE) for r in reasons)
    assert "job:job-9" in reasons[0] and f"assign:{gpu(1)}" in reasons[1]
    assert store.open_holds() == holds
    assert sum(r.commit.transactions + r.commit.duplicates for r in results) == 0


def test_the_cutoffs_survive_a_restart(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path / "ledger") as first:
        pruned_feed(first)
    with DuckDBStore(tmp_path / "ledger") as again:
        cutoffs = again.forgotten_before([f"gpu:{gpu(1)}", f"gpu:{gpu(2)}"])
        assert cutoffs[f"gpu:{gpu(1)}"] == T0_US + 3 * DAY_US + INTERVAL_US
        feed = Feed(again)
        feed.offsets[SAMPLES] = 3
        (letter,) = feed.sample(0).dead_letters
        assert letter.reason.startswith(TOO_LATE)


def test_ids_applied_before_dedupe_scopes_are_pruned_by_their_newest(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    con = duckdb.connect(str(tmp_path / "ledger" / "hot.duckdb"))
    con.execute("CREATE TABLE seen_events (event_id VARCHAR PRIMARY KEY, time_us BIGINT NOT NULL)")
    con.execute(
        "INSERT INTO seen_events VALUES ('old', ?), ('new', ?)", [T0_US, T0_US + 9 * DAY_US]
    )
    con.close()
    with DuckDBStore(tmp_path / "ledger") as store:
        assert store.seen_ids(["old", "new"]) == {"old", "new"}
        assert store.prune_seen_events(WINDOW_US) == 1
        assert store.seen_ids(["old", "new"]) == {"new"}
