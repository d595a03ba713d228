"""GPU health on the Platform page: the rollup from inventory records (pure) and the page over a
sealed ledger whose inventory copy holds an unhealthy, a degraded and a cordoned GPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ledger.events import GpuHealth, HealthKind, SampleSource
from ledger.inventory import InventoryGpu, fold_inventory
from ledger.read import rollups
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import write_inventory
from tests.builders import T0_US
from tests.inventory_builders import a_record
from tests.unit.test_dashboard_pages import PLATFORM, _app, _frame, _metric
from tests.unit.test_dashboard_seed import seed_ledger

S = 1_000_000


def xid(uuid: str, code: int, at_s: int) -> GpuHealth:
    return GpuHealth(
        "node-01",
        uuid,
        0,
        HealthKind.XID_ERROR,
        f"XID {code}",
        T0_US + at_s * S,
        SampleSource.NVML,
        code,
    )


def fleet() -> list[InventoryGpu]:
    records = {
        "GPU-0": a_record("GPU-0"),
        "GPU-1": a_record("GPU-1", index=1),
        "GPU-2": a_record("GPU-2", index=2),
        "GPU-9": a_record("GPU-9", node="node-02", pool="a100", model="A100"),
    }
    changed = fold_inventory(
        [xid("GPU-0", 79, 1), xid("GPU-1", 74, 2), xid("GPU-1", 13, 3)], records
    )
    records |= changed
    records["GPU-2"] = replace(
        records["GPU-2"], cordoned=True, cordoned_by="ops", cordon_reason="fan"
    )
    return list(records.values())


def test_health_by_gpu_node_and_recent_faults() -> None:
    health = rollups.health_of(fleet())
    counts = (health.count("healthy"), health.count("degraded"), health.count("unhealthy"))
    assert counts == (2, 1, 1)
    assert (health.cordoned, health.fault_total) == (1, 3)
    node01, node02 = health.nodes
    assert (node01.node, node01.state, node01.unhealthy, node01.degraded, node01.faults) == (
        "node-01",
        "unhealthy",
        1,
        1,
        3,
    )
    assert (node02.state, node02.faults) == ("healthy", 0)
    assert [(f.uuid, f.xid) for f in health.faults] == [("GPU-1", 13), ("GPU-1", 74), ("GPU-0", 79)]
    assert "fallen off the bus" in health.faults[-1].meaning
    assert rollups.health_of(fleet(), pool="a100").gpus[0].uuid == "GPU-9"


@pytest.fixture(scope="module")
def sick_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = seed_ledger(tmp_path_factory.mktemp("health") / "ledger")
    write_inventory(data / SEGMENTS_DIR, fleet())
    return data


def test_the_platform_page_shows_health_faults_and_cordons(
    monkeypatch: pytest.MonkeyPatch, sick_ledger: Path
) -> None:
    app = _app(monkeypatch, sick_ledger, PLATFORM)
    assert (_metric(app, "Unhealthy"), _metric(app, "Degraded"), _metric(app, "Cordoned")) == (
        "1",
        "1",
        "1",
    )
    assert _metric(app, "Faults") == "3"
    faults = _frame(app, "meaning")
    assert list(faults["xid"]) == [13, 74, 79]
    assert "fallen off the bus" in faults["meaning"].iloc[-1]
    gpus = _frame(app, "cordon")
    assert dict(zip(gpus["uuid"], gpus["health"], strict=True)) == {
        "GPU-0": "unhealthy",
        "GPU-1": "degraded",
        "GPU-2": "healthy",
    }
    assert list(_frame(app, "unhealthy")["node"]) == ["node-01", "node-02"]
