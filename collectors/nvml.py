"""The NVML collector: one sampling round of every local GPU as `GpuSample`s and `GpuHealth`s.

This module owns reading NVML (through the `NvmlPort` it is given: `pynvml` or
`collectors.fake_nvml.FakeNvml`), the per-GPU state carried between rounds, and the translation
of NVML errors, which happens in one place (`_classify`). The only exception it raises is
`NvmlUnavailableError`, at start; failures during a round become values: a field set to None,
a `GpuHealth` event, or a line in `RoundResult.problems` (each problem is reported once).

Rules:
- A round reads one timestamp from `clock`; a GPU's sample covers the time since its previous
  sample, at most three sampling intervals (a longer gap — a stalled collector, a lost GPU — is
  not guessed at); a GPU's first sample, and its first after recovering, covers one interval.
- NotSupported and NoPermission are permanent for a GPU and field: that field is None and not
  asked again (until the GPU's MIG mode changes). Other errors make the field None this round.
- GpuIsLost (also GpuNotFound, ResetRequired, and a driver gone mid-run) on any call marks the
  GPU lost: one GPU_LOST health event, no samples; it is probed each round and a RECOVERED
  event follows when it answers with the same UUID. The other GPUs are sampled as usual.
- Energy: `energy_mj` is a monotonic counter. The driver's counter can restart (driver reload,
  GPU reset) or wrap; a decrease is taken as a restart from zero, so the energy of that interval
  is the new raw value, never negative.
- Per-process SM utilisation comes from `nvmlDeviceGetProcessUtilization(handle, ts)` with `ts`
  the newest sample timestamp of the GPU's previous round (0 at first: NVML's window average).
  Several samples of one process are averaged. When NVML answered (samples, or NotFound for
  none), a listed process without a sample ran no kernels: 0. When it cannot answer: None.
- MIG: one sample per GPU instance (compute instances of one GPU instance are merged: their
  processes together, the lowest CI id). Memory is the instance's own. NVML has no per-instance
  utilisation, so `util_gpu_pct` of an instance is the sum of its processes' SM utilisation,
  capped at 100, when NVML gives per-process samples; otherwise (NVML does not on MIG today) it
  is occupancy: 100 while any process runs in the instance, 0 when none — idle reclaim never
  fires on an occupied slice on a guess, and the processes' `sm_util_pct` of None mark it.
  The same fallback applies to a whole GPU whose utilisation rates are not supported.
  Power and energy are the parent's, apportioned by slices / total slices (energy as a per-
  instance monotonic counter with the remainder carried); temperature and SM clock are the
  parent's. A MIG-enabled GPU with no instances is sampled as a whole GPU (nobody can use it).
- XID errors: `xid_errors` counts the XID events of the round (None where the GPU cannot
  register for them); each also becomes an XID_ERROR health event. An event naming a GPU
  instance counts for that instance only.
- Owners: `owner_resolver(pid, gpu_uuid)` is asked once for a process and the answer kept while
  the process stays on that GPU, re-asked every `owner_refresh_rounds`. `GpuSample.owner` stays
  None: NVML sees processes, not allocations (the scheduler's assignments are its own events).
- Out-of-range readings are dropped, never clamped into a lie: a temperature above 200 °C or an
  SM clock above 10 GHz is None; utilisation is clamped to 0..100.
- Static facts (handles, UUID, name, MIG layout) are read at start; the MIG layout again when
  the MIG mode changes, a process names an unknown GPU instance, an instance stops answering,
  or every `layout_refresh_rounds`.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import pynvml

from collectors.errors import NvmlUnavailableError
from ledger.attribution import unconfigured_slices
from ledger.events import (
    GpuHealth,
    GpuSample,
    HealthKind,
    MigInstance,
    Owner,
    ProcessUsage,
    SampleSource,
)

Clock = Callable[[], int]

NOT_AVAILABLE_U32 = 0xFFFFFFFF
MIB = 1 << 20
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 3600.0
_MAX_EVENTS_PER_ROUND = 1024
_GAP_INTERVALS = 3
# Full-GPU instance profiles, largest first: the first one a GPU supports gives its slice count.
_FULL_PROFILES = (
    pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
)
_DEFAULT_TOTAL_SLICES = 7
_TEMP_GPU = pynvml.NVML_TEMPERATURE_GPU
_CLOCK_SM = pynvml.NVML_CLOCK_SM
_XID_EVENTS = pynvml.nvmlEventTypeXidCriticalError
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")
_PROFILE_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")


class NvmlPort(Protocol):
    """The NVML functions the collector calls, with the signatures of nvidia-ml-py 13."""

    def nvmlInit(self, /) -> None: ...
    def nvmlShutdown(self, /) -> None: ...
    def nvmlDeviceGetCount(self, /) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int, /) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetAttributes(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, /) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timestamp: int, /) -> Any: ...
    def nvmlEventSetCreate(self, /) -> Any: ...
    def nvmlDeviceRegisterEvents(
        self, handle: Any, event_types: int, event_set: Any, /
    ) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int, /) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any, /) -> None: ...


class ProcessOwnerResolver(Protocol):
    """Who a GPU process belongs to (see `collectors.ownership.OwnerResolver`)."""

    def __call__(self, pid: int, gpu_uuid: str, /) -> Owner | None: ...


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one sampling round produced: samples, health events, and new problems (once each)."""

    samples: tuple[GpuSample, ...]
    health: tuple[GpuHealth, ...]
    problems: tuple[str, ...]


