"""dcgm-exporter's fields and label quirks: what each family means, in which unit, at which
scope, and what a row's labels say about its GPU, MIG instance, host and owner.

Rules this module guarantees (and the tests pin):
- Families: 2.x-4.x `DCGM_FI_*` names and the 1.x `dcgm_*` names map to the same `Field`;
  families not listed in `FAMILIES` are ignored. The table here knows each family's unit:
  exporters' help texts are known to be wrong (the PROF ratios say "%" and print 0-1).
- Units (`convert`): utilisations are integer percent; `DCGM_FI_PROF_*` values are ratios 0-1,
  always, and become percent; MiB become bytes, W become mW. Every conversion rounds once, here,
  to the nearest integer with halves up, from the value as printed; NaN, ±Inf, negative values
  and values beyond a field's range are refused with their `ProblemKind`. No float survives.
- Scope (`Unit.device_scoped`): MIG rows repeat the parent GPU's device-level values for the
  device-scoped families; the instance-scoped ones (FB_USED, FB_FREE, all `DCGM_FI_PROF_*`)
  are the slice's own.
- Host: the `Hostname` (or `hostname`) label, else the caller's `host_default`. GPU index: the
  `gpu` label, else the `device` label's `nvidiaN`.
- Owner (`owner_from_labels`): a non-empty `pod` (`pod_name` on 1.x) gives the pod's owner
  by `collectors.k8s_identity.pod_owner`: job id `k8s:<namespace>/<pod>`, team and project
  from the caller's `PodRules` (namespace map, then the pod's labels as the kubelet reports
  them in `pods`, then the namespace's name). Without a pod, a non-empty `hpc_job` gives
  `Owner(job_id="slurm:<hpc_job>")`. Empty labels mean no owner.
- MIG (`mig_slices`, `new_gpu`): rows carrying `GPU_I_ID`/`GPU_I_PROFILE` describe one GPU
  instance; `total_slices` is 4 on the 4-slice models (A30, RTX PRO 6000) and 7 otherwise.
- Labels longer than `MAX_LABEL_CHARS` cannot be carried by an event and make the row unusable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from types import MappingProxyType

from collectors.dcgm_exposition import ProblemKind
from collectors.k8s_identity import Pod, PodRules, pod_owner
from ledger.events import MigInstance, Owner

MIB = 1 << 20
MAX_LABEL_CHARS = 256  # the event decoder rejects longer strings

PodsByName = Mapping[tuple[str, str], Pod]
"""(namespace, name) → the pod as the kubelet reports it (for its labels)."""


# ---------------------------------------------------------------------------- families


class Field(StrEnum):
    """A GPU quantity dcgm-exporter reports, whatever the exporter version calls it."""

    GPU_UTIL = "gpu_util"
    MEM_COPY_UTIL = "mem_copy_util"
    FB_USED = "fb_used"
    FB_FREE = "fb_free"
    POWER = "power"
    ENERGY = "energy"
    TEMPERATURE = "temperature"
    SM_CLOCK = "sm_clock"
    XID = "xid"
    ECC_DBE = "ecc_dbe"
    RETIRED_PENDING = "retired_pending"
    GR_ENGINE_ACTIVE = "gr_engine_active"
    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    DRAM_ACTIVE = "dram_active"


FAMILIES: Mapping[str, Field] = MappingProxyType(
    {
        "DCGM_FI_DEV_GPU_UTIL": Field.GPU_UTIL,
        "DCGM_FI_DEV_MEM_COPY_UTIL": Field.MEM_COPY_UTIL,
        "DCGM_FI_DEV_FB_USED": Field.FB_USED,
        "DCGM_FI_DEV_FB_FREE": Field.FB_FREE,
        "DCGM_FI_DEV_POWER_USAGE": Field.POWER,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Field.ENERGY,
        "DCGM_FI_DEV_GPU_TEMP": Field.TEMPERATURE,
        "DCGM_FI_DEV_SM_CLOCK": Field.SM_CLOCK,
        "DCGM_FI_DEV_XID_ERRORS": Field.XID,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": Field.ECC_DBE,
        "DCGM_FI_DEV_RETIRED_PENDING": Field.RETIRED_PENDING,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Field.GR_ENGINE_ACTIVE,
        "DCGM_FI_PROF_SM_ACTIVE": Field.SM_ACTIVE,
        "DCGM_FI_PROF_SM_OCCUPANCY": Field.SM_OCCUPANCY,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Field.TENSOR_ACTIVE,
        "DCGM_FI_PROF_DRAM_ACTIVE": Field.DRAM_ACTIVE,
        # dcgm-exporter 1.x
        "dcgm_gpu_utilization": Field.GPU_UTIL,
        "dcgm_mem_copy_utilization": Field.MEM_COPY_UTIL,
        "dcgm_fb_used": Field.FB_USED,
        "dcgm_fb_free": Field.FB_FREE,
        "dcgm_power_usage": Field.POWER,
        "dcgm_total_energy_consumption": Field.ENERGY,
        "dcgm_gpu_temp": Field.TEMPERATURE,
        "dcgm_sm_clock": Field.SM_CLOCK,
        "dcgm_xid_errors": Field.XID,
    }
)
"""Metric name → field. Names not here are ignored."""


@dataclass(frozen=True, slots=True)
class Unit:
    scale: int  # integer value = round_half_up(printed value × scale)
    hi: int  # the largest valid integer value
    device_scoped: bool  # MIG rows repeat the parent GPU's value


_PCT = Unit(scale=1, hi=100, device_scoped=True)
_RATIO = Unit(scale=100, hi=100, device_scoped=False)
UNITS: Mapping[Field, Unit] = MappingProxyType(
    {
        Field.GPU_UTIL: _PCT,
        Field.MEM_COPY_UTIL: _PCT,
        Field.FB_USED: Unit(scale=MIB, hi=1 << 50, device_scoped=False),
        Field.FB_FREE: Unit(scale=MIB, hi=1 << 50, device_scoped=False),
        Field.POWER: Unit(scale=1000, hi=100_000_000, device_scoped=True),
        Field.ENERGY: Unit(scale=1, hi=(1 << 63) - 1, device_scoped=True),
        Field.TEMPERATURE: Unit(scale=1, hi=200, device_scoped=True),
        Field.SM_CLOCK: Unit(scale=1, hi=10_000, device_scoped=True),
        Field.XID: Unit(scale=1, hi=(1 << 31) - 1, device_scoped=True),
        Field.ECC_DBE: Unit(scale=1, hi=(1 << 62), device_scoped=True),
        Field.RETIRED_PENDING: Unit(scale=1, hi=(1 << 31) - 1, device_scoped=True),
        Field.GR_ENGINE_ACTIVE: _RATIO,
        Field.SM_ACTIVE: _RATIO,
        Field.SM_OCCUPANCY: _RATIO,
        Field.TENSOR_ACTIVE: _RATIO,
        Field.DRAM_ACTIVE: _RATIO,
    }
)

_FOUR_SLICE_MODELS = ("A30", "RTX PRO 6000")
_MIG_PROFILE = re.compile(r"(?:\d+c\.)?(\d+)g\.\d+gb(?:\+[a-z0-9.]+)*", re.ASCII | re.IGNORECASE)
_DEVICE = re.compile(r"nvidia(\d{1,4})", re.ASCII)


# ---------------------------------------------------------------------------- values


def convert(value: float, unit: Unit) -> tuple[int, None] | tuple[None, ProblemKind]:
    """The printed value as the field's integer, rounded half up, or why it is not one."""
    if type(value) is int:
        scaled = value * unit.scale
    else:
        if not math.isfinite(value):
            return None, ProblemKind.NOT_FINITE
        scaled = int((Decimal(repr(value)) * unit.scale).to_integral_value(ROUND_HALF_UP))
    if value < 0:
        return None, ProblemKind.NEGATIVE
    if scaled > unit.hi:
        return None, ProblemKind.OUT_OF_RANGE
    return scaled, None


