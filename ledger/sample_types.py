"""GPU samples and health events as values: their types, the samples' enums and the bounds a
decoded sample keeps to (`MAX_*`), shared by the codec (`ledger.events`), its decoders
(`ledger.sample_decode`) and the collectors.

Every dataclass here is frozen, slotted and holds tuples, never lists. Most modules import these
names from `ledger.events`, which re-exports them with the samples family.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger.envelope import Envelope

MAX_INTERVAL_US = 3_600_000_000  # one sample never covers more than an hour
MAX_ENERGY_DELTA_MJ = 10**12  # energy of one sample: far above any GPU's for an hour
MAX_TEXT = 256  # a sample's names (node, GPU UUID, model, pool, owner fields)
MAX_SLICES = 64  # MIG slices of one GPU
MAX_TIME_US = 7_258_118_400_000_000  # 2200-01-01: anything later is a broken clock


class EventType(StrEnum):
    """The `type` attribute of every event Tally writes."""

    GPU_SAMPLE = "tally.gpu.sample"
    GPU_HEALTH = "tally.gpu.health"


class HealthKind(StrEnum):
    """What a health event reports about a GPU."""

    GPU_LOST = "gpu_lost"
    XID_ERROR = "xid_error"
    RECOVERED = "recovered"
    ECC_DBE = "ecc_dbe"  # a double-bit (uncorrectable) ECC error counted
    RETIRED_PAGES = "retired_pages"  # pages retired or rows remapped, or pending retirement
    THERMAL_THROTTLE = "thermal_throttle"
    POWER_THROTTLE = "power_throttle"


class SampleSource(StrEnum):
    """Which collector read a sample."""

    NVML = "nvml"
    DCGM = "dcgm"
    SIMULATED = "sim"


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a GPU or a process belongs to, as far as the collector knows."""

    team: str | None = None
    project: str | None = None
    user: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG slice: its GPU/compute instance ids, profile, and share of the parent GPU in slices.

    `first_slice`: where its slices begin in the collector's accounting layout of the GPU (its
    instances in GPU-instance-id order, then the uncarved rest: `ledger.fractional.lay_out`);
    None when the collector gave none. With it, the GPU time of the instances of one sampling
    pass sums exactly to the whole GPU's (`ledger.attribution.physical_gpu_ms`). `uuid`: the
    MIG device's own name, `ledger.mig_devices` (None: the collector could not read it).
    """

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: int
    total_slices: int = 7
    first_slice: int | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on a GPU during a sample interval."""

    pid: int
    used_memory_bytes: int
    sm_util_pct: int | None = None
    owner: Owner | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Schema v1 of a GPU sample: what one GPU (or MIG slice) did over `interval_us`.

    The interval ends at `sample_time_us`. `owner` is the GPU-level owner when the source knows
    one (a pod on dcgm-exporter, the simulated fleet); processes may carry their own owners.
    """

    node: str
    gpu_uuid: str
    gpu_index: int
    model: str
    pool: str
    util_gpu_pct: int
    memory_used_bytes: int
    memory_total_bytes: int
    source: SampleSource
    sample_time_us: int
    interval_us: int
    util_mem_pct: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    mig: MigInstance | None = None
    processes: tuple[ProcessUsage, ...] = ()
    owner: Owner | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    xid_errors: int | None = None
    energy_delta_mj: int | None = None  # energy used over this interval (the counter's rise)

    @property
    def subject(self) -> str:
        """The envelope subject: the GPU, or the GPU and its MIG instance."""
        if self.mig is None:
            return self.gpu_uuid
        return f"{self.gpu_uuid}/gi{self.mig.gpu_instance_id}"

    @property
    def start_us(self) -> int:
        return self.sample_time_us - self.interval_us


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Something happened to a GPU's health (lost from the bus, an XID error, recovered)."""

    node: str
    gpu_uuid: str
    gpu_index: int
    kind: HealthKind
    detail: str
    time_us: int
    source: SampleSource
    xid: int | None = None


SampleEnvelope = Envelope[GpuSample]
