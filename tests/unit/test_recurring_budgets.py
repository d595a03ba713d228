"""Recurring budgets, the pure rules: which months a policy grants, the allowance of a month and
what it carries over, table-tested with exact integers (`ledger.admin.recurring`)."""

from __future__ import annotations

import pytest

from ledger.admin import (
    AdminView,
    AppliedAdmin,
    AppliedPolicy,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    admin_envelope,
    carry_amount,
    plan_allowances,
)
from ledger.admin.recurring import MAX_MONTHS, budget_figures, month_before, policy_for
from ledger.balances import BalanceRow
from ledger.periods import Period
from ledger.units import Unit

MONTHS = ("2026-11", "2026-12", "2027-01", "2027-02", "2027-03", "2027-04")


def policy(
    amount: int,
    every: str = "month",
    start: str | None = "2026-11",
    end: str | None = None,
    carry: str = "none",
    limit: int | None = None,
    set_in: str = "2026-11",
    pid: str = "p1",
) -> AppliedPolicy:
    return AppliedPolicy(
        pid,
        BudgetPolicySet(
            "vision",
            Unit.MONEY,
            amount,
            Cadence(every),
            start,
            end,
            CarryOver(carry),
            limit,
            "alice",
            "test",
            Period.month(set_in).start_us + 7,
        ),
    )


def run(policies, usage=(), months=MONTHS, closed=(), late=None):
    """Plan month after month as the ledger would, each month's usage booked after its grant;
    `late` adds (month, amount) of usage into a month once the next one was granted.
    Returns (period, allowance, carried) per record."""
    key = ("vision", Unit.MONEY)
    spent = dict(zip(months, usage, strict=False))
    latest: dict = {}
    granted: dict = {}
    consumed: dict = {}
    out = []
    for month in months:
        for record in plan_allowances({key: policies}, latest, month, closed, granted, consumed):
            latest[key] = record
            figure = ("vision", "money_micros", record.period)
            granted[figure] = granted.get(figure, 0) + record.granted
            out.append((record.period, record.allowance, record.carried))
        figure = ("vision", "money_micros", month)
        consumed[figure] = consumed.get(figure, 0) + spent.get(month, 0)
        if late is not None and late[0] == month_before(month):
            late_key = ("vision", "money_micros", late[0])
            consumed[late_key] = consumed.get(late_key, 0) + late[1]
    return out


CASES = {
    "monthly-no-carry": (
        [policy(100)],
        (30, 50, 120),
        [("2026-11", 100, 0), ("2026-12", 100, 0), ("2027-01", 100, 0)]
        + [(m, 100, 0) for m in MONTHS[3:]],
    ),
    "monthly-carry-all-compounds": (
        [policy(100, carry="all")],
        (30, 50, 0, 0, 0),
        [
            ("2026-11", 100, 0),
            ("2026-12", 100, 70),
            ("2027-01", 100, 120),
            ("2027-02", 100, 220),
            ("2027-03", 100, 320),
            ("2027-04", 100, 420),
        ],
    ),
    "carry-capped-at-25-percent": (
        [policy(100, carry="percent", limit=25)],
        (30, 120, 200, 0),
        [
            ("2026-11", 100, 0),
            ("2026-12", 100, 25),  # 70 left, at most 25
            ("2027-01", 100, 5),  # 125 − 120
            ("2027-02", 100, 0),  # 105 − 200: overspent, nothing carried, no debt
            ("2027-03", 100, 25),
            ("2027-04", 100, 25),
        ],
    ),
    "carry-percent-rounds-down": (
        [policy(99, carry="percent", limit=10)],
        (0,),
        [("2026-11", 99, 0), ("2026-12", 99, 9)] + [(m, 99, 9) for m in MONTHS[2:]],
    ),
    "carry-capped-at-an-amount": (
        [policy(100, carry="amount", limit=40)],
        (30, 90, 100),
        [
            ("2026-11", 100, 0),
            ("2026-12", 100, 40),
            ("2027-01", 100, 40),  # 140 − 90 = 50, at most 40
            ("2027-02", 100, 40),  # 140 − 100
            ("2027-03", 100, 40),
            ("2027-04", 100, 40),
        ],
    ),
    "quarterly-started-mid-quarter": (
        [policy(300, every="quarter")],
        (100, 150, 100, 250, 0),
        [
            ("2026-11", 300, 0),  # the first month it grants
            ("2026-12", 0, 200),  # same quarter: the whole remainder moves on
            ("2027-01", 300, 0),  # a new quarter, carry-over none
            ("2027-02", 0, 200),
            ("2027-03", 0, 0),  # overspent within the quarter
            ("2027-04", 300, 0),
        ],
    ),
    "quarterly-carry-capped-at-the-quarter-boundary": (
        [
            policy(
                300, every="quarter", start="2027-01", carry="percent", limit=10, set_in="2026-12"
            )
        ],
        (0, 0, 0, 50, 0),
        [
            ("2027-01", 300, 0),
            ("2027-02", 0, 300),
            ("2027-03", 0, 250),  # 300 − 50 booked in February
            ("2027-04", 300, 30),  # 250 left; at most 10 % of 300
        ],
    ),
    "changed-mid-year": (
        [policy(100, carry="all"), policy(150, start="2027-02", set_in="2026-12", pid="p2")],
        (100, 100, 100, 100),
        [
            ("2026-11", 100, 0),
            ("2026-12", 100, 0),
            ("2027-01", 100, 0),
            ("2027-02", 150, 0),  # p2 carries nothing
            ("2027-03", 150, 0),
            ("2027-04", 150, 0),
        ],
    ),
    "ended": (
        [policy(100, end="2027-01", carry="all")],
        (0,),
        [("2026-11", 100, 0), ("2026-12", 100, 100), ("2027-01", 100, 200)],
    ),
    "ended-then-a-new-policy-starts-a-new-chain": (
        [policy(100, end="2026-12", carry="all"), policy(80, start="2027-03", pid="p2")],
        (0,),
        [("2026-11", 100, 0), ("2026-12", 100, 100), ("2027-03", 80, 0), ("2027-04", 80, 0)],
    ),
    "never-granted-before-the-month-it-was-set": (
        [policy(100, start="2026-01", set_in="2027-01")],
        (),
        [("2027-01", 100, 0), ("2027-02", 100, 0), ("2027-03", 100, 0), ("2027-04", 100, 0)],
    ),
}


