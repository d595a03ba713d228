"""The dcgm-exporter collector: NVIDIA dcgm-exporter's `/metrics` as GPU samples and health events.

This module owns:
- `fetch_metrics`: the HTTP side (connect/read timeouts, retries with exponential backoff on
  connection errors, timeouts and 5xx, basic auth, TLS verification). Every failure leaves it as
  one `DcgmScrapeError`;
- `parse_metrics`: the pure mapping of one payload to `GpuSample`, `GpuHealth` and
  `DcgmProblem` values. It never raises for bad text: what it cannot use becomes a problem,
  and `problem_dead_letter` turns a problem into a `DeadLetter` carrying the offending lines;
- `EnergyTracker`: the cumulative energy counter of each GPU as per-interval deltas;
- `DcgmCollector`: one exporter, with the state that spans scrapes (previous scrape time per
  GPU, energy counters, last XID per GPU).

Rules this module guarantees (and the tests pin):
- Families: 2.x-4.x `DCGM_FI_*` names and the 1.x `dcgm_*` names map to the same fields;
  families not listed in `FAMILIES` are ignored. `# HELP` and `# TYPE` lines are dropped before
  parsing: the table here knows each family's unit, and exporters' help texts are known to be
  wrong (the PROF ratios say "%" and print 0-1), so payloads with and without them read alike.
- Units: utilisations are integer percent; `DCGM_FI_PROF_*` values are ratios 0-1, always,
  and become percent; MiB become bytes, W become mW. Every conversion rounds once, here, to the
  nearest integer with halves up, from the value as printed. No float reaches a `GpuSample`.
- Memory: `memory_total_bytes = FB_USED + FB_FREE` (a missing family counts as 0).
- Utilisation of a whole GPU: `DCGM_FI_DEV_GPU_UTIL`, else GR_ENGINE_ACTIVE, else 0 (a sample
  has no "unknown" utilisation; a dropped row is always reported as a problem); memory
  utilisation: `DCGM_FI_DEV_MEM_COPY_UTIL`, else DRAM_ACTIVE, else None. A GPU (slice) none of
  whose rows could be used yields no sample.
- Bad rows: a value that is not a number (`ERROR - FAILED TO CONVERT TO STRING`, empty), NaN,
  ±Inf, negative, out of its field's range, a row without UUID, unreadable labels and a second
  row for the same GPU (slice) and family are dropped and reported, grouped per kind and
  family. The rest of the payload is still used.
- Host: the `Hostname` (or `hostname`) label, else the caller's `host_default`.
- Owner (`owner_from_labels`): a non-empty `pod` (`pod_name` on 1.x) gives
  `Owner(team=<namespace>, project=None, job_id="k8s:<namespace>/<pod>")`; a caller's
  `namespaces` mapping replaces (team, project) for the namespaces it names. Without a pod, a
  non-empty `hpc_job` gives `Owner(job_id="slurm:<hpc_job>")`. Empty labels mean no owner.
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
  `total_slices` is 4 on the 4-slice models (A30, RTX PRO 6000) and 7 otherwise.
- XID: `DCGM_FI_DEV_XID_ERRORS` is the last XID seen. A `GpuHealth(kind=XID_ERROR)` is emitted
  when it is non-zero and differs from the previous scrape's value (one event per GPU, never
  per slice). The same XID twice in a row is indistinguishable from no new error.
- Time: a scrape's time (from the collector's clock, after the response arrived) is every
  sample's `sample_time_us`; `interval_us` is the time since the previous scrape that saw the
  same GPU (slice), or the configured scrape interval on the first scrape, after a gap longer
  than `MAX_INTERVAL_US`, or when the clock went backwards. `energy_mj` is filled only when the
  interval is continuous with the previous reading.
"""

from __future__ import annotations

import math
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from collectors.errors import DcgmScrapeError
from ledger.attribution import unconfigured_slices
from ledger.events import (
    MAX_INTERVAL_US,
    DeadLetter,
    GpuHealth,
    GpuSample,
    HealthKind,
    MigInstance,
    Owner,
    SampleEnvelope,
    SampleSource,
    envelope_for,
)

