"""The NVML port contract, run against the fake and, where a driver answers, the real pynvml.

Every test takes the `nvml` fixture, parametrised over the backends: `fake` (always) and
`pynvml` (skipped with "no NVIDIA driver" when `nvmlInit()` fails). The checks are what
`collectors.nvml.NvmlCollector` relies on: call shapes, struct fields and their types, and that
failures are the binding's `NVMLError` subclass for their code. A check for something a real GPU
may not have (MIG, XID events) accepts NotSupported, but never another kind of answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from collectors.fake_nvml import mixed_node
from collectors.nvml import NvmlCollector
from ledger.events import decode_message, encode_batch, envelope_for

NOT_AVAILABLE_U32 = 0xFFFFFFFF
FULL_PROFILES = (
    pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
)


@pytest.fixture(params=["fake", "pynvml"])
def nvml(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "fake":
        port: Any = mixed_node()
    else:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            pytest.skip("no NVIDIA driver")
        pynvml.nvmlShutdown()
        port = pynvml
    port.nvmlInit()
    try:
        yield port
    finally:
        port.nvmlShutdown()


def handles(nvml: Any) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


def optional(fn: Any, *args: Any, allowed: tuple[int, ...] = ()) -> Any:
    """`fn(*args)`, or None when it fails with NotSupported (or a code in `allowed`).

    Whatever it raises must be the binding's subclass for the error's code.
    """
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        assert type(exc) is pynvml.nvmlExceptionClass(exc.value)
        if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, *allowed):
            return None
        raise


def is_uint(value: Any) -> bool:
    return type(value) is int and value >= 0


# ---------------------------------------------------------------------------- the binding itself


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVMLError_NoPermission"),
        (pynvml.NVML_ERROR_NOT_FOUND, "NVMLError_NotFound"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost"),
        (pynvml.NVML_ERROR_TIMEOUT, "NVMLError_Timeout"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded"),
        (pynvml.NVML_ERROR_UNINITIALIZED, "NVMLError_Uninitialized"),
    ],
)
def test_error_codes_become_their_subclasses(code: int, name: str) -> None:
    by_code = pynvml.NVMLError(code)
    assert type(by_code).__name__ == name
    assert isinstance(by_code, getattr(pynvml, name)) and isinstance(by_code, pynvml.NVMLError)
    assert by_code.value == code
    assert getattr(pynvml, name)().value == code  # the subclass alone knows its code
    with pytest.raises(getattr(pynvml, name)):
        raise pynvml.NVMLError(code)


# ---------------------------------------------------------------------------- the port


def test_init_and_shutdown_nest(nvml: Any) -> None:
    nvml.nvmlInit()
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() >= 1  # still initialised by the fixture


def test_devices_have_string_uuids_and_names(nvml: Any) -> None:
    uuids = []
    for handle in handles(nvml):
        uuid, name = nvml.nvmlDeviceGetUUID(handle), nvml.nvmlDeviceGetName(handle)
        assert type(uuid) is str and uuid.startswith("GPU-")
        assert type(name) is str and name
        uuids.append(uuid)
    assert len(set(uuids)) == len(uuids)


def test_memory_struct(nvml: Any) -> None:
    for handle in handles(nvml):
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        assert is_uint(memory.total) and is_uint(memory.used) and is_uint(memory.free)
        assert memory.total > 0 and memory.used <= memory.total


def test_utilisation_struct(nvml: Any) -> None:
    for handle in handles(nvml):
        rates = optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            assert is_uint(rates.gpu) and rates.gpu <= 100
            assert is_uint(rates.memory) and rates.memory <= 100


def test_scalar_readings_are_integers(nvml: Any) -> None:
    for handle in handles(nvml):
        for value in (
            optional(nvml.nvmlDeviceGetPowerUsage, handle),
            optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle),
            optional(nvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            optional(nvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        ):
            assert value is None or is_uint(value)


def test_not_supported_is_its_subclass(nvml: Any) -> None:
    """Whatever a device does not support fails as NVMLError_NotSupported, nothing vaguer."""
    for handle in handles(nvml):
        for fn in (nvml.nvmlDeviceGetTotalEnergyConsumption, nvml.nvmlDeviceGetMigMode):
            try:
                fn(handle)
            except pynvml.NVMLError_NotSupported as exc:
                assert exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_running_processes(nvml: Any) -> None:
    for handle in handles(nvml):
        processes = optional(
            nvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
            allowed=(pynvml.NVML_ERROR_NO_PERMISSION,),
        )
        for p in processes or ():
            assert is_uint(p.pid)
            assert p.usedGpuMemory is None or is_uint(p.usedGpuMemory)
            assert is_uint(p.gpuInstanceId) and is_uint(p.computeInstanceId)


def test_process_utilisation_is_samples_or_not_found(nvml: Any) -> None:
    for handle in handles(nvml):
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NotSupported):
            continue
        newest = 0
        for s in samples:
            assert is_uint(s.pid) and is_uint(s.timeStamp)
            assert is_uint(s.smUtil) and is_uint(s.memUtil)
            newest = max(newest, s.timeStamp)
        try:
            later = nvml.nvmlDeviceGetProcessUtilization(handle, newest)
        except pynvml.NVMLError_NotFound:
            continue
        assert all(s.timeStamp > newest for s in later)


def test_mig_mode_and_devices(nvml: Any) -> None:
    for handle in handles(nvml):
        mode = optional(nvml.nvmlDeviceGetMigMode, handle)
        if mode is None:
            continue
        current, pending = mode
        assert current in (0, 1) and pending in (0, 1)
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            continue
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        assert is_uint(count) and count > 0
        for index in range(count):
            mig = optional(
                nvml.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                index,
                allowed=(pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT),
            )
            if mig is None:
                continue
            assert is_uint(nvml.nvmlDeviceGetGpuInstanceId(mig))
            assert is_uint(nvml.nvmlDeviceGetComputeInstanceId(mig))
            name = nvml.nvmlDeviceGetName(mig)
            assert type(name) is str and "MIG" in name
            # the MIG device's own name for CUDA_VISIBLE_DEVICES: MIG-<UUID> (R470+) or, on
            # older drivers, MIG-GPU-<GPU UUID>/<gi>/<ci>; never the parent GPU's UUID
            uuid = nvml.nvmlDeviceGetUUID(mig)
            assert type(uuid) is str and uuid.startswith("MIG-")
            assert uuid != nvml.nvmlDeviceGetUUID(handle)
            attrs = nvml.nvmlDeviceGetAttributes(mig)
            assert is_uint(attrs.gpuInstanceSliceCount) and attrs.gpuInstanceSliceCount >= 1
            assert is_uint(attrs.memorySizeMB)
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            assert memory.used <= memory.total


def test_full_gpu_instance_profile(nvml: Any) -> None:
    for handle in handles(nvml):
        mode = optional(nvml.nvmlDeviceGetMigMode, handle)
        if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            continue  # the collector asks only MIG-enabled GPUs
        slice_counts = []
        for profile in FULL_PROFILES:
            info = optional(
                nvml.nvmlDeviceGetGpuInstanceProfileInfo,
                handle,
                profile,
                allowed=(pynvml.NVML_ERROR_INVALID_ARGUMENT,),
            )
            if info is not None:
                assert is_uint(info.sliceCount)
                slice_counts.append(info.sliceCount)
        assert slice_counts, "a MIG-capable GPU supports one full-GPU profile"


def test_xid_event_set(nvml: Any) -> None:
    event_set = nvml.nvmlEventSetCreate()
    try:
        for handle in handles(nvml):
            optional(
                nvml.nvmlDeviceRegisterEvents,
                handle,
                pynvml.nvmlEventTypeXidCriticalError,
                event_set,
            )
        for _ in range(64):
            try:
                data = nvml.nvmlEventSetWait(event_set, 0)
            except pynvml.NVMLError_Timeout:
                break
            assert is_uint(data.eventType) and is_uint(data.eventData)
            assert is_uint(data.gpuInstanceId)
    finally:
        nvml.nvmlEventSetFree(event_set)


def test_pci_info(nvml: Any) -> None:
    addresses = []
    for handle in handles(nvml):
        info = nvml.nvmlDeviceGetPciInfo(handle)
        assert type(info.busId) is str and info.busId.count(":") == 2  # the binding decodes
        assert is_uint(info.domain) and is_uint(info.bus) and is_uint(info.device)
        addresses.append((info.domain, info.bus, info.device))
    assert len(set(addresses)) == len(addresses)


def test_nvlink_state_and_far_ends(nvml: Any) -> None:
    """Links answer 0 or 1 up to the GPU's last, then InvalidArgument (NotSupported on a GPU
    without NVLink); an active link's far end is a PCI address."""
    for handle in handles(nvml):
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = optional(
                nvml.nvmlDeviceGetNvLinkState,
                handle,
                link,
                allowed=(pynvml.NVML_ERROR_INVALID_ARGUMENT,),
            )
            if state is None:
                break
            assert state in (pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED)
            if state == pynvml.NVML_FEATURE_ENABLED:
                far = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                assert is_uint(far.domain) and is_uint(far.bus) and type(far.busId) is str


