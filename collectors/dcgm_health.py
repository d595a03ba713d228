"""GPU health from dcgm-exporter's ECC and retired-page families, where an exporter publishes
them (`DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`, `DCGM_FI_DEV_RETIRED_PENDING`; not in its default
counter set): one `GpuHealth` on each rising edge, as the NVML collector does
(`collectors.nvml_health`):

- `ecc_dbe` when the volatile double-bit ECC total rose since the previous payload (or is above
  zero in the first payload that has it);
- `retired_pages` when pages became pending retirement.

Pure: the GPU's device-scoped values and what the previous payload said in, the events and what
to remember out. XIDs stay in `collectors.dcgm_parse`.
"""

from __future__ import annotations

from collections.abc import Mapping

from collectors.dcgm_fields import Field
from ledger.events import GpuHealth, HealthKind, SampleSource

HealthState = tuple[int, int]  # (double-bit ECC total, pages pending: 0 or 1)


def dcgm_health(
    node: str,
    uuid: str,
    index: int,
    device: Mapping[Field, int],
    previous: HealthState | None,
    time_us: int,
) -> tuple[list[GpuHealth], HealthState | None]:
    """The GPU's new health events, and its state to remember (None: it publishes neither)."""
    if Field.ECC_DBE not in device and Field.RETIRED_PENDING not in device:
        return [], previous
    before_dbe, before_pending = previous if previous is not None else (0, 0)
    dbe = device.get(Field.ECC_DBE, before_dbe)
    pending = 1 if device.get(Field.RETIRED_PENDING, before_pending) else 0
    events = []

    def event(kind: HealthKind, detail: str) -> None:
        events.append(GpuHealth(node, uuid, index, kind, detail, time_us, SampleSource.DCGM))

    if dbe > before_dbe:
        event(HealthKind.ECC_DBE, f"{dbe} volatile double-bit ECC errors")
    if pending and not before_pending:
        event(HealthKind.RETIRED_PAGES, "pages pending retirement (reset the GPU)")
    return events, (dbe, pending)