def wall_clock_us() -> int:
    return time.time_ns() // 1_000


def source_name(node: str) -> str:
    return f"nvml://{node}"


# ---------------------------------------------------------------------------- error translation


class _Failure(StrEnum):
    UNSUPPORTED = "unsupported"
    NO_PERMISSION = "no permission"
    NO_DATA = "no data"
    LOST = "lost"
    TIMEOUT = "timeout"
    OTHER = "error"


_FAILURES = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: _Failure.UNSUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: _Failure.UNSUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: _Failure.NO_PERMISSION,
    pynvml.NVML_ERROR_NOT_FOUND: _Failure.NO_DATA,
    pynvml.NVML_ERROR_NO_DATA: _Failure.NO_DATA,
    pynvml.NVML_ERROR_GPU_IS_LOST: _Failure.LOST,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: _Failure.LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: _Failure.LOST,
    # Mid-run, a driver that went away takes every GPU with it.
    pynvml.NVML_ERROR_UNINITIALIZED: _Failure.LOST,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: _Failure.LOST,
    pynvml.NVML_ERROR_TIMEOUT: _Failure.TIMEOUT,
}

_INIT_MESSAGES = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "the NVIDIA management library (libnvidia-ml.so.1) was not found: no NVIDIA driver is "
        "installed here, or it is not on the library path (in a container, run it with the "
        "NVIDIA container runtime). Use the simulated or dcgm-exporter collector instead."
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded (is this a GPU node? `nvidia-smi` will say "
        "the same); load it with `modprobe nvidia` or use another collector."
    ),
    pynvml.NVML_ERROR_UNINITIALIZED: (
        "the NVIDIA management library could not be initialised (the driver is not loaded or "
        "not usable); check `nvidia-smi`."
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to open the NVIDIA devices (/dev/nvidia*): run the collector as a user "
        "with access to them."
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVIDIA library and kernel driver versions differ (a driver upgrade without a "
        "reboot or module reload); reload the nvidia module or reboot."
    ),
}


def _classify(exc: pynvml.NVMLError) -> _Failure:
    """The one place NVML error codes are interpreted."""
    return _FAILURES.get(getattr(exc, "value", None), _Failure.OTHER)


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # the binding's __str__ may itself call into a missing library
        return repr(exc)


class _GpuLost(Exception):
    """Internal: a call on this GPU said it is gone; the round skips the GPU."""


# ---------------------------------------------------------------------------- per-GPU state


