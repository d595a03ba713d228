"""Reading NVML devices: the `NvmlPort` the collector is given (`pynvml` or
`collectors.fake_nvml.FakeNvml`), the translation of NVML errors, the per-GPU state carried
between rounds, and the reads that follow the error rules (`DeviceReader`): one field of a GPU
or MIG instance, the MIG layout, the energy counter.

Rules (the collector's docstring, `collectors.nvml`, has the rest):
- NVML error codes are interpreted in one place, `classify`. NotSupported and NoPermission are
  permanent for a GPU and field: that field is None and not asked again (until the GPU's MIG
  mode changes). Other errors make the field None this round. GpuIsLost (also GpuNotFound,
  ResetRequired, and a driver gone mid-run) on any call raises `GpuLost`, which the collector
  catches for the round; it never leaves `collectors.nvml`.
- Energy: the counter is made monotonic. The driver's counter can restart (driver reload, GPU
  reset) or wrap; a decrease is taken as a restart from zero, so the energy of that interval is
  the new raw value, never negative.
- MIG layout: one `MigSlot` per GPU instance (compute instances of one GPU instance are merged
  under the lowest CI id); a slot keeps its energy state while its instance is unchanged. The
  total slice count is the largest full-GPU profile the GPU supports (7 when none answers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import pynvml

from ledger.errors import EventError
from ledger.excerpts import shown
from ledger.mig_devices import mig_uuid
from ledger.sample_types import MAX_ENERGY_DELTA_MJ, MAX_SLICES, MAX_TEXT, MigInstance

NOT_AVAILABLE_U32 = 0xFFFFFFFF
MIB = 1 << 20
# Full-GPU instance profiles, largest first: the first one a GPU supports gives its slice count.
_FULL_PROFILES = (
    pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
)
DEFAULT_TOTAL_SLICES = 7
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
    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: int, counter_type: int, /
    ) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, /) -> int: ...
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


class Problems:
    """Problems reported once per key, collected until the round takes them."""

    def __init__(self) -> None:
        self._reported: set[str] = set()
        self._new: list[str] = []

    def report(self, key: str, message: str) -> None:
        """Report `message` once per `key` (problems found by start() go out with round one)."""
        if key not in self._reported:
            self._reported.add(key)
            self._new.append(message)

    def take(self) -> tuple[str, ...]:
        """The problems reported since the last call."""
        new, self._new = tuple(self._new), []
        return new


# ---------------------------------------------------------------------------- error translation


class Failure(StrEnum):
    UNSUPPORTED = "unsupported"
    NO_PERMISSION = "no permission"
    NO_DATA = "no data"
    LOST = "lost"
    TIMEOUT = "timeout"
    OTHER = "error"


_FAILURES = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: Failure.UNSUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: Failure.UNSUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: Failure.NO_PERMISSION,
    pynvml.NVML_ERROR_NOT_FOUND: Failure.NO_DATA,
    pynvml.NVML_ERROR_NO_DATA: Failure.NO_DATA,
    pynvml.NVML_ERROR_GPU_IS_LOST: Failure.LOST,
    pynvml.NVML_ERROR_GPU_NOT_FOUND: Failure.LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: Failure.LOST,
    # Mid-run, a driver that went away takes every GPU with it.
    pynvml.NVML_ERROR_UNINITIALIZED: Failure.LOST,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: Failure.LOST,
    pynvml.NVML_ERROR_TIMEOUT: Failure.TIMEOUT,
}

INIT_MESSAGES = {
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


def classify(exc: pynvml.NVMLError) -> Failure:
    """The one place NVML error codes are interpreted."""
    return _FAILURES.get(getattr(exc, "value", None), Failure.OTHER)


def describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # the binding's __str__ may itself call into a missing library
        return repr(exc)


class GpuLost(Exception):
    """Internal: a call on this GPU said it is gone; the round skips the GPU."""


# ---------------------------------------------------------------------------- per-GPU state


@dataclass(slots=True)
class MigSlot:
    handle: Any
    mig: MigInstance
    memory_total: int
    energy_start: int | None = None  # the instance's counter at its first sample
    energy_numerator: int = 0  # Σ parent energy delta × slices since then


@dataclass(slots=True)
class GpuState:
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
    slots: dict[int, MigSlot] = field(default_factory=dict)  # GPU instance id → slot
    total_slices: int | None = None
    layout_age: int = 0
    layout_stale: bool = True
    xid_registered: bool | None = None  # None: not tried yet; False: cannot


def nvml_text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def identity_problem(uuid: str, model: str, taken: Collection[str] = ()) -> str | None:
    """Why a UUID or model name NVML gave cannot name a GPU's samples (empty, longer than a
    sample carries, with control characters, or another GPU's UUID: a driver fault, not a
    name), or None."""
    for what, text in (("UUID", uuid), ("name", model)):
        if not text or len(text) > MAX_TEXT or not text.isprintable():
            return f"its {what} {shown(text, 80)} is not usable"
    if uuid in taken:
        return f"it answers with the UUID of another GPU, {uuid}"
    return None


def pct(value: Any) -> int:
    return min(100, max(0, int(value)))


def _profile_of(mig_name: str) -> str:
    match = _MIG_PROFILE.search(mig_name)
    profile = match.group(1) if match else mig_name.strip()
    if not profile or len(profile) > MAX_TEXT or not profile.isprintable():
        return "unknown"  # no name a sample can carry
    return profile


def _slices_of(profile: str) -> int | None:
    match = _PROFILE_SLICES.search(profile)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------------- reads with the rules


class DeviceReader:
    """NVML calls for one GPU's fields with the error rules applied; problems go to `problems`."""

    def __init__(self, nvml: NvmlPort, problems: Problems) -> None:
        self.nvml = nvml
        self._problems = problems

    def failed(self, gpu: GpuState, what: str, exc: pynvml.NVMLError) -> Failure:
        """Apply the error rules to a failed call for `gpu`'s field `what`."""
        failure = classify(exc)
        if failure is Failure.LOST:
            raise GpuLost(describe(exc)) from exc
        label = f"GPU {gpu.index} ({gpu.uuid}): {what}"
        if failure in (Failure.UNSUPPORTED, Failure.NO_PERMISSION):
            gpu.skip.add(what)
            consequence = "left empty"
            if gpu.mig_enabled and what == "process utilization":
                consequence = "MIG instances report occupancy as utilisation"
            elif what == "utilization":
                consequence = "utilisation derived from its processes"
            self._problems.report(
                f"{gpu.uuid}/{what}/{failure}", f"{label}: {failure}; {consequence}"
            )
        elif failure is not Failure.NO_DATA:
            code = getattr(exc, "value", None)
            self._problems.report(f"{gpu.uuid}/{what}/{code}", f"{label} failed: {describe(exc)}")
        return failure

    def call(self, gpu: GpuState, what: str, fn: Callable[..., Any], *args: Any) -> Any | None:
        """`fn(*args)` for `gpu`'s field `what`, or None when NVML cannot answer."""
        if what in gpu.skip:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            self.failed(gpu, what, exc)
            return None

    def mig_call(self, gpu: GpuState, slot: MigSlot, what: str, fn: Callable[..., Any]) -> Any:
        """`fn(slot.handle)`; an instance that stops answering makes the layout stale."""
        if what in gpu.skip:
            return None
        try:
            return fn(slot.handle)
        except pynvml.NVMLError as exc:
            if self.failed(gpu, what, exc) not in (Failure.UNSUPPORTED, Failure.NO_PERMISSION):
                gpu.layout_stale = True
            return None

    def energy(self, gpu: GpuState, round_no: int) -> tuple[int | None, int]:
        """(monotonic energy counter in mJ, mJ since the previous reading), or (None, 0)."""
        raw = self.call(gpu, "energy", self.nvml.nvmlDeviceGetTotalEnergyConsumption, gpu.handle)
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
            self._problems.report(
                f"{gpu.uuid}/energy-reset/{round_no}",
                f"GPU {gpu.index} ({gpu.uuid}): energy counter went back from {previous} to "
                f"{raw} mJ; counted as a restart",
            )
        else:
            delta = raw - previous
        if delta > MAX_ENERGY_DELTA_MJ:
            # A rise no GPU makes in one interval: a glitch. Rebased, so nothing is added.
            gpu.energy_base -= delta
            delta = 0
            self._problems.report(
                f"{gpu.uuid}/energy-jump/{round_no}",
                f"GPU {gpu.index} ({gpu.uuid}): energy counter jumped from {previous} to "
                f"{raw} mJ; counted as a glitch",
            )
        gpu.energy_raw = raw
        return gpu.energy_base + raw, delta

    def load_layout(self, gpu: GpuState) -> None:
        """Read the GPU's MIG devices into one slot per GPU instance."""
        nvml = self.nvml
        gpu.layout_stale = False
        gpu.layout_age = 0
        if gpu.total_slices is None:
            gpu.total_slices = self.total_slices(gpu)
        total = gpu.total_slices
        count = self.call(gpu, "MIG devices", nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        found: dict[int, MigSlot] = {}
        for index in range(int(count or 0)):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
                gi = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
                ci = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
            except pynvml.NVMLError as exc:
                if classify(exc) is Failure.LOST:
                    raise GpuLost(describe(exc)) from exc
                if exc.value not in (
                    pynvml.NVML_ERROR_NOT_FOUND,
                    pynvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    self.failed(gpu, f"MIG device {index}", exc)
                continue  # an empty MIG device index
            existing = found.get(gi)
            if existing is not None:
                if ci < existing.mig.compute_instance_id:
                    existing.handle = handle
                    existing.mig = MigInstance(
                        gi,
                        ci,
                        existing.mig.profile,
                        existing.mig.slices,
                        total,
                        uuid=self.mig_uuid(gpu, handle),
                    )
                continue
            name = self.call(gpu, "MIG name", nvml.nvmlDeviceGetName, handle)
            profile = _profile_of(nvml_text(name)) if name is not None else "unknown"
            attrs = self.call(gpu, "MIG attributes", nvml.nvmlDeviceGetAttributes, handle)
            slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
            slices = slices or _slices_of(profile) or 1
            uuid = self.mig_uuid(gpu, handle)
            mig = MigInstance(gi, ci, profile, min(slices, total), total, uuid=uuid)
            memory_total = int(attrs.memorySizeMB) * MIB if attrs is not None else 0
            previous = gpu.slots.get(gi)
            if previous is not None and previous.mig == mig:
                previous.handle = handle
                found[gi] = previous
            else:
                found[gi] = MigSlot(handle, mig, memory_total)
        gpu.slots = dict(sorted(found.items()))

    def mig_uuid(self, gpu: GpuState, handle: Any) -> str | None:
        """The MIG device's own UUID (`nvmlDeviceGetUUID` on its handle: `MIG-<UUID>` since
        R470, `MIG-GPU-<GPU UUID>/<gi>/<ci>` before — both what CUDA accepts); None when NVML
        cannot say or answers something else."""
        raw = self.call(gpu, "MIG UUID", self.nvml.nvmlDeviceGetUUID, handle)
        try:
            return None if raw is None else mig_uuid(nvml_text(raw))
        except EventError:
            return None

    def total_slices(self, gpu: GpuState) -> int:
        for profile in _FULL_PROFILES:
            try:
                info = self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, profile)
            except pynvml.NVMLError as exc:
                if classify(exc) is Failure.LOST:
                    raise GpuLost(describe(exc)) from exc
                continue
            if 0 < int(info.sliceCount) <= MAX_SLICES:  # else no count a GPU has
                return int(info.sliceCount)
        return DEFAULT_TOTAL_SLICES
