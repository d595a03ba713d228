"""Period close: nothing posts into a closed period, late data is booked into the next open one
(a flagged prior-period adjustment), and the close's checksum is what `verify` checks."""

from __future__ import annotations

import json

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    PeriodClosed,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.attribution import attribute_sample
from ledger.balances import decode_balance_update
from ledger.closing import CHECKSUM_ALGORITHM, booking_period
from ledger.errors import StoreError
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.periods import period_label
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.port import SourcedTransaction, ranges_from_offsets
from ledger.store.side_files import closed_period_path, load_closed_periods, period_checksum
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

PRICES = PriceBook((Price("*", 3_600_000),))
DEC_US = T0_US + 30 * 86_400_000_000  # 2026-12-01
META = ("alice", "month end", DEC_US + 3_600_000_000)
CLOSE_NOV = PeriodClosed("2026-11", *META)


def usage(minute):
    return an_envelope(
        sample_time_us=T0_US + minute * INTERVAL_US,
        processes=(a_process(owner=an_owner("vision", "detection", "ada", "job-1")),),
    )


class Feed:
    """One ingestor and the next offset of each topic."""

    def __init__(self, store):
        self.store = store
        self.offsets = {"samples": 0, "admin": 0}
        self.ingestor = Ingestor(
            store,
            "c",
            PRICES,
            {"vision": "research"},
            topics=OutputTopics("alerts", "dl", "balances"),
            inputs=InputTopics("admin", "jobs"),
        )

    def _send(self, topic, value):
        offset = self.offsets[topic]
        self.offsets[topic] += 1
        return self.ingestor.apply([ConsumedMessage(topic, 0, offset, value)])

    def samples(self, *minutes):
        return self._send("samples", encode_batch([usage(m) for m in minutes]))

    def admin(self, *events):
        return self._send(
            "admin", orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])
        )


def booked(store, txn_id):
    rows = LedgerQueries(store.data_dir)._query(
        "SELECT DISTINCT period, start_us FROM {postings} WHERE txn_id = ?", [txn_id]
    )
    assert len(rows) == 1
    return rows[0]


def november_checksum(store):
    files = ", ".join(f"'{f}'" for f in store.manifest.files())
    return period_checksum(store._con, f"read_parquet([{files}])", "2026-11")


@pytest.fixture
def closed(tmp_path):
    """A ledger with three November samples, November closed and sealed."""
    with DuckDBStore(tmp_path / "ledger") as store:
        feed = Feed(store)
        feed.samples(1, 2, 3)
        result = feed.admin(CLOSE_NOV)
        assert result.commit.closed == ("2026-11",)
        store.seal()
        yield feed


def test_closing_records_the_periods_checksum_for_verify(closed):
    store = closed.store
    (record,) = load_closed_periods(store.segments_root)
    assert (record.period, record.rows, record.algorithm) == ("2026-11", 12, CHECKSUM_ALGORITHM)
    assert (record.rows, record.sha256) == november_checksum(store)
    assert record.event_id == admin_envelope(CLOSE_NOV).id
    assert store.closed_periods() == [record]
    report = verify_ledger(store.data_dir)
    assert report.ok, report.problems
    assert report.closed_periods == 1


def test_closing_republishes_the_periods_accounts_without_it(closed):
    queued = [m for m in closed.store.pending_outbox() if m.topic == "balances"]
    update = decode_balance_update(queued[-1].value)
    assert update.periods == ()  # everything it held was November's
    assert update.totals != ()


def test_late_usage_is_booked_into_the_next_open_period(closed):
    store = closed.store
    before = november_checksum(store)
    closed.samples(4)
    store.seal()
    period, start_us = booked(store, usage(4).id)
    assert (period, period_label(start_us)) == ("2026-12", "2026-11")  # a prior-period posting
    assert november_checksum(store) == before
    assert verify_ledger(store.data_dir).ok


