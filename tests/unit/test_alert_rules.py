"""The pure alert rules (`ledger.alert_rules`): budget thresholds and the burn-rate forecast with
exact integers, idle GPU time per team and UTC day, pending jobs past their queue's threshold,
and the open/resolve bookkeeping of job alerts."""

from __future__ import annotations

import pytest

from ledger.alert_rules import (
    DAY_US,
    BudgetMemory,
    BudgetRules,
    IdleSpan,
    JobMemory,
    TeamIdleMemory,
    Waiting,
    budget_step,
    crossed,
    exceed_at,
    forecast_at_end,
    forecast_exceeds,
    idle_gpu_ms,
    job_step,
    overdue,
    team_idle_step,
)
from ledger.balances import BudgetLine, BudgetStatus
from ledger.fleet_alerts import FleetKind, JobAlert
from ledger.periods import Period

NOV = Period.month("2026-11")  # 30 days
HOUR = 3_600_000_000
D0 = NOV.start_us  # a UTC midnight


@pytest.mark.parametrize(
    ("granted", "consumed", "thresholds", "expected"),
    [
        (1000, 0, (50, 80, 100), ()),
        (1000, 499, (50, 80, 100), ()),
        (1000, 500, (50, 80, 100), (50,)),
        (1000, 799, (50, 80, 100), (50,)),
        (1000, 800, (80, 50, 100), (50, 80)),
        (1000, 1000, (50, 80, 100), (50, 80, 100)),
        (3, 2, (66, 67), (66,)),  # 200 ≥ 198, 200 < 201: exact, no rounding
        (1000, 5000, (50, 100, 150), (50, 100, 150)),
        (0, 10, (50,), ()),  # no budget: nothing to cross
        (-5, 10, (50,), ()),
    ],
    ids=[
        "nothing-used",
        "just-under-half",
        "exactly-half",
        "just-under-80",
        "unsorted-thresholds",
        "all-at-100",
        "thirds-exact",
        "over-150",
        "no-budget",
        "negative-budget",
    ],
)
def test_thresholds_crossed(granted, consumed, thresholds, expected):
    assert crossed(granted, consumed, thresholds) == expected


@pytest.mark.parametrize(
    ("consumed", "now", "expected"),
    [
        (100, D0 + 3 * 24 * HOUR, 1000),  # 3 of 30 days: ×10
        (7, D0 + 10 * 24 * HOUR, 21),  # 10 of 30 days: ×3
        (10, D0 + 7 * 24 * HOUR, 42),  # 10 × 30 / 7 = 42.86 → floor 42
        (10, D0, None),  # no time passed: no rate
        (10, NOV.end_us + HOUR, 10),  # past the end: what was consumed
    ],
    ids=["tenth-of-period", "third", "floored", "no-time", "after-end"],
)
def test_forecast_at_period_end(consumed, now, expected):
    assert forecast_at_end(consumed, NOV.start_us, NOV.end_us, now) == expected


@pytest.mark.parametrize(
    ("granted", "consumed", "now", "expected"),
    [
        (1000, 100, D0 + 3 * 24 * HOUR, D0 + 30 * 24 * HOUR),  # exactly at the end
        (1000, 200, D0 + 3 * 24 * HOUR, D0 + 15 * 24 * HOUR),
        (10, 3, D0 + 1, D0 + 4),  # 10 × 1 / 3 = 3.33 → ceiling 4
        (1000, 0, D0 + HOUR, None),
        (1000, 10, D0, None),
    ],
    ids=["at-end", "half-way", "ceiling", "no-burn", "no-time"],
)
def test_when_the_burn_rate_reaches_the_budget(granted, consumed, now, expected):
    assert exceed_at(granted, consumed, D0, now) == expected


@pytest.mark.parametrize(
    ("granted", "consumed", "now", "after_pct", "expected"),
    [
        (1000, 101, D0 + 3 * 24 * HOUR, 10, True),  # 101 × 30 = 3030 > 1000 × 3 = 3000
        (1000, 100, D0 + 3 * 24 * HOUR, 10, False),  # 3000 = 3000: reaches it, not over
        (1000, 99, D0 + 3 * 24 * HOUR, 10, False),
        (1000, 500, D0 + 2 * 24 * HOUR, 10, False),  # 2 of 30 days < 10 %: too early to say
        (1000, 500, D0 + 2 * 24 * HOUR, 0, True),
        (1000, 1000, D0 + 3 * 24 * HOUR, 10, False),  # already reached: the 100 % threshold
        (1000, 999, NOV.end_us, 10, False),  # the period is over
        (0, 10, D0 + 10 * 24 * HOUR, 10, False),
    ],
    ids=[
        "just-over",
        "exactly-on-budget",
        "under",
        "too-early",
        "no-grace",
        "already-reached",
        "period-over",
        "no-budget",
    ],
)
def test_forecast_to_exceed_before_period_end(granted, consumed, now, after_pct, expected):
    assert forecast_exceeds(granted, consumed, NOV.start_us, NOV.end_us, now, after_pct) is expected


