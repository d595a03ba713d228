"""What balance messages need of the whole balances table, kept between commits
(`ledger.store.balance_outbox.BalanceFigures`): moved by each commit's changed rows, the
accounts a commit publishes from them, and the store's kept figures always equal to a fresh
read of the table."""

from __future__ import annotations

import pytest

from ledger.balances import BalanceRow
from ledger.envelope import DeadLetter
from ledger.errors import StoreError
from ledger.store.balance_outbox import BalanceFigures, moved_by, publication, read_figures
from ledger.store.hot import DuckDBStore
from tests.builders import INTERVAL_US
from tests.contract.store_support import DEC_US, a_txn, commit
from tests.unit.test_balances import CREDIT, GRANTS, HOLD, admin, hold, ingestor, samples

NOV, DEC = "2026-11", "2026-12"
CAP = "capacity:h100/H100"
BUDGETED = BalanceFigures(NOV, NOV, frozenset({"vision", "search"}), NOV)


def row(account: str, period: str) -> BalanceRow:
    return BalanceRow(account, "gpu_ms", period, 1)


@pytest.mark.parametrize(
    ("figures", "rows", "expected"),
    [
        pytest.param(BalanceFigures(), [], BalanceFigures(), id="nothing-yet"),
        pytest.param(
            BalanceFigures(),
            [row("consumer:vision/a", NOV)],
            BalanceFigures(None, NOV, frozenset(), None),
            id="no-capacity-the-newest-of-any",
        ),
        pytest.param(
            BalanceFigures(NOV, DEC, frozenset(), NOV),
            [row(CAP, "2026-10"), row("budget:search", NOV)],
            BalanceFigures(NOV, DEC, frozenset({"search"}), NOV),
            id="older-rows-keep-the-newest-a-budget-adds-its-team",
        ),
        pytest.param(
            BalanceFigures(NOV, NOV, frozenset({"vision"}), NOV),
            [row(CAP, DEC), row("consumer:vision/a", DEC)],
            BalanceFigures(DEC, DEC, frozenset({"vision"}), NOV),
            id="capacity-reaches-a-new-month",
        ),
    ],
)
def test_figures_moved_by_a_commits_rows(figures, rows, expected):
    assert moved_by(figures, rows) == expected


@pytest.mark.parametrize(
    ("figures", "changed", "moved", "accounts"),
    [
        pytest.param(BalanceFigures(), set(), False, (), id="empty-ledger-publishes-nothing"),
        pytest.param(
            BUDGETED,
            {"consumer:vision/a", CAP},
            False,
            ("budget:vision", CAP, "consumer:vision/a"),
            id="a-budgeted-teams-usage-publishes-its-budget",
        ),
        pytest.param(
            BUDGETED,
            {"consumer:ads/a", CAP},
            False,
            (CAP, "consumer:ads/a"),
            id="an-unbudgeted-team-publishes-no-budget",
        ),
        pytest.param(
            BUDGETED,
            {"hold:search"},
            False,
            ("budget:search", "hold:search"),
            id="a-hold-publishes-its-teams-budget",
        ),
        pytest.param(
            BalanceFigures(DEC, DEC, frozenset({"vision", "search"}), NOV),
            {CAP},
            True,
            ("budget:search", "budget:vision", CAP),
            id="a-new-current-period-publishes-every-budget",
        ),
        pytest.param(
            BalanceFigures(None, NOV, frozenset({"vision"}), None),
            {"consumer:ads/a"},
            True,
            ("budget:vision", "consumer:ads/a"),
            id="never-announced-is-a-move",
        ),
    ],
)
def test_what_a_commit_publishes(figures, changed, moved, accounts):
    plan = publication(figures, changed)
    assert (plan.moved, plan.accounts) == (moved, accounts)
    assert plan.current == figures.current


def test_the_kept_figures_are_the_tables_after_every_commit_and_forgotten_by_a_rollback(
    tmp_path,
):
    with DuckDBStore(tmp_path / "ledger") as store:
        ing = ingestor(store)
        for batch in (
            [admin(0, *GRANTS)],
            [samples(0, 1, 3)],
            [hold(0, HOLD)],
            [admin(1, CREDIT)],
            [samples(1, 10, 2, team="search")],
        ):
            ing.apply(batch)
            assert store._balance_figures == read_figures(store._con)
        kept = store._balance_figures
        assert kept is not None
        assert (kept.current, kept.budgeted, kept.announced) == (NOV, {"vision"}, NOV)
        # a commit into December, refused after its messages were queued (a dead letter's
        # partition past INTEGER): what it moved the figures by is forgotten with it
        december = a_txn("december", at_us=DEC_US + INTERVAL_US, debit="consumer:vision/x")
        with pytest.raises(StoreError):
            commit(
                store,
                december,
                offset=100,
                balances_topic="balances",
                dead_letters=[DeadLetter("refused", "x", partition=1 << 40)],
            )
        assert store._balance_figures is None
        assert read_figures(store._con) == kept
        ing.apply([samples(2, 20, 1)])
        assert store._balance_figures == read_figures(store._con) == kept
        # published and found settled, as the worker does after each batch: the next commit
        # has nothing to supersede, the one after it supersedes what that one queued
        store.mark_sent([m.id for m in store.pending_outbox()])
        assert store.pending_outbox() == []
        ing.apply([samples(3, 30, 1)])
        ing.apply([samples(4, 40, 1)])
        keys = [m.key for m in store.pending_outbox() if m.topic == "balances"]
        assert sorted(keys) == sorted(set(keys)) and len(keys) == 3  # budget, capacity, consumer
