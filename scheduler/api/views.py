"""What the API shows of the scheduler's records: a job (`job_view`), a queue (`queue_views`),
a team's budget and quotas (`balance_view`) and the GPU inventory (`inventory_views`), as the
response models of
`scheduler.api.models`. Times go out as µs and as RFC 3339 in UTC (`rfc3339`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ledger.fractional import share_text
from ledger.topology import topology_to_dict
from ledger.units import US_PER_SECOND, Unit
from scheduler.api.models import (
    Assigned,
    BalanceView,
    BudgetUnit,
    Hold,
    InventoryGpuView,
    InventoryNodeView,
    JobView,
    MigSliceView,
    Overdraft,
    PriorityRange,
    QueueView,
    QuotaView,
)
from scheduler.dispatcher import Dispatcher
from scheduler.inventory import FleetInventory, placeable
from scheduler.model import IdleAction
from scheduler.quota import gpus_of
from scheduler.records import JobRecord, JobState
from scheduler.state import SchedulerState

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def rfc3339(time_us: int) -> str:
    """µs since the epoch → `2026-11-01T00:00:00.000000Z` (integer arithmetic, no float;
    formatted from the fields: `strftime` took about three times as long, once or more per job
    answered)."""
    m = EPOCH + timedelta(microseconds=time_us)
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
        f".{m.microsecond:06d}Z"
    )


def _at(time_us: int | None) -> str | None:
    return None if time_us is None else rfc3339(time_us)


def job_view(record: JobRecord) -> JobView:
    spec = record.spec
    return JobView(
        job_id=spec.job_id,
        team=spec.team,
        project=spec.project,
        user=spec.user,
        queue=spec.queue,
        gpus=spec.gpus,
        model=spec.model,
        models=list(spec.accepted_models),
        pool=spec.pool,
        span_nodes=spec.span_nodes,
        topology=spec.topology,
        mig_profile=spec.mig_profile,
        gpu_share=None if spec.gpu_share is None else share_text(spec.gpu_share),
        priority=spec.priority,
        estimated_runtime_s=spec.estimated_runtime_us / US_PER_SECOND,
        max_runtime_s=None if spec.max_runtime_us is None else spec.max_runtime_us / US_PER_SECOND,
        state=record.state,
        attempt=record.attempt,
        reason=record.reason,
        detail=record.detail,
        submitted_us=spec.submit_us,
        submitted_at=rfc3339(spec.submit_us),
        admitted_us=record.admitted_us,
        admitted_at=_at(record.admitted_us),
        started_us=record.started_us,
        started_at=_at(record.started_us),
        ended_us=record.ended_us,
        ended_at=_at(record.ended_us),
        assigned=Assigned(
            pool=record.pool,
            model=record.model,
            gpu_uuids=list(record.gpu_uuids),
            nodes=list(record.nodes),
            placement=record.placement,
        ),
        exit_code=record.exit_code,
        preemptions=record.preemptions,
        hold=Hold(gpu_ms=record.hold_gpu_ms, money_micros=record.hold_micros),
        over_budget=record.over_budget,
    )


def queue_views(d: Dispatcher) -> list[QueueView]:
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for r in d.records.values():
        if r.state is JobState.PENDING:
            pending[r.spec.queue] = pending.get(r.spec.queue, 0) + 1
        elif r.state is JobState.RUNNING:
            running[r.spec.queue] = running.get(r.spec.queue, 0) + 1
    out = []
    for q in d.state.queues.values():
        idle = q.idle
        bounds = d.priority_bounds.get(q.name)
        out.append(
            QueueView(
                name=q.name,
                class_=q.queue_class.value,
                priority=q.priority,
                priority_bounds=None
                if bounds is None
                else PriorityRange(min=bounds.low, max=bounds.high),
                preemptible=q.preemptible,
                idle_reclaim=idle.action.value,
                idle_after_min=None
                if idle.action is IdleAction.NEVER
                else idle.after_us / 60_000_000,
                max_runtime_s=None
                if q.max_runtime_us is None
                else q.max_runtime_us / US_PER_SECOND,
                retry_limit=q.max_retries,
                over_budget=q.over_budget.value,
                allowed_models=None if q.allowed_models is None else list(q.allowed_models),
                forbidden_models=list(q.forbidden_models),
                pending=pending.get(q.name, 0),
                running=running.get(q.name, 0),
            )
        )
    return out


def balance_view(d: Dispatcher, team: str) -> BalanceView:
    status = d.budgets.get(team)
    balance = d.balance_of(team)
    own = d.hold_acks.unacknowledged(team)
    units = []
    if status is not None:
        for line in status.lines:
            pending = own.gpu_ms if line.unit == Unit.GPU_MS else own.money_micros
            units.append(
                BudgetUnit(
                    unit=line.unit,
                    granted=line.granted,
                    consumed=line.consumed,
                    ledger_open_holds=line.open_holds,
                    remaining=line.remaining,
                    holds_not_yet_in_ledger=pending,
                    available_to_admit=line.remaining - pending,
                )
            )
    quotas = [
        QuotaView(
            pool=flavor.pool,
            model=flavor.model,
            nominal=quota.nominal,
            borrowing_limit=quota.borrowing_limit,
            lending_limit=quota.lending_limit,
            in_use=gpus_of(d.state.used(team, flavor)),
            in_use_gpus=share_text(d.state.used(team, flavor)),
        )
        for (name, flavor), quota in sorted(d.state.quotas.quota.items())
        if name == team
    ]
    return BalanceView(
        team=team,
        budgeted=status is not None,
        period=None if status is None else status.period,
        units=units,
        overdraft=None
        if balance is None
        else Overdraft(gpu_ms=balance.overdraft_gpu_ms, money_micros=balance.overdraft_micros),
        quotas=quotas,
    )


def inventory_views(
    inventory: FleetInventory | None, state: SchedulerState, now_us: int, pool: str | None
) -> list[InventoryGpuView]:
    """The inventory's GPUs (of `pool`, if given) by node and index, as seen at `now_us`."""
    if inventory is None:
        return []
    gpus = sorted(inventory.gpus.values(), key=lambda g: (g.node, g.index, g.uuid))
    return [
        InventoryGpuView(
            uuid=g.uuid,
            node=g.node,
            index=g.index,
            pool=g.pool,
            model=g.model,
            memory_total_bytes=g.memory_total_bytes,
            mig_mode=g.mig_mode,
            mig=[
                MigSliceView(
                    gpu_instance_id=m.gpu_instance_id,
                    compute_instance_id=m.compute_instance_id,
                    profile=m.profile,
                    slices=m.slices,
                    total_slices=m.total_slices,
                )
                for m in g.mig
            ],
            labels=dict(g.labels),
            driver_version=g.driver_version,
            cuda_version=g.cuda_version,
            topology=topology_to_dict(g.topology),
            source=g.source.value,
            health=g.health.value,
            health_reason=g.health_reason,
            health_since_us=g.health_since_us,
            faults=g.faults,
            cordoned=g.cordoned,
            cordoned_by=g.cordoned_by,
            cordon_reason=g.cordon_reason,
            status=inventory.status(g, now_us).value,
            placeable=placeable(g, now_us, inventory.stale_after_intervals),
            in_use=state.holder(g.uuid) is not None,
            interval_us=g.interval_us,
            first_seen_us=g.first_seen_us,
            first_seen_at=rfc3339(g.first_seen_us),
            last_seen_us=g.last_seen_us,
            last_seen_at=rfc3339(g.last_seen_us),
        )
        for g in gpus
        if pool is None or g.pool == pool
    ]


def node_views(gpus: list[InventoryGpuView]) -> list[InventoryNodeView]:
    """The nodes of `gpus` (as `inventory_views` gives them), by name; a node's labels and
    versions are those of its most recently seen GPU's record."""
    by_node: dict[str, list[InventoryGpuView]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    views = []
    for node in sorted(by_node):
        members = by_node[node]
        newest = max(members, key=lambda g: g.last_seen_us)
        live = sum(g.status == "live" for g in members)
        views.append(
            InventoryNodeView(
                node=node,
                pools=sorted({g.pool for g in members}),
                labels=newest.labels,
                driver_version=newest.driver_version,
                cuda_version=newest.cuda_version,
                gpus=len(members),
                live=live,
                stale=len(members) - live,
                last_seen_us=newest.last_seen_us,
                last_seen_at=newest.last_seen_at,
            )
        )
    return views
