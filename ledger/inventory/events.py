"""Inventory reports: what a collector says one node holds, and the `INVENTORY` family's codec.

A collector sends one `InventoryReport` per node when it starts, every few sampling rounds and
whenever what it sees changes: the node's name, pool and labels, driver and CUDA versions where
its source gives them, its sampling interval, and every GPU it sees (UUID, index, model,
memory, MIG mode and MIG instances with their profiles). Reports travel on the
`inventory-reports` topic keyed by node, in the generic envelope (`ledger.envelope`): subject
the node, time the report's time, id derived from (source, node, time).

Schemas of `tally.inventory.report` data:
- v1 (current): the fields `report_to_dict` writes. No older version exists. A GPU's
  `topology` (`ledger.topology`) is written only when known: a report without it is the same v1
  it always was.

Invariants: frozen, slotted dataclasses holding tuples; labels are sorted (key, value) pairs;
integers are integers (a float, bool or string where one belongs is a decode error); decoding
never raises on bad input except as `EventError` (the envelope makes that a dead letter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from ledger.envelope import REGISTRY, DeadLetter, Envelope, Family, decode, event_id, family_to_dict
from ledger.errors import EventError
from ledger.events import MAX_TIME_US, MigInstance, SampleSource
from ledger.mig_devices import mig_uuid
from ledger.topology import NO_TOPOLOGY, GpuTopology, topology_of, topology_to_dict

MAX_TEXT = 256
MAX_LABELS = 64
MAX_GPUS = 64
MAX_MIG = 64
MAX_INTERVAL_US = 3_600_000_000


class InventoryType(StrEnum):
    REPORT = "tally.inventory.report"


@dataclass(frozen=True, slots=True)
class ReportedGpu:
    """One GPU as a collector sees it. `mig` lists its MIG instances (empty without MIG);
    `topology`: where it sits (labels over what NVML discovered)."""

    uuid: str
    index: int
    model: str
    memory_total_bytes: int
    mig_mode: bool = False
    mig: tuple[MigInstance, ...] = ()
    topology: GpuTopology = NO_TOPOLOGY


@dataclass(frozen=True, slots=True)
class InventoryReport:
    """What one collector sees on one node at `time_us`; `interval_us` is its sampling interval
    in wall-clock time (what staleness counts in)."""

    node: str
    pool: str
    source: SampleSource
    time_us: int
    interval_us: int
    gpus: tuple[ReportedGpu, ...]
    labels: tuple[tuple[str, str], ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None


InventoryEnvelope = Envelope[InventoryReport]
REPORT_SCHEMA = 1


def report_source(report: InventoryReport) -> str:
    """The envelope source of a report: `nvml://node`, `dcgm://node`, `sim://node`."""
    return f"{report.source.value}://{report.node}"


def wrap_report(report: InventoryReport, source: str) -> InventoryEnvelope:
    return Envelope(
        id=event_id(source, report.node, report.time_us),
        type=InventoryType.REPORT,
        source=source,
        subject=report.node,
        time_us=report.time_us,
        schema=REPORT_SCHEMA,
        data=report,
    )


def mig_to_dict(mig: MigInstance) -> dict[str, Any]:
    return {
        "gi": mig.gpu_instance_id,
        "ci": mig.compute_instance_id,
        "profile": mig.profile,
        "slices": mig.slices,
        "total_slices": mig.total_slices,
        **({} if mig.uuid is None else {"uuid": mig.uuid}),
    }


def report_to_dict(report: InventoryReport) -> dict[str, Any]:
    return {
        "node": report.node,
        "pool": report.pool,
        "labels": dict(report.labels),
        "source": report.source.value,
        "time_us": report.time_us,
        "interval_us": report.interval_us,
        "driver_version": report.driver_version,
        "cuda_version": report.cuda_version,
        "gpus": [_gpu_to_dict(g) for g in report.gpus],
    }


def _gpu_to_dict(gpu: ReportedGpu) -> dict[str, Any]:
    data = {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "memory_total_bytes": gpu.memory_total_bytes,
        "mig_mode": gpu.mig_mode,
        "mig": [mig_to_dict(m) for m in gpu.mig],
    }
    if gpu.topology.known:
        data["topology"] = topology_to_dict(gpu.topology)
    return data


# ---------------------------------------------------------------------------- decoding


def integer(data: Mapping[str, Any], key: str, lo: int = 0, hi: int | None = None) -> int:
    value = data.get(key)
    if type(value) is not int:
        raise EventError(f"{key}: expected an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        raise EventError(f"{key}: {value} is out of range")
    return value


def text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if type(value) is not str or not value or len(value) > MAX_TEXT:
        raise EventError(f"{key}: expected a non-empty string of at most {MAX_TEXT} characters")
    return value


def optional_text(data: Mapping[str, Any], key: str) -> str | None:
    return None if data.get(key) in (None, "") else text(data, key)


def labels_of(data: Any) -> tuple[tuple[str, str], ...]:
    if data is None:
        return ()
    if type(data) is not dict or len(data) > MAX_LABELS:
        raise EventError(f"labels: expected an object of at most {MAX_LABELS} labels")
    for key, value in data.items():
        if not key or len(key) > MAX_TEXT or type(value) is not str or len(value) > MAX_TEXT:
            raise EventError(f"labels: {str(key)[:64]!r}: expected a string of at most 256")
    return tuple(sorted(data.items()))


def mig_of(data: Any) -> MigInstance:
    if type(data) is not dict:
        raise EventError("mig: each instance must be an object")
    total = integer(data, "total_slices", 1, 64)
    return MigInstance(
        gpu_instance_id=integer(data, "gi"),
        compute_instance_id=integer(data, "ci"),
        profile=text(data, "profile"),
        slices=integer(data, "slices", 1, total),
        total_slices=total,
        uuid=mig_uuid(data.get("uuid")),
    )


def _gpu(data: Any) -> ReportedGpu:
    if type(data) is not dict:
        raise EventError("gpus: each GPU must be an object")
    mig = data.get("mig") or []
    if type(mig) is not list or len(mig) > MAX_MIG:
        raise EventError(f"mig: expected a list of at most {MAX_MIG} instances")
    mode = data.get("mig_mode", False)
    if type(mode) is not bool:
        raise EventError("mig_mode: expected true or false")
    return ReportedGpu(
        uuid=text(data, "uuid"),
        index=integer(data, "index", 0, 1023),
        model=text(data, "model"),
        memory_total_bytes=integer(data, "memory_total_bytes", 0, 1 << 50),
        mig_mode=mode,
        mig=tuple(mig_of(m) for m in mig),
        topology=topology_of(data.get("topology")),
    )


_SOURCES: dict[Any, SampleSource] = {s.value: s for s in SampleSource}


def report_from_dict(kind: Any, data: Any) -> InventoryReport:
    """Decode and validate v1 report data; raises EventError."""
    del kind
    if type(data) is not dict:
        raise EventError("data: expected an object")
    source = _SOURCES.get(data.get("source"))
    if source is None:
        raise EventError(f"source: expected one of {sorted(_SOURCES)}")
    gpus = data.get("gpus")
    if type(gpus) is not list or len(gpus) > MAX_GPUS:
        raise EventError(f"gpus: expected a list of at most {MAX_GPUS} GPUs")
    decoded = tuple(_gpu(g) for g in gpus)
    if len({g.uuid for g in decoded}) != len(decoded):
        raise EventError("gpus: a GPU UUID appears twice")
    return InventoryReport(
        node=text(data, "node"),
        pool=text(data, "pool"),
        source=source,
        time_us=integer(data, "time_us", 0, MAX_TIME_US),
        interval_us=integer(data, "interval_us", 1, MAX_INTERVAL_US),
        gpus=decoded,
        labels=labels_of(data.get("labels")),
        driver_version=optional_text(data, "driver_version"),
        cuda_version=optional_text(data, "cuda_version"),
    )


INVENTORY: Family[InventoryReport] = Family(
    name="inventory",
    kinds={InventoryType.REPORT.value: InventoryType.REPORT},
    to_data=report_to_dict,
    from_data=report_from_dict,
    wrap=wrap_report,
    schema=REPORT_SCHEMA,
    label="inventory event type",
    subject_is="node",
    time_is="time_us",
)
REGISTRY.add(INVENTORY, {})


def encode_report(report: InventoryReport) -> bytes:
    """One message value holding one report in its envelope."""
    return orjson.dumps(family_to_dict(INVENTORY, wrap_report(report, report_source(report))))


def decode_report_message(
    value: bytes | None,
) -> tuple[list[InventoryEnvelope], list[DeadLetter]]:
    """Decode one message value into reports and dead letters. Never raises on bad input."""
    return decode(value, INVENTORY)
