"""Health events on the `inventory-reports` topic: the `HEALTH` family (type `tally.gpu.health`,
`ledger.events.encode_health` writes it) and the topic's decoder, which reads both families.

Collectors publish a GPU's health events (XID, lost, recovered, ECC, retired pages, throttling)
on the same topic as their node's inventory reports, keyed by node, so one worker agent folds
both, in order, into the inventory records, exactly once (the records and the consumed offsets
commit together). The worker, not the collector, then raises and resolves health alerts.

Schemas of `tally.gpu.health` data:
- v1 (current): node, gpu_uuid, gpu_index, kind, detail, xid, source, time_us.
"""

from __future__ import annotations

from typing import Any

from ledger.envelope import (
    DECODE_ERRORS,
    REGISTRY,
    DeadLetter,
    Envelope,
    Family,
    dead_letter,
    decode_envelope,
    event_id,
    parse,
)
from ledger.errors import EventError
from ledger.events import MAX_TIME_US, EventType, GpuHealth, HealthKind, SampleSource
from ledger.inventory.events import INVENTORY, InventoryReport, integer, text

HEALTH_SCHEMA = 1
_KINDS: dict[Any, HealthKind] = {k.value: k for k in HealthKind}
_SOURCES: dict[Any, SampleSource] = {s.value: s for s in SampleSource}


def wrap_health(health: GpuHealth, source: str) -> Envelope[GpuHealth]:
    return Envelope(
        id=event_id(source, f"{health.gpu_uuid}/{health.kind.value}", health.time_us),
        type=EventType.GPU_HEALTH,
        source=source,
        subject=health.gpu_uuid,
        time_us=health.time_us,
        schema=HEALTH_SCHEMA,
        data=health,
    )


def health_to_dict(health: GpuHealth) -> dict[str, Any]:
    return {
        "node": health.node,
        "gpu_uuid": health.gpu_uuid,
        "gpu_index": health.gpu_index,
        "kind": health.kind.value,
        "detail": health.detail,
        "xid": health.xid,
        "source": health.source.value,
        "time_us": health.time_us,
    }


def health_from_dict(kind: Any, data: Any) -> GpuHealth:
    """Decode and validate v1 health data; raises EventError."""
    del kind
    if type(data) is not dict:
        raise EventError("data: expected an object")
    health_kind, source = _KINDS.get(data.get("kind")), _SOURCES.get(data.get("source"))
    if health_kind is None:
        raise EventError(f"kind: expected one of {sorted(_KINDS)}")
    if source is None:
        raise EventError(f"source: expected one of {sorted(_SOURCES)}")
    detail = data.get("detail", "")
    if type(detail) is not str or len(detail) > 256:
        raise EventError("detail: expected a string of at most 256 characters")
    xid = data.get("xid")
    return GpuHealth(
        node=text(data, "node"),
        gpu_uuid=text(data, "gpu_uuid"),
        gpu_index=integer(data, "gpu_index", 0, 1023),
        kind=health_kind,
        detail=detail,
        time_us=integer(data, "time_us", 0, MAX_TIME_US),
        source=source,
        xid=None if xid is None else integer(data, "xid", 0, 1 << 31),
    )


HEALTH: Family[GpuHealth] = Family(
    name="health",
    kinds={EventType.GPU_HEALTH.value: EventType.GPU_HEALTH},
    to_data=health_to_dict,
    from_data=health_from_dict,
    wrap=wrap_health,
    schema=HEALTH_SCHEMA,
    label="health event type",
    subject_is="GPU UUID",
    time_is="time_us",
)
REGISTRY.add(HEALTH, {})

InventoryEvent = Envelope[InventoryReport] | Envelope[GpuHealth]


def decode_inventory_message(
    value: bytes | None,
) -> tuple[list[InventoryEvent], list[DeadLetter]]:
    """Decode one message of the `inventory-reports` topic (reports and health events) into
    envelopes and dead letters. Never raises on bad input."""
    items, bad = parse(value)
    if bad is not None:
        return [], [bad]
    envelopes: list[InventoryEvent] = []
    dead: list[DeadLetter] = []
    for item in items:
        is_health = type(item) is dict and item.get("type") == EventType.GPU_HEALTH.value
        try:
            if is_health:
                envelopes.append(decode_envelope(item, HEALTH))
            else:
                envelopes.append(decode_envelope(item, INVENTORY))
        except DECODE_ERRORS as exc:
            dead.append(dead_letter(item, exc))
    return envelopes, dead


__all__ = ["HEALTH", "InventoryEvent", "decode_inventory_message", "wrap_health"]
