"""GPU samples and health events: their types, the samples family and its JSON codec.

Samples travel in the generic envelope (`ledger.envelope`); `SAMPLES` is their family in the
schema registry. The wire format of one Kafka message is either one envelope (a JSON object) or
a CloudEvents JSON batch (an array of envelopes) whose events share the message key. Decoding
never raises for bad input: each undecodable message or element becomes a `DeadLetter`.

Schemas of `tally.gpu.sample` data:
- v1 (current): the fields of `GpuSample` as `sample_to_dict` writes them; `mig.first_slice`
  and `mig.uuid` were added to v1 and are written only when set (as a sample always was);
- v0: the first collectors named the GPU `gpu` (not `gpu_uuid`) and reported power in whole
  watts as `power_w` (not milliwatts as `power_mw`); `sample_v0_to_v1` upcasts it. A v0
  envelope's id was derived as today (source, subject, time), so it is unchanged.

Invariants:
- `event_id(source, subject, time_us)` depends on content only, so a resend is the same event;
- every dataclass here is frozen, slotted and holds tuples, never lists;
- integers are integers: a float, bool or string where an integer belongs is a decode error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
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
from ledger.errors import EventError
from ledger.excerpts import shown
from ledger.fast_build import builder
from ledger.mig_devices import mig_uuid

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
    "sample_from_dict",
    "sample_to_dict",
    "sample_v0_to_v1",
]

MAX_INTERVAL_US = 3_600_000_000  # one sample never covers more than an hour
MAX_ENERGY_DELTA_MJ = 10**12  # energy of one sample: far above any GPU's for an hour
MAX_TEXT = 256  # a sample's names (node, GPU UUID, model, pool, owner fields)
MAX_SLICES = 64  # MIG slices of one GPU
MAX_TIME_US = 7_258_118_400_000_000  # 2200-01-01: anything later is a broken clock


class EventType(StrEnum):
    """The `type` attribute of every event Tally writes."""

    GPU_SAMPLE = "tally.gpu.sample"
    GPU_HEALTH = "tally.gpu.health"


class HealthKind(StrEnum):
    """What a health event reports about a GPU."""

    GPU_LOST = "gpu_lost"
    XID_ERROR = "xid_error"
    RECOVERED = "recovered"
    ECC_DBE = "ecc_dbe"  # a double-bit (uncorrectable) ECC error counted
    RETIRED_PAGES = "retired_pages"  # pages retired or rows remapped, or pending retirement
    THERMAL_THROTTLE = "thermal_throttle"
    POWER_THROTTLE = "power_throttle"


class SampleSource(StrEnum):
    """Which collector read a sample."""

    NVML = "nvml"
    DCGM = "dcgm"
    SIMULATED = "sim"


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a GPU or a process belongs to, as far as the collector knows."""

    team: str | None = None
    project: str | None = None
    user: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG slice: its GPU/compute instance ids, profile, and share of the parent GPU in slices.

    `first_slice`: where its slices begin in the collector's accounting layout of the GPU (its
    instances in GPU-instance-id order, then the uncarved rest: `ledger.fractional.lay_out`);
    None when the collector gave none. With it, the GPU time of the instances of one sampling
    pass sums exactly to the whole GPU's (`ledger.attribution.physical_gpu_ms`). `uuid`: the
    MIG device's own name, `ledger.mig_devices` (None: the collector could not read it).
    """

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: int
    total_slices: int = 7
    first_slice: int | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on a GPU during a sample interval."""

    pid: int
    used_memory_bytes: int
    sm_util_pct: int | None = None
    owner: Owner | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Schema v1 of a GPU sample: what one GPU (or MIG slice) did over `interval_us`.

    The interval ends at `sample_time_us`. `owner` is the GPU-level owner when the source knows
    one (a pod on dcgm-exporter, the simulated fleet); processes may carry their own owners.
    """

    node: str
    gpu_uuid: str
    gpu_index: int
    model: str
    pool: str
    util_gpu_pct: int
    memory_used_bytes: int
    memory_total_bytes: int
    source: SampleSource
    sample_time_us: int
    interval_us: int
    util_mem_pct: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    mig: MigInstance | None = None
    processes: tuple[ProcessUsage, ...] = ()
    owner: Owner | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    xid_errors: int | None = None
    energy_delta_mj: int | None = None  # energy used over this interval (the counter's rise)

    @property
    def subject(self) -> str:
        """The envelope subject: the GPU, or the GPU and its MIG instance."""
        if self.mig is None:
            return self.gpu_uuid
        return f"{self.gpu_uuid}/gi{self.mig.gpu_instance_id}"

    @property
    def start_us(self) -> int:
        return self.sample_time_us - self.interval_us


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Something happened to a GPU's health (lost from the bus, an XID error, recovered)."""

    node: str
    gpu_uuid: str
    gpu_index: int
    kind: HealthKind
    detail: str
    time_us: int
    source: SampleSource
    xid: int | None = None