__all__ = [
    "FAMILIES",
    "DcgmCollector",
    "DcgmConfig",
    "DcgmProblem",
    "DcgmScrapeError",
    "EnergyReading",
    "EnergyTracker",
    "Field",
    "GpuActivity",
    "NamespaceOwners",
    "ParseResult",
    "ProblemKind",
    "ScrapeResult",
    "fetch_metrics",
    "make_session",
    "mig_slices",
    "owner_from_labels",
    "parse_metrics",
    "problem_dead_letter",
]

MIB = 1 << 20
MAX_LABEL_CHARS = 256  # the event decoder rejects longer strings
MAX_PROBLEM_LINES = 64  # lines kept per problem; `DcgmProblem.count` has the full number
MAX_DEAD_LETTER_CHARS = 16_384

NamespaceOwners = Mapping[str, tuple[str, str | None]]
"""namespace → (team, project) for pods in that namespace."""

Clock = Callable[[], int]
Sleep = Callable[[float], None]


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
class _Unit:
    scale: int  # integer value = round_half_up(printed value × scale)
    hi: int  # the largest valid integer value
    device_scoped: bool  # MIG rows repeat the parent GPU's value


_PCT = _Unit(scale=1, hi=100, device_scoped=True)
_RATIO = _Unit(scale=100, hi=100, device_scoped=False)
_UNITS: Mapping[Field, _Unit] = MappingProxyType(
    {
        Field.GPU_UTIL: _PCT,
        Field.MEM_COPY_UTIL: _PCT,
        Field.FB_USED: _Unit(scale=MIB, hi=1 << 50, device_scoped=False),
        Field.FB_FREE: _Unit(scale=MIB, hi=1 << 50, device_scoped=False),
        Field.POWER: _Unit(scale=1000, hi=100_000_000, device_scoped=True),
        Field.ENERGY: _Unit(scale=1, hi=(1 << 63) - 1, device_scoped=True),
        Field.TEMPERATURE: _Unit(scale=1, hi=200, device_scoped=True),
        Field.SM_CLOCK: _Unit(scale=1, hi=10_000, device_scoped=True),
        Field.XID: _Unit(scale=1, hi=(1 << 31) - 1, device_scoped=True),
        Field.GR_ENGINE_ACTIVE: _RATIO,
        Field.SM_ACTIVE: _RATIO,
        Field.SM_OCCUPANCY: _RATIO,
        Field.TENSOR_ACTIVE: _RATIO,
        Field.DRAM_ACTIVE: _RATIO,
    }
)

_XID_MEANING: Mapping[int, str] = MappingProxyType(
    {
        13: "graphics engine exception",
        31: "GPU memory page fault",
        32: "invalid or corrupted push buffer stream",
        43: "GPU stopped processing",
        45: "preemptive cleanup",
        48: "double-bit ECC error",
        61: "internal micro-controller breakpoint/warning",
        62: "internal micro-controller halt",
        63: "ECC page retirement or row remapping recorded",
        64: "ECC page retirement or row remapping failed",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        92: "high single-bit ECC error rate",
        94: "contained ECC error",
        95: "uncontained ECC error",
        119: "GSP RPC timeout",
        120: "GSP error",
    }
)

_FOUR_SLICE_MODELS = ("A30", "RTX PRO 6000")
_MIG_PROFILE = re.compile(r"(?:\d+c\.)?(\d+)g\.\d+gb(?:\+[a-z0-9.]+)*", re.ASCII | re.IGNORECASE)
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_DEVICE = re.compile(r"nvidia(\d{1,4})", re.ASCII)


# ---------------------------------------------------------------------------- results


class ProblemKind(StrEnum):
    """Why rows of a payload were not used."""

    UNPARSABLE = "unparsable"  # the Prometheus text parser rejects the line
    NOT_A_NUMBER = "not_a_number"  # value missing or not a number
    NOT_FINITE = "not_finite"  # NaN or ±Inf
    NEGATIVE = "negative"
    OUT_OF_RANGE = "out_of_range"  # beyond the field's range once converted
    MISSING_UUID = "missing_uuid"
    BAD_LABEL = "bad_label"  # GPU index, MIG id/profile, or a label too long to carry
    DUPLICATE = "duplicate"  # a second row for one GPU (slice) and family; the first is kept


