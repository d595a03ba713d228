"""Fractional GPU requests: MIG instances by profile and time-sliced GPU shares — their names,
how a request is written and read, and how a MIG instance is named across the system.

- A MIG request names a GPU-instance profile (`1g.10gb`, `3g.40gb`, `1g.10gb+me`) and a count:
  `1g.10gb:2` is two instances of that profile (`parse_mig`). A job's `gpus` is then the number
  of instances.
- A MIG instance is named `<GPU UUID>/gi<GPU instance id>` (`mig_key`), the subject of its
  samples (`GpuSample.subject`), so a `GpuAssigned` for an instance is found by the instance's
  own samples. A GPU of a MIG flavor in the scheduler is such an instance.
- A MIG flavor's model is `<model>/<profile>` (`mig_model`, `split_mig_model`): quotas, capacity
  and usage of `A100-SXM4-80GB/1g.10gb` are counted apart from whole A100s. Prices are the
  GPU model's (`priced_model`): the ledger charges an instance its slices of the GPU.
- A share is an integer number of per-mille of one GPU (`SHARE_UNITS` = 1000 is the whole GPU),
  in [1, 999]; `parse_share` reads `0.25` or `25%` exactly (no float is ever involved) and
  refuses what is not a whole per-mille.
- A job's share of a GPU is named `<GPU UUID>/share/<job id>` (`share_key`, `share_parent`):
  several jobs hold shares of one GPU at once, each under its own name.
- `lay_out`: the accounting layout a collector gives one GPU's instances (`first_slice`), so
  that the GPU time of a carved GPU's instances and its uncarved rest sums exactly to the
  GPU's time in every sampling pass (`ledger.attribution.physical_gpu_ms`).
- `cuda_mig_device`: what `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` name a MIG instance
  by: its `MIG-…` UUID when the collector reported one, else `MIG-<GPU UUID>/<gi>/<ci>`, the
  form CUDA and the NVIDIA container runtime accept for a MIG device.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal, InvalidOperation

from ledger.attribution import unconfigured_slices
from ledger.errors import EventError
from ledger.events import MigInstance
from ledger.units import SHARE_UNITS as _SHARE_UNITS

SHARE_UNITS = _SHARE_UNITS  # per-mille: 250 is a quarter of a GPU (`ledger.units`)
SPEC_ADDED = ("models", "topology", "mig_profile", "gpu_share")  # `JobSpec`: written when set
MAX_MIG_INSTANCES = 64  # per job
MIG_SEP = "/"

_PROFILE = re.compile(r"(?:\d+c\.)?\d+g\.\d+gb(?:\+[a-z0-9.]+)*", re.ASCII)
_MIG_KEY = re.compile(r"(.+)/gi(\d{1,5})", re.ASCII)


def valid_profile(profile: str) -> bool:
    """Whether `profile` is a GPU-instance profile name such as `1g.10gb` or `1g.10gb+me`."""
    return _PROFILE.fullmatch(profile) is not None


def parse_mig(text: str) -> tuple[str, int]:
    """`PROFILE[:COUNT]` → (profile, count); raises EventError (count in [1, 64])."""
    profile, sep, count_text = text.strip().partition(":")
    profile = profile.strip().lower()
    if not valid_profile(profile):
        raise EventError(f"--mig {text!r}: expected PROFILE[:COUNT], e.g. 1g.10gb:2")
    count = 1
    if sep:
        if not count_text.strip().isdigit():
            raise EventError(f"--mig {text!r}: the count must be a whole number")
        count = int(count_text)
    if not 1 <= count <= MAX_MIG_INSTANCES:
        raise EventError(f"--mig {text!r}: the count must be in [1, {MAX_MIG_INSTANCES}]")
    return profile, count


def parse_share(text: str) -> int:
    """`0.25` or `25%` → 250 (per-mille of one GPU); raises EventError unless it is a whole
    number of per-mille strictly between 0 and 1."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = Decimal(raw[:-1] if percent else raw)
    except InvalidOperation:
        raise EventError(f"--gpu-share {text!r}: expected a fraction such as 0.25") from None
    if not value.is_finite():
        raise EventError(f"--gpu-share {text!r}: expected a fraction such as 0.25")
    units = value * (SHARE_UNITS // 100 if percent else SHARE_UNITS)
    if units != units.to_integral_value() or not 1 <= units <= SHARE_UNITS - 1:
        raise EventError(
            f"--gpu-share {text!r}: expected a share of one GPU in (0, 1), in steps of 0.001"
        )
    return int(units)


def share_text(units: int) -> str:
    """250 → `0.25`, as a person writes it."""
    return str((Decimal(units) / SHARE_UNITS).normalize())


def mig_model(model: str, profile: str) -> str:
    """The flavor model of `profile` instances on GPUs of `model`: `A100-80GB/1g.10gb`."""
    return f"{model}{MIG_SEP}{profile}"


def split_mig_model(flavor_model: str) -> tuple[str, str | None]:
    """(GPU model, MIG profile or None) of a flavor's model."""
    model, sep, profile = flavor_model.rpartition(MIG_SEP)
    if sep and model and valid_profile(profile):
        return model, profile
    return flavor_model, None


def priced_model(flavor_model: str) -> str:
    """The model the price book prices a flavor at: the GPU's own model."""
    return split_mig_model(flavor_model)[0]


def mig_key(gpu_uuid: str, gpu_instance_id: int) -> str:
    """The name of one MIG instance: `<GPU UUID>/gi<id>` (its samples' subject)."""
    return f"{gpu_uuid}/gi{gpu_instance_id}"


def split_mig_key(key: str) -> tuple[str, int] | None:
    """(GPU UUID, GPU instance id) of a MIG instance's name; None for a whole GPU's UUID."""
    match = _MIG_KEY.fullmatch(key)
    return None if match is None else (match.group(1), int(match.group(2)))


def cuda_mig_device(
    gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int, uuid: str | None = None
) -> str:
    """How CUDA and the NVIDIA container runtime name a MIG device: its own `MIG-…` UUID when
    known, else `MIG-<GPU UUID>/<gi>/<ci>`."""
    if uuid is not None:
        return uuid
    return f"MIG-{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"


def check_fraction(job_id: str, gpus: int, mig_profile: str | None, share: int | None) -> None:
    """A job's fractional request is consistent: a valid profile, a share in [1, 999] of one
    GPU, never both; raises EventError."""
    if mig_profile is not None and share is not None:
        raise EventError(f"job {job_id}: ask for MIG instances or a GPU share, not both")
    if mig_profile is not None and not valid_profile(mig_profile):
        raise EventError(f"job {job_id}: MIG profile {mig_profile!r}: expected e.g. 1g.10gb")
    if share is not None:
        if not 1 <= share <= SHARE_UNITS - 1:
            raise EventError(f"job {job_id}: gpu_share must be in [1, {SHARE_UNITS - 1}] per-mille")
        if gpus != 1:
            raise EventError(f"job {job_id}: a GPU share is a share of one GPU (gpus = 1)")


SHARE_MARK = "/share/"


def share_key(gpu_uuid: str, job_id: str) -> str:
    """The name of one job's share of a GPU: `<GPU UUID>/share/<job id>` (what its
    `GpuAssigned` and `JobAdmitted` name; several jobs share one GPU, each its own key)."""
    return f"{gpu_uuid}{SHARE_MARK}{job_id}"


def share_parent(key: str) -> str | None:
    """The GPU a share key is a share of; None for anything else."""
    gpu, sep, job = key.partition(SHARE_MARK)
    return gpu if sep and gpu and job else None


def lay_out(instances: Sequence[MigInstance]) -> tuple[tuple[MigInstance, ...], MigInstance | None]:
    """The accounting layout of one GPU's MIG instances: each with its `first_slice` (in
    GPU-instance-id order, one after another), and the slices no instance occupies as one
    pseudo-instance after them (`ledger.attribution.unconfigured_slices`; None when every slice
    is carved). A layout that does not fit the GPU (more slices than it has) gets no positions,
    and its GPU time is rounded per instance as before."""
    rest = unconfigured_slices(instances)
    if not instances or sum(m.slices for m in instances) > instances[0].total_slices:
        return tuple(instances), rest
    placed: list[MigInstance] = []
    first = 0
    for mig in sorted(instances, key=lambda m: m.gpu_instance_id):
        placed.append(replace(mig, first_slice=first))
        first += mig.slices
    return tuple(placed), None if rest is None else replace(rest, first_slice=first)


def physical_gpu(name: str) -> str:
    """The GPU a placeable unit is on: a MIG instance's or a share's GPU, else `name` itself."""
    shared = share_parent(name)
    if shared is not None:
        return shared
    instance = split_mig_key(name)
    return name if instance is None else instance[0]
