"""Health alerts from the inventory's health fold (pure): what a batch's changed records raise
or resolve, compared with the records before it.

- a GPU leaving `healthy` raises a `tally.gpu.health.alert` (state, the fault's meaning, since);
  one getting worse (degraded → unhealthy) raises another of the same episode (its id names the
  state, so delivery sends it and Alertmanager updates the same alert);
- a GPU back to `healthy` resolves its episode (`tally.gpu.health.resolved`);
- anything else (a fault that only repeats the state, a record that is only reported again)
  raises nothing, so a redelivered batch — which changes no record — raises nothing either.

Ids are content-derived (`ledger.fleet_alerts.HealthAlert.id`): the same change always makes
the same alert, and delivery deduplicates it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.fleet_alerts import FleetKind, HealthAlert
from ledger.inventory.gpu import GpuHealthState, InventoryGpu

RANK = {GpuHealthState.HEALTHY: 0, GpuHealthState.DEGRADED: 1, GpuHealthState.UNHEALTHY: 2}


def health_alerts(
    before: Mapping[str, InventoryGpu], changed: Mapping[str, InventoryGpu]
) -> tuple[HealthAlert, ...]:
    """The alerts `changed` raises or resolves over `before`, by GPU UUID."""
    out: list[HealthAlert] = []
    for uuid in sorted(changed):
        new, old = changed[uuid], before.get(uuid)
        was = old.health if old is not None else GpuHealthState.HEALTHY
        if RANK[new.health] > RANK[was]:
            out.append(_alert(new, FleetKind.GPU_HEALTH, new.health_since_us, new.health_since_us))
        elif new.health is GpuHealthState.HEALTHY and was is not GpuHealthState.HEALTHY:
            assert old is not None
            out.append(
                _alert(new, FleetKind.GPU_HEALTH_RESOLVED, old.health_since_us, new.health_since_us)
            )
    return tuple(out)


def _alert(
    gpu: InventoryGpu, kind: FleetKind, since_us: int | None, at_us: int | None
) -> HealthAlert:
    since = since_us if since_us is not None else gpu.last_seen_us
    return HealthAlert(
        kind=kind,
        gpu_uuid=gpu.uuid,
        node=gpu.node,
        pool=gpu.pool,
        model=gpu.model,
        state=gpu.health.value,
        reason=gpu.health_reason
        or ("healthy again" if kind is FleetKind.GPU_HEALTH_RESOLVED else gpu.health.value),
        since_us=since,
        at_us=at_us if at_us is not None else since,
        faults=gpu.faults,
    )
