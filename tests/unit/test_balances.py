"""Balances: the running table equals the fold of postings, budgets are a projection of it, and
changed balances are queued for the compacted `balances` topic."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.balances import (
    BalanceRow,
    BudgetLine,
    BudgetStatus,
    budget_status,
    budget_statuses,
    decode_balance_update,
)
from ledger.events import encode_batch
from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.pricing import Price, PriceBook
from ledger.read.balances import sealed_balances
from ledger.store.hot import DuckDBStore
from ledger.units import Unit
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

PRICES = PriceBook((Price("*", 3_600_000),))  # one micro-unit per GPU-ms
WHEN = T0_US + 3_600_000_000
META = ("alice", "test", WHEN)
GRANTS = (
    BudgetGranted("vision", "2026-11", Unit.GPU_MS, 1_000_000, *META),
    BudgetGranted("vision", "2026-11", Unit.MONEY, 500_000, *META),
)
CREDIT = AdjustmentRecorded("consumer:vision/detection", Unit.MONEY, -5_000, "2026-11", *META)
HOLD = HoldPlaced("job-2", "vision", "detection", Unit.GPU_MS, 50_000, WHEN * 2, WHEN)


def samples(offset, first, count, team="vision", job="job-1"):
    envelopes = [
        an_envelope(
            sample_time_us=T0_US + (first + i) * INTERVAL_US,
            processes=(a_process(owner=an_owner(team, "detection", "ada", job)),),
        )
        for i in range(count)
    ]
    return ConsumedMessage("samples", 0, offset, encode_batch(envelopes))


def admin(offset, *events):
    value = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])
    return ConsumedMessage("admin", 0, offset, value)


def hold(offset, event):
    return ConsumedMessage("jobs", 0, offset, encode_hold(hold_envelope(event))[1])


def ingestor(store):
    return Ingestor(
        store,
        "c",
        PRICES,
        {"vision": "research"},
        topics=OutputTopics("alerts", "dl", "balances"),
        inputs=InputTopics("admin", "jobs"),
    )


@pytest.fixture
def store(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as s:
        ing = ingestor(s)
        ing.apply([admin(0, *GRANTS)])
        ing.apply([samples(0, 1, 3)])
        ing.apply([hold(0, HOLD)])
        ing.apply([admin(1, CREDIT)])
        yield s


def pending_balances(store):
    return {
        m.key.decode(): decode_balance_update(m.value)
        for m in store.pending_outbox()
        if m.topic == "balances"
    }


VISION = BudgetStatus(
    "vision",
    "2026-11",
    (
        BudgetLine("gpu_ms", granted=1_000_000, consumed=30_000, open_holds=50_000),
        BudgetLine("money_micros", granted=500_000, consumed=25_000, open_holds=0),
    ),
)


def test_the_balances_table_is_the_fold_of_the_postings(store):
    live = store.balance_rows()
    assert live == store.folded_balances()
    store.seal()
    assert store.balance_rows() == live
    assert sealed_balances(store.data_dir) == live
    store.rebuild_balances()
    assert store.balance_rows() == live
    assert {(r.account, r.unit): r.balance for r in live if r.account.startswith("budget")} == {
        ("budget:vision", "gpu_ms"): -1_000_000,
        ("budget:vision", "money_micros"): -500_000,
    }


def test_the_remaining_budget_is_grants_minus_consumption_minus_open_holds(store):
    assert budget_statuses(store.balance_rows()) == [VISION]
    gpu = VISION.line("gpu_ms")
    assert gpu is not None
    assert (gpu.available, gpu.remaining) == (970_000, 920_000)


def test_changed_balances_are_queued_once_per_account_with_the_budget(store):
    queued = pending_balances(store)
    folded = {(r.account, r.unit): r.balance for r in store.folded_balances()}
    assert set(queued) == {a for a, _ in folded}  # every account changed at least once
    for account, update in queued.items():
        assert dict(update.totals) == {u: b for (a, u), b in folded.items() if a == account}
        assert update.current_period == "2026-11"
    assert queued["budget:vision"].budget == VISION
    assert queued["consumer:vision/detection"].budget is None
    # four commits, one message per account: later ones superseded what was not yet sent
    assert len([m for m in store.pending_outbox() if m.topic == "balances"]) == len(queued)


def test_a_new_commit_republishes_the_budget_it_changes(store):
    store.mark_sent([m.id for m in store.pending_outbox()])
    before = pending_balances(store)
    assert before == {}
    ingestor(store).apply([samples(1, 10, 2)])
    after = pending_balances(store)
    assert set(after) == {
        "budget:vision",
        "capacity:h100/NVIDIA H100 80GB HBM3",
        "consumer:vision/detection",
    }
    line = after["budget:vision"].budget.line("gpu_ms")
    assert (line.consumed, line.remaining) == (50_000, 900_000)
    assert after["budget:vision"].seq > 0


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(
            [BalanceRow("consumer:vision/a", "gpu_ms", "2026-11", 9)], None, id="no-grant"
        ),
        pytest.param(
            [
                BalanceRow("budget:vision", "gpu_ms", "2026-10", -100),
                BalanceRow("consumer:vision/a", "gpu_ms", "2026-11", 9),
            ],
            (BudgetLine("gpu_ms", 0, 9, 0),),
            id="granted-only-last-month",
        ),
        pytest.param(
            [
                BalanceRow("budget:vision", "gpu_ms", "2026-11", -100),
                BalanceRow("consumer:vision/a", "gpu_ms", "2026-11", 9),
                BalanceRow("consumer:vision/b", "gpu_ms", "2026-11", 1),
                BalanceRow("consumer:vision/a", "gpu_ms", "2026-10", 50),
                BalanceRow("consumer:visionary/a", "gpu_ms", "2026-11", 7),
                BalanceRow("hold:vision", "gpu_ms", "2026-10", 30),
                BalanceRow("hold:vision", "gpu_ms", "2026-11", -5),
            ],
            (BudgetLine("gpu_ms", 100, 10, 25),),
            id="holds-span-periods-consumption-does-not",
        ),
        pytest.param(
            [
                BalanceRow("budget:vision", "money_micros", "2026-11", -300),
                BalanceRow("budget:vision", "money_micros", "2026-11", 100),
                BalanceRow("consumer:vision/a", "gpu_ms", "2026-11", 9),
            ],
            (BudgetLine("money_micros", 200, 0, 0),),
            id="only-granted-units-are-budgeted",
        ),
    ],
)
def test_budget_projection(rows, expected):
    status = budget_status("vision", "2026-11", rows)
    assert (status.lines if status else None) == expected


def test_report_balances(store):
    store.seal()
    result = CliRunner().invoke(
        cli,
        ["report", "balances", "--data-dir", str(store.data_dir), "--team", "vision", "-o", "json"],
    )
    assert result.exit_code == 0, result.output
    rows = {(r["account"], r["unit"]): r["balance"] for r in orjson.loads(result.output)}
    assert rows == {
        ("budget:vision", "gpu_ms"): -1_000_000,
        ("budget:vision", "money_micros"): -500_000,
        ("consumer:vision/detection", "gpu_ms"): 30_000,
        ("consumer:vision/detection", "money_micros"): 25_000,
        ("hold:vision", "gpu_ms"): 50_000,
        ("holds-outstanding:vision", "gpu_ms"): -50_000,
    }
    budgets = CliRunner().invoke(
        cli, ["report", "balances", "--data-dir", str(store.data_dir), "--budgets", "-o", "csv"]
    )
    assert budgets.exit_code == 0, budgets.output
    assert budgets.output.splitlines() == [
        "team,period,unit,granted,allowance,carried,consumed,open_holds,remaining",
        "vision,2026-11,gpu_ms,1000000,0,0,30000,50000,920000",
        "vision,2026-11,money_micros,500000,0,0,25000,0,475000",
    ]
    table = CliRunner().invoke(
        cli, ["report", "balances", "--data-dir", str(store.data_dir), "--budgets"]
    )
    assert "vision  2026-11  gpu_hours" in table.output
