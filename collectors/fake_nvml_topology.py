"""The fake NVML's topology calls (a mixin of `collectors.fake_nvml.FakeNvml`), answering as
nvidia-ml-py 13.x does:

- `nvmlDeviceGetPciInfo(handle)`: an `nvmlPciInfo_t` (busId read back as str, domain/bus/device as
  integers); a GPU's address is `FakeGpu.pci_bus_id`, else one derived from its position;
- `nvmlDeviceGetNvLinkState(handle, link)`: 1 (active) or 0; NotSupported on a GPU without
  NVLink (`FakeGpu.nvlinks is None`); InvalidArgument for a link the GPU does not have;
- `nvmlDeviceGetNvLinkRemotePciInfo(handle, link)`: the far end's `nvmlPciInfo_t` (another
  GPU's or an NVSwitch's address); NotSupported without NVLink, InvalidArgument past the last
  link or on an inactive link;
- `nvmlDeviceGetNumaNodeId(handle)`: `FakeGpu.numa_node`, NotSupported where it is None (as
  on x86 hosts, where NVML answers only for GPUs that are NUMA nodes themselves);
- `nvmlDeviceGetTopologyCommonAncestor(a, b)`: INTERNAL for one GPU, NODE for GPUs under one
  CPU socket (`FakeGpu.cpu_socket`), SYSTEM across sockets. MIG device handles get
  NotSupported from all of these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

if TYPE_CHECKING:
    from collectors.fake_nvml import FakeGpu, FakeHandle


def pci_info(bus_id: str) -> Any:
    """The binding's `nvmlPciInfo_t` for a bus id "DDDDDDDD:BB:DD.F"."""
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    return pynvml.nvmlPciInfo_t(
        busIdLegacy=bus_id[-12:].encode(),
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(device, 16),
        pciDeviceId=0x20B510DE,
        pciSubSystemId=0x147F10DE,
        busId=bus_id.encode(),
    )


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


class TopologyCalls:
    """NVML's topology queries over the fake's GPUs."""

    gpus: list[FakeGpu]

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        raise NotImplementedError  # FakeNvml's

    def _address_gpus(self) -> None:
        for position, gpu in enumerate(self.gpus):
            if not gpu.pci_bus_id:
                gpu.pci_bus_id = f"00000000:{(0x18 + position * 0x10) % 0x100:02X}:00.0"

    def _whole(self, name: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._gpu(name, handle)
        if handle.mig is not None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _link(self, name: str, handle: FakeHandle, link: int) -> str | None:
        gpu = self._whole(name, handle)
        if gpu.nvlinks is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert gpu.nvlinks is not None
        if not 0 <= link < min(len(gpu.nvlinks), pynvml.NVML_NVLINK_MAX_LINKS):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        return pci_info(self._whole("nvmlDeviceGetPciInfo", handle).pci_bus_id)

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        remote = self._link("nvmlDeviceGetNvLinkState", handle, link)
        return int(pynvml.NVML_FEATURE_DISABLED if remote is None else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> Any:
        remote = self._link("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        if remote is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert remote is not None
        return pci_info(remote)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:
        gpu = self._whole("nvmlDeviceGetNumaNodeId", handle)
        if gpu.numa_node is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert gpu.numa_node is not None
        return gpu.numa_node

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeHandle, second: FakeHandle) -> int:
        a = self._whole("nvmlDeviceGetTopologyCommonAncestor", first)
        b = self._whole("nvmlDeviceGetTopologyCommonAncestor", second)
        if a is b:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.cpu_socket == b.cpu_socket:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)
