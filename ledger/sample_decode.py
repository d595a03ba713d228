"""Decoding a sample's JSON data (schema v1) into a `GpuSample`: two decoders that accept exactly
the same input and build the same value (property-tested, `tests/unit/test_sample_fast_path.py`).

- `_common_sample`, the fast path: a well-formed sample without a MIG slice whose owners were
  seen before, in one function with its checks inline, built with `ledger.fast_build.builder`
  (the same frozen values without a frozen dataclass's per-field `object.__setattr__`); it
  returns None for anything else;
- `_checked_sample`, field by field: everything the fast path does not take, and every malformed
  sample, whose `EventError` names the field.

`sample_data_from_dict` tries them in that order; it is the samples family's decoder
(`ledger.events.SAMPLES`). Decoded owners are shared, one frozen value per distinct owner
(`_OWNERS`, bounded), which is also what lets the fast path recognise a known owner cheaply.
Integers are integers: a float, bool or string where an integer belongs is a decode error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.errors import EventError
from ledger.excerpts import shown
from ledger.fast_build import builder
from ledger.mig_devices import mig_uuid
from ledger.sample_types import (
    MAX_ENERGY_DELTA_MJ,
    MAX_INTERVAL_US,
    MAX_SLICES,
    MAX_TEXT,
    MAX_TIME_US,
    EventType,
    GpuSample,
    MigInstance,
    Owner,
    ProcessUsage,
    SampleSource,
)


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
