"""Topology-aware placement (pure): which free GPUs of a flavor a gang gets when the fleet knows
where its GPUs sit, and why a job's required topology cannot be met now.

Levels, tightest first:
    numa     one NUMA node of one node, within one NVLink domain where domains are known
    nvlink   one NVLink / NVSwitch domain (may span nodes: an NVL72 rack is one domain)
    rail     one InfiniBand rail group
    rack     one rack
    any      anywhere the flavor has free GPUs (`scheduler.placement.place`)
`place_gang` tries the levels in order. At a level, the GPUs are grouped by that level's name
(GPUs whose topology does not name it sit out); among the groups whose free GPUs can hold the
job, the one with the fewest free GPUs wins (best fit: the big domains stay whole for big
gangs; ties by name), and inside it `placement.place` packs nodes as always. A job that
requires a topology (`ledger.topology.TopologyNeed`) stops at its level: `nvlink` after
nvlink, `rail` after rail; `node` tries every level but never spans nodes. A flavor with no
known topology is placed exactly as `placement.place` places it. `largest_group` says whether
a required domain or rail could ever hold a job (else it never fits, `scheduler.admission`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from ledger.topology import GpuTopology, TopologyNeed
from scheduler.model import GpuRef, Node
from scheduler.placement import place


@dataclass(frozen=True, slots=True)
class GpuPlace:
    """Where one GPU sits: its node and its topology."""

    node: str
    topology: GpuTopology


class Level(StrEnum):
    NUMA = "numa"
    NVLINK = "nvlink"
    RAIL = "rail"
    RACK = "rack"


LEVELS = tuple(Level)
_LAST: Mapping[TopologyNeed | None, int] = {
    None: len(LEVELS),
    TopologyNeed.NODE: len(LEVELS),
    TopologyNeed.NVLINK: LEVELS.index(Level.NVLINK) + 1,
    TopologyNeed.RAIL: LEVELS.index(Level.RAIL) + 1,
}
_NAMES = {TopologyNeed.NVLINK: "one NVLink domain", TopologyNeed.RAIL: "one rail"}
REQUIRED = frozenset(_NAMES)  # the needs that topology alone can refuse


def group_of(level: Level, where: GpuPlace) -> Hashable | None:
    """The name of the group a GPU is in at `level`, or None where its topology does not say."""
    t = where.topology
    if level is Level.NUMA:
        return None if t.numa_node is None else (t.nvlink_domain, where.node, t.numa_node)
    if level is Level.NVLINK:
        return t.nvlink_domain
    return t.rail if level is Level.RAIL else t.rack


def groups_at(
    level: Level, free: Mapping[str, tuple[str, ...]], where: Mapping[str, GpuPlace]
) -> dict[Hashable, dict[str, tuple[str, ...]]]:
    """The free GPUs (node → UUIDs, in `free`'s node order) of each group at `level`."""
    groups: dict[Hashable, dict[str, list[str]]] = {}
    for node, uuids in free.items():
        for uuid in uuids:
            place_of = where.get(uuid)
            key = None if place_of is None else group_of(level, place_of)
            if key is not None:
                groups.setdefault(key, {}).setdefault(node, []).append(uuid)
    return {k: {n: tuple(u) for n, u in nodes.items()} for k, nodes in groups.items()}


def place_gang(
    free: Mapping[str, tuple[str, ...]],
    gpus: int,
    span_nodes: bool,
    need: TopologyNeed | None,
    where: Mapping[str, GpuPlace],
) -> tuple[GpuRef, ...] | None:
    """GPUs for a job of `gpus` GPUs from `free` (node → free UUIDs) at the tightest level
    that holds it, or None if none does within what it requires."""
    span = span_nodes and need is not TopologyNeed.NODE
    if where:
        for level in LEVELS[: _LAST[need]]:
            groups = groups_at(level, free, where)
            sizes = {k: sum(len(u) for u in nodes.values()) for k, nodes in groups.items()}
            for key in sorted(
                (k for k in groups if sizes[k] >= gpus), key=lambda k: (sizes[k], str(k))
            ):
                chosen = place(groups[key], gpus, span)
                if chosen is not None:
                    return chosen
    if need in _NAMES:
        return None
    return place(free, gpus, span)


def largest_group(nodes: Iterable[Node], need: TopologyNeed, where: Mapping[str, GpuPlace]) -> int:
    """The most GPUs of `nodes` in one NVLink domain or rail (`need`), busy or free."""
    level = Level.NVLINK if need is TopologyNeed.NVLINK else Level.RAIL
    every = {n.name: n.gpu_uuids for n in nodes}
    return max(
        (sum(map(len, g.values())) for g in groups_at(level, every, where).values()), default=0
    )


def unmet_detail(
    free: Mapping[str, tuple[str, ...]],
    gpus: int,
    need: TopologyNeed,
    where: Mapping[str, GpuPlace],
    flavor: object,
) -> str:
    """Why a job requiring `need` has no placement though enough GPUs of `flavor` are free."""
    if need is TopologyNeed.NODE:
        most = max((len(u) for u in free.values()), default=0)
        return f"{gpus} GPU(s) of {flavor} on one node wanted; at most {most} free on one node"
    level = Level.NVLINK if need is TopologyNeed.NVLINK else Level.RAIL
    sizes = [sum(len(u) for u in g.values()) for g in groups_at(level, free, where).values()]
    return (
        f"{gpus} GPU(s) of {flavor} in {_NAMES[need]} wanted; at most {max(sizes, default=0)} "
        f"free in one ({sum(len(u) for u in free.values())} free in all)"
    )
