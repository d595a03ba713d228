"""Balances as readers see them: the fold of the sealed postings, from the segments."""

from __future__ import annotations

from pathlib import Path

import duckdb

from ledger.balances import BalanceRow, fold_rows
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.segments import Manifest

FOLD_SQL = "SELECT account, unit, period, sum(amount) FROM {source} GROUP BY ALL ORDER BY ALL"


def sealed_balances(data_dir: Path | str) -> list[BalanceRow]:
    """The fold of the sealed postings per (account, unit, period), read from the segments
    with a connection of its own (what readers such as `tally report balances` see)."""
    root = Path(data_dir) / SEGMENTS_DIR
    files = Manifest(root).files()
    if not files:
        return []
    listed = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(FOLD_SQL.format(source=f"read_parquet([{listed}])")).fetchall()
    finally:
        con.close()
    return fold_rows(rows)
