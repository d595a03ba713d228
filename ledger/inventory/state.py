"""The inventory: every GPU the collectors have reported, folded from their reports; whether a
GPU is stale; and its record on the compacted `inventory` topic.

- `fold_reports(reports, current)` (pure) returns the GPU records the reports change. A report
  newer than a GPU's record replaces what the record says of the GPU and its node (node, index,
  model, memory, MIG, pool, labels, versions, interval, topology) and moves `last_seen_us`; an
  older one (a resend, a spool replayed late) can only move `first_seen_us` back. Folding the
  same reports again changes nothing, so redelivery needs no dedupe set. A GPU missing from its
  node's newest report keeps its record: it is simply not seen any more, and goes stale.
- `status_of(last_seen, interval, now, stale_after_intervals)` (pure): a GPU silent for more
  than `stale_after_intervals` sampling intervals is `stale`; it is `live` again as soon as a
  report names it.
- On the `inventory` topic (keyed by GPU UUID) each record travels as a `tally.inventory.gpu`
  envelope (`encode_record` / `decode_record`); its id is a digest of the record, so a record
  published again unchanged is the same message.

Cordons (admin events, `ledger.ingest.admin`) set `cordoned`, `cordoned_by` and
`cordon_reason` of the GPUs they name (`cordon_records`); a node's standing cordon also covers
GPUs it reports later (`fold_inventory(cordons=…)`).

Health events travel on the same `inventory-reports` topic (`ledger.inventory.health_events`)
and fold into the same records (`ledger.inventory.health`); `fold_inventory` folds a batch of
both in order. A report keeps the record's health and cordon; a report a healthy window after
the last fault heals it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any

import orjson

from ledger.envelope import Envelope, encode_data
from ledger.errors import EventError
from ledger.events import MAX_TIME_US, GpuHealth, HealthKind, SampleSource
from ledger.inventory.events import (
    MAX_INTERVAL_US,
    InventoryReport,
    ReportedGpu,
    integer,
    labels_of,
    mig_of,
    mig_to_dict,
    optional_text,
    text,
)
from ledger.inventory.gpu import Fault, GpuHealthState, InventoryGpu, Severity
from ledger.inventory.health import HEALTHY_WINDOW_US, fold_health, heal
from ledger.topology import topology_of, topology_to_dict

RECORD_TYPE = "tally.inventory.gpu"
RECORD_SCHEMA = 1
INVENTORY_SOURCE = "tally://inventory"


class GpuStatus(StrEnum):
    LIVE = "live"
    STALE = "stale"


class _RecordType(StrEnum):
    GPU = RECORD_TYPE


def fold_reports(
    reports: Sequence[InventoryReport], current: Mapping[str, InventoryGpu]
) -> dict[str, InventoryGpu]:
    """The records `reports` change (by GPU UUID), folded in order over `current`."""
    return fold_inventory(reports, current)


Cordon = tuple[str, str]  # (actor, reason) of a standing cordon


def fold_inventory(
    events: Sequence[InventoryReport | GpuHealth],
    current: Mapping[str, InventoryGpu],
    window_us: int = HEALTHY_WINDOW_US,
    cordons: Mapping[str, Cordon] | None = None,
) -> dict[str, InventoryGpu]:
    """The records a batch of reports and health events changes (by GPU UUID), folded in
    order over `current`. A GPU reported for the first time is cordoned when `cordons` (the
    standing cordons, by GPU UUID or node) names it or its node."""
    changed: dict[str, InventoryGpu] = {}
    for event in events:
        if isinstance(event, GpuHealth):
            changed.update(fold_health([event], {**current, **changed}))
        else:
            for gpu in event.gpus:
                old = changed.get(gpu.uuid) or current.get(gpu.uuid)
                new = _reported(event, gpu, old, window_us)
                standing = (cordons or {}).get(gpu.uuid) or (cordons or {}).get(event.node)
                if old is None and standing is not None:
                    new = replace(new, cordoned=True, cordoned_by=standing[0])
                    new = replace(new, cordon_reason=standing[1])
                if new != old:
                    changed[gpu.uuid] = new
    return {u: r for u, r in changed.items() if r != current.get(u)}


def cordon_records(
    current: Mapping[str, InventoryGpu], target: str, cordon: Cordon | None
) -> dict[str, InventoryGpu]:
    """The records a cordon (`cordon` = (actor, reason)) or an uncordon (`None`) of `target` —
    a GPU UUID or a node — changes."""
    changed = {}
    for uuid, gpu in current.items():
        if target not in (uuid, gpu.node):
            continue
        if cordon is None:
            new = replace(gpu, cordoned=False, cordoned_by=None, cordon_reason=None)
        else:
            new = replace(gpu, cordoned=True, cordoned_by=cordon[0], cordon_reason=cordon[1])
        if new != gpu:
            changed[uuid] = new
    return changed


def _reported(
    report: InventoryReport, gpu: ReportedGpu, old: InventoryGpu | None, window_us: int
) -> InventoryGpu:
    if old is not None and report.time_us < old.last_seen_us:
        if report.time_us < old.first_seen_us:
            return replace(old, first_seen_us=report.time_us)
        return old
    seen = {
        "node": report.node,
        "index": gpu.index,
        "model": gpu.model,
        "memory_total_bytes": gpu.memory_total_bytes,
        "pool": report.pool,
        "source": report.source,
        "interval_us": report.interval_us,
        "last_seen_us": report.time_us,
        "mig_mode": gpu.mig_mode,
        "mig": gpu.mig,
        "labels": report.labels,
        "driver_version": report.driver_version,
        "cuda_version": report.cuda_version,
        "topology": gpu.topology,
    }
    if old is None:
        return InventoryGpu(uuid=gpu.uuid, first_seen_us=report.time_us, **seen)  # type: ignore[arg-type]
    return heal(replace(old, **seen), report.time_us, window_us)  # type: ignore[arg-type]


def status_of(
    last_seen_us: int, interval_us: int, now_us: int, stale_after_intervals: int
) -> GpuStatus:
    """`stale` when nothing was heard for more than `stale_after_intervals` intervals."""
    if now_us - last_seen_us > stale_after_intervals * interval_us:
        return GpuStatus.STALE
    return GpuStatus.LIVE


# ---------------------------------------------------------------------------- the record


def record_to_dict(gpu: InventoryGpu) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "node": gpu.node,
        "index": gpu.index,
        "model": gpu.model,
        "memory_total_bytes": gpu.memory_total_bytes,
        "pool": gpu.pool,
        "source": gpu.source.value,
        "interval_us": gpu.interval_us,
        "first_seen_us": gpu.first_seen_us,
        "last_seen_us": gpu.last_seen_us,
        "mig_mode": gpu.mig_mode,
        "mig": [mig_to_dict(m) for m in gpu.mig],
        "labels": dict(gpu.labels),
        "driver_version": gpu.driver_version,
        "cuda_version": gpu.cuda_version,
        **({"topology": topology_to_dict(gpu.topology)} if gpu.topology.known else {}),
        "health": gpu.health.value,
        "health_reason": gpu.health_reason,
        "health_since_us": gpu.health_since_us,
        "health_event_us": gpu.health_event_us,
        "last_fault_us": gpu.last_fault_us,
        "lost": gpu.lost,
        "faults": gpu.faults,
        "recent_faults": [fault_to_dict(f) for f in gpu.recent_faults],
        "cordoned": gpu.cordoned,
        "cordon_reason": gpu.cordon_reason,
        "cordoned_by": gpu.cordoned_by,
    }


def fault_to_dict(fault: Fault) -> dict[str, Any]:
    return {
        "time_us": fault.time_us,
        "kind": fault.kind.value,
        "meaning": fault.meaning,
        "severity": fault.severity.value,
        "xid": fault.xid,
    }


_KINDS: dict[Any, HealthKind] = {k.value: k for k in HealthKind}
_SEVERITIES: dict[Any, Severity] = {s.value: s for s in Severity}


def fault_of(data: Any) -> Fault:
    if type(data) is not dict:
        raise EventError("recent_faults: each fault must be an object")
    kind, severity = _KINDS.get(data.get("kind")), _SEVERITIES.get(data.get("severity"))
    if kind is None or severity is None:
        raise EventError("recent_faults: bad kind or severity")
    xid = data.get("xid")
    return Fault(
        time_us=integer(data, "time_us", 0, MAX_TIME_US),
        kind=kind,
        meaning=text(data, "meaning"),
        severity=severity,
        xid=None if xid is None else integer(data, "xid", 0, 1 << 31),
    )


def _optional_time(data: Mapping[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else integer(data, key, 0, MAX_TIME_US)


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if type(value) is not bool:
        raise EventError(f"{key}: expected true or false")
    return value


_SOURCES: dict[Any, SampleSource] = {s.value: s for s in SampleSource}
_HEALTH: dict[Any, GpuHealthState] = {h.value: h for h in GpuHealthState}


def record_from_dict(data: Any) -> InventoryGpu:
    """Decode a record's JSON object; raises EventError."""
    if type(data) is not dict:
        raise EventError("inventory record: expected an object")
    source = _SOURCES.get(data.get("source"))
    health = _HEALTH.get(data.get("health"))
    mig = data.get("mig") or []
    faults = data.get("recent_faults") or []
    if source is None or health is None or type(mig) is not list or type(faults) is not list:
        raise EventError("inventory record: bad source, health or mig")
    mode = data.get("mig_mode")
    if type(mode) is not bool:
        raise EventError("mig_mode: expected true or false")
    return InventoryGpu(
        uuid=text(data, "uuid"),
        node=text(data, "node"),
        index=integer(data, "index", 0, 1023),
        model=text(data, "model"),
        memory_total_bytes=integer(data, "memory_total_bytes", 0, 1 << 50),
        pool=text(data, "pool"),
        source=source,
        interval_us=integer(data, "interval_us", 1, MAX_INTERVAL_US),
        first_seen_us=integer(data, "first_seen_us", 0, MAX_TIME_US),
        last_seen_us=integer(data, "last_seen_us", 0, MAX_TIME_US),
        mig_mode=mode,
        mig=tuple(mig_of(m) for m in mig),
        labels=labels_of(data.get("labels")),
        driver_version=optional_text(data, "driver_version"),
        cuda_version=optional_text(data, "cuda_version"),
        topology=topology_of(data.get("topology")),
        health=health,
        health_reason=optional_text(data, "health_reason"),
        health_since_us=_optional_time(data, "health_since_us"),
        health_event_us=_optional_time(data, "health_event_us"),
        last_fault_us=_optional_time(data, "last_fault_us"),
        lost=_flag(data, "lost"),
        faults=integer(data, "faults", 0) if "faults" in data else 0,
        recent_faults=tuple(fault_of(f) for f in faults),
        cordoned=_flag(data, "cordoned"),
        cordon_reason=optional_text(data, "cordon_reason"),
        cordoned_by=optional_text(data, "cordoned_by"),
    )


