"""Every event family through the one codec and schema registry: v1 round trips, the v0 → v1
upcaster of each family that had a v0 (inventory reports, GPU health and the admin topic's
`ShardsSealedThrough` began at v1), and versions no upcaster leads from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from ledger.admin import (
    ADMIN,
    V0_REASON,
    AdminKind,
    BudgetGranted,
    JobUsage,
    ShardsSealedThrough,
    TeamUsage,
    admin_envelope,
)
from ledger.envelope import (
    REGISTRY,
    Envelope,
    Family,
    decode,
    decode_envelope,
    encode,
    encode_many,
    to_dict,
)
from ledger.errors import UnknownSchemaError
from ledger.events import SAMPLES, EventType, GpuHealth, HealthKind, SampleSource, envelope_for
from ledger.holds import HOLDS, HoldPlaced, HoldReleased, hold_envelope
from ledger.inventory import INVENTORY, InventoryReport, InventoryType, ReportedGpu, wrap_report
from ledger.inventory.health_events import HEALTH, wrap_health
from ledger.job_events import JOBS, GpuAssigned, JobSpec, JobSubmitted, job_envelope
from ledger.units import Unit
from tests.builders import T0_US, a_sample


@dataclass(frozen=True)
class Case:
    """A family, one of its current (v1) envelopes, and the v0 message an older producer wrote
    for the same event."""

    family: Family[Any]
    v1: Envelope[Any]
    v0: dict[str, Any] | None  # None: the family began at v1


def _v0(v1: Envelope[Any], data: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    """The v1 envelope's attributes around v0 `data` (schema versions the data only)."""
    return {**to_dict(v1), "schema": 0, "data": data, "id": id or v1.id}


def _sample_case() -> Case:
    v1 = envelope_for(a_sample(power_mw=350_000), "sim://node-01")
    data = to_dict(v1)["data"]
    data["gpu"] = data.pop("gpu_uuid")
    data["power_w"] = data.pop("power_mw") // 1000  # 350 W
    return Case(SAMPLES, v1, _v0(v1, data))


def _admin_case() -> Case:
    grant = BudgetGranted("vision", "2026-11", Unit.MONEY, 5_000_000, "ada", V0_REASON, T0_US)
    v1 = admin_envelope(grant)
    data = {
        "team": "vision",
        "period": "2026-11",
        "unit": "money_micros",
        "amount": 5_000_000,
        "by": "ada",
        "effective_us": T0_US,
        "expected_total": None,
    }
    return Case(ADMIN, v1, _v0(v1, data, id="id-the-v0-producer-hashed"))


def _sealed_case() -> Case:
    sealed = ShardsSealedThrough(
        T0_US,
        ("samples-0", "samples-1"),
        (JobUsage("job-1", Unit.MONEY, 90_000), JobUsage("job-1", Unit.GPU_MS, 36_000)),
        (TeamUsage("vision", Unit.MONEY, "2026-11", -5),),
        "tally-ledger",
        "sealed",
        T0_US,
    )
    return Case(ADMIN, admin_envelope(sealed), None)


def _hold_case() -> Case:
    placed = HoldPlaced("job-1", "vision", "detection", Unit.MONEY, 90_000, T0_US + 60, T0_US)
    v1 = hold_envelope(placed)
    data = {
        "job_id": "job-1",
        "team": "vision",
        "project": "detection",
        "amount_micros": 90_000,
        "expires_us": T0_US + 60,
        "time_us": T0_US,
    }
    return Case(HOLDS, v1, _v0(v1, data, id="id-the-v0-producer-hashed"))


def _hold_released_case() -> Case:
    v1 = hold_envelope(HoldReleased("job-1", T0_US))
    return Case(HOLDS, v1, _v0(v1, {"job_id": "job-1", "time_us": T0_US}))


def _job_case() -> Case:
    assigned = GpuAssigned(
        "GPU-1", "node-01", "h100", "H100", "job-1", "vision", "detection", "ada", T0_US + 5_000
    )
    v1 = job_envelope(assigned, "tally://scheduler")
    data = orjson.loads(orjson.dumps(assigned))
    data["time_ms"] = data.pop("time_us") // 1000
    return Case(JOBS, v1, _v0(v1, data, id="id-the-v0-producer-hashed"))