@dataclass(frozen=True, slots=True)
class DcgmProblem:
    """Rows of one payload that were dropped, for one reason and one family.

    `lines` holds the first `MAX_PROBLEM_LINES` offending lines as printed; `count` all of them.
    """

    kind: ProblemKind
    family: str | None
    detail: str
    lines: tuple[str, ...]
    count: int


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


def problem_dead_letter(problem: DcgmProblem) -> DeadLetter:
    """The dead-letter record of a problem; its payload is the offending lines."""
    payload = "\n".join(problem.lines)
    if len(payload) > MAX_DEAD_LETTER_CHARS:
        payload = payload[:MAX_DEAD_LETTER_CHARS] + "…"
    family = f" {problem.family}" if problem.family else ""
    return DeadLetter(
        reason=f"dcgm {problem.kind.value}{family}: {problem.detail} ({problem.count} rows)",
        payload=payload,
    )


# ---------------------------------------------------------------------------- labels


def owner_from_labels(
    labels: Mapping[str, str], namespaces: NamespaceOwners | None = None
) -> Owner | None:
    """The GPU's owner from its row's pod or HPC-job labels (see the module's rules)."""
    pod = labels.get("pod") or labels.get("pod_name") or ""
    if pod:
        namespace = labels.get("namespace") or labels.get("pod_namespace") or ""
        team: str | None = namespace or None
        project: str | None = None
        if namespaces is not None and namespace in namespaces:
            team, project = namespaces[namespace]
        job_id = f"k8s:{namespace}/{pod}" if namespace else f"k8s:{pod}"
        return Owner(team=team or None, project=project or None, job_id=job_id)
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


def _owner_too_long(owner: Owner) -> bool:
    return any(
        value is not None and len(value) > MAX_LABEL_CHARS
        for value in (owner.team, owner.project, owner.job_id)
    )


# ---------------------------------------------------------------------------- parsing


class _Group:
    __slots__ = ("count", "detail", "lines")

    def __init__(self, detail: str) -> None:
        self.detail = detail
        self.lines: list[str] = []
        self.count = 0


