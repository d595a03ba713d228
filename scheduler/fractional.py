"""Fractional placement policy: which flavors a MIG or whole-GPU request may use, the MIG
instances the inventory offers, and how GPU shares pack onto GPUs.

MIG (`ledger.fractional`): each MIG instance a collector reported on a placeable GPU is one
placeable "GPU" of the flavor `(pool, <model>/<profile>)`, named `<GPU UUID>/gi<id>`, on the
GPU's node (`mig_units`). The layout is what the collectors reported: the scheduler never
re-partitions a GPU (an operator's action), and a GPU in MIG mode is never placed whole. So the
whole admission machinery — quotas per flavor (a quota per MIG profile is a quota of that
flavor), borrowing, preemption, gangs, `GpuAssigned` per instance — applies to instances as it
does to GPUs. `accepts(spec, flavor_model, kept, queue)` says which flavors a request matches:
a whole-GPU job never matches a MIG flavor, a MIG job only the flavors of its profile, and the
queue's model policy applies to the GPU's model.

Shares (`JobSpec.gpu_share`, per-mille of one GPU, time-sliced): `pack_share` picks the GPU a
share goes to — the most loaded GPU that still has room (best fit, so whole GPUs stay free),
else a free whole GPU; never a GPU a whole-GPU job holds; a GPU's shares never sum past
`SHARE_UNITS` (`place_share` names the share `<GPU UUID>/share/<job id>`, and the state holds
the GPU for its shares until the last one ends). `share_allowed` says which queue classes may
run shares (dev and inference: time slicing gives no isolation nor guaranteed throughput, fine
for notebooks and serving, wrong for training).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ledger.attribution import UNCONFIGURED_PROFILE
from ledger.fractional import (
    SHARE_UNITS,
    cuda_mig_device,
    mig_key,
    mig_model,
    share_key,
    share_parent,
    share_text,
    split_mig_model,
)
from ledger.inventory import InventoryGpu
from ledger.job_events import JobSpec
from ledger.topology import GpuTopology
from scheduler.model import Flavor, GpuRef, Queue, QueueClass, RunningJob

SHARE_CLASSES = frozenset({QueueClass.DEV, QueueClass.INFERENCE})


def mig_units(gpu: InventoryGpu) -> tuple[tuple[str, str, GpuTopology], ...]:
    """The placeable units of one GPU as (flavor model, UUID, topology): the GPU itself, or —
    in MIG mode — each MIG instance the collector reported (none if no instance is carved)."""
    if not gpu.mig_mode:
        return ((gpu.model, gpu.uuid, gpu.topology),)
    return tuple(
        (mig_model(gpu.model, m.profile), mig_key(gpu.uuid, m.gpu_instance_id), gpu.topology)
        for m in sorted(gpu.mig, key=lambda m: m.gpu_instance_id)
        if m.profile != UNCONFIGURED_PROFILE
    )


def mig_devices(gpu: InventoryGpu) -> dict[str, str]:
    """MIG instance name → what `CUDA_VISIBLE_DEVICES` names it by: its own `MIG-…` UUID as
    the collector reported it, else `MIG-<GPU UUID>/<gi>/<ci>` (empty outside MIG mode)."""
    if not gpu.mig_mode:
        return {}
    return {
        mig_key(gpu.uuid, m.gpu_instance_id): cuda_mig_device(
            gpu.uuid, m.gpu_instance_id, m.compute_instance_id, m.uuid
        )
        for m in gpu.mig
        if m.profile != UNCONFIGURED_PROFILE
    }


def accepts(spec: JobSpec, flavor_model: str, kept: Sequence[str], queue: Queue) -> bool:
    """Whether a job may be placed in a flavor of `flavor_model`: the GPU model is one the job
    accepts (`kept`: those its queue permits; empty: any the queue permits), and the flavor is
    of the job's MIG profile (a whole-GPU job: no MIG flavor)."""
    model, profile = split_mig_model(flavor_model)
    if profile != spec.mig_profile:
        return False
    return model in kept if kept else queue.permits(model)


def base_models(flavor_models: Iterable[str]) -> frozenset[str]:
    """The GPU models of some flavors (`A100/1g.10gb` → `A100`)."""
    return frozenset(split_mig_model(m)[0] for m in flavor_models)