def _status(*lines: tuple[str, int, int]) -> BudgetStatus:
    return BudgetStatus("vision", "2026-11", tuple(BudgetLine(u, g, c, 0) for u, g, c in lines))


def test_each_threshold_fires_once_per_team_period_and_unit():
    rules = BudgetRules(forecast=False)
    memory = BudgetMemory()
    memory, first = budget_step(memory, _status(("gpu_ms", 1000, 820)), D0 + HOUR, rules)
    assert [(a.kind, a.unit, a.threshold_pct) for a in first] == [
        (FleetKind.BUDGET_THRESHOLD, "gpu_ms", 50),
        (FleetKind.BUDGET_THRESHOLD, "gpu_ms", 80),
    ]
    assert (first[1].granted, first[1].consumed, first[1].at_us) == (1000, 820, D0 + HOUR)
    assert first[1].period_start_us == NOV.start_us and first[1].period_end_us == NOV.end_us
    memory, again = budget_step(memory, _status(("gpu_ms", 1000, 900)), D0 + 2 * HOUR, rules)
    assert again == []
    memory, more = budget_step(
        memory, _status(("gpu_ms", 1000, 1000), ("money_micros", 10, 5)), D0 + 3 * HOUR, rules
    )
    assert [(a.unit, a.threshold_pct) for a in more] == [("gpu_ms", 100), ("money_micros", 50)]
    other = BudgetStatus("vision", "2026-12", (BudgetLine("gpu_ms", 1000, 600, 0),))
    _, december = budget_step(memory, other, Period.month("2026-12").start_us + HOUR, rules)
    assert [a.threshold_pct for a in december] == [50]  # a new period starts over
    assert first[0].id != december[0].id


def test_a_forecast_overrun_fires_once_and_resolves_when_it_clears():
    rules = BudgetRules(thresholds_pct=(), forecast_after_pct=10)
    day3 = D0 + 3 * 24 * HOUR
    memory, fired = budget_step(BudgetMemory(), _status(("gpu_ms", 1000, 150)), day3, rules)
    (alert,) = fired
    assert alert.kind is FleetKind.BUDGET_FORECAST
    assert alert.forecast == 1500  # 150 × 30 / 3
    assert alert.exceed_at_us == D0 + 20 * 24 * HOUR  # 1000 × 3 days / 150
    memory, same = budget_step(memory, _status(("gpu_ms", 1000, 160)), day3 + HOUR, rules)
    assert same == []
    granted_more = _status(("gpu_ms", 3000, 160))  # a grant: back within budget
    memory, cleared = budget_step(memory, granted_more, day3 + 2 * HOUR, rules)
    (resolution,) = cleared
    assert resolution.kind is FleetKind.BUDGET_FORECAST_RESOLVED and resolution.resolved
    assert resolution.episode == alert.episode and resolution.id != alert.id
    assert memory.forecasting == frozenset()


def test_a_malformed_period_raises_nothing():
    status = BudgetStatus("vision", "november", (BudgetLine("gpu_ms", 10, 10, 0),))
    assert budget_step(BudgetMemory(), status, D0, BudgetRules()) == (BudgetMemory(), [])


@pytest.mark.parametrize(
    ("spans", "now", "expected"),
    [
        ([IdleSpan("a", D0 + HOUR, D0 + 3 * HOUR)], D0 + 5 * HOUR, {"a": 7_200_000}),
        ([IdleSpan("a", D0 - HOUR, D0 + HOUR)], D0 + 5 * HOUR, {"a": 3_600_000}),  # from midnight
        ([IdleSpan("a", D0 + 23 * HOUR, None)], D0 + DAY_US + HOUR, {"a": 3_600_000}),  # to 24h
        ([IdleSpan("a", D0 + HOUR, None)], D0 + 2 * HOUR + 1_500, {"a": 3_600_001}),  # open, floor
        (
            [IdleSpan("a", D0, D0 + HOUR), IdleSpan("a", D0, D0 + HOUR), IdleSpan("b", D0, D0 + 1)],
            D0 + 5 * HOUR,
            {"a": 7_200_000, "b": 0},  # two GPUs of one team add up; µs floored per team
        ),
        ([IdleSpan("a", D0 - 2 * HOUR, D0 - HOUR)], D0 + HOUR, {}),  # another day
    ],
    ids=["inside", "from-midnight", "to-midnight", "open-span", "two-gpus", "yesterday-only"],
)
def test_idle_gpu_time_per_team_in_a_day(spans, now, expected):
    assert idle_gpu_ms(spans, D0, D0 + DAY_US, now) == expected


