"""The audit trail as readers see it: the records of the sealed ledger
(`segments/audit.jsonl`, `ledger.audit`), filtered. Readers never open the writer's database;
`tally audit` and the dashboard's Audit page render what this returns. Checking the chain is
`tally ledger verify`'s business (`ledger.store.verify`)."""

from __future__ import annotations

from pathlib import Path

from ledger.audit import AuditFilter, AuditRecord, select
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_audit_file


def audit_trail(data_dir: Path | str, where: AuditFilter | None = None) -> list[AuditRecord]:
    """The sealed ledger's audit records that `where` accepts, oldest first; raises
    SegmentError for a trail that cannot be read."""
    records = load_audit_file(Path(data_dir) / SEGMENTS_DIR)
    return records if where is None else select(records, where)
