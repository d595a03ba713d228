"""What the writer's store answers about committed postings and the admin state: balances
(the projection, and the fold recomputed from every posting, hot and sealed), budgets, closed
periods, the admin log, reversals, transactions by id; and the readers' copies of the admin log,
of closed periods, of the dead-letter summary and of the GPU inventory it writes beside the
segments. A base class of
`DuckDBStore`, over its connection."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa

from ledger.accounts import budget_account
from ledger.admin import AdminView, AppliedAdmin, applied_from_dict
from ledger.balances import BalanceRow, current_period, fold_rows
from ledger.closing import ClosedPeriod
from ledger.inventory import InventoryGpu, record_from_json
from ledger.postings import Transaction
from ledger.pricing import PriceBook
from ledger.store.balance_outbox import BalanceFigures
from ledger.store.layout import first_row, sql_list
from ledger.store.schema import POSTING_COLUMNS_SQL, transaction_from_rows
from ledger.store.segments import Manifest
from ledger.store.side_files import (
    INVENTORY_NAME,
    REFUSED_NAME,
    REFUSED_SQL,
    RefusedGroup,
    write_admin_log,
    write_closed_period,
    write_inventory,
    write_refused,
)
from ledger.units import Unit

BALANCES_VERSION = "1"


class HotReads:
    _con: duckdb.DuckDBPyConnection
    manifest: Manifest
    segments_root: Path
    _admin_cache: tuple[AppliedAdmin, ...] | None  # the admin log, as read
    _closed_cache: frozenset[str] | None
    _balance_figures: BalanceFigures | None
    _admin_log_exported: bool
    _refused_exported: int | None = None  # dead letters in the last summary written
    _inventory_exported: tuple[int, int] | None = None  # (records, content hash) last written

    def _sealed_sql(self) -> str | None:
        files = self.manifest.files()
        if not files:
            return None
        return f"read_parquet([{sql_list(files)}])"

    def _all_postings_sql(self) -> str:
        """Every committed posting: the hot rows and the sealed segments (disjoint once sealing
        has finished, which holds whenever the writer is not inside `seal`)."""
        sealed = self._sealed_sql()
        if sealed is None:
            return "postings"
        columns = POSTING_COLUMNS_SQL
        return f"(SELECT {columns} FROM postings UNION ALL SELECT {columns} FROM {sealed})"

    def balance_rows(self) -> list[BalanceRow]:
        """The balances table: balance per (account, unit, period)."""
        return fold_rows(
            self._con.execute(
                "SELECT account, unit, period, balance FROM balances ORDER BY ALL"
            ).fetchall()
        )

    def folded_balances(self) -> list[BalanceRow]:
        """The fold of every committed posting per (account, unit, period), recomputed."""
        return fold_rows(
            self._con.execute(
                f"SELECT account, unit, period, sum(amount) FROM {self._all_postings_sql()} "
                "GROUP BY ALL ORDER BY ALL"
            ).fetchall()
        )

    def rebuild_balances(self) -> None:
        """Recompute the balances table from the postings."""
        con = self._con
        self._balance_figures = None  # read again from the table recomputed
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM balances")
            con.execute(
                "INSERT INTO balances SELECT account, unit, period, sum(amount) "
                f"FROM {self._all_postings_sql()} GROUP BY ALL"
            )
            con.execute(
                "INSERT INTO ledger_meta VALUES ('balances_version', ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [BALANCES_VERSION],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def current_period(self) -> str | None:
        return current_period(self.balance_rows())

    def budget_total(self, team: str, period: str, unit: Unit) -> int:
        """What `team` was granted of `unit` for `period`, net of negative grants."""
        row = first_row(
            self._con.execute(
                "SELECT coalesce(-sum(balance), 0) FROM balances "
                "WHERE account = ? AND period = ? AND unit = ?",
                [budget_account(team), period, unit.value],
            )
        )
        return int(row[0]) if row else 0

    def closed_period_labels(self) -> frozenset[str]:
        if self._closed_cache is None:  # read once per close: only this writer closes
            rows = self._con.execute("SELECT period FROM closed_periods").fetchall()
            self._closed_cache = frozenset(str(r[0]) for r in rows)
        return self._closed_cache

    def closed_periods(self) -> list[ClosedPeriod]:
        rows = self._con.execute(
            'SELECT period, event_id, effective_us, actor, reason, "rows", sha256, algorithm '
            "FROM closed_periods ORDER BY period"
        ).fetchall()
        return [
            ClosedPeriod(str(p), str(e), int(t), str(a), str(r), int(n), str(h), str(alg))
            for p, e, t, a, r, n, h, alg in rows
        ]

    def admin_entries(self) -> list[AppliedAdmin]:
        """Every applied admin event, in the order applied (read once per change: only this
        writer appends to the log)."""
        if self._admin_cache is None:
            rows = self._con.execute("SELECT entry FROM admin_log ORDER BY seq").fetchall()
            self._admin_cache = tuple(applied_from_dict(orjson.loads(r[0])) for r in rows)
        return list(self._admin_cache)

    def admin_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are applied admin events (kept for good, unlike `seen_events`)."""
        if not ids:
            return set()
        self._con.register("batch_admin_ids", pa.table({"event_id": list(ids)}))
        try:
            rows = self._con.execute(
                "SELECT a.event_id FROM admin_log a SEMI JOIN batch_admin_ids b USING (event_id)"
            ).fetchall()
        finally:
            self._con.unregister("batch_admin_ids")
        return {str(r[0]) for r in rows}

    def admin_view(self) -> AdminView:
        return AdminView.from_log(self.admin_entries())

    def price_book(self, default: PriceBook) -> PriceBook:
        """`default` (the configuration's book) plus every applied `PriceSet`."""
        return self.admin_view().price_book(default)

    def reversed_by(self, txn_id: str) -> str | None:
        row = first_row(
            self._con.execute("SELECT reversed_by FROM reversals WHERE txn_id = ?", [txn_id])
        )
        return str(row[0]) if row else None

    def find_transaction(self, txn_id: str) -> Transaction | None:
        """A committed transaction, from the hot rows or the sealed segments."""
        rows = self._con.execute(
            f"SELECT {POSTING_COLUMNS_SQL} FROM {self._all_postings_sql()} "
            "WHERE txn_id = ? ORDER BY leg",
            [txn_id],
        ).fetchall()
        return transaction_from_rows(rows)

    def export_admin_log(self) -> None:
        """Write the readers' copy of the admin log (`segments/admin-log.json`)."""
        write_admin_log(self.segments_root, self.admin_entries())
        self._admin_log_exported = True

    def export_closed_periods(self) -> int:
        """Write the record of every closed period that has none yet; how many were written."""
        return sum(write_closed_period(self.segments_root, c) for c in self.closed_periods())

    def export_refused(self) -> bool:
        """Write the dead-letter summary (`segments/refused.json`) when letters were recorded
        since the last one (or it is missing); whether it was written."""
        row = first_row(self._con.execute("SELECT count(*) FROM dead_letters"))
        count = int(row[0]) if row else 0
        path = self.segments_root / REFUSED_NAME
        if count == self._refused_exported and (path.exists() or not count):
            return False
        groups = [
            RefusedGroup(str(k), str(t), int(n), int(first), int(last), str(example))
            for k, t, n, first, last, example in self._con.execute(REFUSED_SQL).fetchall()
        ]
        write_refused(self.segments_root, groups)
        self._refused_exported = count
        return True

    def inventory(self) -> dict[str, InventoryGpu]:
        """The GPU inventory by UUID (`inventory_gpus`)."""
        rows = self._con.execute("SELECT uuid, record FROM inventory_gpus").fetchall()
        return {str(uuid): record_from_json(str(record)) for uuid, record in rows}

    def export_inventory(self) -> bool:
        """Write the readers' copy of the inventory (`segments/inventory.json`) when it changed
        since the last one (or it is missing); whether it was written."""
        row = first_row(
            self._con.execute("SELECT count(*), coalesce(sum(hash(record)), 0) FROM inventory_gpus")
        )
        mark = (int(row[0]), int(row[1])) if row else (0, 0)
        path = self.segments_root / INVENTORY_NAME
        if mark == self._inventory_exported and (path.exists() or not mark[0]):
            return False
        write_inventory(self.segments_root, self.inventory().values())
        self._inventory_exported = mark
        return True