@pytest.mark.parametrize(("policies", "usage", "expected"), list(CASES.values()), ids=list(CASES))
def test_grants_month_by_month(policies, usage, expected):
    assert run(policies, usage) == expected


def test_months_without_usage_are_granted_in_order_in_one_plan():
    assert run([policy(100, carry="all")], (40,), months=("2026-11", "2027-02")) == [
        ("2026-11", 100, 0),
        ("2026-12", 100, 60),
        ("2027-01", 100, 160),
        ("2027-02", 100, 260),
    ]


def test_late_usage_into_the_previous_month_changes_nothing_already_carried():
    # 70 of November was carried into December; 50 more booked into November afterwards
    # lowers November's own figures only: January carries December's remainder, 170 either way.
    plain = run([policy(100, carry="all")], (30, 0), months=MONTHS[:3])
    late = run([policy(100, carry="all")], (30, 0), months=MONTHS[:3], late=("2026-11", 50))
    assert plain == late == [("2026-11", 100, 0), ("2026-12", 100, 70), ("2027-01", 100, 170)]


def test_a_closed_month_gets_a_record_of_nothing_and_breaks_the_carry():
    assert run([policy(100, carry="all")], (0,), closed=("2026-12",), months=MONTHS[:3]) == [
        ("2026-11", 100, 0),
        ("2026-12", 0, 0),
        ("2027-01", 100, 0),
    ]


def test_one_plan_grants_at_most_max_months():
    records = plan_allowances({("vision", Unit.MONEY): [policy(1)]}, {}, "2040-01", (), {}, {})
    assert len(records) == MAX_MONTHS
    assert (records[0].period, records[-1].period) == ("2026-11", "2029-10")


CARRY = {
    "none": (CarryOver.NONE, None, 100, 70, 0),
    "all": (CarryOver.ALL, None, 100, 70, 70),
    "all-of-a-negative-remainder": (CarryOver.ALL, None, 100, -5, 0),
    "percent-under-the-cap": (CarryOver.PERCENT, 50, 100, 20, 20),
    "percent-at-the-cap": (CarryOver.PERCENT, 50, 100, 70, 50),
    "percent-rounds-down": (CarryOver.PERCENT, 33, 10, 70, 3),
    "amount-under-the-cap": (CarryOver.AMOUNT, 40, 100, 39, 39),
    "amount-at-the-cap": (CarryOver.AMOUNT, 40, 100, 41, 40),
    "zero-remainder": (CarryOver.AMOUNT, 40, 100, 0, 0),
}


@pytest.mark.parametrize(
    ("rule", "limit", "amount", "remainder", "carried"), list(CARRY.values()), ids=list(CARRY)
)
def test_carry_amount(rule, limit, amount, remainder, carried):
    assert carry_amount(rule, limit, amount, remainder) == carried


def test_the_policy_in_force_is_the_last_applied_that_has_started():
    first, second = policy(100), policy(150, start="2027-02", set_in="2026-12", pid="p2")
    assert [getattr(policy_for([first, second], m), "policy_id", None) for m in MONTHS] == [
        "p1",
        "p1",
        "p1",
        "p2",
        "p2",
        "p2",
    ]
    ended = policy(100, end="2026-12", pid="p3")
    assert [getattr(policy_for([first, ended], m), "policy_id", None) for m in MONTHS[:3]] == [
        "p3",
        "p3",
        None,
    ]


def test_figures_come_from_budget_and_consumer_balances():
    rows = [
        BalanceRow("budget:vision", "money_micros", "2026-11", -100),
        BalanceRow("funding:research", "money_micros", "2026-11", 100),
        BalanceRow("consumer:vision/detection", "money_micros", "2026-11", 30),
        BalanceRow("consumer:vision/-", "money_micros", "2026-11", 5),
        BalanceRow("consumer:language/x", "money_micros", "2026-11", 9),
    ]
    granted, consumed = budget_figures(rows)
    assert granted == {("vision", "money_micros", "2026-11"): 100}
    assert consumed == {
        ("vision", "money_micros", "2026-11"): 35,
        ("language", "money_micros", "2026-11"): 9,
    }


def test_the_admin_view_knows_policies_and_the_latest_allowance():
    applied = policy(100)
    records = plan_allowances({("vision", Unit.MONEY): [applied]}, {}, "2026-12", (), {}, {})
    log = [AppliedAdmin(admin_envelope(applied.policy))] + [
        AppliedAdmin(admin_envelope(r)) for r in records
    ]
    view = AdminView.from_log(log)
    assert view.policy("vision", Unit.MONEY) == applied.policy
    assert view.latest_allowance[("vision", Unit.MONEY)].period == "2026-12"
    assert sorted(view.allowances) == [
        ("vision", Unit.MONEY, "2026-11"),
        ("vision", Unit.MONEY, "2026-12"),
    ]
