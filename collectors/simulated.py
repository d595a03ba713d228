"""The simulated fleet: a deterministic GPU fleet with realistic workload shapes.

Given a seed, the fleet's GPUs, their UUIDs, and the workload each GPU runs at any time are
fixed; so are the values sampled in a sequence of rounds. Workload shapes:

- training:     near saturation (90–100 % SM), 70–95 % of memory, several hours at a time;
- inference:    a daily cycle (busiest mid-afternoon UTC), moderate memory;
- notebook:     holds 30–60 % of memory at ~0 % utilisation (the classic idle waste);
- unallocated:  no processes, no owner.

Each GPU's timeline is cut into epochs of 2–8 hours (length fixed per GPU by the seed); the
workload and owner of an epoch are drawn from the seed, so any time can be sampled directly.

As a simulated *cluster* (`external_pct` set, what `tally up` runs): a GPU runs what the
scheduler placed there (`jobs`: GPU UUID → the job's workload, kept by whoever follows the
scheduler: `collectors.jobs_follower` live, `tally.history` for the backfill); a GPU with no
job runs, per epoch, an external notebook with its own owner (`external_pct` % of epochs: work
Tally did not schedule, which idle alerts still catch) or nothing at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ledger.events import GpuSample, Owner, ProcessUsage, SampleSource

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
GIB = 1 << 30
_MASK64 = (1 << 64) - 1


class WorkloadKind(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"
    UNALLOCATED = "unallocated"


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    model: str
    nodes: int
    gpus_per_node: int
    memory_gib: int


@dataclass(frozen=True, slots=True)
class TeamSpec:
    name: str
    projects: tuple[str, ...]
    users: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SimGpu:
    node: str
    uuid: str
    index: int
    model: str
    pool: str
    memory_total_bytes: int
    epoch_us: int
    phase_us: int
    ordinal: int


@dataclass(frozen=True, slots=True)
class Workload:
    kind: WorkloadKind
    owner: Owner | None
    pid: int


def _mix(*values: int) -> int:
    """splitmix64 over the values: a fast, deterministic hash."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state


mix64 = _mix  # for the other simulated parts (`collectors.workload`)


def _unit(*values: int) -> float:
    """A deterministic number in [0, 1) (simulation values only; never a ledger amount)."""
    return (_mix(*values) >> 11) / float(1 << 53)


