"""The samples family and its JSON codec: a sample's envelope, its encoding, the family's entry
in the schema registry with its upcaster, decoding a message; and the health event's encoding.

Samples travel in the generic envelope (`ledger.envelope`); `SAMPLES` is their family in the
schema registry. The wire format of one Kafka message is either one envelope (a JSON object) or
a CloudEvents JSON batch (an array of envelopes) whose events share the message key. Decoding
never raises for bad input: each undecodable message or element becomes a `DeadLetter`.

The types (`GpuSample`, `GpuHealth`, `Owner`, …) are `ledger.sample_types`', re-exported here
because most modules import them with the codec; a sample's data is decoded by
`ledger.sample_decode` (its fast path and its field-by-field decoder).

Schemas of `tally.gpu.sample` data:
- v1 (current): the fields of `GpuSample` as `sample_to_dict` writes them; `mig.first_slice`
  and `mig.uuid` were added to v1 and are written only when set (as a sample always was);
- v0: the first collectors named the GPU `gpu` (not `gpu_uuid`) and reported power in whole
  watts as `power_w` (not milliwatts as `power_mw`); `sample_v0_to_v1` upcasts it. A v0
  envelope's id was derived as today (source, subject, time), so it is unchanged.

Invariant: `event_id(source, subject, time_us)` depends on content only, so a resend is the
same event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from ledger.envelope import (
    MAX_DEAD_LETTER_BYTES,
    REGISTRY,
    SPEC_VERSION,
    DeadLetter,
    Envelope,
    Family,
    SchemaRegistry,
    decode,
    decode_envelope,
    encode_data,
    encode_dead_letter,
    event_id,
    family_to_dict,
)
from ledger.fast_build import builder
from ledger.sample_decode import sample_data_from_dict
from ledger.sample_types import (
    MAX_INTERVAL_US,
    MAX_TIME_US,
    EventType,
    GpuHealth,
    GpuSample,
    HealthKind,
    MigInstance,
    Owner,
    ProcessUsage,
    SampleEnvelope,
    SampleSource,
)

__all__ = [
    "CURRENT_SCHEMA",
    "DEFAULT_REGISTRY",
    "MAX_DEAD_LETTER_BYTES",
    "MAX_INTERVAL_US",
    "MAX_TIME_US",
    "SAMPLES",
    "SPEC_VERSION",
    "DeadLetter",
    "Envelope",
    "EventType",
    "GpuHealth",
    "GpuSample",
    "HealthKind",
    "MigInstance",
    "Owner",
    "ProcessUsage",
    "SampleEnvelope",
    "SampleSource",
    "SchemaRegistry",
    "decode_message",
    "encode_batch",
    "encode_dead_letter",
    "encode_envelope",
    "encode_health",
    "envelope_for",
    "envelope_from_dict",
    "envelope_to_dict",
    "event_id",
    "sample_to_dict",
    "sample_v0_to_v1",
]


def envelope_for(sample: GpuSample, source: str) -> SampleEnvelope:
    """Wrap a sample in its envelope with its content-derived id."""
    subject = sample.subject
    time_us = sample.sample_time_us
    return _build_envelope(
        event_id(source, subject, time_us),
        EventType.GPU_SAMPLE,
        source,
        subject,
        time_us,
        SAMPLE_SCHEMA,
        sample,
    )


# ---------------------------------------------------------------------------- encoding


def _owner_dict(owner: Owner | None) -> dict[str, Any] | None:
    if owner is None:
        return None
    return {"team": owner.team, "project": owner.project, "user": owner.user, "job": owner.job_id}


def sample_to_dict(sample: GpuSample) -> dict[str, Any]:
    """The v1 JSON object of a sample."""
    mig = sample.mig
    return {
        "node": sample.node,
        "gpu_uuid": sample.gpu_uuid,
        "gpu_index": sample.gpu_index,
        "model": sample.model,
        "pool": sample.pool,
        "util_gpu_pct": sample.util_gpu_pct,
        "util_mem_pct": sample.util_mem_pct,
        "memory_used_bytes": sample.memory_used_bytes,
        "memory_total_bytes": sample.memory_total_bytes,
        "power_mw": sample.power_mw,
        "energy_mj": sample.energy_mj,
        "mig": None
        if mig is None
        else {
            "gi": mig.gpu_instance_id,
            "ci": mig.compute_instance_id,
            "profile": mig.profile,
            "slices": mig.slices,
            "total_slices": mig.total_slices,
            **({} if mig.first_slice is None else {"first_slice": mig.first_slice}),
            **({} if mig.uuid is None else {"uuid": mig.uuid}),
        },
        "processes": [
            {
                "pid": p.pid,
                "used_memory_bytes": p.used_memory_bytes,
                "sm_util_pct": p.sm_util_pct,
                "owner": _owner_dict(p.owner),
            }
            for p in sample.processes
        ],
        "owner": _owner_dict(sample.owner),
        "source": sample.source.value,
        "sample_time_us": sample.sample_time_us,
        "interval_us": sample.interval_us,
        "temperature_c": sample.temperature_c,
        "sm_clock_mhz": sample.sm_clock_mhz,
        "xid_errors": sample.xid_errors,
        "energy_delta_mj": sample.energy_delta_mj,
    }


def envelope_to_dict(envelope: SampleEnvelope) -> dict[str, Any]:
    return family_to_dict(SAMPLES, envelope)


def encode_batch(envelopes: Iterable[SampleEnvelope]) -> bytes:
    """One Kafka message value: a CloudEvents JSON batch."""
    return orjson.dumps([family_to_dict(SAMPLES, e) for e in envelopes])


def encode_envelope(envelope: SampleEnvelope) -> bytes:
    return orjson.dumps(family_to_dict(SAMPLES, envelope))


def sample_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 sample data → v1: `gpu` becomes `gpu_uuid`, `power_w` (W) becomes `power_mw`."""
    out = {k: v for k, v in data.items() if k not in ("gpu", "power_w")}
    if "gpu" in data:
        out["gpu_uuid"] = data["gpu"]
    watts = data.get("power_w")
    out["power_mw"] = watts * 1000 if type(watts) is int else watts
    return out