class _Problems:
    """Problems in order of first appearance, grouped per (kind, family)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[ProblemKind, str | None], _Group] = {}

    def add(self, kind: ProblemKind, family: str | None, detail: str, line: str) -> None:
        group = self._groups.get((kind, family))
        if group is None:
            group = self._groups[(kind, family)] = _Group(detail)
        if len(group.lines) < MAX_PROBLEM_LINES:
            group.lines.append(line)
        group.count += 1

    def result(self) -> tuple[DcgmProblem, ...]:
        return tuple(
            DcgmProblem(kind, family, group.detail, tuple(group.lines), group.count)
            for (kind, family), group in self._groups.items()
        )


def _is_number(token: str) -> bool:
    if "_" in token:  # float() accepts 1_000, the Prometheus parser does not
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split_sample_lines(text: str, problems: _Problems) -> list[tuple[str, str | None]]:
    """The sample lines worth parsing, as (line, metric name or None when only the parser can
    tell). Comments go; lines of unknown families go; lines whose value or timestamp is not a
    number are reported here, because one of them makes the parser reject the whole payload."""
    kept: list[tuple[str, str | None]] = []
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        if line[0] == "{":  # the name is a label (`{"name", ...}`): only the parser can tell
            kept.append((line, None))
            continue
        match = _METRIC_NAME.match(line)
        if match is None:
            problems.add(ProblemKind.UNPARSABLE, None, "not a metric line", line)
            continue
        name = match.group()
        if name not in FAMILIES:
            continue
        rest = line[match.end() :]
        after = rest.lstrip(" \t")
        if after[:1] == "{":
            close = after.rfind("}")
            if close == -1:
                problems.add(ProblemKind.UNPARSABLE, name, "labels are not closed", line)
                continue
            after = after[close + 1 :]
        elif after and len(after) == len(rest):  # the name runs into something else
            problems.add(ProblemKind.UNPARSABLE, name, "not a metric name", line)
            continue
        tokens = after.split()
        if not tokens or not _is_number(tokens[0]) or not _is_number(tokens[-1]):
            problems.add(ProblemKind.NOT_A_NUMBER, name, "the value is not a number", line)
            continue
        kept.append((line, name))
    return kept


def _samples_of(text: str) -> list[Sample]:
    samples: list[Sample] = []
    for family in text_string_to_metric_families(text):
        samples.extend(family.samples)
    return samples


def _parse_lines(
    lines: list[tuple[str, str | None]], problems: _Problems
) -> Iterator[tuple[str, Sample]]:
    """(line, parsed sample) for every line the Prometheus parser accepts.

    Without comment lines every sample line is its own family, so the parser's samples are the
    lines' samples in order; only when it rejects the block are lines parsed one by one.
    """
    try:
        samples = _samples_of("\n".join(line for line, _ in lines))
    except Exception:  # the parser raises assorted errors on bad input; the fallback reports
        samples = []
    if len(samples) == len(lines):
        yield from zip((line for line, _ in lines), samples, strict=True)
        return
    for line, name in lines:
        try:
            parsed = _samples_of(line)
        except Exception as exc:  # as above: the line's problem, not the caller's
            problems.add(ProblemKind.UNPARSABLE, name, _short(str(exc)), line)
            continue
        if len(parsed) == 1:
            yield line, parsed[0]
        else:
            problems.add(ProblemKind.UNPARSABLE, name, "not one sample", line)


def _short(message: str) -> str:
    return message if len(message) <= 120 else message[:120] + "…"


def _convert(value: float, unit: _Unit) -> tuple[int, None] | tuple[None, ProblemKind]:
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


_PROBLEM_DETAIL: Mapping[ProblemKind, str] = MappingProxyType(
    {
        ProblemKind.NOT_FINITE: "the value is NaN or infinite",
        ProblemKind.NEGATIVE: "the value is negative",
        ProblemKind.OUT_OF_RANGE: "the value is out of the field's range",
    }
)


class _Gpu:
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


def _new_gpu(
    labels: Mapping[str, str], uuid: str, host_default: str, model_default: str
) -> _Gpu | str:
    """The GPU (slice) a row describes, or why its labels cannot be used."""
    node = labels.get("Hostname") or labels.get("hostname") or host_default
    model = labels.get("modelName") or model_default
    if max(len(uuid), len(node), len(model)) > MAX_LABEL_CHARS:
        return f"UUID, host or model longer than {MAX_LABEL_CHARS} characters"
    index = _small_int(labels.get("gpu", ""), 1023)
    if index is None:
        device = _DEVICE.fullmatch(labels.get("device", ""))
        index = _small_int(device.group(1), 1023) if device else None
    if index is None:
        return "no GPU index in the gpu or device label"
    gi_text = labels.get("GPU_I_ID", "")
    profile = labels.get("GPU_I_PROFILE", "")
    if not gi_text and not profile:
        return _Gpu(uuid, index, model, node, None)
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
    return _Gpu(uuid, index, model, node, mig)


def parse_metrics(
    text: str,
    *,
    host_default: str,
    pool: str,
    time_us: int,
    interval_us: int,
    namespaces: NamespaceOwners | None = None,
    previous_xid: Mapping[str, int] | None = None,
    model_default: str = "unknown",
) -> ParseResult:
    """Map one dcgm-exporter payload to samples, XID health events and problems.

    Pure: no I/O, no clock. Every sample has `sample_time_us=time_us` and
    `interval_us=interval_us`. `previous_xid` is each GPU's XID value from the previous payload
    (absent: 0). Raises ValueError only for invalid arguments, never for the text.
    """
    if not pool or len(pool) > MAX_LABEL_CHARS:
        raise ValueError("pool must be a non-empty name of at most 256 characters")
    if not host_default or len(host_default) > MAX_LABEL_CHARS:
        raise ValueError("host_default must be a non-empty name of at most 256 characters")
    if not 1 <= interval_us <= MAX_INTERVAL_US or time_us < 1:
        raise ValueError("time_us must be positive and interval_us in [1, MAX_INTERVAL_US]")
    problems = _Problems()
    lines = _split_sample_lines(text, problems)
    gpus: dict[tuple[str, str, str], _Gpu | str] = {}
    for line, sample in _parse_lines(lines, problems):
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
            gpu = gpus[key] = _new_gpu(labels, uuid, host_default, model_default)
        if isinstance(gpu, str):
            problems.add(ProblemKind.BAD_LABEL, name, gpu, line)
            continue
        value, kind = _convert(sample.value, _UNITS[field_])
        if value is None:
            assert kind is not None
            problems.add(kind, name, _PROBLEM_DETAIL[kind], line)
            continue
        if field_ in gpu.values:
            problems.add(ProblemKind.DUPLICATE, name, "a second row; the first is kept", line)
            continue
        if gpu.owner is None:
            owner = owner_from_labels(labels, namespaces)
            if owner is not None and _owner_too_long(owner):
                problems.add(ProblemKind.BAD_LABEL, name, "pod labels too long to carry", line)
                continue
            gpu.owner = owner
        gpu.values[field_] = value
    return _assemble(
        [gpu for gpu in gpus.values() if not isinstance(gpu, str) and gpu.values],
        problems.result(),
        pool=pool,
        time_us=time_us,
        interval_us=interval_us,
        previous_xid=previous_xid or {},
    )


def _assemble(
    gpus: list[_Gpu],
    problems: tuple[DcgmProblem, ...],
    *,
    pool: str,
    time_us: int,
    interval_us: int,
    previous_xid: Mapping[str, int],
) -> ParseResult:
    by_uuid: dict[str, list[_Gpu]] = {}
    for gpu in gpus:
        by_uuid.setdefault(gpu.uuid, []).append(gpu)
    samples: list[GpuSample] = []
    health: list[GpuHealth] = []
    energy: list[EnergyReading] = []
    activity: list[GpuActivity] = []
    for uuid, rows in by_uuid.items():
        whole = next((gpu for gpu in rows if gpu.mig is None), None)
        slices = sorted(
            (gpu for gpu in rows if gpu.mig is not None),
            key=lambda gpu: gpu.mig.gpu_instance_id if gpu.mig else 0,
        )
        device = _device_values(whole, slices)
        parent = whole if whole is not None else slices[0]
        for gpu in slices or [parent]:
            samples.append(_sample(gpu, device, pool, time_us, interval_us))
            activity.append(_activity(gpu))
        rest = unconfigured_slices([gpu.mig for gpu in slices if gpu.mig is not None])
        if rest is not None:  # slices no instance occupies: unallocated capacity
            spare = _Gpu(uuid, parent.index, parent.model, parent.node, rest)
            samples.append(_sample(spare, {}, pool, time_us, interval_us))
        if Field.ENERGY in device:
            energy.append(EnergyReading(gpu_uuid=uuid, counter_mj=device[Field.ENERGY]))
        xid = device.get(Field.XID, 0)
        if xid and xid != previous_xid.get(uuid, 0):
            meaning = _XID_MEANING.get(xid)
            health.append(
                GpuHealth(
                    node=parent.node,
                    gpu_uuid=uuid,
                    gpu_index=parent.index,
                    kind=HealthKind.XID_ERROR,
                    detail=f"XID {xid}" + (f": {meaning}" if meaning else ""),
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
    )


def _device_values(whole: _Gpu | None, slices: list[_Gpu]) -> dict[Field, int]:
    """The parent GPU's device-scoped values: its own rows first, else the first slice's copy."""
    values = {f: v for f, v in whole.values.items() if _UNITS[f].device_scoped} if whole else {}
    for gpu in slices:
        for f, v in gpu.values.items():
            if _UNITS[f].device_scoped:
                values.setdefault(f, v)
    return values


def _sample(
    gpu: _Gpu, device: Mapping[Field, int], pool: str, time_us: int, interval_us: int
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


def _activity(gpu: _Gpu) -> GpuActivity:
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


# ---------------------------------------------------------------------------- energy


class EnergyTracker:
    """Cumulative energy counters (mJ) per GPU as energy used since the previous reading.

    A counter lower than its previous reading was reset (driver reload, GPU reset) and is taken
    to have counted from zero since, as Prometheus' `increase()` does. The first reading of a
    GPU, or the first after `forget`, gives None.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def observe(self, key: str, counter_mj: int) -> int | None:
        previous = self._last.get(key)
        self._last[key] = counter_mj
        if previous is None:
            return None
        if counter_mj >= previous:
            return counter_mj - previous
        return counter_mj

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


