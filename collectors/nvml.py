"""The NVML collector: one sampling round of every local GPU as `GpuSample`s and `GpuHealth`s.

This module owns `NvmlCollector`: its lifecycle (NVML started and released, the GPUs opened),
the round (one timestamp, every GPU sampled, lost GPUs probed), turning one GPU's readings into
samples (whole GPU or one per MIG instance, power and energy apportioned), and health (XID
events, GPU lost and recovered). The only exception it raises is `NvmlUnavailableError`, at
start; failures during a round become values: a field set to None, a `GpuHealth` event, or a
line in `RoundResult.problems` (each problem is reported once). The reading itself lives in:

    nvml_device      NvmlPort (`pynvml` or `collectors.fake_nvml.FakeNvml`), the translation of
                     NVML errors (in one place, `classify`), the per-GPU state carried between
                     rounds, DeviceReader: one field under the error rules, MIG layout, energy
    nvml_processes   ProcessReader: processes per GPU instance, their SM utilisation, owners
    nvml_topology    each GPU's NVLink domain and NUMA node (`NvmlCollector.topology()`)

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
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from collectors.errors import NvmlUnavailableError
from collectors.nvml_device import (
    DEFAULT_TOTAL_SLICES,
    INIT_MESSAGES,
    NOT_AVAILABLE_U32,
    DeviceReader,
    Failure,
    GpuLost,
    GpuState,
    NvmlPort,
    Problems,
    classify,
    describe,
    identity_problem,
    nvml_text,
    pct,
)
from collectors.nvml_health import HealthWatch
from collectors.nvml_processes import ProcessOwnerResolver, ProcessReader, occupancy_util
from collectors.nvml_topology import read_topology
from ledger.events import (
    GpuHealth,
    GpuSample,
    HealthKind,
    MigInstance,
    ProcessUsage,
    SampleSource,
)
from ledger.fractional import lay_out
from ledger.topology import GpuTopology

Clock = Callable[[], int]

MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 3600.0
_MAX_EVENTS_PER_ROUND = 1024
_GAP_INTERVALS = 3
_TEMP_GPU = pynvml.NVML_TEMPERATURE_GPU
_CLOCK_SM = pynvml.NVML_CLOCK_SM
_XID_EVENTS = pynvml.nvmlEventTypeXidCriticalError


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


def _handle_key(handle: Any) -> Hashable:
    """A hashable identity for a device handle: the C pointer's address, or the object itself."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle  # type: ignore[no-any-return]