def test_a_team_over_the_daily_idle_threshold_is_reported_once_per_day():
    spans = [IdleSpan("vision", D0 + HOUR, None), IdleSpan("language", D0 + HOUR, D0 + 2 * HOUR)]
    memory, early = team_idle_step(TeamIdleMemory(), spans, D0 + 3 * HOUR, 7_200_000)
    assert early == []  # exactly 2 h: not over
    memory, over = team_idle_step(memory, spans, D0 + 3 * HOUR + 1_000, 7_200_000)
    assert [(a.team, a.day_start_us, a.idle_gpu_ms) for a in over] == [("vision", D0, 7_200_001)]
    memory, later = team_idle_step(memory, spans, D0 + 10 * HOUR, 7_200_000)
    assert later == []
    _, next_day = team_idle_step(memory, spans, D0 + DAY_US + 3 * HOUR, 7_200_000)
    assert [(a.team, a.day_start_us) for a in next_day] == [("vision", D0 + DAY_US)]


def test_a_team_s_idle_day_is_a_day_of_the_ledger_s_time_zone():
    """In Asia/Shanghai a day starts at 16:00 UTC: idle time on both sides of UTC midnight is
    one local day, and the alert names that day's start."""
    from zoneinfo import ZoneInfo

    shanghai = ZoneInfo("Asia/Shanghai")
    local_midnight = D0 - 8 * HOUR  # 00:00 in Shanghai is 16:00 UTC the day before
    spans = [IdleSpan("vision", D0 - 2 * HOUR, D0 + HOUR)]  # 22:00–01:00 UTC: 06:00–09:00 local
    _, raised = team_idle_step(TeamIdleMemory(), spans, D0 + 2 * HOUR, 10_000_000, shanghai)
    assert [(a.team, a.day_start_us, a.idle_gpu_ms) for a in raised] == [
        ("vision", local_midnight, 10_800_000)
    ]
    _, in_utc = team_idle_step(TeamIdleMemory(), spans, D0 + 2 * HOUR, 10_000_000)
    assert in_utc == []  # split at UTC midnight: 2 h and 1 h, neither day over the threshold


@pytest.mark.parametrize(
    ("limits", "default", "expected"),
    [
        ({}, None, []),
        ({}, 2 * HOUR, ["j-old"]),
        ({"interactive": HOUR // 2}, None, ["j-mid"]),
        ({"interactive": HOUR // 2}, 2 * HOUR, ["j-old", "j-mid"]),
        ({"batch": 4 * HOUR}, HOUR // 2, ["j-mid"]),
    ],
    ids=["no-threshold", "default", "one-queue", "both", "queue-overrides-default"],
)
def test_jobs_pending_past_their_queues_threshold(limits, default, expected):
    now = D0 + 10 * HOUR
    waiting = [
        Waiting("j-old", "vision", "batch", now - 3 * HOUR, 4, "no_capacity"),
        Waiting("j-mid", "vision", "interactive", now - HOUR, 1),
        Waiting("j-new", "vision", "interactive", now - HOUR // 2, 1),  # exactly at: not over
    ]
    found = overdue(waiting, limits, default, now)
    assert [a.job for a in found] == expected
    for alert in found:
        assert alert.kind is FleetKind.JOB_PENDING and alert.at_us == now
        assert alert.limit_us == limits.get(alert.queue, default)


def _pending(job: str, since: int) -> JobAlert:
    return JobAlert(FleetKind.JOB_PENDING, job, "vision", "batch", since, D0 + 5 * HOUR, HOUR, 2)


def test_job_alerts_open_once_and_resolve_when_no_longer_found():
    memory, raised = job_step(
        JobMemory(), FleetKind.JOB_PENDING, [_pending("j1", D0)], D0 + 5 * HOUR
    )
    assert [a.kind for a in raised] == [FleetKind.JOB_PENDING]
    memory, again = job_step(memory, FleetKind.JOB_PENDING, [_pending("j1", D0)], D0 + 6 * HOUR)
    assert again == []
    memory, idle_kind = job_step(memory, FleetKind.JOB_IDLE, [], D0 + 6 * HOUR)
    assert idle_kind == []  # another kind's rule does not resolve pending alerts
    memory, resolved = job_step(
        memory, FleetKind.JOB_PENDING, [], D0 + 7 * HOUR, ended={"j1": "admitted"}
    )
    (alert,) = resolved
    assert (alert.kind, alert.at_us, alert.reason) == (
        FleetKind.JOB_PENDING_RESOLVED,
        D0 + 7 * HOUR,
        "admitted",
    )
    assert alert.episode == raised[0].episode
    assert memory.open == {}


def test_a_new_episode_of_the_same_job_resolves_the_old_one_first():
    memory, _ = job_step(JobMemory(), FleetKind.JOB_PENDING, [_pending("j1", D0)], D0)
    memory, raised = job_step(memory, FleetKind.JOB_PENDING, [_pending("j1", D0 + HOUR)], D0)
    assert [(a.kind, a.since_us) for a in raised] == [
        (FleetKind.JOB_PENDING_RESOLVED, D0),
        (FleetKind.JOB_PENDING, D0 + HOUR),
    ]