class SimulatedFleet:
    """A seeded fleet; `sample_round(t)` gives one sample per GPU for the interval ending at t."""

    def __init__(
        self,
        seed: int,
        pools: Sequence[PoolSpec],
        teams: Sequence[TeamSpec],
        mix: Sequence[tuple[WorkloadKind, int]],
        interval_us: int,
        external_pct: int | None = None,
    ) -> None:
        if not teams:
            raise ValueError("the simulated fleet needs at least one team to draw owners from")
        self.seed = seed
        self.teams = tuple(teams)
        self.interval_us = interval_us
        self.external_pct = external_pct
        self.jobs: dict[str, Workload] = {}  # cluster mode: GPU UUID → the job running there
        self._kinds = [kind for kind, weight in mix if weight > 0]
        self._weights = [weight for _, weight in mix if weight > 0]
        gpus: list[SimGpu] = []
        for pool_no, pool in enumerate(pools):
            for node_no in range(pool.nodes):
                node = f"{pool.name}-node-{node_no:02d}"
                for index in range(pool.gpus_per_node):
                    h = _mix(seed, pool_no, node_no, index)
                    uuid = (
                        f"GPU-{h >> 32 & 0xFFFFFFFF:08x}-{h >> 16 & 0xFFFF:04x}-"
                        f"{h & 0xFFFF:04x}-{_mix(h, 1) & 0xFFFF:04x}-"
                        f"{_mix(h, 2) & 0xFFFFFFFFFFFF:012x}"
                    )
                    epoch = 2 * HOUR_US + _mix(h, 3) % (6 * HOUR_US)
                    gpus.append(
                        SimGpu(
                            node,
                            uuid,
                            index,
                            pool.model,
                            pool.name,
                            pool.memory_gib * GIB,
                            epoch,
                            _mix(h, 4) % epoch,
                            len(gpus),
                        )
                    )
        self.gpus = tuple(gpus)
        self._energy_mj = [_mix(seed, g.ordinal, 5) % (10**9) for g in gpus]

    def workload_at(self, gpu: SimGpu, time_us: int) -> Workload:
        epoch = (time_us + gpu.phase_us) // gpu.epoch_us
        h = _mix(self.seed, gpu.ordinal, epoch)
        kind = self._kinds[-1]
        if self.external_pct is not None:
            running = self.jobs.get(gpu.uuid)
            if running is not None:
                return running
            external = h % 100 < self.external_pct
            kind = WorkloadKind.NOTEBOOK if external else WorkloadKind.UNALLOCATED
        else:
            pick = h % sum(self._weights)
            for candidate, weight in zip(self._kinds, self._weights, strict=True):
                if pick < weight:
                    kind = candidate
                    break
                pick -= weight
        if kind is WorkloadKind.UNALLOCATED:
            return Workload(kind, None, 0)
        team = self.teams[_mix(h, 1) % len(self.teams)]
        project = team.projects[_mix(h, 2) % len(team.projects)]
        users = team.users or (f"{team.name}-user{_mix(h, 3) % 4}",)
        user = users[_mix(h, 4) % len(users)]
        job = f"{kind.value[:5]}-{h % 1_000_000:06d}"
        pid = 1000 + _mix(h, 5) % 60_000
        return Workload(kind, Owner(team=team.name, project=project, user=user, job_id=job), pid)

    def job_workload(self, kind: WorkloadKind, owner: Owner) -> Workload:
        """What a scheduled job runs on each of its GPUs: its profile and its owner (a pid
        drawn from the job id, as stable as a real process's)."""
        h = _mix(self.seed, *(ord(c) for c in owner.job_id or ""))
        return Workload(kind, owner, 1000 + h % 60_000)

    def sample(self, gpu: SimGpu, time_us: int) -> GpuSample:
        """The sample of `gpu` for the interval ending at `time_us`."""
        work = self.workload_at(gpu, time_us - 1)
        noise = _unit(self.seed, gpu.ordinal, time_us)
        total = gpu.memory_total_bytes
        if work.kind is WorkloadKind.TRAINING:
            util = 90 + int(noise * 11)
            memory = total * (70 + int(_unit(self.seed, gpu.ordinal, time_us, 1) * 26)) // 100
        elif work.kind is WorkloadKind.INFERENCE:
            day = (time_us % DAY_US) / DAY_US
            wave = 35 + 30 * math.sin(2 * math.pi * (day - 0.35))
            util = max(0, min(100, int(wave + noise * 10)))
            memory = total * 40 // 100
        elif work.kind is WorkloadKind.NOTEBOOK:
            util = int(noise * 2)
            memory = (
                total * (30 + (_mix(self.seed, gpu.ordinal, time_us // gpu.epoch_us) % 31)) // 100
            )
        else:
            util = 0
            memory = 0
        power_mw = 70_000 + util * 6_300
        used_mj = power_mw * self.interval_us // 1_000_000  # mW·s = mJ
        self._energy_mj[gpu.ordinal] += used_mj
        processes: tuple[ProcessUsage, ...] = ()
        if work.owner is not None:
            processes = (ProcessUsage(work.pid, memory, util, work.owner),)
        return GpuSample(
            node=gpu.node,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            model=gpu.model,
            pool=gpu.pool,
            util_gpu_pct=util,
            util_mem_pct=util // 2,
            memory_used_bytes=memory,
            memory_total_bytes=total,
            power_mw=power_mw,
            energy_mj=self._energy_mj[gpu.ordinal],
            energy_delta_mj=used_mj,
            processes=processes,
            source=SampleSource.SIMULATED,
            sample_time_us=time_us,
            interval_us=self.interval_us,
        )

    def sample_round(self, time_us: int) -> list[GpuSample]:
        return [self.sample(gpu, time_us) for gpu in self.gpus]


def align(time_us: int, interval_us: int) -> int:
    """The sampling grid point at or before `time_us`."""
    return time_us - time_us % interval_us
