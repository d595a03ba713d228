"""The readers' projection of a sharded ledger's open holds (`ledger.hold_projection`): per
unit, `Σ max(0, hold − usage so far)` over a team's open holds, as a table of holds and usage;
a budget that lists its holds gets its lines' open holds so projected, one that does not is
left as it is. A retried job's hold projects by its job's usage past its baseline, never
showing more budget than a whole ledger would; the baselines travel in the budget message."""

from __future__ import annotations

import orjson
import pytest

from ledger.balances import (
    BalanceUpdate,
    BudgetLine,
    BudgetStatus,
    JobAmount,
    decode_balance_update,
    encode_balance_update,
)
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


# A retried job keeps its id, and its usage so far is every attempt's: each hold projects by
# the usage past its baseline (what earlier holds' settlements read). Beside each case, what a
# whole ledger (one worker) shows: never less held than that, so a team never looks richer.
RETRIES: dict[str, tuple[JobAmount, int | None, int]] = {
    # (open hold, the job's usage so far) → projected; whole ledger's in the comment
    "first-attempt": (JobAmount("job-1", MONEY, 1_000), 400, 600),  # 600
    "retry-after-the-first-settled-usage-under": (
        JobAmount("job-1", MONEY, 800, baseline=400),  # the first used 400 of its 1,000
        400 + 300,
        500,  # 800 − 300
    ),
    "retry-after-the-first-overran": (
        JobAmount("job-1", MONEY, 800, baseline=1_500),  # the first used 1,500 of its 1,000
        1_500 + 300,
        500,  # 800 − 300: the first attempt's overrun frees nothing of the retry's hold
    ),
    "retry-past-its-hold": (JobAmount("job-1", MONEY, 800, baseline=400), 400 + 900, 0),  # 0
    "retry-not-started": (JobAmount("job-1", MONEY, 800, baseline=400), 400, 800),  # 800
    "retry-whose-usage-no-shard-published": (  # or a reader forgot it: whole, not 800 + 400
        JobAmount("job-1", MONEY, 800, baseline=400),
        None,
        800,
    ),
    # the first attempt (1,000) ended but is not settled yet: the retry (800) joined it
    "retry-joined-the-unsettled-first-under": (
        JobAmount("job-1", MONEY, 1_800, earlier=1_000),
        400 + 300,  # readers cannot tell the split: the retry's part projects whole
        800 + 300,  # whole ledger: 800 − 300 = 500
    ),
    "retry-joined-the-unsettled-first-that-overran": (
        JobAmount("job-1", MONEY, 1_800, earlier=1_000),
        1_500 + 300,
        800,  # whole ledger: 500 (the joined hold's 1,800 − 1,800 = 0 would show 500 more)
    ),
    "retry-joined-an-unsettled-second-past-a-baseline": (
        JobAmount("job-1", MONEY, 1_300, baseline=400, earlier=800),
        400 + 300 + 100,
        500 + 800 - 400,  # whole ledger: 500 − 100 = 400
    ),
}


@pytest.mark.parametrize(("hold", "usage", "expected"), RETRIES.values(), ids=RETRIES.keys())
def test_a_retried_jobs_hold_is_projected_by_the_usage_past_its_baseline(
    hold: JobAmount, usage: int | None, expected: int
) -> None:
    known = {} if usage is None else {("job-1", MONEY): usage}
    assert projected_holds([hold], known) == {MONEY: expected}


def test_the_baselines_travel_in_the_budget_message_and_an_old_message_reads_as_none() -> None:
    holds = (
        JobAmount("job-1", MONEY, 800, baseline=400),
        JobAmount("job-2", GPU, 1_800, baseline=0, earlier=1_000),
        JobAmount("job-3", MONEY, 500),
    )
    update = BalanceUpdate("budget:vision", 7, 1, "2026-11", (), (), budget=a_status(holds))
    value = encode_balance_update(update)
    assert decode_balance_update(value).budget == a_status(holds)
    old = orjson.loads(value)
    assert old["data"]["budget"]["holds"] == [
        ["job-1", MONEY, 800, 400, 0],
        ["job-2", GPU, 1_800, 0, 1_000],
        ["job-3", MONEY, 500],  # no baseline: written as before the fields
    ]
    old["data"]["budget"]["holds"] = [["job-1", MONEY, 800]]  # from before the fields
    decoded = decode_balance_update(orjson.dumps(old)).budget
    assert decoded is not None and decoded.holds == (JobAmount("job-1", MONEY, 800, 0, 0),)


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