SampleEnvelope = Envelope[GpuSample]


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


# ---------------------------------------------------------------------------- decoding


def _int(data: Mapping[str, Any], key: str, lo: int = 0, hi: int | None = None) -> int:
    value = data.get(key)
    if type(value) is not int:
        raise EventError(f"{key}: expected an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        raise EventError(f"{key}: {value} is out of range [{lo}, {hi if hi is not None else '∞'}]")
    return value


def _opt_int(data: Mapping[str, Any], key: str, lo: int = 0, hi: int | None = None) -> int | None:
    if data.get(key) is None:
        return None
    return _int(data, key, lo, hi)


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if type(value) is not str or not value:
        raise EventError(f"{key}: expected a non-empty string")
    if len(value) > MAX_TEXT:
        raise EventError(f"{key}: longer than {MAX_TEXT} characters")
    return value


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if type(value) is not str or len(value) > 256:
        raise EventError(f"{key}: expected a string of at most 256 characters")
    return value


def _owner(data: Any) -> Owner | None:
    if data is None:
        return None
    if type(data) is not dict:
        raise EventError("owner: expected an object")
    key = (
        _opt_str(data, "team"),
        _opt_str(data, "project"),
        _opt_str(data, "user"),
        _opt_str(data, "job"),
    )
    if key == (None, None, None, None):
        return None
    owner = _OWNERS.get(key)
    if owner is None:  # owners repeat sample after sample: share one frozen value each
        if len(_OWNERS) >= 65_536:
            _OWNERS.clear()
        owner = _OWNERS[key] = Owner(*key)
    return owner


_OWNERS: dict[tuple[str | None, str | None, str | None, str | None], Owner] = {}


def _mig(data: Any) -> MigInstance | None:
    if data is None:
        return None
    if type(data) is not dict:
        raise EventError("mig: expected an object")
    total = _int(data, "total_slices", 1, MAX_SLICES)
    slices = _int(data, "slices", 1, total)
    return MigInstance(
        gpu_instance_id=_int(data, "gi"),
        compute_instance_id=_int(data, "ci"),
        profile=_str(data, "profile"),
        slices=slices,
        total_slices=total,
        first_slice=_opt_int(data, "first_slice", 0, total - slices),
        uuid=mig_uuid(data.get("uuid")),
    )


def _process(data: Any) -> ProcessUsage:
    if type(data) is not dict:
        raise EventError("processes: each process must be an object")
    return ProcessUsage(
        pid=_int(data, "pid"),
        used_memory_bytes=_int(data, "used_memory_bytes"),
        sm_util_pct=_opt_int(data, "sm_util_pct", 0, 100),
        owner=_owner(data.get("owner")),
    )


def sample_from_dict(data: Any) -> GpuSample:
    """Decode and validate the v1 JSON object of a sample; raises EventError."""
    return sample_data_from_dict(EventType.GPU_SAMPLE, data)


def sample_data_from_dict(kind: EventType, data: Any) -> GpuSample:
    """`sample_from_dict` as the family's decoder, (type, data): one call less per sample.

    The common sample (no MIG slice, every field well formed) takes `_common_sample`, one
    function with its checks inline; anything else, and every malformed sample, takes
    `_checked_sample`, which says what is wrong. Both accept exactly the same samples and
    build the same value (property-tested)."""
    if type(data) is dict:
        sample = _common_sample(data)
        if sample is not None:
            return sample
    return _checked_sample(data)


def _common_sample(data: dict[str, Any]) -> GpuSample | None:
    """`data` decoded when it is a well-formed sample without a MIG slice, else None."""
    g = data.get
    node, gpu_uuid, model, pool = g("node"), g("gpu_uuid"), g("model"), g("pool")
    index, util, used, total = (
        g("gpu_index"),
        g("util_gpu_pct"),
        g("memory_used_bytes"),
        g("memory_total_bytes"),
    )
    time_us, interval = g("sample_time_us"), g("interval_us")
    mem, power, energy, delta = (
        g("util_mem_pct"),
        g("power_mw"),
        g("energy_mj"),
        g("energy_delta_mj"),
    )
    temp, clock, xid = g("temperature_c"), g("sm_clock_mhz"), g("xid_errors")
    raw_source = g("source")
    source = _SOURCES.get(raw_source) if type(raw_source) is str else None
    if not (
        source is not None
        and g("mig") is None
        and type(node) is str
        and 0 < len(node) <= 256
        and type(gpu_uuid) is str
        and 0 < len(gpu_uuid) <= 256
        and type(model) is str
        and 0 < len(model) <= 256
        and type(pool) is str
        and 0 < len(pool) <= 256
        and type(index) is int
        and 0 <= index <= 1023
        and type(util) is int
        and 0 <= util <= 100
        and type(used) is int
        and used >= 0
        and type(total) is int
        and total >= 0
        and type(time_us) is int
        and 1 <= time_us <= MAX_TIME_US
        and type(interval) is int
        and 1 <= interval <= MAX_INTERVAL_US
        and (mem is None or (type(mem) is int and 0 <= mem <= 100))
        and (power is None or (type(power) is int and power >= 0))
        and (energy is None or (type(energy) is int and energy >= 0))
        and (delta is None or (type(delta) is int and 0 <= delta <= 10**12))
        and (temp is None or (type(temp) is int and 0 <= temp <= 200))
        and (clock is None or (type(clock) is int and 0 <= clock <= 10_000))
        and (xid is None or (type(xid) is int and xid >= 0))
    ):
        return None
    raw = g("processes") or []
    if type(raw) is not list or len(raw) > 1024:
        return None
    processes = []
    for p in raw:
        if type(p) is not dict:
            return None
        pid, pmem, sm = p.get("pid"), p.get("used_memory_bytes"), p.get("sm_util_pct")
        if not (
            type(pid) is int
            and pid >= 0
            and type(pmem) is int
            and pmem >= 0
            and (sm is None or (type(sm) is int and 0 <= sm <= 100))
        ):
            return None
        owner = _common_owner(p.get("owner"))
        if owner is _UNSEEN:
            return None
        processes.append(_build_process(pid, pmem, sm, owner))
    owner = _common_owner(g("owner"))
    if owner is _UNSEEN:
        return None
    return _build_sample(
        node, gpu_uuid, index, model, pool, util, used, total, source, time_us, interval,
        mem, power, energy, None, tuple(processes), owner, temp, clock, xid, delta,
    )  # fmt: skip


def _common_owner(data: Any) -> Owner | None:
    """The owner `data` describes when it is one already seen (or none), else `_UNSEEN`."""
    if data is None:
        return None
    if type(data) is not dict:
        return _UNSEEN
    g = data.get
    return _OWNERS.get((g("team"), g("project"), g("user"), g("job")), _UNSEEN)


_UNSEEN = Owner("\x00unseen")  # compared by identity: no decoded owner is this object
# The hot path's constructors (`ledger.fast_build`): the same values, without a frozen
# dataclass's per-field `object.__setattr__`.
_build_sample = builder(GpuSample)
_build_process = builder(ProcessUsage)
_build_envelope = builder(Envelope)


def _checked_sample(data: Any) -> GpuSample:
    """`sample_data_from_dict`, checking field by field; raises EventError naming the field."""
    if type(data) is not dict:
        raise EventError("data: expected an object")
    raw_source = data.get("source")  # a dict: calling the enum is slow
    source = _SOURCES.get(raw_source) if type(raw_source) is str else None
    if source is None:
        raise EventError(f"source: unknown sample source {shown(raw_source)}")
    processes = data.get("processes") or ()
    if type(processes) not in (list, tuple):
        raise EventError("processes: expected an array")
    if len(processes) > 1024:
        raise EventError("processes: more than 1024 processes on one GPU")
    used = _int(data, "memory_used_bytes")
    total = _int(data, "memory_total_bytes")
    return GpuSample(
        node=_str(data, "node"),
        gpu_uuid=_str(data, "gpu_uuid"),
        gpu_index=_int(data, "gpu_index", 0, 1023),
        model=_str(data, "model"),
        pool=_str(data, "pool"),
        util_gpu_pct=_int(data, "util_gpu_pct", 0, 100),
        util_mem_pct=_opt_int(data, "util_mem_pct", 0, 100),
        memory_used_bytes=used,
        memory_total_bytes=total,
        power_mw=_opt_int(data, "power_mw"),
        energy_mj=_opt_int(data, "energy_mj"),
        mig=_mig(data.get("mig")),
        processes=tuple(_process(p) for p in processes),
        owner=_owner(data.get("owner")),
        source=source,
        sample_time_us=_int(data, "sample_time_us", 1, MAX_TIME_US),
        interval_us=_int(data, "interval_us", 1, MAX_INTERVAL_US),
        temperature_c=_opt_int(data, "temperature_c", 0, 200),
        sm_clock_mhz=_opt_int(data, "sm_clock_mhz", 0, 10_000),
        xid_errors=_opt_int(data, "xid_errors"),
        energy_delta_mj=_opt_int(data, "energy_delta_mj", 0, MAX_ENERGY_DELTA_MJ),
    )


_SOURCES: dict[Any, SampleSource] = {s.value: s for s in SampleSource}


def sample_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 sample data → v1: `gpu` becomes `gpu_uuid`, `power_w` (W) becomes `power_mw`."""
    out = {k: v for k, v in data.items() if k not in ("gpu", "power_w")}
    if "gpu" in data:
        out["gpu_uuid"] = data["gpu"]
    watts = data.get("power_w")
    out["power_mw"] = watts * 1000 if type(watts) is int else watts
    return out


SAMPLE_SCHEMA = 1
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
