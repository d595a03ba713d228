"""GPU health alerts: what the inventory's health fold raises and resolves (pure), their
encoding, and their delivery to a real Slack-style and Alertmanager webhook on 127.0.0.1 with
the XID's meaning, deduplicated, resolved with the same labels."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ledger.fleet_alerts import FleetKind, HealthAlert, decode_any_alert, encode_fleet_alert
from ledger.inventory import GpuHealthState, InventoryGpu
from ledger.inventory.alerts import health_alerts
from streams.alerts.dispatcher import AlertDispatcher
from streams.alerts.settings import SinkKind
from tests.builders import T0_US
from tests.inventory_builders import a_record
from tests.unit.test_alerting import Receiver, _sink, receiver  # noqa: F401 (a fixture)

S = 1_000_000
FALLEN = "XID 79: GPU has fallen off the bus"


def state(health: GpuHealthState, since_s: int = 1, reason: str | None = FALLEN) -> InventoryGpu:
    return replace(
        a_record(),
        health=health,
        health_since_us=T0_US + since_s * S,
        health_reason=reason,
        faults=1,
    )


HEALTHY = a_record()
DEGRADED = state(GpuHealthState.DEGRADED, reason="XID 74: NVLink error")
UNHEALTHY = state(GpuHealthState.UNHEALTHY)


@dataclass(frozen=True)
class Case:
    before: InventoryGpu | None
    after: InventoryGpu
    raised: tuple[tuple[FleetKind, str], ...]


CASES = {
    "healthy-to-unhealthy-raises": Case(HEALTHY, UNHEALTHY, ((FleetKind.GPU_HEALTH, "unhealthy"),)),
    "healthy-to-degraded-raises": Case(HEALTHY, DEGRADED, ((FleetKind.GPU_HEALTH, "degraded"),)),
    "degraded-to-unhealthy-raises-again": Case(
        DEGRADED, UNHEALTHY, ((FleetKind.GPU_HEALTH, "unhealthy"),)
    ),
    "unhealthy-to-healthy-resolves": Case(
        UNHEALTHY,
        replace(HEALTHY, health_since_us=T0_US + 900 * S),
        ((FleetKind.GPU_HEALTH_RESOLVED, "healthy"),),
    ),
    "another-fault-of-the-same-state-raises-nothing": Case(
        UNHEALTHY, replace(UNHEALTHY, faults=2), ()
    ),
    "a-report-of-a-healthy-gpu-raises-nothing": Case(
        HEALTHY, replace(HEALTHY, last_seen_us=T0_US + S), ()
    ),
    "a-new-gpu-already-unhealthy-raises": Case(
        None, UNHEALTHY, ((FleetKind.GPU_HEALTH, "unhealthy"),)
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_health_changes_raise_and_resolve(case: Case) -> None:
    before = {} if case.before is None else {"GPU-0": case.before}
    alerts = health_alerts(before, {"GPU-0": case.after})
    assert tuple((a.kind, a.state) for a in alerts) == case.raised
    for alert in alerts:
        assert decode_any_alert(encode_fleet_alert(alert)) == alert


def test_an_episode_keeps_its_start_and_each_state_is_its_own_alert() -> None:
    (degraded,) = health_alerts({"GPU-0": HEALTHY}, {"GPU-0": DEGRADED})
    (unhealthy,) = health_alerts({"GPU-0": DEGRADED}, {"GPU-0": UNHEALTHY})
    healed = replace(HEALTHY, health_since_us=T0_US + 900 * S)
    (resolved,) = health_alerts({"GPU-0": UNHEALTHY}, {"GPU-0": healed})
    assert degraded.episode == unhealthy.episode == resolved.episode
    assert len({degraded.id, unhealthy.id, resolved.id}) == 3
    assert (resolved.since_us, resolved.at_us) == (T0_US + S, T0_US + 900 * S)
    assert health_alerts({"GPU-0": HEALTHY}, {"GPU-0": DEGRADED})[0].id == degraded.id


def _raised() -> tuple[HealthAlert, HealthAlert]:
    (fired,) = health_alerts({"GPU-0": HEALTHY}, {"GPU-0": UNHEALTHY})
    (ended,) = health_alerts(
        {"GPU-0": UNHEALTHY}, {"GPU-0": replace(HEALTHY, health_since_us=T0_US + 900 * S)}
    )
    return fired, ended


def test_slack_gets_the_xid_meaning_once_and_the_resolution(receiver: Receiver, tmp_path) -> None:  # noqa: F811
    fired, ended = _raised()
    dispatcher = AlertDispatcher([_sink(receiver.url)], tmp_path).start()
    try:
        dispatcher.submit([fired])
        dispatcher.submit([fired])  # redelivered: sent once
        receiver.wait_for(1)
        dispatcher.submit([ended])
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    texts = [body["text"] for _, body in receiver.posts]
    assert len(texts) == 2
    assert "GPU GPU-0 on node-01" in texts[0] and "fallen off the bus" in texts[0]
    assert "no new jobs go there" in texts[0]
    assert "healthy again" in texts[1]


def test_alertmanager_resolves_the_same_alert(receiver: Receiver, tmp_path) -> None:  # noqa: F811
    fired, ended = _raised()
    sink = _sink(receiver.url, SinkKind.ALERTMANAGER)
    dispatcher = AlertDispatcher([sink], tmp_path).start()
    try:
        dispatcher.submit([fired])
        receiver.wait_for(1)
        dispatcher.submit([ended])
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    ((_, (firing,)), (_, (resolving,))) = receiver.posts
    assert firing["labels"] == resolving["labels"]
    assert firing["labels"]["alertname"] == "TallyGpuHealth"
    assert firing["labels"]["gpu_uuid"] == "GPU-0"
    assert firing["annotations"]["reason"] == FALLEN
    assert "endsAt" in resolving and "endsAt" not in firing
