"""The readers' projection of a sharded ledger's open holds (`ledger.hold_projection`): per
unit, `Σ max(0, hold − usage so far)` over a team's open holds, as a table of holds and usage;
a budget that lists its holds gets its lines' open holds so projected, one that does not is
left as it is."""

from __future__ import annotations

import pytest

from ledger.balances import BudgetLine, BudgetStatus, JobAmount
from ledger.hold_projection import JobUnit, projected_holds, projected_status

MONEY, GPU = "money_micros", "gpu_ms"

# (open holds, usage so far per (job, unit)) → open holds per unit
PROJECTIONS: dict[str, tuple[list[JobAmount], dict[JobUnit, int], dict[str, int]]] = {
    "no-holds": ([], {("job-1", MONEY): 500}, {}),
    "no-usage-yet-holds-whole": ([JobAmount("job-1", MONEY, 1_000)], {}, {MONEY: 1_000}),
    "usage-under-the-hold": (
        [JobAmount("job-1", MONEY, 1_000)],
        {("job-1", MONEY): 400},
        {MONEY: 600},
    ),
    "usage-equal-to-the-hold": (
        [JobAmount("job-1", MONEY, 1_000)],
        {("job-1", MONEY): 1_000},
        {MONEY: 0},
    ),
    "usage-over-the-hold-is-zero-not-negative": (
        [JobAmount("job-1", MONEY, 1_000)],
        {("job-1", MONEY): 1_700},
        {MONEY: 0},
    ),
    "one-jobs-overrun-frees-nothing-of-anothers-hold": (
        [JobAmount("job-1", MONEY, 1_000), JobAmount("job-2", MONEY, 1_000)],
        {("job-1", MONEY): 1_700, ("job-2", MONEY): 100},
        {MONEY: 900},
    ),
    "usage-of-a-job-without-a-hold-counts-for-none": (
        [JobAmount("job-1", MONEY, 1_000)],
        {("job-9", MONEY): 800},
        {MONEY: 1_000},
    ),
    "units-apart": (
        [JobAmount("job-1", MONEY, 1_000), JobAmount("job-1", GPU, 3_600)],
        {("job-1", MONEY): 250, ("job-1", GPU): 4_000},
        {MONEY: 750, GPU: 0},
    ),
    "a-reversal-gives-back-usage": (
        [JobAmount("job-1", MONEY, 1_000)],
        {("job-1", MONEY): -100},  # net usage below zero: the hold stays whole and more
        {MONEY: 1_100},
    ),
    "a-job-named-twice-is-one-hold": (
        [JobAmount("job-1", MONEY, 600), JobAmount("job-1", MONEY, 400)],
        {("job-1", MONEY): 700},
        {MONEY: 300},
    ),
}


@pytest.mark.parametrize(
    ("holds", "usage", "expected"), PROJECTIONS.values(), ids=PROJECTIONS.keys()
)
def test_each_open_hold_is_projected_against_its_jobs_usage_so_far(
    holds: list[JobAmount], usage: dict[JobUnit, int], expected: dict[str, int]
) -> None:
    assert projected_holds(holds, usage) == expected


def a_status(holds: tuple[JobAmount, ...] | None) -> BudgetStatus:
    lines = (BudgetLine(GPU, 10_000, 0, 3_600), BudgetLine(MONEY, 5_000, 1_200, 1_000))
    return BudgetStatus("vision", "2026-11", lines, holds)


STATUSES = {
    "listed-holds-projected": (
        (JobAmount("job-1", MONEY, 1_000),),
        {GPU: 0, MONEY: 1_000 - 400},  # no GPU-ms hold listed: none open
    ),
    "no-holds-listed-left-as-published": (None, {GPU: 3_600, MONEY: 1_000}),
}


@pytest.mark.parametrize(("holds", "expected"), STATUSES.values(), ids=STATUSES.keys())
def test_a_budget_listing_its_holds_gets_them_projected(
    holds: tuple[JobAmount, ...] | None, expected: dict[str, int]
) -> None:
    status = projected_status(a_status(holds), {("job-1", MONEY): 400})
    assert {line.unit: line.open_holds for line in status.lines} == expected
    assert [(line.granted, line.consumed) for line in status.lines] == [(10_000, 0), (5_000, 1_200)]