def test_numa_node_and_common_ancestor(nvml: Any) -> None:
    levels = {
        pynvml.NVML_TOPOLOGY_INTERNAL,
        pynvml.NVML_TOPOLOGY_SINGLE,
        pynvml.NVML_TOPOLOGY_MULTIPLE,
        pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        pynvml.NVML_TOPOLOGY_NODE,
        pynvml.NVML_TOPOLOGY_SYSTEM,
    }
    found = handles(nvml)
    for handle in found:
        numa = optional(
            nvml.nvmlDeviceGetNumaNodeId, handle, allowed=(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,)
        )
        assert numa is None or type(numa) is int
    for first, second in itertools.pairwise(found):
        level = optional(nvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
        assert level is None or level in levels - {pynvml.NVML_TOPOLOGY_INTERNAL}


def test_topology_is_read_without_raising(nvml: Any) -> None:
    collector = NvmlCollector(nvml, "contract-node", "contract-pool", interval_s=1)
    with collector:
        topology = collector.topology()
        uuids = {nvml.nvmlDeviceGetUUID(h) for h in handles(nvml)}
    assert set(topology) <= uuids
    for where in topology.values():
        assert where.known and (where.rail, where.rack) == (None, None)
        assert where.nvlink_domain is None or where.nvlink_domain.startswith("contract-node/")


# ---------------------------------------------------------------------------- the collector on it


def test_collector_round(nvml: Any) -> None:
    collector = NvmlCollector(nvml, "contract-node", "contract-pool", interval_s=1)
    with collector:
        first = collector.collect_round()
        second = collector.collect_round()
    assert collector.gpu_count == nvml.nvmlDeviceGetCount()
    for result in (first, second):
        assert {s.gpu_index for s in result.samples} <= set(range(collector.gpu_count))
        assert result.samples, "every GPU that answers is sampled"
        for sample in result.samples:
            for value in (sample.util_gpu_pct, sample.memory_used_bytes, sample.power_mw):
                assert not isinstance(value, float)
        envelopes = [envelope_for(s, collector.source) for s in result.samples]
        decoded, dead = decode_message(encode_batch(envelopes))
        assert dead == [] and len(decoded) == len(envelopes)
