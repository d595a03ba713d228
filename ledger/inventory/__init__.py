"""The GPU inventory: collectors' reports of what each node holds (`events`), and the inventory
folded from them, staleness and the `inventory` topic's records (`state`). Pure: no I/O."""

from ledger.inventory.events import (
    INVENTORY,
    InventoryEnvelope,
    InventoryReport,
    InventoryType,
    ReportedGpu,
    decode_report_message,
    encode_report,
    report_source,
    wrap_report,
)
from ledger.inventory.state import (
    GpuHealthState,
    GpuStatus,
    InventoryGpu,
    decode_record,
    encode_record,
    fold_reports,
    record_from_json,
    record_id,
    record_json,
    status_of,
)

__all__ = [
    "INVENTORY",
    "GpuHealthState",
    "GpuStatus",
    "InventoryEnvelope",
    "InventoryGpu",
    "InventoryReport",
    "InventoryType",
    "ReportedGpu",
    "decode_record",
    "decode_report_message",
    "encode_record",
    "encode_report",
    "fold_reports",
    "record_from_json",
    "record_id",
    "record_json",
    "report_source",
    "status_of",
    "wrap_report",
]