@dataclass(slots=True)
class _MigSlot:
    handle: Any
    mig: MigInstance
    memory_total: int
    energy_start: int | None = None  # the instance's counter at its first sample
    energy_numerator: int = 0  # Σ parent energy delta × slices since then


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    model: str
    skip: set[str] = field(default_factory=set)
    lost: bool = False
    last_time_us: int | None = None
    memory_total: int = 0
    process_ts: int = 0
    energy_raw: int | None = None
    energy_base: int = 0
    mig_enabled: bool = False
    slots: dict[int, _MigSlot] = field(default_factory=dict)  # GPU instance id → slot
    total_slices: int | None = None
    layout_age: int = 0
    layout_stale: bool = True
    xid_registered: bool | None = None  # None: not tried yet; False: cannot


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Hashable:
    """A hashable identity for a device handle: the C pointer's address, or the object itself."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle  # type: ignore[no-any-return]


def _pct(value: Any) -> int:
    return min(100, max(0, int(value)))


def _in_range(value: int | None, hi: int) -> int | None:
    return value if value is not None and 0 <= value <= hi else None


def _profile_of(mig_name: str) -> str:
    match = _MIG_PROFILE.search(mig_name)
    return match.group(1) if match else mig_name.strip() or "unknown"


def _slices_of(profile: str) -> int | None:
    match = _PROFILE_SLICES.search(profile)
    return int(match.group(1)) if match else None


def _occupancy_util(processes: list[ProcessUsage]) -> int:
    """Utilisation from processes: Σ SM utilisation (capped) if known, else occupancy."""
    known = [p.sm_util_pct for p in processes if p.sm_util_pct is not None]
    if known:
        return min(100, sum(known))
    return 100 if processes else 0


@dataclass(slots=True)
class _Round:
    now_us: int
    samples: list[GpuSample] = field(default_factory=list)
    health: list[GpuHealth] = field(default_factory=list)
    seen_owners: set[tuple[int, str]] = field(default_factory=set)


# ---------------------------------------------------------------------------- the collector


class NvmlCollector:
    """Samples every GPU of this node through NVML; one `collect_round()` per sampling interval.

    `start()` initialises NVML and reads the static facts (the first round does it too);
    `close()` releases NVML. As a context manager it does both.
    """

    def __init__(
        self,
        nvml: NvmlPort,
        node: str,
        pool: str,
        *,
        clock: Clock = wall_clock_us,
        owner_resolver: ProcessOwnerResolver | None = None,
        interval_s: float = 10.0,
        layout_refresh_rounds: int = 30,
        owner_refresh_rounds: int = 30,
    ) -> None:
        if not node or not pool:
            raise ValueError("node and pool must be non-empty")
        if not (math.isfinite(interval_s) and MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S):
            raise ValueError(
                f"sampling interval must be between {MIN_INTERVAL_S:g} s and "
                f"{MAX_INTERVAL_S:g} s, got {interval_s!r}"
            )
        if layout_refresh_rounds < 1 or owner_refresh_rounds < 1:
            raise ValueError("refresh periods must be at least one round")
        self._nvml = nvml
        self.node = node
        self.pool = pool
        self.source = source_name(node)
        self.interval_us = round(interval_s * 1_000_000)
        self._clock = clock
        self._resolver = owner_resolver
        self._layout_refresh = layout_refresh_rounds
        self._owner_refresh = owner_refresh_rounds
        self._gpus: list[_Gpu] = []
        self._by_handle: dict[Hashable, int] = {}
        self._event_set: Any = None
        self._owners: dict[tuple[int, str], tuple[Owner | None, int]] = {}
        self._reported: set[str] = set()
        self._new_problems: list[str] = []
        self._round = 0
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> NvmlCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def start(self) -> None:
        """Initialise NVML and read the GPUs. Raises NvmlUnavailableError with a human message."""
        if self._started:
            return
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            message = _INIT_MESSAGES.get(code, f"NVML could not start: {_describe(exc)}")
            raise NvmlUnavailableError(message) from exc
        try:
            count = nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self._shutdown_quietly()
            raise NvmlUnavailableError(f"NVML cannot count the GPUs: {_describe(exc)}") from exc
        if count == 0:
            self._shutdown_quietly()
            raise NvmlUnavailableError("the NVIDIA driver is loaded but sees no GPU on this node")
        self._by_handle.clear()
        self._gpus = [self._open_gpu(index) for index in range(count)]
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._event_set = None
            self._problem("events", f"XID events are unavailable on this node: {_describe(exc)}")
        self._started = True

    def close(self) -> None:
        """Release NVML; a later round starts it again."""
        if not self._started:
            return
        self._started = False
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):  # shutdown releases the set too
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self._shutdown_quietly()

    def _shutdown_quietly(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):  # nothing left to release
            self._nvml.nvmlShutdown()

    def _open_gpu(self, index: int) -> _Gpu:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _Gpu(
                index=index,
                handle=handle,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                model=_text(nvml.nvmlDeviceGetName(handle)),
            )
        except pynvml.NVMLError as exc:
            # Its UUID is unknown, so no health event names it; it is probed every round.
            self._problem(f"open/{index}", f"GPU {index} cannot be read: {_describe(exc)}")
            return _Gpu(index=index, handle=None, uuid="", model="", lost=True)
        self._by_handle[_handle_key(handle)] = index
        return gpu

    # ------------------------------------------------------------------ the round

    def collect_round(self) -> RoundResult:
        """Sample every GPU once. Never raises for what a GPU or the driver does mid-run."""
        self.start()
        self._round += 1
        ctx = _Round(now_us=self._clock())
        xids = self._drain_xids(ctx)
        for position, listed in enumerate(self._gpus):
            gpu: _Gpu | None = listed
            if listed.lost:
                gpu = self._probe(position, listed, ctx)
            if gpu is None:
                continue
            try:
                if gpu.xid_registered is None:
                    self._register_xid(gpu)
                self._sample(gpu, ctx, xids.get(gpu.index, []))
            except _GpuLost as lost:
                self._mark_lost(gpu, ctx, str(lost))
        for key in [k for k in self._owners if k not in ctx.seen_owners]:
            del self._owners[key]
        problems, self._new_problems = tuple(self._new_problems), []
        return RoundResult(tuple(ctx.samples), tuple(ctx.health), problems)

    def _problem(self, key: str, message: str) -> None:
        """Report `message` once per `key` (problems found by start() go out with round one)."""
        if key not in self._reported:
            self._reported.add(key)
            self._new_problems.append(message)

    # ------------------------------------------------------------------ calls with the rules

    def _failed(self, gpu: _Gpu, what: str, exc: pynvml.NVMLError) -> _Failure:
        """Apply the error rules to a failed call for `gpu`'s field `what`."""
        failure = _classify(exc)
        if failure is _Failure.LOST:
            raise _GpuLost(_describe(exc)) from exc
        label = f"GPU {gpu.index} ({gpu.uuid}): {what}"
        if failure in (_Failure.UNSUPPORTED, _Failure.NO_PERMISSION):
            gpu.skip.add(what)
            consequence = "left empty"
            if gpu.mig_enabled and what == "process utilization":
                consequence = "MIG instances report occupancy as utilisation"
            elif what == "utilization":
                consequence = "utilisation derived from its processes"
            self._problem(f"{gpu.uuid}/{what}/{failure}", f"{label}: {failure}; {consequence}")
        elif failure is not _Failure.NO_DATA:
            code = getattr(exc, "value", None)
            self._problem(f"{gpu.uuid}/{what}/{code}", f"{label} failed: {_describe(exc)}")
        return failure

    def _call(self, gpu: _Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any | None:
        """`fn(*args)` for `gpu`'s field `what`, or None when NVML cannot answer."""
        if what in gpu.skip:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            self._failed(gpu, what, exc)
            return None

    # ------------------------------------------------------------------ sampling one GPU

    def _sample(self, gpu: _Gpu, ctx: _Round, xids: list[tuple[int, int]]) -> None:
        nvml = self._nvml
        now = ctx.now_us
        if gpu.last_time_us is not None and now <= gpu.last_time_us:
            self._problem("clock", "the clock did not advance between rounds; round skipped")
            return
        interval = (
            self.interval_us
            if gpu.last_time_us is None
            else min(now - gpu.last_time_us, _GAP_INTERVALS * self.interval_us)
        )
        h = gpu.handle
        mode = self._call(gpu, "MIG mode", nvml.nvmlDeviceGetMigMode, h)
        enabled = mode is not None and int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
        if enabled != gpu.mig_enabled:
            gpu.mig_enabled = enabled
            gpu.layout_stale = True
            gpu.slots = {}
            gpu.skip -= {"utilization", "process utilization"}
        gpu.layout_age += 1
        if enabled and (gpu.layout_stale or gpu.layout_age >= self._layout_refresh):
            self._load_layout(gpu)

        utils = self._process_utils(gpu)
        by_gi = self._processes(gpu, ctx, utils)
        if enabled and any(gi not in gpu.slots for gi in by_gi):
            self._load_layout(gpu)
            for gi in by_gi:
                if gi not in gpu.slots:
                    self._problem(
                        f"{gpu.uuid}/gi{gi}",
                        f"GPU {gpu.index} ({gpu.uuid}): processes in unknown GPU instance {gi} "
                        "are not sampled",
                    )
        temperature = self._call(gpu, "temperature", nvml.nvmlDeviceGetTemperature, h, _TEMP_GPU)
        sm_clock = self._call(gpu, "SM clock", nvml.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        power = self._call(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h)
        energy, energy_delta = self._energy(gpu)
        gpu.last_time_us = now

        def make(
            util: int,
            util_mem: int | None,
            used: int,
            total: int,
            power_mw: int | None,
            energy_mj: int | None,
            mig: MigInstance | None,
            processes: list[ProcessUsage],
            xid_errors: int | None,
            energy_delta_mj: int | None = None,
        ) -> GpuSample:
            return GpuSample(
                node=self.node,
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                model=gpu.model,
                pool=self.pool,
                util_gpu_pct=util,
                util_mem_pct=util_mem,
                memory_used_bytes=used,
                memory_total_bytes=total,
                source=SampleSource.NVML,
                sample_time_us=now,
                interval_us=interval,
                power_mw=None if power_mw is None else int(power_mw),
                energy_mj=energy_mj,
                mig=mig,
                processes=tuple(processes),
                temperature_c=_in_range(temperature, 200),
                sm_clock_mhz=_in_range(sm_clock, 10_000),
                xid_errors=xid_errors,
                energy_delta_mj=energy_delta_mj,
            )

        if not enabled or not gpu.slots:
            processes = [p for group in by_gi.values() for p in group]
            memory = self._call(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
            rates = None
            if not enabled:
                rates = self._call(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
            if memory is not None:
                gpu.memory_total = int(memory.total)
            ctx.samples.append(
                make(
                    util=_pct(rates.gpu) if rates is not None else _occupancy_util(processes),
                    util_mem=_pct(rates.memory) if rates is not None else None,
                    used=int(memory.used)
                    if memory is not None
                    else sum(p.used_memory_bytes for p in processes),
                    total=gpu.memory_total,
                    power_mw=power,
                    energy_mj=energy,
                    mig=None,
                    processes=processes,
                    xid_errors=len(xids) if gpu.xid_registered else None,
                    energy_delta_mj=energy_delta or None,  # 0: no earlier reading to rise from
                )
            )
            return

        total_slices = gpu.total_slices or _DEFAULT_TOTAL_SLICES
        apportioned = 0  # energy given to instances this round; the rest is the spare slices'
        for gi, slot in gpu.slots.items():
            processes = by_gi.get(gi, [])
            memory = self._mig_call(gpu, slot, "MIG memory", nvml.nvmlDeviceGetMemoryInfo)
            if memory is not None:
                slot.memory_total = int(memory.total)
            slices = slot.mig.slices
            slot_energy = None
            slot_delta: int | None = None
            if energy is not None:
                if slot.energy_start is None:
                    slot.energy_start = energy * slices // total_slices
                else:
                    before = slot.energy_start + slot.energy_numerator // total_slices
                    slot.energy_numerator += energy_delta * slices
                    slot_delta = slot.energy_start + slot.energy_numerator // total_slices - before
                slot_energy = slot.energy_start + slot.energy_numerator // total_slices
            if slot_delta:
                apportioned += slot_delta
            ctx.samples.append(
                make(
                    util=_occupancy_util(processes),
                    util_mem=None,
                    used=int(memory.used)
                    if memory is not None
                    else sum(p.used_memory_bytes for p in processes),
                    total=slot.memory_total,
                    power_mw=None if power is None else int(power) * slices // total_slices,
                    energy_mj=slot_energy,
                    mig=slot.mig,
                    processes=processes,
                    xid_errors=sum(1 for _, x_gi in xids if x_gi in (gi, NOT_AVAILABLE_U32))
                    if gpu.xid_registered
                    else None,
                    energy_delta_mj=slot_delta or None,
                )
            )
        rest = unconfigured_slices([slot.mig for slot in gpu.slots.values()])
        if rest is not None:  # slices no instance occupies: unallocated capacity, and its energy
            spare_energy = energy_delta - apportioned if energy is not None else 0
            ctx.samples.append(
                make(0, None, 0, 0, None, None, rest, [], None, spare_energy or None)
            )

    def _mig_call(self, gpu: _Gpu, slot: _MigSlot, what: str, fn: Callable[..., Any]) -> Any:
        """`fn(slot.handle)`; an instance that stops answering makes the layout stale."""
        if what in gpu.skip:
            return None
        try:
            return fn(slot.handle)
        except pynvml.NVMLError as exc:
            if self._failed(gpu, what, exc) not in (_Failure.UNSUPPORTED, _Failure.NO_PERMISSION):
                gpu.layout_stale = True
            return None

    def _processes(
        self, gpu: _Gpu, ctx: _Round, utils: dict[int, int] | None
    ) -> dict[int, list[ProcessUsage]]:
        """The GPU's processes by GPU instance id (NOT_AVAILABLE_U32 outside MIG).

        On a MIG GPU the parent's list needs privileges; without them each instance is asked.
        """
        nvml = self._nvml
        raw_by_gi: list[tuple[int | None, Any]] = []
        listed = self._call(gpu, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, gpu.handle)
        if listed is not None:
            raw_by_gi = [(None, raw) for raw in listed]
        elif gpu.mig_enabled and "processes" in gpu.skip:
            for gi, slot in gpu.slots.items():
                per_slot = self._mig_call(
                    gpu, slot, "MIG processes", nvml.nvmlDeviceGetComputeRunningProcesses
                )
                raw_by_gi.extend((gi, raw) for raw in per_slot or ())
        by_gi: dict[int, list[ProcessUsage]] = {}
        for known_gi, raw in raw_by_gi:
            pid = int(raw.pid)
            memory = getattr(raw, "usedGpuMemory", None)
            usage = ProcessUsage(
                pid=pid,
                used_memory_bytes=int(memory) if memory is not None else 0,
                sm_util_pct=utils.get(pid, 0) if utils is not None else None,
                owner=self._owner(pid, gpu.uuid, ctx),
            )
            if not gpu.mig_enabled:
                gi = NOT_AVAILABLE_U32
            elif known_gi is not None:
                gi = known_gi
            else:
                gi = int(getattr(raw, "gpuInstanceId", NOT_AVAILABLE_U32))
            by_gi.setdefault(gi, []).append(usage)
        return by_gi

    def _process_utils(self, gpu: _Gpu) -> dict[int, int] | None:
        """pid → SM % since the previous round's newest sample; {} for none; None if unknown."""
        what = "process utilization"
        if what in gpu.skip:
            return None
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_ts)
        except pynvml.NVMLError as exc:
            return {} if self._failed(gpu, what, exc) is _Failure.NO_DATA else None
        sums: dict[int, int] = {}
        counts: dict[int, int] = {}
        newest = gpu.process_ts
        for sample in samples:
            pid = int(sample.pid)
            sums[pid] = sums.get(pid, 0) + _pct(sample.smUtil)
            counts[pid] = counts.get(pid, 0) + 1
            newest = max(newest, int(sample.timeStamp))
        gpu.process_ts = newest
        return {pid: sums[pid] // counts[pid] for pid in sums}

    def _energy(self, gpu: _Gpu) -> tuple[int | None, int]:
        """(monotonic energy counter in mJ, mJ since the previous reading), or (None, 0)."""
        raw = self._call(gpu, "energy", self._nvml.nvmlDeviceGetTotalEnergyConsumption, gpu.handle)
        if raw is None:
            return None, 0
        raw = int(raw)
        previous = gpu.energy_raw
        if previous is None:
            delta = 0
        elif raw < previous:
            # Restarted (reset, reload) or wrapped: what it counts now is all since then.
            gpu.energy_base += previous
            delta = raw
            self._problem(
                f"{gpu.uuid}/energy-reset/{self._round}",
                f"GPU {gpu.index} ({gpu.uuid}): energy counter went back from {previous} to "
                f"{raw} mJ; counted as a restart",
            )
        else:
            delta = raw - previous
        gpu.energy_raw = raw
        return gpu.energy_base + raw, delta

    def _owner(self, pid: int, gpu_uuid: str, ctx: _Round) -> Owner | None:
        if self._resolver is None:
            return None
        key = (pid, gpu_uuid)
        ctx.seen_owners.add(key)
        cached = self._owners.get(key)
        if cached is not None and self._round - cached[1] < self._owner_refresh:
            return cached[0]
        try:
            owner = self._resolver(pid, gpu_uuid)
        except Exception as exc:  # a resolver bug must not stop metering
            self._problem(f"owner/{type(exc).__name__}", f"owner lookup failed: {exc!r}")
            owner = None
        self._owners[key] = (owner, self._round)
        return owner

    # ------------------------------------------------------------------ MIG layout

    def _load_layout(self, gpu: _Gpu) -> None:
        """Read the GPU's MIG devices into one slot per GPU instance."""
        nvml = self._nvml
        gpu.layout_stale = False
        gpu.layout_age = 0
        if gpu.total_slices is None:
            gpu.total_slices = self._total_slices(gpu)
        total = gpu.total_slices
        count = self._call(gpu, "MIG devices", nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        found: dict[int, _MigSlot] = {}
        for index in range(int(count or 0)):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
                gi = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
                ci = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
            except pynvml.NVMLError as exc:
                if _classify(exc) is _Failure.LOST:
                    raise _GpuLost(_describe(exc)) from exc
                if exc.value not in (
                    pynvml.NVML_ERROR_NOT_FOUND,
                    pynvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    self._failed(gpu, f"MIG device {index}", exc)
                continue  # an empty MIG device index
            existing = found.get(gi)
            if existing is not None:
                if ci < existing.mig.compute_instance_id:
                    existing.handle = handle
                    existing.mig = MigInstance(
                        gi, ci, existing.mig.profile, existing.mig.slices, total
                    )
                continue
            name = self._call(gpu, "MIG name", nvml.nvmlDeviceGetName, handle)
            profile = _profile_of(_text(name)) if name is not None else "unknown"
            attrs = self._call(gpu, "MIG attributes", nvml.nvmlDeviceGetAttributes, handle)
            slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
            slices = slices or _slices_of(profile) or 1
            mig = MigInstance(gi, ci, profile, min(slices, total), total)
            memory_total = int(attrs.memorySizeMB) * MIB if attrs is not None else 0
            previous = gpu.slots.get(gi)
            if previous is not None and previous.mig == mig:
                previous.handle = handle
                found[gi] = previous
            else:
                found[gi] = _MigSlot(handle, mig, memory_total)
        gpu.slots = dict(sorted(found.items()))

    def _total_slices(self, gpu: _Gpu) -> int:
        for profile in _FULL_PROFILES:
            try:
                info = self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, profile)
            except pynvml.NVMLError as exc:
                if _classify(exc) is _Failure.LOST:
                    raise _GpuLost(_describe(exc)) from exc
                continue
            if int(info.sliceCount) > 0:
                return int(info.sliceCount)
        return _DEFAULT_TOTAL_SLICES

    # ------------------------------------------------------------------ health

    def _register_xid(self, gpu: _Gpu) -> None:
        if self._event_set is None:
            gpu.xid_registered = False
            return
        try:
            self._nvml.nvmlDeviceRegisterEvents(gpu.handle, _XID_EVENTS, self._event_set)
        except pynvml.NVMLError as exc:
            self._failed(gpu, "XID events", exc)
            gpu.xid_registered = False
            return
        gpu.xid_registered = True

    def _drain_xids(self, ctx: _Round) -> dict[int, list[tuple[int, int]]]:
        """GPU index → [(xid, GPU instance id)] of the XID events pending now (none waited for)."""
        found: dict[int, list[tuple[int, int]]] = {}
        if self._event_set is None:
            return found
        for _ in range(_MAX_EVENTS_PER_ROUND):
            try:
                data = self._nvml.nvmlEventSetWait(self._event_set, 0)
            except pynvml.NVMLError as exc:
                if _classify(exc) is not _Failure.TIMEOUT:
                    code = getattr(exc, "value", None)
                    self._problem(f"events/{code}", f"reading XID events: {_describe(exc)}")
                break
            if not int(data.eventType) & _XID_EVENTS:
                continue
            index = self._by_handle.get(_handle_key(data.device))
            if index is None:
                continue  # a GPU this collector did not open
            gpu = self._gpus[index]
            xid = int(data.eventData)
            gi = int(getattr(data, "gpuInstanceId", NOT_AVAILABLE_U32))
            found.setdefault(index, []).append((xid, gi))
            where = "" if gi == NOT_AVAILABLE_U32 else f" in GPU instance {gi}"
            ctx.health.append(
                GpuHealth(
                    node=self.node,
                    gpu_uuid=gpu.uuid,
                    gpu_index=index,
                    kind=HealthKind.XID_ERROR,
                    detail=f"XID {xid}{where}",
                    time_us=ctx.now_us,
                    source=SampleSource.NVML,
                    xid=xid,
                )
            )
        return found

    def _mark_lost(self, gpu: _Gpu, ctx: _Round, detail: str) -> None:
        if gpu.lost:
            return
        gpu.lost = True
        gpu.xid_registered = None
        self._by_handle.pop(_handle_key(gpu.handle), None)
        ctx.health.append(
            GpuHealth(
                node=self.node,
                gpu_uuid=gpu.uuid,
                gpu_index=gpu.index,
                kind=HealthKind.GPU_LOST,
                detail=f"GPU {gpu.index} lost: {detail}",
                time_us=ctx.now_us,
                source=SampleSource.NVML,
            )
        )

    def _probe(self, position: int, gpu: _Gpu, ctx: _Round) -> _Gpu | None:
        """The GPU again if it answers now (RECOVERED when it was announced lost), else None."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            model = gpu.model or _text(nvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError:
            return None
        if gpu.uuid and uuid != gpu.uuid:
            self._problem(
                f"replaced/{gpu.index}/{uuid}",
                f"GPU {gpu.index} was {gpu.uuid} and now answers as {uuid}; sampling the new one",
            )
            gpu = _Gpu(index=gpu.index, handle=handle, uuid=uuid, model=model, lost=False)
            self._gpus[position] = gpu
        else:
            announced = bool(gpu.uuid)
            gpu.handle, gpu.uuid, gpu.model, gpu.lost = handle, uuid, model, False
            gpu.last_time_us = None
            gpu.slots = {}
            gpu.layout_stale = True
            if announced:
                ctx.health.append(
                    GpuHealth(
                        node=self.node,
                        gpu_uuid=uuid,
                        gpu_index=gpu.index,
                        kind=HealthKind.RECOVERED,
                        detail=f"GPU {gpu.index} answers again",
                        time_us=ctx.now_us,
                        source=SampleSource.NVML,
                    )
                )
        self._by_handle[_handle_key(handle)] = gpu.index
        return gpu