# ---------------------------------------------------------------------------- scraping


@dataclass(frozen=True, slots=True)
class DcgmConfig:
    """One dcgm-exporter endpoint and how to read it.

    `verify` is True (system CAs), False (no verification) or the path of a CA bundle.
    `node` is the node name for rows without a host label (default: this machine's hostname).
    """

    url: str
    pool: str = "default"
    node: str | None = None
    scrape_interval_us: int = 30_000_000  # dcgm-exporter's default collection interval
    connect_timeout_s: float = 3.05
    read_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    verify: bool | str = True
    max_bytes: int = 32 << 20
    namespaces: NamespaceOwners = field(default_factory=lambda: MappingProxyType({}))
    model_default: str = "unknown"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http:// or https://, got {self.url!r}")
        if not 1 <= self.scrape_interval_us <= MAX_INTERVAL_US:
            raise ValueError("scrape_interval_us must be in [1, MAX_INTERVAL_US]")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError("retries and backoff must not be negative")
        if not self.pool or len(self.pool) > MAX_LABEL_CHARS:
            raise ValueError("pool must be a non-empty name of at most 256 characters")
        if self.max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if self.basic_auth is not None:
            try:
                ":".join(self.basic_auth).encode("latin-1")
            except UnicodeEncodeError as exc:
                raise ValueError("basic_auth must be latin-1 text (HTTP basic auth)") from exc
        object.__setattr__(self, "namespaces", MappingProxyType(dict(self.namespaces)))


