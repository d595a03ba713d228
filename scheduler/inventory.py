"""The scheduler's copy of the GPU inventory (the compacted `inventory` topic), and which of its
GPUs new placements may use.

- `FleetInventory.on_record(value)` folds one message of the topic (a GPU's newest record, by
  UUID; an older record than the one held is ignored, so a replay in any order ends the same);
- `placeable_nodes(gpus, now, stale_after_intervals)` (pure): the nodes, as the core's `Node`s,
  of the GPUs that are not unhealthy, not cordoned and not stale at `now`
  (`ledger.inventory.status_of`; a degraded GPU still takes work). A node whose GPUs are of
  several (pool, model) flavors becomes one `Node` per flavor, named `<node>/<model>` (a MIG
  flavor's model names its profile), and carries its GPUs' topology (`ledger.topology`). A GPU
  that no collector has reported does not exist for the scheduler;
- `FleetInventory.sync(state, now)` hands the placeable nodes to the state
  (`SchedulerState.set_fleet`) when they differ from the last ones it handed over. Running
  jobs keep GPUs that went stale; only new placements avoid them;
- `unhealthy(gpus)` (pure): the unhealthy GPUs and why; the service stops and requeues the jobs
  running there (`scheduler.health`). A cordoned GPU only gets no new placements;
- `device_ids`: GPU UUID → its index on its node, what `CUDA_VISIBLE_DEVICES` says (the local
  executor reads this mapping as it changes).

MIG: a GPU in MIG mode is never placed whole; each MIG instance its collector reported is
placed on its own, as a GPU of the flavor `(pool, <model>/<profile>)` named `<GPU UUID>/gi<id>`
(`scheduler.fractional.mig_units`), and `device_ids` maps it to its `MIG-…` device name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ledger.errors import EventError
from ledger.inventory import GpuHealthState, GpuStatus, InventoryGpu, decode_record, status_of
from ledger.topology import GpuTopology
from scheduler.fractional import mig_devices, mig_units
from scheduler.model import Node
from scheduler.state import SchedulerState

log = logging.getLogger("tally.scheduler")


def placeable(gpu: InventoryGpu, now_us: int, stale_after_intervals: int) -> bool:
    """Whether new placements may use `gpu` at `now_us`: not unhealthy (a degraded GPU still
    takes work), not cordoned, not stale."""
    live = status_of(gpu.last_seen_us, gpu.interval_us, now_us, stale_after_intervals)
    usable = gpu.health is not GpuHealthState.UNHEALTHY and not gpu.cordoned
    return usable and live is GpuStatus.LIVE


def unhealthy(gpus: Iterable[InventoryGpu]) -> dict[str, str]:
    """The unhealthy GPUs (UUID → why): the jobs running there are stopped and requeued."""
    return {
        g.uuid: g.health_reason or "unhealthy" for g in gpus if g.health is GpuHealthState.UNHEALTHY
    }


def placeable_nodes(
    gpus: Iterable[InventoryGpu], now_us: int, stale_after_intervals: int
) -> tuple[Node, ...]:
    """The nodes of the GPUs new placements may use at `now_us`, by name, GPUs by UUID."""
    groups: dict[str, dict[tuple[str, str], list[tuple[str, GpuTopology]]]] = {}
    for gpu in gpus:
        if placeable(gpu, now_us, stale_after_intervals):
            flavors = groups.setdefault(gpu.node, {})
            for model, uuid, topology in mig_units(gpu):
                flavors.setdefault((gpu.pool, model), []).append((uuid, topology))
    nodes = []
    for name in sorted(groups):
        flavors = groups[name]
        for (pool, model), held in sorted(flavors.items()):
            label = name if len(flavors) == 1 else f"{name}/{model}"
            held.sort()
            where = tuple((uuid, t) for uuid, t in held if t.known)
            nodes.append(Node(label, pool, model, tuple(uuid for uuid, _ in held), where))
    return tuple(nodes)


class FleetInventory:
    """The inventory topic folded, and what it last handed to the scheduler's state."""

    def __init__(self, stale_after_intervals: int) -> None:
        self.stale_after_intervals = stale_after_intervals
        self.records = 0
        self.refused = 0
        self.gpus: dict[str, InventoryGpu] = {}
        self.device_ids: dict[str, str] = {}
        self._handed: tuple[Node, ...] | None = None

    def on_record(self, value: bytes | None) -> None:
        """Fold one message of the `inventory` topic (a record that cannot be read is logged
        and skipped)."""
        self.records += 1
        if value is None:
            return
        try:
            gpu = decode_record(value)
        except EventError as exc:
            self.refused += 1
            log.warning("ignored an inventory message: %s", exc)
            return
        held = self.gpus.get(gpu.uuid)
        if held is not None and held.last_seen_us > gpu.last_seen_us:
            return
        self.gpus[gpu.uuid] = gpu
        self.device_ids[gpu.uuid] = str(gpu.index)
        self.device_ids.update(mig_devices(gpu))

    def unhealthy(self) -> dict[str, str]:
        return unhealthy(self.gpus.values())

    def nodes(self, now_us: int) -> tuple[Node, ...]:
        return placeable_nodes(self.gpus.values(), now_us, self.stale_after_intervals)

    def status(self, gpu: InventoryGpu, now_us: int) -> GpuStatus:
        return status_of(gpu.last_seen_us, gpu.interval_us, now_us, self.stale_after_intervals)

    def sync(self, state: SchedulerState, now_us: int) -> bool:
        """Give `state` the placeable nodes at `now_us` if they changed; whether they did."""
        nodes = self.nodes(now_us)
        if nodes == self._handed:
            return False
        state.set_fleet(nodes)
        self._handed = nodes
        return True