def share_allowed(queue: Queue) -> bool:
    """Whether `queue`'s jobs may ask for a GPU share."""
    return queue.queue_class in SHARE_CLASSES


def pack_share(
    share: int,
    loads: Mapping[str, int],
    free_whole: Sequence[str],
    whole_held: frozenset[str] = frozenset(),
) -> str | None:
    """The GPU a share of `share` per-mille goes to, or None if none has room.

    `loads`: the GPUs already running shares, with the per-mille they hold; `free_whole`: the
    GPUs nobody holds, in placement order; `whole_held`: GPUs a whole-GPU job holds (never
    used, whatever `loads` says). Best fit among the shared GPUs (the one left fullest, the
    first UUID among equals), else the first free GPU."""
    best: str | None = None
    best_left = SHARE_UNITS
    for uuid in sorted(loads):
        if uuid in whole_held:
            continue
        left = SHARE_UNITS - loads[uuid] - share
        if left >= 0 and (best is None or left < best_left):
            best, best_left = uuid, left
    if best is not None:
        return best
    return next((u for u in free_whole if u not in whole_held and u not in loads), None)


def share_loads(jobs: Iterable[RunningJob], flavor: Flavor) -> dict[str, tuple[str, int]]:
    """The GPUs of `flavor` that running share jobs hold shares of: GPU → (node, per-mille)."""
    loads: dict[str, tuple[str, int]] = {}
    for job in jobs:
        share = job.spec.gpu_share
        if share is None or job.flavor != flavor:
            continue
        for ref in job.gpus:
            gpu = share_parent(ref.uuid)
            if gpu is not None:
                node, held = loads.get(gpu, (ref.node, 0))
                loads[gpu] = (node, held + share)
    return loads


def place_share(
    spec: JobSpec, loads: Mapping[str, tuple[str, int]], free: Mapping[str, tuple[str, ...]]
) -> tuple[GpuRef, ...] | None:
    """Where a share job goes (`pack_share`): its one share key on the GPU it packs onto, or
    None. Free whole GPUs are taken from the node with the fewest free GPUs first, keeping
    whole nodes free for gangs."""
    assert spec.gpu_share is not None
    nodes = sorted(free, key=lambda n: (len(free[n]), n))
    free_whole = [u for n in nodes for u in sorted(free[n])]
    home = {u: n for n, uuids in free.items() for u in uuids}
    gpu = pack_share(spec.gpu_share, {g: held for g, (_, held) in loads.items()}, free_whole)
    if gpu is None:
        return None
    node = loads[gpu][0] if gpu in loads else home[gpu]
    return (GpuRef(share_key(gpu, spec.job_id), node),)


def freed_by(
    victims: Iterable[RunningJob], loads: Mapping[str, tuple[str, int]]
) -> tuple[dict[str, list[str]], dict[str, tuple[str, int]]]:
    """What stopping `victims` frees: the whole GPUs per node (a whole-GPU job's GPUs; a GPU
    whose every share stops), and the share loads left on the GPUs still running shares
    (`loads`: GPU → (node, per-mille held) before). Stopping a share frees only that share."""
    freed: dict[str, list[str]] = {}
    left = dict(loads)
    for job in victims:
        share = job.spec.gpu_share
        for ref in job.gpus:
            gpu = share_parent(ref.uuid)
            if share is None or gpu is None:
                freed.setdefault(ref.node, []).append(ref.uuid)
                continue
            node, held = left.get(gpu, (ref.node, share))
            if held - share > 0:
                left[gpu] = (node, held - share)
            elif gpu in left:
                del left[gpu]
                freed.setdefault(node, []).append(gpu)
    return freed, left


def share_fits(share: int, loads: Mapping[str, tuple[str, int]], free_total: int) -> bool:
    """Whether a share of `share` per-mille has room: a GPU running shares with that much left,
    or a free GPU."""
    return free_total > 0 or any(held + share <= SHARE_UNITS for _, held in loads.values())


def share_of(spec: JobSpec) -> str:
    """A share job's share as a person writes it (`0.25 of a GPU`)."""
    return f"{share_text(spec.gpu_share or 0)} of a GPU"