def make_session() -> requests.Session:
    """The HTTP session `DcgmCollector` creates when none is passed in."""
    session = requests.Session()
    session.headers["Accept"] = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    session.headers["User-Agent"] = "tally-dcgm-collector"
    return session


class _Retry(Exception):
    """One attempt failed in a way another attempt may fix."""

    def __init__(self, message: str, status: int | None, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.wait_s = wait_s


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isascii() and value.isdigit() else None


def _attempt(session: requests.Session, config: DcgmConfig) -> str:
    """One GET. Raises `_Retry` for what a retry may fix, DcgmScrapeError for the rest; the only
    place that handles requests' exceptions."""
    url = config.url
    try:
        with session.get(
            url,
            timeout=(config.connect_timeout_s, config.read_timeout_s),
            auth=config.basic_auth,
            verify=config.verify,
            stream=True,
        ) as response:
            status = response.status_code
            if status >= 500:
                raise _Retry(f"HTTP {status} {response.reason}", status, _retry_after(response))
            if status in (401, 403):
                raise DcgmScrapeError(
                    f"HTTP {status}: the exporter refused the credentials"
                    + ("" if config.basic_auth else " (no basic auth configured)"),
                    url=url,
                    status=status,
                )
            if not 200 <= status < 300:
                raise DcgmScrapeError(f"HTTP {status} {response.reason}", url=url, status=status)
            body = bytearray()
            for chunk in response.iter_content(chunk_size=1 << 16):
                body += chunk
                if len(body) > config.max_bytes:
                    raise DcgmScrapeError(
                        f"the response is larger than {config.max_bytes} bytes",
                        url=url,
                        status=status,
                    )
            return body.decode("utf-8", errors="replace")
    except requests.exceptions.SSLError as exc:  # a certificate does not fix itself on retry
        raise DcgmScrapeError(f"TLS error: {exc}", url=url) from exc
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.ChunkedEncodingError,
    ) as exc:
        raise _Retry(f"{type(exc).__name__}: {exc}", None) from exc
    except requests.RequestException as exc:
        raise DcgmScrapeError(f"{type(exc).__name__}: {exc}", url=url) from exc
    except OSError as exc:  # requests raises a bare OSError for a CA bundle path it cannot read
        raise DcgmScrapeError(f"{type(exc).__name__}: {exc}", url=url) from exc


