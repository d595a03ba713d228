"""GPU health beyond XID events, read from NVML each round: ECC double-bit errors, pages
pending retirement, and clocks slowed for temperature or power. Each becomes a `GpuHealth`
event on its rising edge only, so a condition that lasts is one fault, not one per round:

- `ecc_dbe`: the volatile uncorrected ECC count (`nvmlDeviceGetTotalEccErrors`) rose — or is
  above zero at the first read (errors since the driver loaded);
- `retired_pages`: pages are pending retirement (`nvmlDeviceGetRetiredPagesPendingStatus`),
  newly so;
- `thermal_throttle`: HW slowdown, HW thermal or SW thermal slowdown among the current clock
  event reasons (`nvmlDeviceGetCurrentClocksEventReasons`), newly so; `power_throttle`: the HW
  power brake, newly so. The SW power cap is not a fault (a GPU at its power limit under load
  is working as meant).

Reads go through `DeviceReader.call`: a GPU that does not support a query (consumer boards
have no ECC) has it left out for good, with one problem line.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from collectors.nvml_device import DeviceReader, GpuState
from ledger.events import GpuHealth, HealthKind, SampleSource

THERMAL = (
    pynvml.nvmlClocksEventReasonHwSlowdown
    | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    | pynvml.nvmlClocksEventReasonSwThermalSlowdown
)
POWER = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


@dataclass(slots=True)
class _Seen:
    dbe: int | None = None
    pending: bool = False
    thermal: bool = False
    power: bool = False


class HealthWatch:
    """What each GPU's health queries said last round, to report only what is new."""

    def __init__(self, reader: DeviceReader, node: str) -> None:
        self._reader = reader
        self._node = node
        self._seen: dict[str, _Seen] = {}

    def read(self, gpu: GpuState, now_us: int) -> list[GpuHealth]:
        """The health events of `gpu` this round (may raise `GpuLost`, like every read)."""
        nvml = self._reader.nvml
        h = gpu.handle
        seen = self._seen.setdefault(gpu.uuid, _Seen())
        found: list[GpuHealth] = []

        def event(kind: HealthKind, detail: str) -> None:
            found.append(
                GpuHealth(self._node, gpu.uuid, gpu.index, kind, detail, now_us, SampleSource.NVML)
            )

        dbe = self._reader.call(
            gpu,
            "ECC errors",
            nvml.nvmlDeviceGetTotalEccErrors,
            h,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        if dbe is not None:
            count = int(dbe)
            if count > (seen.dbe or 0):
                event(HealthKind.ECC_DBE, f"{count} uncorrected ECC errors since the driver loaded")
            seen.dbe = count
        pending = self._reader.call(
            gpu, "retired pages", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h
        )
        if pending is not None:
            now_pending = int(pending) == pynvml.NVML_FEATURE_ENABLED
            if now_pending and not seen.pending:
                event(HealthKind.RETIRED_PAGES, "pages pending retirement (reset the GPU)")
            seen.pending = now_pending
        reasons = self._reader.call(
            gpu, "clock event reasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, h
        )
        if reasons is not None:
            thermal, power = bool(int(reasons) & THERMAL), bool(int(reasons) & POWER)
            if thermal and not seen.thermal:
                event(
                    HealthKind.THERMAL_THROTTLE,
                    f"clocks slowed for temperature ({int(reasons):#x})",
                )
            if power and not seen.power:
                event(
                    HealthKind.POWER_THROTTLE,
                    f"clocks slowed by the power brake ({int(reasons):#x})",
                )
            seen.thermal, seen.power = thermal, power
        return found
