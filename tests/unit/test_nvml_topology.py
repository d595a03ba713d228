"""What NVML says of where GPUs sit (`collectors.nvml_topology`), on fake nodes shaped like real
ones: an NVSwitch board, NVLink-bridged PCIe pairs, a GPU without NVLink, a coherent platform
where NVML knows the NUMA node, a lost GPU, and a driver writing a 4-digit PCI domain."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from collectors.fake_nvml import FakeGpu, FakeNvml, gpu_uuid, mixed_node
from collectors.nvml import NvmlCollector
from ledger.topology import GpuTopology

SWITCHES = [f"00000000:{0xA0 + s:02X}:00.0" for s in range(4)]


def nvswitch_board() -> FakeNvml:
    """Eight GPUs, each with 18 links over four NVSwitches; sockets 0 and 1 by halves."""
    gpus = [
        FakeGpu(gpu_uuid(i), nvlinks=[SWITCHES[link % 4] for link in range(18)], cpu_socket=i // 4)
        for i in range(8)
    ]
    return FakeNvml(gpus)


def bridged_pairs(domain_digits: int = 8) -> FakeNvml:
    """Four PCIe GPUs, NVLink-bridged in pairs (0, 1) and (2, 3); one socket."""
    buses = [0x18, 0x28, 0x38, 0x48]
    gpus = []
    for i, bus in enumerate(buses):
        partner = buses[i ^ 1]
        far = f"{'0' * domain_digits}:{partner:02X}:00.0"
        gpus.append(FakeGpu(gpu_uuid(i), pci_bus_id=f"00000000:{bus:02X}:00.0", nvlinks=[far] * 4))
    return FakeNvml(gpus)


def coherent() -> FakeNvml:
    """Two GPUs that are NUMA nodes themselves (NVML answers nvmlDeviceGetNumaNodeId)."""
    gpus = [FakeGpu(gpu_uuid(i), numa_node=4 + i, nvlinks=[SWITCHES[0]] * 18) for i in range(2)]
    return FakeNvml(gpus)


def lost_partner() -> FakeNvml:
    fake = bridged_pairs()
    fake.gpus[1].lost = True
    return fake


def no_ancestor() -> FakeNvml:
    fake = bridged_pairs()
    for gpu in fake.gpus:
        gpu.unsupported.add("nvmlDeviceGetTopologyCommonAncestor")
        gpu.unsupported.add("nvmlDeviceGetNvLinkState")
    return fake


@dataclass(frozen=True)
class Case:
    node: Callable[[], FakeNvml]
    expect: dict[int, GpuTopology]  # GPU index → topology (absent: NVML says nothing)


def t(domain: str | None, numa: int | None) -> GpuTopology:
    return GpuTopology(nvlink_domain=domain, numa_node=numa)


CASES = {
    "nvswitch-board-is-one-domain-two-numa-nodes": Case(
        nvswitch_board, {i: t("n/nvlink0", i // 4) for i in range(8)}
    ),
    "bridged-pairs-are-two-domains": Case(
        bridged_pairs,
        {0: t("n/nvlink0", 0), 1: t("n/nvlink0", 0), 2: t("n/nvlink2", 0), 3: t("n/nvlink2", 0)},
    ),
    "a-4-digit-pci-domain-names-the-same-gpu": Case(
        lambda: bridged_pairs(4),
        {0: t("n/nvlink0", 0), 1: t("n/nvlink0", 0), 2: t("n/nvlink2", 0), 3: t("n/nvlink2", 0)},
    ),
    "mixed-node-one-bridge-inactive-links-and-no-nvlink": Case(
        mixed_node, {0: t("n/nvlink0", 0), 1: t("n/nvlink0", 0), 2: t(None, 0), 3: t(None, 1)}
    ),
    "numa-from-nvml-where-it-knows": Case(coherent, {0: t("n/nvlink0", 4), 1: t("n/nvlink0", 5)}),
    "a-lost-gpu-is-left-out-its-partner-keeps-a-domain": Case(
        lost_partner, {0: t("n/nvlink0", 0), 2: t("n/nvlink2", 0), 3: t("n/nvlink2", 0)}
    ),
    "nothing-supported-nothing-known": Case(no_ancestor, {}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_topology_from_nvml(case: Case) -> None:
    fake = case.node()
    collector = NvmlCollector(fake, "n", "pool", interval_s=1)
    with collector:
        found = collector.topology()
    by_index = {i: g.uuid for i, g in enumerate(fake.gpus)}
    assert found == {by_index[i]: where for i, where in case.expect.items()}
