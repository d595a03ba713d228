"""Ordering policy: priority, then (for quota policies) non-borrowing before borrowing, then fair
share from decayed metered usage (or requested share, or nothing for FIFO), then age."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.job_events import JobSpec
from scheduler.admission import nominate
from scheduler.fairshare import (
    DecayedUsage,
    accrue,
    decay,
    meter_all,
    standing,
    usage_at,
)
from scheduler.model import Ordering, Policy
from scheduler.ordering import order
from tests.scheduler_builders import HOUR_US, T0_US, a_cluster, a_spec, a_team

GPU_HOUR_MS = 3_600_000
DAY_US = 24 * HOUR_US


@dataclass(frozen=True)
class Case:
    pending: Sequence[JobSpec]
    expect: Sequence[str]  # job ids, first served first
    ordering: Ordering = Ordering.METERED_FAIR_SHARE
    metered: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # team → (GPU-h, age µs)
    running: Sequence[JobSpec] = ()
    nominal: Mapping[str, int] = field(default_factory=lambda: {"vision": 8, "audio": 8})


def _job(job_id: str, team: str, at: int = 0, **kw: object) -> JobSpec:
    return a_spec(job_id, team, submit_us=T0_US + at, **kw)


CASES = [
    pytest.param(
        Case(
            [_job("low", "audio"), _job("high", "vision", priority=5)],
            ["high", "low"],
            metered={"vision": (1000, 0)},
        ),
        id="priority-before-fair-share",
    ),
    pytest.param(
        Case(
            [_job("early", "vision", 0), _job("late", "audio", 10)],
            ["late", "early"],
            metered={"vision": (100, 0), "audio": (10, 0)},
        ),
        id="fair-share-before-age",
    ),
    pytest.param(
        Case([_job("b", "vision", 2), _job("a", "vision", 1)], ["a", "b"]),
        id="age-breaks-ties",
    ),
    pytest.param(
        Case(
            [_job("v", "vision", 0), _job("a", "audio", 1)],
            ["v", "a"],
            metered={"vision": (16, 0), "audio": (10, 0)},
            nominal={"vision": 16, "audio": 8},
        ),
        id="usage-is-divided-by-quota-weight",
    ),
    pytest.param(
        Case(
            [_job("v", "vision", 0), _job("a", "audio", 1)],
            ["v", "a"],
            metered={"vision": (100, 3 * DAY_US), "audio": (20, 0)},
        ),
        id="old-usage-decays",  # 100 GPU-h three half-lives ago weigh 12.5 < 20
    ),
    pytest.param(
        Case(
            [_job("v", "vision", 0), _job("a", "audio", 1)],
            ["a", "v"],
            metered={"vision": (100, 2 * DAY_US), "audio": (20, 0)},
        ),
        id="recent-enough-usage-still-counts",  # 25 > 20
    ),
    pytest.param(
        Case(
            [_job("b", "audio", 1, priority=9), _job("a", "vision", 0)],
            ["a", "b"],
            ordering=Ordering.FIFO,
            metered={"vision": (1000, 0)},
        ),
        id="fifo-ignores-priority-and-usage",
    ),
    pytest.param(
        Case(
            [_job("v", "vision", 0), _job("a", "audio", 1)],
            ["a", "v"],
            ordering=Ordering.REQUESTED_SHARE,
            metered={"audio": (1000, 0)},
            running=[_job("held", "vision", -5, gpus=4)],
        ),
        id="requested-share-counts-gpus-held-now",
    ),
    pytest.param(
        Case(
            [_job("v", "vision", 0), _job("a", "audio", 1)],
            ["v", "a"],
            ordering=Ordering.METERED_FAIR_SHARE,
            metered={"audio": (1000, 0)},
            running=[_job("held", "vision", -5, gpus=4)],
        ),
        id="metered-share-counts-usage-not-requests",
    ),
    pytest.param(
        Case(
            [_job("borrower", "vision", 0), _job("within", "audio", 1)],
            ["within", "borrower"],
            metered={"audio": (1000, 0)},
            running=[_job("held", "vision", -5, gpus=8)],
        ),
        id="within-nominal-before-borrowing",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_order(case: Case) -> None:
    teams = [a_team(t, n) for t, n in case.nominal.items()]
    policy = Policy(ordering=case.ordering)
    cluster = a_cluster(teams=teams, policy=policy, half_life_us=DAY_US)
    if case.running:
        cluster.run(*case.running)
    for team, (gpu_hours, age_us) in case.metered.items():
        cluster.state.meter(team, gpu_hours * GPU_HOUR_MS, cluster.now_us - age_us)
    cluster.submit(*case.pending)
    snap = cluster.snapshot()
    nominations, verdicts = nominate(snap, snap.heads, policy)
    assert not verdicts
    assert [n.spec.job_id for n in order(nominations, case.ordering, snap)] == list(case.expect)


def test_metered_fair_share_decides_who_gets_the_last_gpus() -> None:
    cluster = a_cluster(half_life_us=DAY_US)
    cluster.run(a_spec("hog", "vision", gpus=15))
    cluster.state.meter("vision", 500 * GPU_HOUR_MS, cluster.now_us)
    cluster.submit(_job("v", "vision", 1), _job("a", "audio", 2))
    cluster.cycle()
    assert cluster.state.running_job("a") is not None
    assert cluster.state.running_job("v") is None


# ---------------------------------------------------------------------------- decay


@pytest.mark.parametrize(
    ("elapsed", "expect"),
    [
        pytest.param(0, 1000, id="no-time"),
        pytest.param(DAY_US, 500, id="one-half-life"),
        pytest.param(2 * DAY_US, 250, id="two-half-lives"),
        pytest.param(DAY_US // 2, 707, id="half-a-half-life-rounds-down"),
        pytest.param(-5, 1000, id="negative-elapsed-is-no-decay"),
    ],
)
def test_decay(elapsed: int, expect: int) -> None:
    assert decay(1000, elapsed, DAY_US) == expect


def test_accrue_decays_then_adds() -> None:
    usage = accrue(DecayedUsage(1000, 0), 300, DAY_US, DAY_US)
    assert usage == DecayedUsage(800, DAY_US)


def test_late_metering_is_added_without_decay() -> None:
    usage = accrue(DecayedUsage(1000, DAY_US), 300, 0, DAY_US)
    assert usage == DecayedUsage(1300, DAY_US)


def test_meter_all_returns_a_new_table() -> None:
    table = {"vision": DecayedUsage(1000, 0)}
    new = meter_all(table, [("vision", 10), ("audio", 5)], DAY_US, DAY_US)
    assert table == {"vision": DecayedUsage(1000, 0)}
    assert new == {"vision": DecayedUsage(510, DAY_US), "audio": DecayedUsage(5, DAY_US)}


def test_negative_metering_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        accrue(DecayedUsage(), -1, 0, DAY_US)


def test_standing_divides_by_weight() -> None:
    assert standing(300, 3) < standing(300, 2)
    assert standing(300, 0) == standing(300, 1)


@given(
    st.integers(min_value=0, max_value=10**15),
    st.integers(min_value=0, max_value=10**13),
    st.integers(min_value=0, max_value=10**13),
)
def test_decay_is_monotone_and_never_negative(gpu_ms: int, first: int, second: int) -> None:
    early = usage_at(DecayedUsage(gpu_ms, 0), min(first, second), DAY_US)
    late = usage_at(DecayedUsage(gpu_ms, 0), max(first, second), DAY_US)
    assert 0 <= late <= early <= gpu_ms
