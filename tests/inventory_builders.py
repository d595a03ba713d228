"""Builders for inventory tests (no tests here): reported GPUs, node reports and inventory
records with readable defaults (a default record is what a default report makes of its GPU)."""

from __future__ import annotations

from typing import Any

from ledger.events import MigInstance, SampleSource
from ledger.inventory import InventoryGpu, InventoryReport, ReportedGpu
from tests.builders import INTERVAL_US, T0_US

GIB = 1 << 30


def a_gpu(uuid: str = "GPU-0", index: int = 0, **overrides: Any) -> ReportedGpu:
    fields: dict[str, Any] = {"model": "H100", "memory_total_bytes": 80 * GIB}
    fields.update(overrides)
    return ReportedGpu(uuid, index, **fields)


def a_report(
    node: str = "node-01", *gpus: ReportedGpu, at_us: int = T0_US, **overrides: Any
) -> InventoryReport:
    fields: dict[str, Any] = {
        "pool": "h100",
        "source": SampleSource.NVML,
        "interval_us": INTERVAL_US,
        "labels": (("rack", "r1"),),
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
    }
    fields.update(overrides)
    return InventoryReport(node=node, time_us=at_us, gpus=gpus or (a_gpu(),), **fields)


def a_record(uuid: str = "GPU-0", **overrides: Any) -> InventoryGpu:
    fields: dict[str, Any] = {
        "node": "node-01",
        "index": 0,
        "model": "H100",
        "memory_total_bytes": 80 * GIB,
        "pool": "h100",
        "source": SampleSource.NVML,
        "interval_us": INTERVAL_US,
        "first_seen_us": T0_US,
        "last_seen_us": T0_US,
        "labels": (("rack", "r1"),),
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
    }
    fields.update(overrides)
    return InventoryGpu(uuid=uuid, **fields)


def a_mig_slice(gi: int = 1, profile: str = "3g.40gb", slices: int = 3) -> MigInstance:
    return MigInstance(gi, 0, profile, slices)
