"""`parse_metrics`: one dcgm-exporter payload as `GpuSample`, `GpuHealth` and `DcgmProblem`
values. Pure: no I/O, no clock; it never raises for bad text.

Rules this module guarantees (and the tests pin); families, units and labels are
`collectors.dcgm_fields`' rules, the text format `collectors.dcgm_exposition`':
- Memory: `memory_total_bytes = FB_USED + FB_FREE` (a missing family counts as 0).
- Utilisation of a whole GPU: `DCGM_FI_DEV_GPU_UTIL`, else GR_ENGINE_ACTIVE, else 0 (a sample
  has no "unknown" utilisation; a dropped row is always reported as a problem); memory
  utilisation: `DCGM_FI_DEV_MEM_COPY_UTIL`, else DRAM_ACTIVE, else None. A GPU (slice) none of
  whose rows could be used yields no sample.
- Bad rows: a value that is not a number (`ERROR - FAILED TO CONVERT TO STRING`, empty), NaN,
  ±Inf, negative, out of its field's range, a row without UUID, unreadable labels and a second
  row for the same GPU (slice) and family are dropped and reported, grouped per kind and
  family. The rest of the payload is still used.
- MIG: a GPU with rows carrying `GPU_I_ID`/`GPU_I_PROFILE` yields one sample per GPU instance
  and never a whole-GPU sample as well. Those rows repeat the parent GPU's device-level values,
  so each family is read at its scope:
    * instance-scoped (the slice's own value): FB_USED, FB_FREE and all `DCGM_FI_PROF_*`;
      a slice's util_gpu_pct is its GR_ENGINE_ACTIVE (0 when absent) and its util_mem_pct its
      DRAM_ACTIVE (None when absent); `DCGM_FI_DEV_GPU_UTIL` and MEM_COPY_UTIL are not used;
    * device-scoped intensive values (temperature, SM clock, last XID) are copied to each
      slice: copying them counts nothing twice;
    * device-scoped extensive values (power, energy) are left None on slices, since a
      per-slice copy would count the board's power once per slice.
  Slices no instance occupies get one sample of unallocated capacity.
- XID: `DCGM_FI_DEV_XID_ERRORS` is the last XID seen. A `GpuHealth(kind=XID_ERROR)` is emitted
  when it is non-zero and differs from the previous payload's value (one event per GPU, never
  per slice). The same XID twice in a row is indistinguishable from no new error.
- ECC and retired pages (where the exporter publishes them): `collectors.dcgm_health`, one
  event per rising edge; `health_state` is what the next payload compares with.
- Energy: samples carry `energy_mj=None`; the cumulative counters come back as
  `EnergyReading`s for the collector, which alone knows the previous payload.
- Nodes: the labels common to a node's used rows and its driver version come back as `nodes`
  (`collectors.dcgm_nodes`), for its inventory report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from collectors.dcgm_exposition import (
    DcgmProblem,
    ProblemKind,
    ProblemLog,
    parse_lines,
    split_sample_lines,
)
from collectors.dcgm_fields import (
    FAMILIES,
    MAX_LABEL_CHARS,
    PROBLEM_DETAIL,
    UNITS,
    Field,
    GpuRows,
    PodsByName,
    convert,
    new_gpu,
    owner_from_labels,
    owner_too_long,
)
from collectors.dcgm_health import HealthState, dcgm_health
from collectors.dcgm_nodes import NodeLabelLog
from collectors.inventory import NodeFacts
from collectors.k8s_identity import PodRules
from ledger.events import (
    MAX_INTERVAL_US,
    GpuHealth,
    GpuSample,
    HealthKind,
    SampleSource,
)
from ledger.fractional import lay_out
from ledger.inventory.health import xid_meaning


@dataclass(frozen=True, slots=True)
class EnergyReading:
    """A GPU's cumulative energy counter (mJ since driver load) as read in one payload."""

    gpu_uuid: str
    counter_mj: int


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """The profiling ratios of one GPU or MIG slice, as integer percent (None: not reported)."""

    gpu_uuid: str
    gpu_instance_id: int | None
    gr_engine_active_pct: int | None
    sm_active_pct: int | None
    sm_occupancy_pct: int | None
    tensor_active_pct: int | None
    dram_active_pct: int | None


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What one payload holds.

    `samples` carry `energy_mj=None`: an energy delta needs the previous payload, which only
    `DcgmCollector` (through `EnergyTracker` and `energy`) has.
    """

    samples: tuple[GpuSample, ...]
    health: tuple[GpuHealth, ...]
    problems: tuple[DcgmProblem, ...]
    energy: tuple[EnergyReading, ...] = ()
    activity: tuple[GpuActivity, ...] = ()
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    health_state: Mapping[str, HealthState] = field(default_factory=dict)  # ECC, retired pages


def parse_metrics(
    text: str,
    *,
    host_default: str,
    pool: str,
    time_us: int,
    interval_us: int,
    pod_rules: PodRules | None = None,
    pods: PodsByName | None = None,
    previous_xid: Mapping[str, int] | None = None,
    model_default: str = "unknown",
    previous_health: Mapping[str, HealthState] | None = None,
) -> ParseResult:
    """Map one dcgm-exporter payload to samples, health events and problems.

    Pure: no I/O, no clock. Every sample has `sample_time_us=time_us` and
    `interval_us=interval_us`. `previous_xid` is each GPU's XID value from the previous payload
    (absent: 0); `previous_health` its ECC and retired-page state (`collectors.dcgm_health`);
    `pod_rules` and `pods` (the kubelet's pods by namespace and name) name a pod's owner.
    Raises ValueError only for invalid arguments, never for the text.
    """
    if not pool or len(pool) > MAX_LABEL_CHARS:
        raise ValueError("pool must be a non-empty name of at most 256 characters")
    if not host_default or len(host_default) > MAX_LABEL_CHARS:
        raise ValueError("host_default must be a non-empty name of at most 256 characters")
    if not 1 <= interval_us <= MAX_INTERVAL_US or time_us < 1:
        raise ValueError("time_us must be positive and interval_us in [1, MAX_INTERVAL_US]")
    problems = ProblemLog()
    nodes = NodeLabelLog()
    lines = split_sample_lines(text, FAMILIES, problems)
    gpus: dict[tuple[str, str, str], GpuRows | str] = {}
    for line, sample in parse_lines(lines, problems):
        name = sample.name
        field_ = FAMILIES.get(name)
        if field_ is None:
            continue
        labels = sample.labels
        uuid = labels.get("UUID") or labels.get("uuid") or ""
        if not uuid:
            problems.add(ProblemKind.MISSING_UUID, name, "the row has no UUID label", line)
            continue
        key = (uuid, labels.get("GPU_I_ID", ""), labels.get("GPU_I_PROFILE", ""))
        gpu = gpus.get(key)
        if gpu is None:
            gpu = gpus[key] = new_gpu(labels, uuid, host_default, model_default)
        if isinstance(gpu, str):
            problems.add(ProblemKind.BAD_LABEL, name, gpu, line)
            continue
        nodes.add(gpu.node, labels)
        value, kind = convert(sample.value, UNITS[field_])
        if value is None:
            assert kind is not None
            problems.add(kind, name, PROBLEM_DETAIL[kind], line)
            continue
        if field_ in gpu.values:
            problems.add(ProblemKind.DUPLICATE, name, "a second row; the first is kept", line)
            continue
        if gpu.owner is None:
            owner = owner_from_labels(labels, pod_rules, pods)
            if owner is not None and owner_too_long(owner):
                problems.add(ProblemKind.BAD_LABEL, name, "pod labels too long to carry", line)
                continue
            gpu.owner = owner
        gpu.values[field_] = value
    parsed = _assemble(
        [gpu for gpu in gpus.values() if not isinstance(gpu, str) and gpu.values],
        problems.result(),
        pool=pool,
        time_us=time_us,
        interval_us=interval_us,
        previous_xid=previous_xid or {},
        previous_health=previous_health or {},
    )
    return replace(parsed, nodes=nodes.facts())


def _assemble(
    gpus: list[GpuRows],
    problems: tuple[DcgmProblem, ...],
    *,
    pool: str,
    time_us: int,
    interval_us: int,
    previous_xid: Mapping[str, int],
    previous_health: Mapping[str, HealthState],
) -> ParseResult:
    by_uuid: dict[str, list[GpuRows]] = {}
    for gpu in gpus:
        by_uuid.setdefault(gpu.uuid, []).append(gpu)
    samples: list[GpuSample] = []
    health: list[GpuHealth] = []
    energy: list[EnergyReading] = []
    activity: list[GpuActivity] = []
    health_state: dict[str, HealthState] = {}
    for uuid, rows in by_uuid.items():
        whole = next((gpu for gpu in rows if gpu.mig is None), None)
        slices = sorted(
            (gpu for gpu in rows if gpu.mig is not None),
            key=lambda gpu: gpu.mig.gpu_instance_id if gpu.mig else 0,
        )
        device = _device_values(whole, slices)
        parent = whole if whole is not None else slices[0]
        placed, rest = lay_out([gpu.mig for gpu in slices if gpu.mig is not None])
        if len(placed) == len(slices):  # each instance's place in the accounting layout
            for gpu, mig in zip(slices, placed, strict=True):
                gpu.mig = mig
        for gpu in slices or [parent]:
            samples.append(_sample(gpu, device, pool, time_us, interval_us))
            activity.append(_activity(gpu))
        if rest is not None:  # slices no instance occupies: unallocated capacity
            spare = GpuRows(uuid, parent.index, parent.model, parent.node, rest)
            samples.append(_sample(spare, {}, pool, time_us, interval_us))
        if Field.ENERGY in device:
            energy.append(EnergyReading(gpu_uuid=uuid, counter_mj=device[Field.ENERGY]))
        more, state = dcgm_health(
            parent.node, uuid, parent.index, device, previous_health.get(uuid), time_us
        )
        health.extend(more)
        if state is not None:
            health_state[uuid] = state
        xid = device.get(Field.XID, 0)
        if xid and xid != previous_xid.get(uuid, 0):
            health.append(
                GpuHealth(
                    node=parent.node,
                    gpu_uuid=uuid,
                    gpu_index=parent.index,
                    kind=HealthKind.XID_ERROR,
                    detail=xid_meaning(xid),
                    time_us=time_us,
                    source=SampleSource.DCGM,
                    xid=xid,
                )
            )
    return ParseResult(
        samples=tuple(samples),
        health=tuple(health),
        problems=problems,
        energy=tuple(energy),
        activity=tuple(activity),
        health_state=health_state,
    )


def _device_values(whole: GpuRows | None, slices: list[GpuRows]) -> dict[Field, int]:
    """The parent GPU's device-scoped values: its own rows first, else the first slice's copy."""
    values = {f: v for f, v in whole.values.items() if UNITS[f].device_scoped} if whole else {}
    for gpu in slices:
        for f, v in gpu.values.items():
            if UNITS[f].device_scoped:
                values.setdefault(f, v)
    return values


def _sample(
    gpu: GpuRows, device: Mapping[Field, int], pool: str, time_us: int, interval_us: int
) -> GpuSample:
    own = gpu.values
    used = own.get(Field.FB_USED, 0)
    if gpu.mig is None:
        util = own.get(Field.GPU_UTIL, own.get(Field.GR_ENGINE_ACTIVE, 0))
        util_mem = own.get(Field.MEM_COPY_UTIL, own.get(Field.DRAM_ACTIVE))
        power = device.get(Field.POWER)
    else:
        util = own.get(Field.GR_ENGINE_ACTIVE, 0)
        util_mem = own.get(Field.DRAM_ACTIVE)
        power = None
    return GpuSample(
        node=gpu.node,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        model=gpu.model,
        pool=pool,
        util_gpu_pct=util,
        memory_used_bytes=used,
        memory_total_bytes=used + own.get(Field.FB_FREE, 0),
        source=SampleSource.DCGM,
        sample_time_us=time_us,
        interval_us=interval_us,
        util_mem_pct=util_mem,
        power_mw=power,
        energy_mj=None,
        mig=gpu.mig,
        owner=gpu.owner,
        temperature_c=device.get(Field.TEMPERATURE),
        sm_clock_mhz=device.get(Field.SM_CLOCK),
        xid_errors=device.get(Field.XID),
    )


def _activity(gpu: GpuRows) -> GpuActivity:
    own = gpu.values
    return GpuActivity(
        gpu_uuid=gpu.uuid,
        gpu_instance_id=gpu.mig.gpu_instance_id if gpu.mig else None,
        gr_engine_active_pct=own.get(Field.GR_ENGINE_ACTIVE),
        sm_active_pct=own.get(Field.SM_ACTIVE),
        sm_occupancy_pct=own.get(Field.SM_OCCUPANCY),
        tensor_active_pct=own.get(Field.TENSOR_ACTIVE),
        dram_active_pct=own.get(Field.DRAM_ACTIVE),
    )
