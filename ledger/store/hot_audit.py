"""The writer's audit trail (`ledger.audit`): the `audit_trail` table, appending a batch's
entries as chained records inside its commit, reading the trail back, and keeping the readers'
copy beside the segments (`segments/audit.jsonl`, appended at every seal, so it holds exactly the
records of the sealed batches, which a rebuild compares). The trail is never pruned: retention
is forever. A base class of `DuckDBStore`, over its connection."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa

from ledger.audit import AuditEntry, AuditRecord, chain, new_entries, record_from_dict
from ledger.audit import record_to_dict as _to_dict
from ledger.store.hot_tables import insert_rows
from ledger.store.layout import first_row
from ledger.store.side_files import append_audit_file

AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS audit_trail (
    seq BIGINT PRIMARY KEY, event_id VARCHAR NOT NULL UNIQUE, record VARCHAR NOT NULL
);
"""


class HotAudit:
    _con: duckdb.DuckDBPyConnection
    segments_root: Path
    _audit_exported: int | None = None  # records in the readers' copy (None: not counted yet)

    def audit_records(self) -> list[AuditRecord]:
        rows = self._con.execute("SELECT record FROM audit_trail ORDER BY seq").fetchall()
        return [record_from_dict(orjson.loads(r[0])) for r in rows]

    def audited_ids(self, ids: Sequence[str]) -> set[str]:
        if not ids:
            return set()
        self._con.register("batch_audit_ids", pa.table({"event_id": list(ids)}))
        try:
            rows = self._con.execute(
                "SELECT a.event_id FROM audit_trail a SEMI JOIN batch_audit_ids b USING (event_id)"
            ).fetchall()
        finally:
            self._con.unregister("batch_audit_ids")
        return {str(r[0]) for r in rows}

    def _append_audit(self, entries: Sequence[AuditEntry]) -> int:
        """Chain `entries` (less those the trail holds) after the last record and insert them,
        inside the caller's transaction; returns how many were appended."""
        if not entries:
            return 0
        fresh = list(new_entries(entries, self.audited_ids([e.event_id for e in entries])))
        row = first_row(
            self._con.execute("SELECT record FROM audit_trail ORDER BY seq DESC LIMIT 1")
        )
        last = None if row is None else record_from_dict(orjson.loads(row[0]))
        records = chain(last, fresh)
        insert_rows(
            self._con,
            "audit_trail",
            [(r.seq, r.entry.event_id, orjson.dumps(_to_dict(r)).decode()) for r in records],
        )
        return len(records)

    def export_audit(self) -> None:
        """Append to the readers' copy the records it does not hold yet."""
        held = self._audit_exported
        after = 0 if held is None else held
        rows = self._con.execute(
            "SELECT record FROM audit_trail WHERE seq > ? ORDER BY seq", [after]
        ).fetchall()
        if held is not None and not rows:
            return
        records = [record_from_dict(orjson.loads(r[0])) for r in rows]
        self._audit_exported = append_audit_file(self.segments_root, records, held)