PROBLEM_DETAIL: Mapping[ProblemKind, str] = MappingProxyType(
    {
        ProblemKind.NOT_FINITE: "the value is NaN or infinite",
        ProblemKind.NEGATIVE: "the value is negative",
        ProblemKind.OUT_OF_RANGE: "the value is out of the field's range",
    }
)


# ---------------------------------------------------------------------------- labels


def owner_from_labels(
    labels: Mapping[str, str], rules: PodRules | None = None, pods: PodsByName | None = None
) -> Owner | None:
    """The GPU's owner from its row's pod or HPC-job labels (see the module's rules)."""
    pod = labels.get("pod") or labels.get("pod_name") or ""
    if pod:
        namespace = labels.get("namespace") or labels.get("pod_namespace") or ""
        known = pods.get((namespace, pod)) if pods is not None else None
        return pod_owner(namespace, pod, known.labels if known is not None else {}, rules)
    hpc_job = labels.get("hpc_job") or ""
    if hpc_job:
        return Owner(job_id=f"slurm:{hpc_job}")
    return None


def mig_slices(profile: str, model: str) -> tuple[int, int] | None:
    """(slices, total_slices) of a GPU-instance profile (`3g.40gb`, `1g.10gb+me`), or None."""
    match = _MIG_PROFILE.fullmatch(profile)
    if match is None:
        return None
    total = 4 if any(name in model for name in _FOUR_SLICE_MODELS) else 7
    slices = int(match.group(1))
    if not 1 <= slices <= total:
        return None
    return slices, total