def record_json(gpu: InventoryGpu) -> str:
    """The record as JSON text (what the stores keep)."""
    return orjson.dumps(record_to_dict(gpu)).decode()


def record_from_json(value: str | bytes) -> InventoryGpu:
    return record_from_dict(orjson.loads(value))


def record_id(gpu: InventoryGpu) -> str:
    """The message id of a record: a digest of its content."""
    return hashlib.blake2b(record_json(gpu).encode(), digest_size=16).hexdigest()


def encode_record(gpu: InventoryGpu) -> bytes:
    """The `inventory` topic's message value for one GPU."""
    return encode_data(
        Envelope(
            id=record_id(gpu),
            type=_RecordType.GPU,
            source=INVENTORY_SOURCE,
            subject=gpu.uuid,
            time_us=gpu.last_seen_us,
            schema=RECORD_SCHEMA,
            data=record_to_dict(gpu),
        )
    )


def decode_record(value: bytes) -> InventoryGpu:
    """A record read back from the `inventory` topic; raises EventError."""
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"inventory record: not JSON: {exc}") from exc
    if type(obj) is not dict or obj.get("type") != RECORD_TYPE:
        raise EventError("inventory record: not a tally.inventory.gpu envelope")
    if obj.get("schema") != RECORD_SCHEMA:
        raise EventError(f"inventory record: schema {obj.get('schema')!r} is not read here")
    gpu = record_from_dict(obj.get("data"))
    if obj.get("subject") != gpu.uuid:
        raise EventError("inventory record: subject is not the GPU's UUID")
    return gpu
