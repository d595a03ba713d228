"""The allocated-but-idle detector, table-driven over sample sequences (one per minute)."""

from __future__ import annotations

import pytest

from ledger.events import Owner
from ledger.idle import (
    MINUTE_US,
    AlertKind,
    IdleObservation,
    IdlePolicy,
    ResolveReason,
    state_from_row,
    state_to_row,
    step,
)

ADA = Owner("vision", "detection", "ada", "nb-1")
BOB = Owner("search", "ranking", "bob", "job-2")
POLICY = IdlePolicy(
    threshold_pct=5,
    min_duration_us=30 * MINUTE_US,
    resolve_pct=10,
    resolve_duration_us=5 * MINUTE_US,
)


def obs(minute: int, util: int, owner: Owner | None = ADA) -> IdleObservation:
    return IdleObservation(
        subject="GPU-1",
        gpu_uuid="GPU-1",
        node="n",
        pool="p",
        model="m",
        owner=owner,
        util_pct=util,
        start_us=minute * MINUTE_US,
        end_us=(minute + 1) * MINUTE_US,
        gpu_ms=60_000,
        cost_micros=100,
    )


def run(observations):
    state, alerts, flags = None, [], []
    for o in observations:
        state, raised, flag = step(state, o, POLICY)
        alerts.extend(raised)
        flags.append(flag)
    return state, alerts, flags


def idle_for(minutes, start=0, util=0, owner=ADA):
    return [obs(m, util, owner) for m in range(start, start + minutes)]


CASES = [
    pytest.param(idle_for(29), [], 0, id="under-the-grace-period-no-alert"),
    pytest.param(idle_for(30), [(AlertKind.DETECTED, 0, 100)], 1, id="thirty-minutes-detects"),
    pytest.param(
        idle_for(40), [(AlertKind.DETECTED, 0, 100)], 11, id="one-alert-while-idle-continues"
    ),
    pytest.param(
        idle_for(20) + [obs(20, 50)] + idle_for(20, 21),
        [],
        0,
        id="busy-minute-restarts-the-episode",
    ),
    pytest.param(
        idle_for(35) + [obs(m, 60) for m in range(35, 40)],
        [(AlertKind.DETECTED, 0, 100), (AlertKind.RESOLVED, 0, 600)],
        6,
        id="five-busy-minutes-resolve",
    ),
    pytest.param(
        idle_for(35) + [obs(m, 60) for m in range(35, 38)] + idle_for(5, 38),
        [(AlertKind.DETECTED, 0, 100)],
        11,
        id="short-busy-stretch-keeps-it-open",
    ),
    pytest.param(
        idle_for(35) + [obs(m, 7) for m in range(35, 45)],
        [(AlertKind.DETECTED, 0, 100)],
        6,
        id="between-thresholds-is-hysteresis",
    ),
    pytest.param(
        idle_for(35) + [obs(35, 0, owner=None)],
        [(AlertKind.DETECTED, 0, 100), (AlertKind.RESOLVED, 0, 600)],
        6,
        id="released-gpu-resolves",
    ),
    pytest.param(
        idle_for(35) + [obs(35, 0, owner=BOB)],
        [(AlertKind.DETECTED, 0, 100), (AlertKind.RESOLVED, 0, 600)],
        6,
        id="new-owner-resolves-and-starts-fresh",
    ),
    pytest.param(idle_for(40, owner=None), [], 0, id="unallocated-is-not-allocated-idle"),
    pytest.param(
        idle_for(40, util=4), [(AlertKind.DETECTED, 0, 100)], 11, id="just-below-threshold-is-idle"
    ),
    pytest.param(idle_for(40, util=5), [], 0, id="at-threshold-is-not-idle"),
]


@pytest.mark.parametrize(("observations", "expected", "flagged"), CASES)
def test_detector(observations, expected, flagged):
    _, alerts, flags = run(observations)
    assert [(a.kind, a.since_us // MINUTE_US, a.waste_micros) for a in alerts] == expected
    assert sum(flags) == flagged


def test_detected_alert_carries_owner_and_since():
    _, alerts, _ = run(idle_for(31))
    alert = alerts[0]
    assert alert.owner == ADA
    assert alert.since_us == 0
    assert alert.at_us == 30 * MINUTE_US
    assert alert.reason is None


def test_resolve_reason():
    _, alerts, _ = run(idle_for(35) + [obs(35, 0, owner=BOB)])
    assert alerts[1].reason is ResolveReason.OWNER_CHANGED


def test_late_samples_are_ignored():
    state, _, _ = run(idle_for(31))
    same, alerts, flag = step(state, obs(10, 90), POLICY)
    assert (same, alerts, flag) == (state, (), False)


def test_alert_ids_are_stable_and_distinct():
    _, first, _ = run(idle_for(35) + [obs(m, 60) for m in range(35, 40)])
    _, again, _ = run(idle_for(35) + [obs(m, 60) for m in range(35, 40)])
    assert [a.id for a in first] == [a.id for a in again]
    assert first[0].id != first[1].id


@pytest.mark.parametrize("minutes", [0, 10, 31, 36], ids=lambda m: f"after-{m}-minutes")
def test_state_round_trips_through_a_row(minutes):
    state, _, _ = run(idle_for(minutes) + [obs(minutes, 60)])
    assert state_from_row(state_to_row(state)) == state