def _job_submitted_case() -> Case:
    spec = JobSpec("job-1", "vision", "detection", "ada", "default", 8, T0_US, 3_600_000_000)
    v1 = job_envelope(JobSubmitted(spec, T0_US + 7_000), "tally://scheduler")
    data = orjson.loads(orjson.dumps(v1.data))
    data["time_ms"] = data.pop("time_us") // 1000
    return Case(JOBS, v1, _v0(v1, data))


def _inventory_case() -> Case:
    gpu = ReportedGpu("GPU-1", 0, "H100", 80 << 30)
    report = InventoryReport("node-01", "h100", SampleSource.NVML, T0_US, 10_000_000, (gpu,))
    return Case(INVENTORY, wrap_report(report, "nvml://node-01"), None)


def _health_case() -> Case:
    health = GpuHealth(
        "node-01", "GPU-1", 0, HealthKind.XID_ERROR, "XID 79", T0_US, SampleSource.NVML, 79
    )
    return Case(HEALTH, wrap_health(health, "nvml://node-01"), None)


CASES = [
    pytest.param(_sample_case(), id="samples"),
    pytest.param(_health_case(), id="gpu-health"),
    pytest.param(_admin_case(), id="admin-budget-granted"),
    pytest.param(_sealed_case(), id="admin-shards-sealed-through"),
    pytest.param(_hold_case(), id="holds-placed"),
    pytest.param(_hold_released_case(), id="holds-released"),
    pytest.param(_job_case(), id="jobs-gpu-assigned"),
    pytest.param(_job_submitted_case(), id="jobs-submitted"),
    pytest.param(_inventory_case(), id="inventory-report"),
]
V0_CASES = [p for p in CASES if p.values[0].v0 is not None]
BEGAN_AT_V1 = {InventoryType.REPORT, EventType.GPU_HEALTH, AdminKind.SHARDS_SEALED_THROUGH}


@pytest.mark.parametrize("case", CASES)
def test_v1_round_trips(case: Case) -> None:
    assert case.v1.schema == 1
    assert decode(encode(case.v1), case.family) == ([case.v1], [])
    assert decode(encode_many([case.v1, case.v1]), case.family) == ([case.v1, case.v1], [])


@pytest.mark.parametrize("case", V0_CASES)
def test_v0_is_upcast_to_the_v1_envelope(case: Case) -> None:
    envelopes, dead = decode(orjson.dumps(case.v0), case.family)
    assert dead == []
    assert envelopes == [case.v1]  # current schema, and the id the v1 form derives


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        pytest.param(2, "is newer than this build reads (1)", id="newer"),
        pytest.param(-1, "no upcaster from", id="older-than-v0"),
    ],
)
def test_an_unknown_version_is_a_dead_letter(case: Case, schema: int, reason: str) -> None:
    message = {**orjson.loads(encode(case.v1)), "schema": schema}
    envelopes, dead = decode(orjson.dumps(message), case.family)
    assert envelopes == []
    assert [(d.event_id, reason in d.reason) for d in dead] == [(case.v1.id, True)]
    with pytest.raises(UnknownSchemaError, match=f"schema {schema}"):
        decode_envelope(message, case.family)


@pytest.mark.parametrize("case", CASES)
def test_a_family_refuses_another_familys_type(case: Case) -> None:
    message = {**orjson.loads(encode(case.v1)), "type": "tally.other.thing"}
    with pytest.raises(UnknownSchemaError, match=r"unknown .*event type 'tally\.other\.thing'"):
        decode_envelope(message, case.family)


def test_every_registered_family_and_type_has_a_case_and_a_v0_upcaster() -> None:
    families = {f.name for f in REGISTRY.families.values()}
    assert families == {p.values[0].family.name for p in CASES}
    assert {t for t, v in REGISTRY.upcasters if v == 0} == set(REGISTRY.current) - BEGAN_AT_V1
