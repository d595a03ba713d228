"""GPU health folded into the inventory records: severities, XID meanings, recovery, redelivery,
and the record's health fields on the wire."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ledger.events import GpuHealth, HealthKind, SampleSource, encode_health
from ledger.inventory import (
    GpuHealthState,
    InventoryGpu,
    Severity,
    decode_record,
    encode_record,
    fold_inventory,
    xid_meaning,
)
from ledger.inventory.health import HEALTHY_WINDOW_US
from ledger.inventory.health_events import decode_inventory_message
from tests.builders import T0_US
from tests.inventory_builders import a_gpu, a_record, a_report

S = 1_000_000


def an_event(
    kind: HealthKind, at_s: int = 1, xid: int | None = None, uuid: str = "GPU-0"
) -> GpuHealth:
    return GpuHealth(
        "node-01", uuid, 0, kind, f"{kind.value} {xid}", T0_US + at_s * S, SampleSource.NVML, xid
    )


def xid(code: int, at_s: int = 1) -> GpuHealth:
    return an_event(HealthKind.XID_ERROR, at_s, code)


@dataclass(frozen=True)
class Case:
    events: tuple[object, ...]
    health: GpuHealthState
    faults: int
    reason: str | None = None
    on: str = "GPU-0"  # the GPU the record is of


CASES = {
    "xid-79-fallen-off-the-bus-is-unhealthy": Case(
        (xid(79),), GpuHealthState.UNHEALTHY, 1, "XID 79: GPU has fallen off the bus"
    ),
    "xid-48-double-bit-ecc-is-unhealthy": Case((xid(48),), GpuHealthState.UNHEALTHY, 1),
    "xid-95-uncontained-ecc-is-unhealthy": Case((xid(95),), GpuHealthState.UNHEALTHY, 1),
    "xid-94-contained-ecc-is-degraded": Case((xid(94),), GpuHealthState.DEGRADED, 1),
    "xid-74-nvlink-is-degraded": Case((xid(74),), GpuHealthState.DEGRADED, 1),
    "xid-92-high-sbe-rate-is-degraded": Case((xid(92),), GpuHealthState.DEGRADED, 1),
    "xid-13-application-fault-is-only-recorded": Case((xid(13),), GpuHealthState.HEALTHY, 1),
    "xid-31-43-45-application-faults-recorded": Case(
        (xid(31, 1), xid(43, 2), xid(45, 3)), GpuHealthState.HEALTHY, 3
    ),
    "unknown-xid-is-degraded": Case((xid(999),), GpuHealthState.DEGRADED, 1, "XID 999"),
    "gpu-lost-is-unhealthy": Case((an_event(HealthKind.GPU_LOST),), GpuHealthState.UNHEALTHY, 1),
    "ecc-dbe-is-unhealthy": Case((an_event(HealthKind.ECC_DBE),), GpuHealthState.UNHEALTHY, 1),
    "thermal-throttle-is-degraded": Case(
        (an_event(HealthKind.THERMAL_THROTTLE),), GpuHealthState.DEGRADED, 1
    ),
    "power-throttle-is-degraded": Case(
        (an_event(HealthKind.POWER_THROTTLE),), GpuHealthState.DEGRADED, 1
    ),
    "degraded-then-unhealthy-escalates": Case(
        (xid(74, 1), xid(79, 2)), GpuHealthState.UNHEALTHY, 2, "XID 79: GPU has fallen off the bus"
    ),
    "unhealthy-is-not-lowered-by-a-lesser-fault": Case(
        (xid(79, 1), xid(74, 2)), GpuHealthState.UNHEALTHY, 2
    ),
    "a-resent-fault-counts-once": Case((xid(79, 1), xid(79, 1)), GpuHealthState.UNHEALTHY, 1),
    "an-older-event-after-a-newer-changes-nothing": Case(
        (xid(74, 5), xid(79, 2)), GpuHealthState.DEGRADED, 1
    ),
    "a-report-inside-the-window-does-not-heal": Case(
        (xid(74, 1), a_report(at_us=T0_US + 1 * S + HEALTHY_WINDOW_US - 1)),
        GpuHealthState.DEGRADED,
        1,
    ),
    "a-report-a-window-after-the-last-fault-heals": Case(
        (xid(74, 1), a_report(at_us=T0_US + 1 * S + HEALTHY_WINDOW_US)), GpuHealthState.HEALTHY, 1
    ),
    "a-lost-gpu-is-not-healed-by-reports-alone": Case(
        (an_event(HealthKind.GPU_LOST), a_report(at_us=T0_US + S + HEALTHY_WINDOW_US)),
        GpuHealthState.UNHEALTHY,
        1,
    ),
    "a-lost-gpu-recovered-heals-after-the-window": Case(
        (
            an_event(HealthKind.GPU_LOST, 1),
            an_event(HealthKind.RECOVERED, 2),
            a_report(at_us=T0_US + S + HEALTHY_WINDOW_US),
        ),
        GpuHealthState.HEALTHY,
        1,
    ),
    "a-fault-for-an-unknown-gpu-is-not-kept": Case(
        (xid(79, 1),), GpuHealthState.HEALTHY, 0, on="GPU-9"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_health_folds_into_the_record(case: Case) -> None:
    current = {case.on: a_record(case.on)}
    events = case.events
    changed = fold_inventory(events, current)  # type: ignore[arg-type]
    record = {**current, **changed}[case.on]
    assert (record.health, record.faults) == (case.health, case.faults)
    if case.reason is not None:
        assert record.health_reason == case.reason
    assert set(changed) <= {case.on}
    # folding the same events again over the result changes nothing (redelivery)
    assert fold_inventory(events, {**current, **changed}) == {}  # type: ignore[arg-type]


def test_since_and_recent_faults_follow_the_events() -> None:
    current = {"GPU-0": a_record()}
    events = [xid(74, 1), xid(13, 2), xid(79, 3)]
    record = fold_inventory(events, current)["GPU-0"]
    assert record.health_since_us == T0_US + 1 * S  # the episode began with the XID 74
    assert record.last_fault_us == T0_US + 3 * S
    assert [(f.xid, f.severity) for f in record.recent_faults] == [
        (74, Severity.DEGRADED),
        (13, Severity.RECORDED),
        (79, Severity.UNHEALTHY),
    ]
    healed = fold_inventory([a_report(at_us=T0_US + 3 * S + HEALTHY_WINDOW_US)], {"GPU-0": record})
    assert healed["GPU-0"].health is GpuHealthState.HEALTHY
    assert healed["GPU-0"].health_since_us == T0_US + 3 * S + HEALTHY_WINDOW_US
    assert healed["GPU-0"].faults == 3  # failure counts survive recovery


def test_a_report_keeps_health_and_cordon() -> None:
    record = replace(
        a_record(),
        health=GpuHealthState.UNHEALTHY,
        last_fault_us=T0_US,
        faults=1,
        cordoned=True,
        cordon_reason="bad fan",
        cordoned_by="ops",
    )
    changed = fold_inventory(
        [a_report("node-01", a_gpu(model="H200"), at_us=T0_US + S)], {"GPU-0": record}
    )
    new = changed["GPU-0"]
    assert new.model == "H200" and new.health is GpuHealthState.UNHEALTHY
    assert (new.cordoned, new.cordon_reason, new.cordoned_by) == (True, "bad fan", "ops")


def test_a_record_with_health_round_trips_and_an_old_record_reads_as_healthy() -> None:
    record = fold_inventory([xid(79), xid(13, 2)], {"GPU-0": a_record()})["GPU-0"]
    record = replace(record, cordoned=True, cordon_reason="r", cordoned_by="ops")
    assert decode_record(encode_record(record)) == record
    plain = a_record()
    assert isinstance(decode_record(encode_record(plain)), InventoryGpu)


def test_health_events_and_reports_share_the_topic() -> None:
    health = xid(79)
    from ledger.inventory import encode_report

    for value in (encode_health(health, "nvml://node-01"), encode_report(a_report())):
        envelopes, dead = decode_inventory_message(value)
        assert dead == [] and len(envelopes) == 1
    envelopes, _ = decode_inventory_message(encode_health(health, "nvml://node-01"))
    assert envelopes[0].data == health
    bad = encode_health(replace(health, time_us=-1), "nvml://node-01")
    assert decode_inventory_message(bad)[1][0].reason.startswith("time_us")


@pytest.mark.parametrize(
    ("code", "words"),
    [(79, "fallen off the bus"), (48, "double-bit"), (95, "uncontained"), (7, "XID 7")],
    ids=["79", "48", "95", "unknown"],
)
def test_xid_meanings(code: int, words: str) -> None:
    assert words in xid_meaning(code)