def fetch_metrics(
    session: requests.Session, config: DcgmConfig, *, sleep: Sleep = time.sleep
) -> str:
    """The exporter's payload as text; raises DcgmScrapeError.

    Connection errors, timeouts and 5xx are retried `config.retries` times, waiting
    `backoff_s × 2^(n-1)` (at most `backoff_max_s`, or a 5xx's `Retry-After` up to that cap)
    before the n-th retry. 4xx and TLS errors are not retried.
    """
    attempts = config.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            return _attempt(session, config)
        except _Retry as failure:
            if attempt == attempts:
                raise DcgmScrapeError(
                    f"{failure} (after {attempts} attempts)",
                    url=config.url,
                    status=failure.status,
                    attempts=attempts,
                ) from failure.__cause__
            wait = config.backoff_s * 2 ** (attempt - 1)
            if failure.wait_s is not None:
                wait = max(wait, failure.wait_s)
            sleep(min(wait, config.backoff_max_s))
    raise AssertionError("unreachable: the loop returns or raises")


# ---------------------------------------------------------------------------- collector


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape: sample envelopes, XID health events, dead letters for dropped rows, and the
    problems and profiling ratios they came with."""

    envelopes: tuple[SampleEnvelope, ...]
    health: tuple[GpuHealth, ...]
    dead_letters: tuple[DeadLetter, ...]
    problems: tuple[DcgmProblem, ...] = ()
    activity: tuple[GpuActivity, ...] = ()


def _wall_clock_us() -> int:
    return time.time_ns() // 1_000


class DcgmCollector:
    """Scrapes one dcgm-exporter and keeps what spans scrapes: each GPU's previous scrape time,
    its energy counter and its last XID.

    The session is created here (`make_session`) unless one is passed in; a passed-in session
    is not closed by `close()`.
    """

    def __init__(
        self,
        config: DcgmConfig,
        *,
        session: requests.Session | None = None,
        clock: Clock = _wall_clock_us,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.config = config
        self._session = session if session is not None else make_session()
        self._owns_session = session is None
        self._clock = clock
        self._sleep = sleep
        self._host = config.node or socket.gethostname()
        self._last_time_us: dict[str, int] = {}
        self._energy = EnergyTracker()
        self._xid: dict[str, int] = {}

    def scrape(self) -> ScrapeResult:
        """Read the exporter once; raises DcgmScrapeError when it cannot be read."""
        text = fetch_metrics(self._session, self.config, sleep=self._sleep)
        return self.ingest(text, self._clock())

    def ingest(self, text: str, time_us: int) -> ScrapeResult:
        """Turn one payload read at `time_us` into envelopes, updating the state across scrapes."""
        config = self.config
        parsed = parse_metrics(
            text,
            host_default=self._host,
            pool=config.pool,
            time_us=time_us,
            interval_us=config.scrape_interval_us,
            namespaces=config.namespaces,
            previous_xid=self._xid,
            model_default=config.model_default,
        )
        counters = {reading.gpu_uuid: reading.counter_mj for reading in parsed.energy}
        envelopes: list[SampleEnvelope] = []
        for sample in parsed.samples:
            previous = self._last_time_us.get(sample.subject)
            self._last_time_us[sample.subject] = time_us
            interval = config.scrape_interval_us
            continuous = previous is not None and 0 < time_us - previous <= MAX_INTERVAL_US
            if continuous and previous is not None:
                interval = time_us - previous
            energy = None
            if sample.mig is None:
                counter = counters.get(sample.gpu_uuid)
                if not continuous or counter is None:
                    self._energy.forget(sample.gpu_uuid)
                if counter is not None:
                    energy = self._energy.observe(sample.gpu_uuid, counter)
            timed = replace(sample, interval_us=interval, energy_mj=energy)
            envelopes.append(envelope_for(timed, source=f"dcgm://{timed.node}"))
        self._xid.update(
            {s.gpu_uuid: s.xid_errors for s in parsed.samples if s.xid_errors is not None}
        )
        return ScrapeResult(
            envelopes=tuple(envelopes),
            health=parsed.health,
            dead_letters=tuple(problem_dead_letter(p) for p in parsed.problems),
            problems=parsed.problems,
            activity=parsed.activity,
        )

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> DcgmCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
