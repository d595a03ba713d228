"""What NVML says of where each GPU of this node sits: its NVLink domain and its NUMA node.

`read_topology(nvml, gpus, node)` takes the node's GPUs as (index, UUID, handle) and returns
each one's `GpuTopology` (only what NVML could tell; labels add the rest,
`collectors.inventory`):

- NVLink: links 0, 1, … until the GPU has no more (`nvmlDeviceGetNvLinkState` answers
  InvalidArgument past its last link, NotSupported on a GPU without NVLink). The far end of an
  active link (`nvmlDeviceGetNvLinkRemotePciInfo`) is another GPU of this node, known by its PCI
  address (`nvmlDeviceGetPciInfo`), or an NVSwitch. GPUs joined by links, directly or through
  a switch, form one domain, named `<node>/nvlink<k>` with k the lowest GPU index in it. A GPU
  with no active link has no domain. PCI addresses compare as (domain, bus, device) numbers,
  never as text (drivers write the domain with 4 or 8 digits).
- NUMA: `nvmlDeviceGetNumaNodeId` where NVML knows it (platforms whose GPUs are NUMA nodes);
  otherwise GPUs whose common ancestor (`nvmlDeviceGetTopologyCommonAncestor`) is at most
  `NVML_TOPOLOGY_NODE` share a NUMA node, the groups numbered 0, 1, … by their lowest GPU
  index (the OS's numbering on the usual two-socket host, not a promise: the scheduler only
  compares them within a node).

Best effort: an NVML error leaves that fact unknown for that GPU; nothing here raises an
NVMLError. Read once at start: topology does not change while the driver is loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pynvml

from ledger.topology import MAX_NUMA, GpuTopology

PciKey = tuple[int, int, int]
_TOPOLOGY_NODE = pynvml.NVML_TOPOLOGY_NODE


def _pci_key(info: Any) -> PciKey:
    return (int(info.domain), int(info.bus), int(info.device))


class _Joined:
    """Union-find over GPUs and the switches their links reach."""

    def __init__(self) -> None:
        self.parent: dict[object, object] = {}

    def find(self, item: object) -> object:
        self.parent.setdefault(item, item)
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def join(self, a: object, b: object) -> None:
        self.parent[self.find(a)] = self.find(b)


def _remote_ends(nvml: Any, handle: Any) -> list[PciKey] | None:
    """The PCI address at the far end of each active link; None without NVLink."""
    ends: list[PciKey] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError_InvalidArgument:
            break  # past the GPU's last link
        except pynvml.NVMLError:
            if link == 0:
                return None  # no NVLink on this GPU
            break
        if active != pynvml.NVML_FEATURE_ENABLED:
            continue
        try:
            ends.append(_pci_key(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except pynvml.NVMLError:
            continue
    return ends


def nvlink_domains(nvml: Any, gpus: Sequence[tuple[int, str, Any]], node: str) -> dict[str, str]:
    """GPU UUID → its NVLink domain, for the GPUs with an active link."""
    joined = _Joined()
    by_pci: dict[PciKey, str] = {}
    ends: dict[str, list[PciKey]] = {}
    for _, uuid, handle in gpus:
        with contextlib.suppress(pynvml.NVMLError):
            by_pci[_pci_key(nvml.nvmlDeviceGetPciInfo(handle))] = uuid
        found = _remote_ends(nvml, handle)
        if found:
            ends[uuid] = found
    for uuid, remote in ends.items():
        for end in remote:
            joined.join(("gpu", uuid), ("gpu", by_pci[end]) if end in by_pci else ("pci", end))
    names: dict[object, str] = {}
    domains: dict[str, str] = {}
    for index, uuid, _ in sorted(gpus):
        if uuid in ends:
            root = joined.find(("gpu", uuid))
            domains[uuid] = names.setdefault(root, f"{node}/nvlink{index}")
    return domains


def numa_nodes(nvml: Any, gpus: Sequence[tuple[int, str, Any]]) -> dict[str, int]:
    """GPU UUID → its NUMA node, where NVML tells it or the PCI tree implies it."""
    numa: dict[str, int] = {}
    for _, uuid, handle in gpus:
        with contextlib.suppress(pynvml.NVMLError):
            numa[uuid] = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    told = {u: n for u, n in numa.items() if 0 <= n <= MAX_NUMA}
    if len(numa) == len(gpus):
        return told
    groups: list[list[tuple[int, str, Any]]] = []
    for gpu in sorted(gpus):
        for group in groups:
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(group[0][2], gpu[2])
            except pynvml.NVMLError:
                return told
            if level <= _TOPOLOGY_NODE:
                group.append(gpu)
                break
        else:
            groups.append([gpu])
    return {uuid: number for number, group in enumerate(groups) for _, uuid, _ in group}


def read_topology(
    nvml: Any, gpus: Sequence[tuple[int, str, Any]], node: str
) -> dict[str, GpuTopology]:
    """Each GPU's topology as NVML tells it (GPUs NVML says nothing of are left out)."""
    domains = nvlink_domains(nvml, gpus, node)
    numa = numa_nodes(nvml, gpus)
    found = {}
    for _, uuid, _ in gpus:
        topology = GpuTopology(nvlink_domain=domains.get(uuid), numa_node=numa.get(uuid))
        if topology.known:
            found[uuid] = topology
    return found
