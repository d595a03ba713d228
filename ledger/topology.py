"""GPU topology: where a GPU sits (`GpuTopology`: NVLink/NVSwitch domain, NUMA node, InfiniBand
rail, rack), what a job may require of its GPUs (`TopologyNeed`), and how a GPU's topology is
read from labels over what NVML discovered.

Labels (node labels, per-GPU labels over them): `topology.nvlink_domain`, `topology.numa_node`
(an integer), `topology.rail`, `topology.rack`. A label wins over what NVML discovered (an
operator knows the NVSwitch fabric spanning nodes; NVML sees one node). Names are opaque
strings: GPUs with equal `nvlink_domain` share one NVLink domain, whatever nodes they are on.

Schemas: `topology_to_dict` writes only the fields that are set and `topology_of` reads that
object (strictly: a wrong type is `EventError`); a GPU with no topology writes nothing, so a
record without topology is what it always was. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from ledger.errors import EventError

MAX_NAME = 256
MAX_NUMA = 1023
LABEL_PREFIX = "topology."
LABEL_KEYS = ("nvlink_domain", "numa_node", "rail", "rack")


class TopologyNeed(StrEnum):
    """What a job requires of its GPUs: all on one node, in one NVLink domain, or on one IB
    rail (the nodes of one rail group). None: preferences only."""

    NODE = "node"
    NVLINK = "nvlink"
    RAIL = "rail"


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """Where one GPU sits; None: not known."""

    nvlink_domain: str | None = None
    numa_node: int | None = None
    rail: str | None = None
    rack: str | None = None

    def __post_init__(self) -> None:
        for name in ("nvlink_domain", "rail", "rack"):
            value = getattr(self, name)
            if value is not None and (not value or len(value) > MAX_NAME):
                raise EventError(f"topology.{name}: expected 1 to {MAX_NAME} characters")
        if self.numa_node is not None and not 0 <= self.numa_node <= MAX_NUMA:
            raise EventError(f"topology.numa_node: expected an integer in [0, {MAX_NUMA}]")

    @property
    def known(self) -> bool:
        return self != NO_TOPOLOGY


NO_TOPOLOGY = GpuTopology()


def topology_to_dict(topology: GpuTopology) -> dict[str, Any]:
    """The fields that are set (an empty object for none)."""
    return {k: getattr(topology, k) for k in LABEL_KEYS if getattr(topology, k) is not None}


def topology_of(data: Any) -> GpuTopology:
    """Decode `topology_to_dict`'s object (None or absent: no topology); raises EventError."""
    if data is None:
        return NO_TOPOLOGY
    if type(data) is not dict or not data.keys() <= set(LABEL_KEYS):
        raise EventError(f"topology: expected an object with keys among {list(LABEL_KEYS)}")
    numa = data.get("numa_node")
    if numa is not None and type(numa) is not int:
        raise EventError("topology.numa_node: expected an integer")
    for key in ("nvlink_domain", "rail", "rack"):
        if data.get(key) is not None and type(data[key]) is not str:
            raise EventError(f"topology.{key}: expected a string")
    return GpuTopology(data.get("nvlink_domain"), numa, data.get("rail"), data.get("rack"))


def from_labels(
    discovered: GpuTopology, *labels: Mapping[str, str] | tuple[tuple[str, str], ...]
) -> GpuTopology:
    """`discovered` with each `topology.*` label of `labels` (later mappings win) over it. A
    `topology.numa_node` that is not an integer in range is ignored, like an empty value."""
    changes: dict[str, Any] = {}
    for mapping in labels:
        for key, value in dict(mapping).items():
            name = key.removeprefix(LABEL_PREFIX)
            if key == name or name not in LABEL_KEYS or not value or len(value) > MAX_NAME:
                continue
            if name == "numa_node":
                if not value.isdigit() or int(value) > MAX_NUMA:
                    continue
                changes[name] = int(value)
            else:
                changes[name] = value
    return replace(discovered, **changes) if changes else discovered