def test_corrections_for_a_closed_period_land_in_the_next_open_one(closed):
    store = closed.store
    before = november_checksum(store)
    adjustment = AdjustmentRecorded(
        "consumer:vision/detection", Unit.MONEY, -1_000, "2026-11", *META
    )
    reversal = AdjustmentRecorded.reversal(usage(1).id, *META)
    grant = BudgetGranted("vision", "2026-11", Unit.MONEY, 5, *META)
    result = closed.admin(adjustment, reversal, grant, PeriodClosed("2026-11", "bob", "again", 1))
    assert [d.reason for d in result.dead_letters] == [
        "budget for 2026-11 refused: the period is closed"
    ]
    store.seal()
    for event in (adjustment, reversal):
        period, start_us = booked(store, admin_envelope(event).id)
        assert (period, period_label(start_us)) == ("2026-12", "2026-11")
    assert [e.outcome for e in store.admin_entries()][-1] == "unchanged: already closed"
    assert november_checksum(store) == before
    assert len(load_closed_periods(store.segments_root)) == 1
    assert verify_ledger(store.data_dir).ok


def test_the_store_refuses_a_posting_into_a_closed_period(closed):
    late = attribute_sample(usage(9), PRICES, {})  # not rebooked by the ingest
    assert late.period == "2026-11"
    with pytest.raises(StoreError, match="2026-11 is closed"):
        closed.store.commit(
            "c",
            ranges_from_offsets([("samples", 0, 99)]),
            [SourcedTransaction(late, "samples", 0, 99)],
        )
    assert closed.store.applied_offsets("c") == {("samples", 0): 1, ("admin", 0): 1}


def test_a_change_to_a_closed_period_fails_verify(closed):
    store = closed.store
    path = closed_period_path(store.segments_root, "2026-11")
    record = json.loads(path.read_text())
    record["rows"] = 11
    path.write_text(json.dumps(record))
    problems = verify_ledger(store.data_dir).problems
    assert any("closed period 2026-11 changed" in p for p in problems), problems


def test_compaction_does_not_change_a_closed_periods_checksum(closed):
    store = closed.store
    for minute in range(4, 14):
        closed.samples(minute)
        store.seal(compact_min_segments=100)
    result = store.seal(compact_min_segments=4)
    assert result.compacted
    assert verify_ledger(store.data_dir).ok


def test_a_batch_closing_a_period_counts_what_came_before_the_close(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        feed = Feed(store)
        feed.samples(1)  # committed, not sealed: the close seals first
        before = AdjustmentRecorded("consumer:vision/detection", Unit.MONEY, 7, "2026-11", *META)
        after = AdjustmentRecorded("consumer:vision/detection", Unit.MONEY, 9, "2026-11", *META)
        feed.admin(before, CLOSE_NOV, after)
        store.seal()
        assert booked(store, admin_envelope(before).id)[0] == "2026-11"
        assert booked(store, admin_envelope(after).id)[0] == "2026-12"
        (record,) = load_closed_periods(store.segments_root)
        assert record.rows == 6  # the sample's four postings and the adjustment's two
        assert verify_ledger(store.data_dir).ok


@pytest.mark.parametrize(
    ("natural", "closed", "expected"),
    [
        ("2026-11", set(), "2026-11"),
        ("2026-11", {"2026-11"}, "2026-12"),
        ("2026-11", {"2026-11", "2026-12"}, "2027-01"),
        ("2026-10", {"2026-11"}, "2026-10"),
    ],
    ids=["open", "closed", "two-closed-in-a-row", "earlier-still-open"],
)
def test_booking_period(natural, closed, expected):
    assert booking_period(natural, closed) == expected


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["2099-01"], 2, "has not ended yet"),
        (["2026-13"], 2, "not a month"),
        (["2026-10", "--dry-run"], 0, "close 2026-10"),
    ],
    ids=["unfinished", "bad-month", "dry-run"],
)
def test_ledger_close_cli(tmp_path, args, code, message):
    DuckDBStore(tmp_path).close()  # a fresh ledger, as the worker creates it
    result = CliRunner().invoke(cli, ["ledger", "close", *args, "--data-dir", str(tmp_path)])
    assert result.exit_code == code, result.output
    assert message in result.output


def test_ledger_close_cli_knows_a_closed_period(closed):
    result = CliRunner().invoke(
        cli, ["ledger", "close", "2026-11", "--data-dir", str(closed.store.data_dir)]
    )
    assert result.exit_code == 0
    assert "2026-11 is already closed" in result.output