SAMPLE_SCHEMA = 1
_build_envelope = builder(Envelope)  # the hot path's constructor (`ledger.fast_build`)
CURRENT_SCHEMA: dict[str, int] = {EventType.GPU_SAMPLE: SAMPLE_SCHEMA}
SAMPLES: Family[GpuSample] = Family(
    name="sample",
    kinds={EventType.GPU_SAMPLE.value: EventType.GPU_SAMPLE},
    to_data=sample_to_dict,
    from_data=sample_data_from_dict,
    wrap=envelope_for,
    schema=SAMPLE_SCHEMA,
    subject_is="GPU or MIG instance",
    time_is="sample_time_us",
)
REGISTRY.add(SAMPLES, {(EventType.GPU_SAMPLE, 0): sample_v0_to_v1})
DEFAULT_REGISTRY = REGISTRY


def envelope_from_dict(obj: Any, registry: SchemaRegistry = REGISTRY) -> SampleEnvelope:
    """Decode one envelope, upcasting its data to the current schema; raises EventError."""
    return decode_envelope(obj, SAMPLES, registry)


def decode_message(
    value: bytes | None, registry: SchemaRegistry = REGISTRY
) -> tuple[list[SampleEnvelope], list[DeadLetter]]:
    """Decode one Kafka message value into events and dead letters. Never raises on bad input."""
    return decode(value, SAMPLES, registry)


def encode_health(health: GpuHealth, source: str) -> bytes:
    """A health event in its envelope (published on the `inventory-reports` topic, keyed by node;
    the worker folds it into the GPU's inventory record: `ledger.inventory.health`)."""
    return encode_data(
        Envelope(
            id=event_id(source, f"{health.gpu_uuid}/{health.kind.value}", health.time_us),
            type=EventType.GPU_HEALTH,
            source=source,
            subject=health.gpu_uuid,
            time_us=health.time_us,
            schema=1,
            data={
                "node": health.node,
                "gpu_uuid": health.gpu_uuid,
                "gpu_index": health.gpu_index,
                "kind": health.kind.value,
                "detail": health.detail,
                "xid": health.xid,
                "source": health.source.value,
                "time_us": health.time_us,
            },
        )
    )
