"""An in-memory NVML: the same function names, struct shapes and errors as `pynvml`, scripted.

This module owns the fake side of the NVML port. `FakeNvml` answers every function in
`collectors.nvml.NvmlPort` the way nvidia-ml-py 13.x does:

- names and UUIDs are `str` (the binding's `convertStrBytes` decodes them); a MIG device
  handle's UUID is the device's own, `MIG-<UUID>` as drivers since R470 give it (`FakeMig.uuid`,
  else one derived from the GPU's UUID and the instance ids: `fake_mig_uuid`), or — on a GPU
  with `legacy_mig_uuids`, as R450/R460 drivers did — `MIG-GPU-<GPU UUID>/<gi>/<ci>`;
- memory, utilisation, process-utilisation samples, device attributes and GPU-instance profile
  info are the binding's own ctypes structures; running processes are `nvmlFriendlyObject`s
  with `pid`, `usedGpuMemory` (None when the driver cannot say), `gpuInstanceId`,
  `computeInstanceId` (0xFFFFFFFF outside MIG), exactly as the binding builds them;
- errors are the real `pynvml.NVMLError(code)`, which the binding maps to its subclasses
  (`NVMLError_NotSupported`, `NVMLError_GpuIsLost`, …);
- `nvmlDeviceGetProcessUtilization(handle, ts)` returns samples newer than `ts` (the latest per
  process when `ts` is 0) and raises NotFound when there are none;
- `nvmlEventSetWait(set, 0)` pops one pending event or raises Timeout;
- the topology queries (PCI info, NVLink state and far ends, NUMA node, common ancestor) are in
  `collectors.fake_nvml_topology`, from `FakeGpu.pci_bus_id`, `nvlinks`, `numa_node`,
  `cpu_socket`.

State is plain mutable data (`FakeGpu`, `FakeProcess`, `FakeMig`) that a test changes between
rounds; `tick(seconds)` advances the fake's clock, integrates energy and records utilisation
samples. Optional per-call latencies are paid in sleeps (no CPU), carried until at least 1 ms
is owed so timer slack does not inflate them. Every call is counted in `calls`, and the
timestamps passed to `nvmlDeviceGetProcessUtilization` are kept in `process_util_timestamps`.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from collectors.fake_nvml_topology import TopologyCalls

NOT_AVAILABLE_U32 = 0xFFFFFFFF
GIB = 1 << 30
MIB = 1 << 20
_MIN_SLEEP_S = 0.001

# Typical per-call latencies on a datacentre GPU (order of magnitude, not measured here):
# cheap cached getters are microseconds; power/energy go through the SMBus/PMU; process queries
# walk the driver's client list.
REALISTIC_LATENCY_S: Mapping[str, float] = {
    "nvmlDeviceGetCount": 5e-6,
    "nvmlDeviceGetHandleByIndex": 10e-6,
    "nvmlDeviceGetUUID": 10e-6,
    "nvmlDeviceGetName": 10e-6,
    "nvmlDeviceGetMemoryInfo": 40e-6,
    "nvmlDeviceGetUtilizationRates": 60e-6,
    "nvmlDeviceGetPowerUsage": 300e-6,
    "nvmlDeviceGetTotalEnergyConsumption": 300e-6,
    "nvmlDeviceGetTemperature": 60e-6,
    "nvmlDeviceGetClockInfo": 30e-6,
    "nvmlDeviceGetMigMode": 20e-6,
    "nvmlDeviceGetComputeRunningProcesses": 400e-6,
    "nvmlDeviceGetProcessUtilization": 800e-6,
    "nvmlEventSetWait": 10e-6,
}


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """A device handle: a whole GPU (`mig is None`) or the MIG device at `mig` of GPU `gpu`."""

    gpu: int
    mig: int | None = None


@dataclass(frozen=True, slots=True)
class FakeEventSet:
    id: int


@dataclass(slots=True)
class FakeEventData:
    """The fields of `c_nvmlEventData_t` the collector reads."""

    device: FakeHandle
    eventType: int  # the binding's field names
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass(slots=True)
class FakeProcess:
    """A compute process on a GPU; `gi`/`ci` place it in a MIG instance."""

    pid: int
    used_memory: int | None = 4 * GIB
    sm_util: int | None = 50
    mem_util: int = 20
    gi: int = NOT_AVAILABLE_U32
    ci: int = NOT_AVAILABLE_U32


@dataclass(slots=True)
class FakeMig:
    """A MIG device (one compute instance of one GPU instance)."""

    gi: int
    ci: int
    profile: str
    slices: int
    memory_total: int
    memory_used: int = 0
    uuid: str = ""


@dataclass(slots=True)
class FakeGpu:
    """One fake GPU. `unsupported`/`no_permission` name NVML functions that fail on it.

    `no_permission` applies to the parent handle only, like NVML's rule that aggregate MIG
    queries on the parent need privileges while a MIG device handle answers for its instance.
    """

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total: int = 80 * GIB
    memory_used: int = 0
    util_gpu: int = 0
    util_mem: int = 0
    power_mw: int = 60_000
    energy_mj: int = 1_000_000
    temperature_c: int = 35
    sm_clock_mhz: int = 1410
    ecc_dbe: int = 0  # volatile uncorrected ECC errors
    retired_pending: bool = False
    clock_reasons: int = 0  # nvmlClocksEventReason* bits
    mig_capable: bool = True
    mig_enabled: bool = False
    max_mig_devices: int = 7
    total_slices: int = 7
    migs: dict[int, FakeMig] = field(default_factory=dict)  # MIG device index → device
    processes: list[FakeProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    no_permission: set[str] = field(default_factory=set)
    lost: bool = False
    xid_supported: bool = True
    pending_xids: list[tuple[int, int]] = field(default_factory=list)  # (xid, gi)
    util_samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # ts,pid,sm,mem
    pci_bus_id: str = ""  # "00000000:BB:00.0"; empty: one derived from its position
    nvlinks: list[str | None] | None = None  # per link, the far end's bus id (None: inactive)
    numa_node: int | None = None  # what nvmlDeviceGetNumaNodeId says (None: NotSupported)
    cpu_socket: int = 0  # the socket its PCI tree hangs off (nvmlDeviceGetTopologyCommonAncestor)
    legacy_mig_uuids: bool = False  # MIG devices named as before R470: MIG-<GPU UUID>/<gi>/<ci>


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


class FakeNvml(TopologyCalls):
    """A scripted NVML library; see the module docstring for what it mimics."""

    # The binding's constants the collector may read off the module it is given.
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(
        self,
        gpus: Iterable[FakeGpu],
        *,
        init_error: int | None = None,
        latency_s: Mapping[str, float] | None = None,
        start_us: int = 1_793_491_200_000_000,
    ) -> None:
        self.gpus: list[FakeGpu] = list(gpus)
        self.init_error = init_error
        self.latency_s: Mapping[str, float] = latency_s or {}
        self.now_us = start_us
        self.initialised = 0
        self.calls: Counter[str] = Counter()
        self.process_util_timestamps: dict[int, list[int]] = {}
        self._owed_s = 0.0
        self._event_sets: dict[int, set[int]] = {}
        self._next_set = 1
        for gpu in self.gpus:
            self._name_migs(gpu)
        self._address_gpus()

    # ------------------------------------------------------------------ scripting

    def tick(self, seconds: float = 10.0) -> None:
        """Advance time: integrate energy from power, record one utilisation sample a process."""
        step_us = round(seconds * 1_000_000)
        self.now_us += step_us
        for gpu in self.gpus:
            gpu.energy_mj += gpu.power_mw * step_us // 1_000_000
            for proc in gpu.processes:
                if proc.sm_util is not None:
                    gpu.util_samples.append((self.now_us, proc.pid, proc.sm_util, proc.mem_util))
            del gpu.util_samples[: max(0, len(gpu.util_samples) - 256)]

    def add_process(self, gpu: int, process: FakeProcess) -> None:
        self.gpus[gpu].processes.append(process)

    def remove_process(self, gpu: int, pid: int) -> None:
        self.gpus[gpu].processes = [p for p in self.gpus[gpu].processes if p.pid != pid]

    def inject_xid(self, gpu: int, xid: int, gi: int = NOT_AVAILABLE_U32) -> None:
        self.gpus[gpu].pending_xids.append((xid, gi))

    def settle(self) -> None:
        """Pay any latency still owed (call at the end of a measured round)."""
        if self._owed_s > 0:
            time.sleep(self._owed_s)
            self._owed_s = 0.0

    def _name_migs(self, gpu: FakeGpu) -> None:
        for mig in gpu.migs.values():
            if not mig.uuid:
                mig.uuid = fake_mig_uuid(gpu.uuid, mig.gi, mig.ci)

    # ------------------------------------------------------------------ plumbing

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        latency = self.latency_s.get(name)
        if latency:
            self._owed_s += latency
            if self._owed_s >= _MIN_SLEEP_S:
                time.sleep(self._owed_s)
                self._owed_s = 0.0
        if not self.initialised:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        self._enter(name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.gpu]
        if gpu.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.no_permission and handle.mig is None:
            _raise(pynvml.NVML_ERROR_NO_PERMISSION)
        if name in gpu.unsupported:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, gpu: FakeGpu, handle: FakeHandle) -> FakeMig:
        assert handle.mig is not None
        mig = gpu.migs.get(handle.mig)
        if mig is None or not gpu.mig_enabled:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert mig is not None
        return mig

    # ------------------------------------------------------------------ the NVML API

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            _raise(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        if handle.mig is None:
            return gpu.uuid
        mig = self._mig(gpu, handle)
        if gpu.legacy_mig_uuids:
            return f"MIG-{gpu.uuid}/{mig.gi}/{mig.ci}"
        return mig.uuid or fake_mig_uuid(gpu.uuid, mig.gi, mig.ci)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        gpu = self._gpu("nvmlDeviceGetName", handle)
        if handle.mig is None:
            return gpu.name
        return f"{gpu.name} MIG {self._mig(gpu, handle).profile}"

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is None:
            total, used = gpu.memory_total, gpu.memory_used
            if gpu.mig_enabled:
                used = sum(m.memory_used for m in gpu.migs.values())
        else:
            mig = self._mig(gpu, handle)
            total, used = mig.memory_total, mig.memory_used
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_enabled or handle.mig is not None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if clock_type != pynvml.NVML_CLOCK_SM:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.sm_clock_mhz

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, error_type: int, counter_type: int
    ) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counter_type != pynvml.NVML_VOLATILE_ECC:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc_dbe

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return int(
            pynvml.NVML_FEATURE_ENABLED if gpu.retired_pending else pynvml.NVML_FEATURE_DISABLED
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if not gpu.mig_capable:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        return gpu.max_mig_devices if gpu.mig_capable else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not gpu.mig_enabled or not 0 <= index < gpu.max_mig_devices:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index not in gpu.migs:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(gpu, handle).gi

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetComputeInstanceId", handle)
        if handle.mig is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(gpu, handle).ci

    def nvmlDeviceGetAttributes(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetAttributes", handle)
        if handle.mig is None:
            slices, memory = 0, gpu.memory_total
        else:
            mig = self._mig(gpu, handle)
            slices, memory = mig.slices, mig.memory_total
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.gpuInstanceSliceCount = slices
        attrs.computeInstanceSliceCount = slices
        attrs.memorySizeMB = memory // MIB
        return attrs

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: FakeHandle, profile: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        full = {
            8: pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
            7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
            6: pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
            4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        }
        if not gpu.mig_capable or full.get(gpu.total_slices) != profile:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = gpu.total_slices
        info.instanceCount = 1
        info.memorySizeMB = gpu.memory_total // MIB
        return info

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = gpu.processes
        if handle.mig is not None:
            mig = self._mig(gpu, handle)
            procs = [p for p in procs if p.gi == mig.gi and p.ci == mig.ci]
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_memory,
                    "gpuInstanceId": p.gi,
                    "computeInstanceId": p.ci,
                    "usedGpuCcProtectedMemory": 0,
                }
            )
            for p in procs
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timestamp: int) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetProcessUtilization", handle)
        self.process_util_timestamps.setdefault(handle.gpu, []).append(timestamp)
        if gpu.mig_enabled or handle.mig is not None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if timestamp == 0:
            latest: dict[int, tuple[int, int, int, int]] = {}
            for sample in gpu.util_samples:
                latest[sample[1]] = sample
            chosen = list(latest.values())
        else:
            chosen = [s for s in gpu.util_samples if s[0] > timestamp]
        if not chosen:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for ts, pid, sm, mem in chosen:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = pid, ts, sm, mem
            out.append(sample)
        return out

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet(self._next_set)
        self._next_set += 1
        self._event_sets[event_set.id] = set()
        return event_set

    def nvmlDeviceRegisterEvents(
        self, handle: FakeHandle, event_types: int, event_set: FakeEventSet
    ) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_supported:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if event_set.id not in self._event_sets:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            self._event_sets[event_set.id].add(handle.gpu)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait")
        registered = self._event_sets.get(event_set.id)
        if registered is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert registered is not None
        for index in sorted(registered):
            gpu = self.gpus[index]
            if gpu.pending_xids:
                xid, gi = gpu.pending_xids.pop(0)
                return FakeEventData(
                    FakeHandle(index), pynvml.nvmlEventTypeXidCriticalError, xid, gi, 0
                )
        _raise(pynvml.NVML_ERROR_TIMEOUT)
        raise AssertionError  # unreachable: _raise always raises

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        self._event_sets.pop(event_set.id, None)


# ---------------------------------------------------------------------------- scenarios


def fake_mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    """A MIG device's own UUID as R470+ drivers form it (`MIG-` and a UUID of its own, not the
    GPU's), derived deterministically from the GPU's UUID and the instance ids."""
    digest = hashlib.sha256(f"{gpu_uuid}/{gi}/{ci}".encode()).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-5{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


def gpu_uuid(index: int, node: int = 0) -> str:
    """A readable, valid-looking GPU UUID."""
    return f"GPU-{node:08x}-{index:04x}-4000-8000-{index:012x}"


def mig_gpu(uuid: str, layout: Iterable[tuple[int, str, int]], **kwargs: Any) -> FakeGpu:
    """A MIG-enabled A100 80GB with MIG devices given as (gpu instance id, profile, slices)."""
    migs = {}
    for index, (gi, profile, slices) in enumerate(layout):
        memory_gb = int(profile.split(".")[1].removesuffix("gb"))
        migs[index] = FakeMig(
            gi=gi, ci=0, profile=profile, slices=slices, memory_total=memory_gb * GIB
        )
    return FakeGpu(uuid=uuid, mig_enabled=True, migs=migs, **kwargs)


def mixed_node() -> FakeNvml:
    """Four GPUs: two busy plain A100s, one MIG A100 (3g + 2g + 1g), one idle V100 (no MIG).
    GPUs 0 and 1 share an NVLink bridge (links 0–3; 4–11 inactive); the V100, on the second
    CPU socket, has no NVLink.

    Processes have pids 1001.. on GPU 0, 2001.. on GPU 1, 3001.. on GPU 2 (in MIG instances).
    """
    busy = FakeGpu(
        uuid=gpu_uuid(0),
        memory_used=30 * GIB,
        util_gpu=93,
        util_mem=40,
        power_mw=350_000,
        processes=[FakeProcess(1001, 20 * GIB, 60), FakeProcess(1002, 10 * GIB, 30)],
    )
    half = FakeGpu(
        uuid=gpu_uuid(1),
        memory_used=12 * GIB,
        util_gpu=45,
        util_mem=10,
        power_mw=180_000,
        processes=[FakeProcess(2001, 12 * GIB, 45)],
    )
    mig = mig_gpu(gpu_uuid(2), [(1, "3g.40gb", 3), (5, "2g.20gb", 2), (13, "1g.10gb", 1)])
    mig.power_mw = 210_000
    mig.migs[0].memory_used = 18 * GIB
    mig.migs[1].memory_used = 6 * GIB
    mig.processes = [
        FakeProcess(3001, 18 * GIB, 70, gi=1, ci=0),
        FakeProcess(3002, 6 * GIB, 20, gi=5, ci=0),
    ]
    old = FakeGpu(
        uuid=gpu_uuid(3),
        name="Tesla V100-SXM2-32GB",
        memory_total=32 * GIB,
        mig_capable=False,
        power_mw=40_000,
        unsupported={"nvmlDeviceGetTotalEnergyConsumption"},
    )
    busy.nvlinks = ["00000000:28:00.0"] * 4 + [None] * 8
    half.nvlinks = ["00000000:18:00.0"] * 4 + [None] * 8
    mig.nvlinks, old.cpu_socket = [None] * 12, 1
    fake = FakeNvml([busy, half, mig, old])
    fake.tick(1.0)
    return fake


def busy_node(
    gpus: int = 8, processes_per_gpu: int = 16, latency_s: Mapping[str, float] | None = None
) -> FakeNvml:
    """`gpus` plain H100s, each shared by `processes_per_gpu` processes (pids g*1000 + 1 …)."""
    fleet = []
    for g in range(gpus):
        procs = [
            FakeProcess(pid=(g + 1) * 1000 + p, used_memory=2 * GIB, sm_util=(p * 7) % 60)
            for p in range(1, processes_per_gpu + 1)
        ]
        fleet.append(
            FakeGpu(
                uuid=gpu_uuid(g),
                name="NVIDIA H100 80GB HBM3",
                memory_used=2 * GIB * processes_per_gpu,
                util_gpu=80,
                util_mem=30,
                power_mw=500_000,
                processes=procs,
            )
        )
    fake = FakeNvml(fleet, latency_s=latency_s)
    fake.tick(1.0)
    return fake
