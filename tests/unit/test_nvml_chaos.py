"""NVML quirks all at once, drawn by Hypothesis: any call of any round may raise any of the
binding's errors (NotSupported, NoPermission, GpuIsLost, Unknown, Timeout, Uninitialized,
NotFound, InsufficientSize, …) or answer with a value at the edge of its C type (0, u32 and u64
maxima, memory used above the total, empty and control-character names, processes of pid 0
with unknown or 2⁶⁴-1 bytes), and processes vanish between the calls that list them and the
calls that measure them.

The collector (`collectors.nvml.NvmlCollector` on the fake NVML, `collectors.fake_nvml`) must
never raise from `collect_round`: each round's samples survive the event codec (so every value
is an integer in its range), their subjects are distinct, and a round after the chaos stops is
a full, clean round again. `tests/unit/test_nvml_collector.py` has each quirk as a scenario;
this runs them together (`CHAOS_EXAMPLES` examples of `ROUNDS` rounds each).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.fake_nvml import GIB, FakeNvml, FakeProcess, mixed_node
from collectors.nvml import NvmlCollector
from ledger.events import sample_to_dict
from ledger.sample_decode import sample_from_dict
from tests.unit.test_nvml_collector import stepping_clock

CHAOS_EXAMPLES = 60
ROUNDS = 4
U32 = 0xFFFFFFFF
U64 = 2**64 - 1

ERRORS = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_UNKNOWN,
    pynvml.NVML_ERROR_TIMEOUT,
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_NOT_FOUND,
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
)
# what a call may answer besides its true value: the edges of its C type
EDGE_INTS = (0, 1, U32, U32 - 1, 2**31, U64, 2**63)
EDGE_TEXT = ("", "\x00", "GPU-\x1b[2J", "G" * 300, "ü")
CALLS = (
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlEventSetWait",
)


def _edge_value(name: str, true: Any, draw: st.DrawFn) -> Any:
    """A value of the same C shape as `true`, at an edge."""
    if isinstance(true, bool):
        return true
    if isinstance(true, int):
        if name == "nvmlDeviceGetCount":
            return draw(st.sampled_from((0, 1, 17)))
        return draw(st.sampled_from(EDGE_INTS))
    if isinstance(true, str):
        return draw(st.sampled_from(EDGE_TEXT))
    if isinstance(true, list) and name == "nvmlDeviceGetComputeRunningProcesses":
        for proc in true:  # the binding's objects: mutate their fields
            proc.pid = draw(st.sampled_from((proc.pid, 0, U32)))
            proc.usedGpuMemory = draw(st.sampled_from((proc.usedGpuMemory, None, 0, U64)))
        return true
    if isinstance(true, list) and true and isinstance(true[0], int):  # MIG mode [current, pending]
        return [draw(st.sampled_from((0, 1, 2, U32))) for _ in true]
    if isinstance(true, ctypes.Structure):
        for field_name, kind in type(true)._fields_:
            if kind in (ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_uint64, ctypes.c_uint32):
                limit = U32 if kind in (ctypes.c_uint, ctypes.c_uint32) else U64
                setattr(true, field_name, min(draw(st.sampled_from(EDGE_INTS)), limit))
        return true
    return true


class ChaosNvml:
    """The fake NVML with a drawn fault or edge value on some calls; constants and the calls
    not chosen pass through unchanged."""

    def __init__(self, fake: FakeNvml, draw: st.DrawFn) -> None:
        self._fake = fake
        self._draw = draw
        self.chaos = True
        self.faults = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._fake, name)
        if name not in CALLS:
            return real

        def call(*args: Any) -> Any:
            if self.chaos:
                what = self._draw(st.sampled_from(("pass",) * 4 + ("raise", "edge", "vanish")))
                if what == "raise":
                    self.faults += 1
                    raise pynvml.NVMLError(self._draw(st.sampled_from(ERRORS)))
                if what == "vanish":  # processes leave between the calls about them
                    for gpu in self._fake.gpus:
                        gpu.processes = gpu.processes[: len(gpu.processes) // 2]
                result = real(*args)
                if what == "edge":
                    self.faults += 1
                    return _edge_value(name, result, self._draw)
                return result
            return real(*args)

        return call


def _check(samples: Any) -> None:
    subjects = [s.subject for s in samples]
    assert len(subjects) == len(set(subjects))
    for sample in samples:
        assert sample_from_dict(sample_to_dict(sample)) == sample


@settings(
    max_examples=CHAOS_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_nvml_quirk_stops_a_round_or_makes_an_invalid_sample(data):
    fake = mixed_node()
    chaos = ChaosNvml(fake, data.draw)
    chaos.chaos = False  # a failed start is a clear error by design (test_nvml_collector)
    clock: Callable[[], int] = stepping_clock()
    collector = NvmlCollector(chaos, "node-1", "a100", clock=clock)  # type: ignore[arg-type]
    collector.start()
    chaos.chaos = True
    for _ in range(ROUNDS):
        result = collector.collect_round()
        _check(result.samples)
        for problem in result.problems:
            assert isinstance(problem, str) and len(problem) < 4096
        fake.tick(10)
        fake.add_process(0, FakeProcess(data.draw(st.integers(1000, 1010)), used_memory=GIB))
    chaos.chaos = False
    for gpu in fake.gpus:
        gpu.lost = False
    calm = collector.collect_round()  # once NVML answers again, every GPU is sampled
    _check(calm.samples)
    assert {s.gpu_index for s in calm.samples} == set(range(len(fake.gpus)))
