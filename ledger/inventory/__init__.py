"""The GPU inventory: collectors' reports of what each node holds (`events`) and their health
events (`health_events`); the record of each GPU (`gpu`); health severities and XID meanings
(`health`); the inventory folded from both, staleness and the `inventory` topic's records
(`state`). Pure: no I/O."""

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
from ledger.inventory.gpu import Fault, GpuHealthState, InventoryGpu, Severity
from ledger.inventory.health import XID_CODES, severity_of, xid_meaning
from ledger.inventory.state import (
    GpuStatus,
    cordon_records,
    decode_record,
    encode_record,
    fold_inventory,
    fold_reports,
    record_from_json,
    record_id,
    record_json,
    status_of,
)

__all__ = [
    "INVENTORY",
    "XID_CODES",
    "Fault",
    "GpuHealthState",
    "GpuStatus",
    "InventoryEnvelope",
    "InventoryGpu",
    "InventoryReport",
    "InventoryType",
    "ReportedGpu",
    "Severity",
    "cordon_records",
    "decode_record",
    "decode_report_message",
    "encode_record",
    "encode_report",
    "fold_inventory",
    "fold_reports",
    "record_from_json",
    "record_id",
    "record_json",
    "report_source",
    "severity_of",
    "status_of",
    "wrap_report",
    "xid_meaning",
]
