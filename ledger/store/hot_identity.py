"""The writer's job identity (`ledger.job_owners`): the `job_owners` table (job key → owner,
the first owner learned for a key stays) and the `awaiting_owner` table (suspense transactions
awaiting a job key's owner, numbered in commit order), written inside a batch's commit and read
for a batch's view. A base class of `DuckDBStore`, over its connection."""

from __future__ import annotations

from collections.abc import Callable, Collection

import duckdb

from ledger.events import Owner
from ledger.postings import Transaction
from ledger.store.hot_tables import insert_rows
from ledger.store.layout import first_row
from ledger.store.port import StateChanges
from ledger.store.schema import POSTING_COLUMNS_SQL, POSTINGS_SCHEMA, transaction_from_rows

_TXN_ID = POSTINGS_SCHEMA.names.index("txn_id")

IDENTITY_DDL = """
CREATE TABLE IF NOT EXISTS job_owners (
    job_key VARCHAR PRIMARY KEY, team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR
);
CREATE TABLE IF NOT EXISTS awaiting_owner (
    seq BIGINT NOT NULL, job_key VARCHAR NOT NULL, txn_id VARCHAR NOT NULL, end_us BIGINT NOT NULL
);
"""


def write_identity(
    con: duckdb.DuckDBPyConnection, changes: StateChanges, last_seq: int | None = None
) -> int | None:
    """Write a batch's job owners, awaiting and resolved transactions (see `StateChanges`);
    `last_seq`: `awaiting_owner`'s greatest `seq` when the caller knows it (None: read here).
    Returns the greatest `seq` after the batch when known."""
    if changes.job_owners:
        known = _keys_in(con, "job_owners", list(changes.job_owners))
        insert_rows(
            con,
            "job_owners",
            [
                (key, o.team, o.project, o.user, o.job_id)
                for key, o in sorted(changes.job_owners.items())
                if key not in known
            ],
        )
    if changes.resolved:
        con.execute(
            "DELETE FROM awaiting_owner WHERE txn_id IN (SELECT unnest(?))",
            [list(changes.resolved)],
        )
    if changes.forget_awaiting:
        keys, cutoffs = zip(*sorted(changes.forget_awaiting.items()), strict=True)
        con.execute(
            "DELETE FROM awaiting_owner a USING (SELECT unnest(?) AS k, unnest(?) AS c) f "
            "WHERE a.job_key = f.k AND a.end_us < f.c",
            [list(keys), list(cutoffs)],
        )
    if changes.awaiting:
        if last_seq is None:
            row = first_row(con.execute("SELECT coalesce(max(seq), 0) FROM awaiting_owner"))
            last_seq = int(row[0]) if row else 0
        # a batch's transactions are new to the ledger: only a repeat within it can be held
        fresh = list(dict.fromkeys(changes.awaiting))
        rows = [(last_seq + i, k, t, end) for i, (k, t, end) in enumerate(fresh, start=1)]
        insert_rows(con, "awaiting_owner", rows)
        last_seq += len(fresh)
    return last_seq


def _keys_in(con: duckdb.DuckDBPyConnection, table: str, keys: list[str]) -> set[str]:
    rows = con.execute(f"SELECT job_key FROM {table} WHERE list_contains(?, job_key)", [keys])
    return {str(r[0]) for r in rows.fetchall()}


class HotIdentity:
    _con: duckdb.DuckDBPyConnection
    _all_postings_sql: Callable[[], str]  # `HotReads`'

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]:
        if not keys:
            return {}
        rows = self._con.execute(
            'SELECT job_key, team, project, "user", job_id FROM job_owners '
            "WHERE list_contains(?, job_key) ORDER BY job_key",
            [sorted(keys)],
        ).fetchall()
        return {str(r[0]): Owner(r[1], r[2], r[3], r[4]) for r in rows}

    def awaiting_owner(self, keys: Collection[str]) -> dict[str, tuple[str, ...]]:
        if not keys:
            return {}
        rows = self._con.execute(
            "SELECT job_key, txn_id FROM awaiting_owner WHERE list_contains(?, job_key) "
            "ORDER BY seq",
            [sorted(keys)],
        ).fetchall()
        found: dict[str, list[str]] = {}
        for key, txn in rows:
            found.setdefault(str(key), []).append(str(txn))
        return {k: tuple(v) for k, v in sorted(found.items())}

    def awaiting_transactions(self, keys: Collection[str]) -> dict[str, tuple[Transaction, ...]]:
        """`awaiting_owner`, each id as its committed transaction, in one query (hot rows first
        in practice: awaiting usage is recent)."""
        ids = self.awaiting_owner(keys)
        wanted = sorted({t for found in ids.values() for t in found})
        if not wanted:
            return {}
        rows = self._con.execute(
            f"SELECT {POSTING_COLUMNS_SQL} FROM {self._all_postings_sql()} "
            "WHERE list_contains(?, txn_id) ORDER BY txn_id, leg",
            [wanted],
        ).fetchall()
        by_id: dict[str, list[tuple[object, ...]]] = {}
        for row in rows:
            by_id.setdefault(str(row[_TXN_ID]), []).append(row)
        txns = {t: txn for t, r in by_id.items() if (txn := transaction_from_rows(r)) is not None}
        return {k: tuple(txns[t] for t in found if t in txns) for k, found in ids.items()}
