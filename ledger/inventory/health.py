"""GPU health: the meaning and severity of each health event, and its fold into the GPU's
inventory record (`InventoryGpu.health`, `health_reason`, `health_since_us`, faults).

Severity (`severity_of`), by event kind:
- `gpu_lost` (fallen off the bus, NVML no longer answers), `ecc_dbe` (a double-bit ECC error):
  `unhealthy`;
- `retired_pages`, `thermal_throttle`, `power_throttle`: `degraded`;
- `xid_error`: by code, `XID_CODES` (meaning and severity). Codes that usually point at the
  application (13, 31, 43, 45) are only recorded: counted and listed, the state unchanged. An
  unknown code is `degraded`;
- `recovered` (the GPU answers again) clears `lost`; it makes no fault.

The fold (`fold_health`, pure) per GPU record:
- a fault raises the state to its severity (never lowers it), sets `health_reason` to the
  event's meaning, `health_since_us` when the GPU stops being healthy (the episode's start: a
  GPU getting worse keeps it; back to healthy, it is when it healed), `last_fault_us`, counts it in
  `faults` and keeps it among the `RECENT_FAULTS` newest `recent_faults`;
- recovery: a report naming the GPU at least `window_us` after its last fault (and, for a lost
  GPU, after a `recovered`) makes it `healthy` again (`heal`);
- idempotent and order-tolerant for redelivery: an event older than the GPU's newest folded
  health event, or one equal to a fault already listed, changes nothing (a collector sends a
  GPU's health events in time order; a resend repeats one);
- a health event for a GPU no report has named yet is not kept (there is no record to hold it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ledger.events import GpuHealth, HealthKind
from ledger.inventory.gpu import Fault, GpuHealthState, InventoryGpu, Severity

HEALTHY_WINDOW_US = 600_000_000  # ten minutes of reports without a fault
RECENT_FAULTS = 8


RANK = {GpuHealthState.HEALTHY: 0, GpuHealthState.DEGRADED: 1, GpuHealthState.UNHEALTHY: 2}


@dataclass(frozen=True, slots=True)
class XidCode:
    meaning: str
    severity: Severity


XID_CODES: Mapping[int, XidCode] = {
    13: XidCode("graphics engine exception (usually the application)", Severity.RECORDED),
    31: XidCode("GPU memory page fault (usually the application)", Severity.RECORDED),
    32: XidCode("invalid or corrupted push buffer stream", Severity.RECORDED),
    43: XidCode("GPU stopped processing (usually the application)", Severity.RECORDED),
    45: XidCode("preemptive cleanup after earlier errors", Severity.RECORDED),
    48: XidCode("double-bit ECC error", Severity.UNHEALTHY),
    61: XidCode("internal micro-controller breakpoint/warning", Severity.DEGRADED),
    62: XidCode("internal micro-controller halt", Severity.UNHEALTHY),
    63: XidCode("ECC page retirement or row remapping recorded", Severity.DEGRADED),
    64: XidCode("ECC page retirement or row remapping failed", Severity.UNHEALTHY),
    74: XidCode("NVLink error", Severity.DEGRADED),
    79: XidCode("GPU has fallen off the bus", Severity.UNHEALTHY),
    92: XidCode("high single-bit ECC error rate", Severity.DEGRADED),
    94: XidCode("contained ECC error", Severity.DEGRADED),
    95: XidCode("uncontained ECC error", Severity.UNHEALTHY),
    119: XidCode("GSP RPC timeout", Severity.UNHEALTHY),
    120: XidCode("GSP error", Severity.UNHEALTHY),
}

KIND_SEVERITY: Mapping[HealthKind, tuple[str, Severity]] = {
    HealthKind.GPU_LOST: ("GPU lost (no longer answers)", Severity.UNHEALTHY),
    HealthKind.ECC_DBE: ("double-bit ECC errors", Severity.UNHEALTHY),
    HealthKind.RETIRED_PAGES: ("retired or pending-retirement pages", Severity.DEGRADED),
    HealthKind.THERMAL_THROTTLE: ("clocks throttled for temperature", Severity.DEGRADED),
    HealthKind.POWER_THROTTLE: ("clocks throttled for power", Severity.DEGRADED),
}


def xid_meaning(xid: int) -> str:
    """What an XID code means, in words (`XID n` for a code not in `XID_CODES`)."""
    code = XID_CODES.get(xid)
    return f"XID {xid}" if code is None else f"XID {xid}: {code.meaning}"


def severity_of(event: GpuHealth) -> tuple[str, Severity] | None:
    """The meaning and severity of a fault; None for `recovered` (not a fault)."""
    if event.kind is HealthKind.RECOVERED:
        return None
    if event.kind is HealthKind.XID_ERROR:
        xid = event.xid if event.xid is not None else -1
        code = XID_CODES.get(xid)
        return xid_meaning(xid), Severity.DEGRADED if code is None else code.severity
    return KIND_SEVERITY[event.kind]


def apply_health(record: InventoryGpu, event: GpuHealth) -> InventoryGpu:
    """`record` (an `InventoryGpu`) with `event` folded in."""
    newest = record.health_event_us
    if newest is not None and event.time_us < newest:
        return record
    judged = severity_of(event)
    if judged is None:  # recovered
        return replace(record, lost=False, health_event_us=event.time_us)
    meaning, severity = judged
    fault = Fault(event.time_us, event.kind, meaning, severity, event.xid)
    if fault in record.recent_faults:
        return record
    new = replace(
        record,
        faults=record.faults + 1,
        recent_faults=(*record.recent_faults, fault)[-RECENT_FAULTS:],
        health_event_us=event.time_us,
        lost=record.lost or event.kind is HealthKind.GPU_LOST,
    )
    if severity is Severity.RECORDED:
        return new
    state = GpuHealthState(severity.value)
    new = replace(new, last_fault_us=event.time_us)
    if RANK[state] > RANK[record.health]:
        since = event.time_us if record.health is GpuHealthState.HEALTHY else record.health_since_us
        return replace(new, health=state, health_since_us=since, health_reason=meaning)
    if state is record.health:
        return replace(new, health_reason=meaning)
    return new


def heal(record: InventoryGpu, seen_us: int, window_us: int) -> InventoryGpu:
    """`record` healthy again when a report at `seen_us` comes a healthy window after its last
    fault (a lost GPU first needs a `recovered`)."""
    if record.health is GpuHealthState.HEALTHY or record.lost:
        return record
    last = record.last_fault_us
    if last is not None and seen_us < last + window_us:
        return record
    return replace(
        record, health=GpuHealthState.HEALTHY, health_since_us=seen_us, health_reason=None
    )


def fold_health(
    events: Sequence[GpuHealth], current: Mapping[str, InventoryGpu]
) -> dict[str, InventoryGpu]:
    """The records `events` change (by GPU UUID), folded in order over `current`."""
    changed: dict[str, InventoryGpu] = {}
    for event in events:
        old = changed.get(event.gpu_uuid) or current.get(event.gpu_uuid)
        if old is not None:
            changed[event.gpu_uuid] = apply_health(old, event)
    return {u: r for u, r in changed.items() if r != current.get(u)}
