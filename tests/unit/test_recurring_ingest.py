"""Recurring budgets in the ledger: a policy on the admin topic, grants made by the samples that
reach a new month, on both stores; one-off grants beside them; rebuild identity; the wire."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdminView,
    BudgetAllowanceGranted,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    admin_envelope,
    admin_envelope_to_dict,
    decode_admin_message,
    describe,
)
from ledger.admin.events import LEDGER_BUDGETS_SOURCE
from ledger.balances import budget_status, decode_balance_update
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.periods import Period
from ledger.pricing import Price, PriceBook
from ledger.read import rollups
from ledger.read.reports import ReportQueries
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.rebuild import rebuild, sealed_snapshot
from ledger.store.side_files import load_admin_log
from ledger.units import Unit
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.unit.test_rebuild import SETTINGS, Feed, usage

PRICES = PriceBook((Price("*", 3_600_000),))  # one micro-unit per GPU-ms
DEC = 30 * 86_400_000_000 // INTERVAL_US  # the first sample index in December
JAN = DEC + 31 * 86_400_000_000 // INTERVAL_US
ALLOWANCE = 1_000_000
POLICY = BudgetPolicySet(
    "vision",
    Unit.MONEY,
    ALLOWANCE,
    Cadence.MONTH,
    None,
    None,
    CarryOver.ALL,
    None,
    "alice",
    "test",
    T0_US + 7,
)


def admin_message(offset, *events):
    value = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])
    return ConsumedMessage("admin", 0, offset, value)


def sample_message(offset, *indexes):
    envelopes = [
        an_envelope(
            sample_time_us=T0_US + i * INTERVAL_US,
            processes=(a_process(owner=an_owner("vision", "detection", "ada", "job-1")),),
        )
        for i in indexes
    ]
    return ConsumedMessage("samples", 0, offset, encode_batch(envelopes))


def ingestor(store):
    return Ingestor(
        store,
        "c",
        PRICES,
        {"vision": "research"},
        topics=OutputTopics("alerts", "dl", "balances"),
        inputs=InputTopics("admin", "jobs"),
    )


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    s = DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    yield s
    s.close()


def line(store, period):
    status = budget_status("vision", period, store.balance_rows())
    assert status is not None
    found = status.line("money_micros")
    assert found is not None
    return found


def records(store):
    return [
        e.envelope.data
        for e in store.admin_entries()
        if isinstance(e.envelope.data, BudgetAllowanceGranted)
    ]


def test_samples_reaching_a_month_grant_its_allowance_and_carry(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    assert records(store) == []  # the policy alone grants nothing: samples are the clock
    feed.apply([sample_message(0, 1, 2)])
    november = line(store, "2026-11")
    assert november.granted == ALLOWANCE
    assert 0 < november.consumed < ALLOWANCE
    feed.apply([sample_message(1, DEC + 1)])
    december = line(store, "2026-12")
    left = ALLOWANCE - november.consumed
    assert december.granted == ALLOWANCE + left
    assert [(r.period, r.allowance, r.carried, r.remainder) for r in records(store)] == [
        ("2026-11", ALLOWANCE, 0, None),
        ("2026-12", ALLOWANCE, left, left),
    ]
    # resent and further December samples grant nothing more
    feed.apply([sample_message(2, DEC + 1, DEC + 2), sample_message(3, 3)])
    assert len(records(store)) == 2
    assert line(store, "2026-12").granted == ALLOWANCE + left


def test_a_month_without_samples_is_granted_on_the_way(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    feed.apply([sample_message(0, 1)])
    spent = line(store, "2026-11").consumed
    feed.apply([sample_message(1, JAN + 1)])  # nothing at all in December
    assert [(r.period, r.allowance, r.carried) for r in records(store)] == [
        ("2026-11", ALLOWANCE, 0),
        ("2026-12", ALLOWANCE, ALLOWANCE - spent),
        ("2027-01", ALLOWANCE, 2 * ALLOWANCE - spent),
    ]
    assert line(store, "2027-01").granted == 3 * ALLOWANCE - spent


def test_the_grant_is_published_on_the_balances_topic(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    feed.apply([sample_message(0, 1)])
    budget = [
        decode_balance_update(m.value)
        for m in store.pending_outbox()
        if m.topic == "balances" and m.key == b"budget:vision"
    ][-1].budget
    assert budget is not None
    assert (budget.period, budget.lines[0].granted) == ("2026-11", ALLOWANCE)


def test_one_off_grants_are_checked_against_one_off_totals_only(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    feed.apply([sample_message(0, 1)])
    extra = BudgetGranted("vision", "2026-11", Unit.MONEY, 500, "alice", "t", T0_US + 9)
    result = feed.apply(
        [admin_message(1, BudgetGranted(**{**_fields(extra), "expected_total": 0}))]
    )
    assert result.dead_letters == ()
    assert line(store, "2026-11").granted == ALLOWANCE + 500


def _fields(event):
    return {name: getattr(event, name) for name in event.__slots__}


def test_an_allowance_record_sent_on_the_admin_topic_is_refused(store):
    forged = BudgetAllowanceGranted(
        "vision", Unit.MONEY, "2026-11", 5, 0, None, "x", Cadence.MONTH, "eve", "t", T0_US
    )
    result = ingestor(store).apply([admin_message(0, forged)])
    assert [d.reason for d in result.dead_letters] == [
        "allowance records are made by the ledger from budget policies, not sent"
    ]
    assert store.balance_rows() == []


def test_a_changed_policy_applies_from_its_start(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    feed.apply([sample_message(0, 1)])
    raised = BudgetPolicySet(**{**_fields(POLICY), "amount": 7, "start": "2027-01"})
    feed.apply([admin_message(1, raised)])
    feed.apply([sample_message(1, JAN + 1)])
    assert [(r.period, r.allowance) for r in records(store)] == [
        ("2026-11", ALLOWANCE),
        ("2026-12", ALLOWANCE),
        ("2027-01", 7),
    ]
    assert AdminView.from_log(store.admin_entries()).policy("vision", Unit.MONEY) == raised


def test_rebuild_makes_the_same_grants(tmp_path):
    with DuckDBStore(tmp_path / "live") as live:
        feed = Feed(live)
        policy = BudgetPolicySet(
            **{**_fields(POLICY), "carry_over": CarryOver.PERCENT, "carry_limit": 50}
        )
        feed.apply(feed.admin(policy))
        feed.apply(feed.samples(usage(1), usage(2)))
        feed.apply(feed.samples(usage(DEC + 1)), feed.samples(usage(2, gpu="GPU-2"), partition=1))
        feed.apply(feed.samples(usage(JAN + 1)))
        live.seal()
        report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
        assert report.differences == ()
        rebuilt = sealed_snapshot(tmp_path / "rebuilt")
        assert rebuilt.balances == {
            (r.account, r.unit, r.period): r.balance for r in live.balance_rows()
        }
        granted = [r for r in records(live)]
        assert [r.period for r in granted] == ["2026-11", "2026-12", "2027-01"]
        assert [r.carried for r in granted] == [0, ALLOWANCE // 2, ALLOWANCE // 2]
        again = [
            e.envelope
            for e in load_admin_log(tmp_path / "rebuilt" / "segments")
            if e.envelope.source == LEDGER_BUDGETS_SOURCE
        ]
        assert [e.id for e in again] == [
            e.envelope.id
            for e in live.admin_entries()
            if e.envelope.source == LEDGER_BUDGETS_SOURCE
        ]


POLICIES = {
    "monthly-carry-all": POLICY,
    "quarterly-capped": BudgetPolicySet(
        "vision",
        Unit.GPU_MS,
        5,
        Cadence.QUARTER,
        "2027-01",
        "2027-12",
        CarryOver.AMOUNT,
        3,
        "alice",
        "test",
        T0_US,
    ),
}


@pytest.mark.parametrize("event", list(POLICIES.values()), ids=list(POLICIES))
def test_policies_survive_the_wire(event):
    envelopes, dead = decode_admin_message(
        orjson.dumps(admin_envelope_to_dict(admin_envelope(event)))
    )
    assert (dead, [e.data for e in envelopes]) == ([], [event])
    assert describe(event)


BAD = {
    "percent-without-a-limit": (
        {"carry_over": "percent"},
        "carry_limit: carry-over percent needs one",
    ),
    "limit-without-a-cap": ({"carry_limit": 5}, "carry_limit: carry-over all takes none"),
    "over-100-percent": (
        {"carry_over": "percent", "carry_limit": 101},
        "carry_limit: a percentage of at most 100",
    ),
    "ends-before-it-starts": ({"start": "2027-02", "end": "2027-01"}, "end: 2027-01 is before"),
    "unknown-cadence": ({"every": "week"}, "data.every: expected one of month, quarter"),
    "negative-amount": ({"amount": -1}, "data.amount: -1 is out of range"),
    "energy": ({"unit": "energy_mj"}, "unit: budgets are in"),
}


@pytest.mark.parametrize(("change", "reason"), list(BAD.values()), ids=list(BAD))
def test_bad_policies_are_dead_letters(change, reason):
    obj = admin_envelope_to_dict(admin_envelope(POLICY))
    obj["data"].update(change)
    envelopes, dead = decode_admin_message(orjson.dumps(obj))
    assert envelopes == []
    assert reason in dead[0].reason


def test_report_balances_shows_allowance_and_carried(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as store:
        feed = ingestor(store)
        feed.apply([admin_message(0, POLICY)])
        feed.apply([sample_message(0, 1)])
        feed.apply([sample_message(1, DEC + 1)])
        store.seal()
        spent = line(store, "2026-11").consumed
        used = line(store, "2026-12").consumed
        out = CliRunner().invoke(
            cli,
            ["report", "balances", "--data-dir", str(store.data_dir), "--budgets", "-o", "csv"],
        )
    assert out.exit_code == 0, out.output
    carried = ALLOWANCE - spent
    granted = ALLOWANCE + carried
    assert out.output.splitlines() == [
        "team,period,unit,granted,allowance,carried,consumed,open_holds,remaining",
        f"vision,2026-12,money_micros,{granted},{ALLOWANCE},{carried},{used},0,{granted - used}",
    ]


def recurring_ledger(data_dir):
    """A sealed ledger: vision's monthly money policy (carry-over all), usage in November and
    December. Returns November's and December's budget lines."""
    with DuckDBStore(data_dir) as store:
        feed = ingestor(store)
        feed.apply([admin_message(0, POLICY)])
        feed.apply([sample_message(0, 1, 2)])
        feed.apply([sample_message(1, DEC + 1)])
        store.seal()
        return line(store, "2026-11"), line(store, "2026-12")


def test_the_finance_rollup_splits_allowance_and_carried(tmp_path):
    november, december = recurring_ledger(tmp_path / "ledger")
    queries = ReportQueries(tmp_path / "ledger")
    try:
        (burn,) = rollups.budget_burn(queries, "2026-12", T0_US + DEC * INTERVAL_US, "vision")
    finally:
        queries.close()
    carried = ALLOWANCE - november.consumed
    assert (burn.granted_micros, burn.allowance_micros, burn.carried_micros) == (
        december.granted,
        ALLOWANCE,
        carried,
    )
    assert december.granted == ALLOWANCE + carried


def test_a_far_month_is_granted_over_several_batches(store):
    feed = ingestor(store)
    feed.apply([admin_message(0, POLICY)])
    far = (Period.month("2030-03").start_us - T0_US) // INTERVAL_US + 1
    feed.apply([sample_message(0, far)])
    assert [r.period for r in records(store)][-1] == "2029-10"  # 36 months in one batch
    feed.apply([sample_message(1, far + 1)])
    periods = [r.period for r in records(store)]
    assert (len(periods), periods[-1], len(set(periods))) == (41, "2030-03", 41)