def _in_range(value: int | None, hi: int) -> int | None:
    return value if value is not None and 0 <= value <= hi else None


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
        self._layout_refresh = layout_refresh_rounds
        self._gpus: list[GpuState] = []
        self._by_handle: dict[Hashable, int] = {}
        self._event_set: Any = None
        self._problems = Problems()
        self._device = DeviceReader(nvml, self._problems)
        self._health = HealthWatch(self._device, node)
        self._processes = ProcessReader(
            self._device, self._problems, owner_resolver, owner_refresh_rounds
        )
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
            message = INIT_MESSAGES.get(code, f"NVML could not start: {describe(exc)}")
            raise NvmlUnavailableError(message) from exc
        try:
            count = nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self._shutdown_quietly()
            raise NvmlUnavailableError(f"NVML cannot count the GPUs: {describe(exc)}") from exc
        if count == 0:
            self._shutdown_quietly()
            raise NvmlUnavailableError("the NVIDIA driver is loaded but sees no GPU on this node")
        self._by_handle.clear()
        self._gpus = []
        for index in range(count):  # one by one: each GPU's UUID must differ from the others'
            self._gpus.append(self._open_gpu(index))
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._event_set = None
            self._problems.report(
                "events", f"XID events are unavailable on this node: {describe(exc)}"
            )
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

    def topology(self) -> dict[str, GpuTopology]:
        """Each open GPU's NVLink domain and NUMA node as NVML tells them, by UUID
        (`collectors.nvml_topology`; best effort, never raises)."""
        self.start()
        gpus = [(g.index, g.uuid, g.handle) for g in self._gpus if not g.lost]
        return read_topology(self._nvml, gpus, self.node)

    def _shutdown_quietly(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):  # nothing left to release
            self._nvml.nvmlShutdown()

    def _open_gpu(self, index: int) -> GpuState:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = GpuState(
                index=index,
                handle=handle,
                uuid=nvml_text(nvml.nvmlDeviceGetUUID(handle)),
                model=nvml_text(nvml.nvmlDeviceGetName(handle)),
            )
            problem = identity_problem(gpu.uuid, gpu.model, {g.uuid for g in self._gpus})
        except pynvml.NVMLError as exc:
            problem = describe(exc)
        if problem is not None:
            # Its UUID is unknown, so no health event names it; it is probed every round.
            self._problems.report(f"open/{index}", f"GPU {index} cannot be read: {problem}")
            return GpuState(index=index, handle=None, uuid="", model="", lost=True)
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
            gpu: GpuState | None = listed
            if listed.lost:
                gpu = self._probe(position, listed, ctx)
            if gpu is None:
                continue
            try:
                if gpu.xid_registered is None:
                    self._register_xid(gpu)
                self._sample(gpu, ctx, xids.get(gpu.index, []))
            except GpuLost as lost:
                self._mark_lost(gpu, ctx, str(lost))
        self._processes.forget_unseen(ctx.seen_owners)
        return RoundResult(tuple(ctx.samples), tuple(ctx.health), self._problems.take())

    # ------------------------------------------------------------------ sampling one GPU

    def _sample(self, gpu: GpuState, ctx: _Round, xids: list[tuple[int, int]]) -> None:
        nvml = self._nvml
        now = ctx.now_us
        if gpu.last_time_us is not None and now <= gpu.last_time_us:
            self._problems.report(
                "clock", "the clock did not advance between rounds; round skipped"
            )
            return
        interval = (
            self.interval_us
            if gpu.last_time_us is None
            else min(now - gpu.last_time_us, _GAP_INTERVALS * self.interval_us)
        )
        h = gpu.handle
        mode = self._device.call(gpu, "MIG mode", nvml.nvmlDeviceGetMigMode, h)
        enabled = mode is not None and int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
        if enabled != gpu.mig_enabled:
            gpu.mig_enabled = enabled
            gpu.layout_stale = True
            gpu.slots = {}
            gpu.skip -= {"utilization", "process utilization"}
        gpu.layout_age += 1
        if enabled and (gpu.layout_stale or gpu.layout_age >= self._layout_refresh):
            self._device.load_layout(gpu)

        utils = self._processes.utils(gpu)
        by_gi = self._processes.by_instance(gpu, utils, ctx.seen_owners, self._round)
        if enabled and any(gi not in gpu.slots for gi in by_gi):
            self._device.load_layout(gpu)
            for gi in by_gi:
                if gi not in gpu.slots:
                    self._problems.report(
                        f"{gpu.uuid}/gi{gi}",
                        f"GPU {gpu.index} ({gpu.uuid}): processes in unknown GPU instance {gi} "
                        "are not sampled",
                    )
        temperature = self._device.call(
            gpu, "temperature", nvml.nvmlDeviceGetTemperature, h, _TEMP_GPU
        )
        sm_clock = self._device.call(gpu, "SM clock", nvml.nvmlDeviceGetClockInfo, h, _CLOCK_SM)
        ctx.health.extend(self._health.read(gpu, now))
        power = self._device.call(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h)
        energy, energy_delta = self._device.energy(gpu, self._round)
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
            memory = self._device.call(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
            rates = None
            if not enabled:
                rates = self._device.call(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
            if memory is not None:
                gpu.memory_total = int(memory.total)
            ctx.samples.append(
                make(
                    util=pct(rates.gpu) if rates is not None else occupancy_util(processes),
                    util_mem=pct(rates.memory) if rates is not None else None,
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

        total_slices = gpu.total_slices or DEFAULT_TOTAL_SLICES
        apportioned = 0  # energy given to instances this round; the rest is the spare slices'
        placed, rest = lay_out([slot.mig for slot in gpu.slots.values()])
        layout = {m.gpu_instance_id: m for m in placed}  # each instance's accounting place
        for gi, slot in gpu.slots.items():
            processes = by_gi.get(gi, [])
            memory = self._device.mig_call(gpu, slot, "MIG memory", nvml.nvmlDeviceGetMemoryInfo)
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
                    util=occupancy_util(processes),
                    util_mem=None,
                    used=int(memory.used)
                    if memory is not None
                    else sum(p.used_memory_bytes for p in processes),
                    total=slot.memory_total,
                    power_mw=None if power is None else int(power) * slices // total_slices,
                    energy_mj=slot_energy,
                    mig=layout.get(gi, slot.mig),
                    processes=processes,
                    xid_errors=sum(1 for _, x_gi in xids if x_gi in (gi, NOT_AVAILABLE_U32))
                    if gpu.xid_registered
                    else None,
                    energy_delta_mj=slot_delta or None,
                )
            )
        if rest is not None:  # slices no instance occupies: unallocated capacity, and its energy
            spare_energy = energy_delta - apportioned if energy is not None else 0
            ctx.samples.append(
                make(0, None, 0, 0, None, None, rest, [], None, spare_energy or None)
            )

    # ------------------------------------------------------------------ health

    def _register_xid(self, gpu: GpuState) -> None:
        if self._event_set is None:
            gpu.xid_registered = False
            return
        try:
            self._nvml.nvmlDeviceRegisterEvents(gpu.handle, _XID_EVENTS, self._event_set)
        except pynvml.NVMLError as exc:
            self._device.failed(gpu, "XID events", exc)
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
                if classify(exc) is not Failure.TIMEOUT:
                    code = getattr(exc, "value", None)
                    self._problems.report(f"events/{code}", f"reading XID events: {describe(exc)}")
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

    def _mark_lost(self, gpu: GpuState, ctx: _Round, detail: str) -> None:
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

    def _probe(self, position: int, gpu: GpuState, ctx: _Round) -> GpuState | None:
        """The GPU again if it answers now (RECOVERED when it was announced lost), else None."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
            model = gpu.model or nvml_text(nvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError:
            return None
        others = {g.uuid for i, g in enumerate(self._gpus) if i != position}
        if identity_problem(uuid, model, others) is not None:
            return None
        if gpu.uuid and uuid != gpu.uuid:
            self._problems.report(
                f"replaced/{gpu.index}/{uuid}",
                f"GPU {gpu.index} was {gpu.uuid} and now answers as {uuid}; sampling the new one",
            )
            gpu = GpuState(index=gpu.index, handle=handle, uuid=uuid, model=model, lost=False)
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
