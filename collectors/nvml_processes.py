"""A GPU's processes through NVML: which processes run where (GPU instance), their memory and
SM utilisation, and who owns them (`ProcessReader`).

Rules:
- Per-process SM utilisation comes from `nvmlDeviceGetProcessUtilization(handle, ts)` with `ts`
  the newest sample timestamp of the GPU's previous round (0 at first: NVML's window average).
  Several samples of one process are averaged. When NVML answered (samples, or NotFound for
  none), a listed process without a sample ran no kernels: 0. When it cannot answer: None.
- On a MIG GPU the parent's process list needs privileges; without them each instance is
  asked.
- Owners: `owner_resolver(pid, gpu_uuid)` is asked once for a process and the answer kept while
  the process stays on that GPU, re-asked every `owner_refresh_rounds`. A resolver that raises
  is a problem of the round, and the process has no owner.
- `occupancy_util`: utilisation from processes where NVML has none (MIG instances, GPUs whose
  utilisation rates are not supported): the sum of their SM utilisation, capped at 100, when
  known; otherwise occupancy, 100 while any process runs and 0 when none.
"""

from __future__ import annotations

from typing import Any, Protocol

import pynvml

from collectors.nvml_device import (
    NOT_AVAILABLE_U32,
    DeviceReader,
    Failure,
    GpuState,
    Problems,
    pct,
)
from ledger.events import Owner, ProcessUsage


class ProcessOwnerResolver(Protocol):
    """Who a GPU process belongs to (see `collectors.ownership.OwnerResolver`)."""

    def __call__(self, pid: int, gpu_uuid: str, /) -> Owner | None: ...


def occupancy_util(processes: list[ProcessUsage]) -> int:
    """Utilisation from processes: Σ SM utilisation (capped) if known, else occupancy."""
    known = [p.sm_util_pct for p in processes if p.sm_util_pct is not None]
    if known:
        return min(100, sum(known))
    return 100 if processes else 0


class ProcessReader:
    """Reads a GPU's processes and keeps each (pid, GPU)'s owner between rounds."""

    def __init__(
        self,
        device: DeviceReader,
        problems: Problems,
        owner_resolver: ProcessOwnerResolver | None,
        owner_refresh_rounds: int,
    ) -> None:
        self._device = device
        self._problems = problems
        self._resolver = owner_resolver
        self._owner_refresh = owner_refresh_rounds
        self._owners: dict[tuple[int, str], tuple[Owner | None, int]] = {}

    def forget_unseen(self, seen: set[tuple[int, str]]) -> None:
        """Drop the owners of processes not seen this round."""
        for key in [k for k in self._owners if k not in seen]:
            del self._owners[key]

    def by_instance(
        self,
        gpu: GpuState,
        utils: dict[int, int] | None,
        seen: set[tuple[int, str]],
        round_no: int,
    ) -> dict[int, list[ProcessUsage]]:
        """The GPU's processes by GPU instance id (NOT_AVAILABLE_U32 outside MIG).

        On a MIG GPU the parent's list needs privileges; without them each instance is asked.
        """
        nvml = self._device.nvml
        raw_by_gi: list[tuple[int | None, Any]] = []
        listed = self._device.call(
            gpu, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, gpu.handle
        )
        if listed is not None:
            raw_by_gi = [(None, raw) for raw in listed]
        elif gpu.mig_enabled and "processes" in gpu.skip:
            for gi, slot in gpu.slots.items():
                per_slot = self._device.mig_call(
                    gpu, slot, "MIG processes", nvml.nvmlDeviceGetComputeRunningProcesses
                )
                raw_by_gi.extend((gi, raw) for raw in per_slot or ())
        by_gi: dict[int, list[ProcessUsage]] = {}
        for known_gi, raw in raw_by_gi:
            pid = int(raw.pid)
            memory = getattr(raw, "usedGpuMemory", None)
            usage = ProcessUsage(
                pid=pid,
                used_memory_bytes=int(memory) if memory is not None else 0,
                sm_util_pct=utils.get(pid, 0) if utils is not None else None,
                owner=self._owner(pid, gpu.uuid, seen, round_no),
            )
            if not gpu.mig_enabled:
                gi = NOT_AVAILABLE_U32
            elif known_gi is not None:
                gi = known_gi
            else:
                gi = int(getattr(raw, "gpuInstanceId", NOT_AVAILABLE_U32))
            by_gi.setdefault(gi, []).append(usage)
        return by_gi

    def utils(self, gpu: GpuState) -> dict[int, int] | None:
        """pid → SM % since the previous round's newest sample; {} for none; None if unknown."""
        what = "process utilization"
        if what in gpu.skip:
            return None
        try:
            samples = self._device.nvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_ts)
        except pynvml.NVMLError as exc:
            return {} if self._device.failed(gpu, what, exc) is Failure.NO_DATA else None
        sums: dict[int, int] = {}
        counts: dict[int, int] = {}
        newest = gpu.process_ts
        for sample in samples:
            pid = int(sample.pid)
            sums[pid] = sums.get(pid, 0) + pct(sample.smUtil)
            counts[pid] = counts.get(pid, 0) + 1
            newest = max(newest, int(sample.timeStamp))
        gpu.process_ts = newest
        return {pid: sums[pid] // counts[pid] for pid in sums}

    def _owner(
        self, pid: int, gpu_uuid: str, seen: set[tuple[int, str]], round_no: int
    ) -> Owner | None:
        if self._resolver is None:
            return None
        key = (pid, gpu_uuid)
        seen.add(key)
        cached = self._owners.get(key)
        if cached is not None and round_no - cached[1] < self._owner_refresh:
            return cached[0]
        try:
            owner = self._resolver(pid, gpu_uuid)
        except Exception as exc:  # a resolver bug must not stop metering
            self._problems.report(f"owner/{type(exc).__name__}", f"owner lookup failed: {exc!r}")
            owner = None
        self._owners[key] = (owner, round_no)
        return owner
