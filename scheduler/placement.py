"""Placement: which free GPUs of a flavor a job gets.

Rules:
- all or nothing: a job gets exactly the GPUs it asked for, or no placement;
- best fit: a job that fits on one node goes to the node with the fewest free GPUs that still
  holds it, keeping whole nodes free for large gangs;
- a multi-node gang takes the emptiest nodes first (fewest nodes), and its remainder goes to
  the best-fitting node; a job that may not span nodes never does;
- among equally good nodes the first in the index wins (a perfect fit ends the search), so
  placement is deterministic for a given event history.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.model import GpuRef


def _best_fit(free: Mapping[str, tuple[str, ...]], gpus: int, skip: set[str]) -> str | None:
    best: str | None = None
    best_free = 0
    for node, uuids in free.items():
        n = len(uuids)
        if n < gpus or node in skip:
            continue
        if best is None or n < best_free:
            best, best_free = node, n
            if n == gpus:
                break
    return best


def place(
    free: Mapping[str, tuple[str, ...]], gpus: int, span_nodes: bool
) -> tuple[GpuRef, ...] | None:
    """GPUs for a job of `gpus` GPUs from `free` (node → free UUIDs), or None if it cannot fit."""
    node = _best_fit(free, gpus, set())
    if node is not None:
        return tuple(GpuRef(uuid, node) for uuid in sorted(free[node])[:gpus])
    if not span_nodes or sum(len(u) for u in free.values()) < gpus:
        return None
    chosen: list[GpuRef] = []
    used: set[str] = set()
    remaining = gpus
    for name, uuids in sorted(free.items(), key=lambda item: (-len(item[1]), item[0])):
        if remaining <= len(uuids):
            break
        chosen.extend(GpuRef(uuid, name) for uuid in sorted(uuids))
        used.add(name)
        remaining -= len(uuids)
    last = _best_fit(free, remaining, used)
    if last is None:  # cannot happen: the total sufficed and only whole nodes were taken
        return None
    chosen.extend(GpuRef(uuid, last) for uuid in sorted(free[last])[:remaining])
    return tuple(chosen)