def _small_int(text: str, hi: int) -> int | None:
    if not text or len(text) > 6 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= hi else None


def owner_too_long(owner: Owner) -> bool:
    return any(
        value is not None and len(value) > MAX_LABEL_CHARS
        for value in (owner.team, owner.project, owner.job_id)
    )


class GpuRows:
    """The rows of one GPU or MIG slice seen so far (mutable while one payload is parsed)."""

    __slots__ = ("index", "mig", "model", "node", "owner", "uuid", "values")

    def __init__(self, uuid: str, index: int, model: str, node: str, mig: MigInstance | None):
        self.uuid = uuid
        self.index = index
        self.model = model
        self.node = node
        self.mig = mig
        self.owner: Owner | None = None
        self.values: dict[Field, int] = {}


def new_gpu(
    labels: Mapping[str, str], uuid: str, host_default: str, model_default: str
) -> GpuRows | str:
    """The GPU (slice) a row describes, or why its labels cannot be used."""
    node = labels.get("Hostname") or labels.get("hostname") or host_default
    model = labels.get("modelName") or model_default
    if max(len(uuid), len(node), len(model)) > MAX_LABEL_CHARS:
        return f"UUID, host or model longer than {MAX_LABEL_CHARS} characters"
    if not (uuid.isprintable() and node.isprintable() and model.isprintable()):
        return "UUID, host or model with control characters"  # names, not a GPU's
    index = _small_int(labels.get("gpu", ""), 1023)
    if index is None:
        device = _DEVICE.fullmatch(labels.get("device", ""))
        index = _small_int(device.group(1), 1023) if device else None
    if index is None:
        return "no GPU index in the gpu or device label"
    gi_text = labels.get("GPU_I_ID", "")
    profile = labels.get("GPU_I_PROFILE", "")
    if not gi_text and not profile:
        return GpuRows(uuid, index, model, node, None)
    gpu_instance_id = _small_int(gi_text, 1023)
    shares = mig_slices(profile, model)
    if gpu_instance_id is None or shares is None:
        return f"unreadable MIG instance (GPU_I_ID={gi_text!r}, GPU_I_PROFILE={profile!r})"
    mig = MigInstance(
        gpu_instance_id=gpu_instance_id,
        compute_instance_id=0,
        profile=profile,
        slices=shares[0],
        total_slices=shares[1],
    )
    return GpuRows(uuid, index, model, node, mig)
