"""The writer's job identity (`ledger.job_owners`): the `job_owners` table (job key → owner,
the first owner learned for a key stays) and the `awaiting_owner` table (suspense transactions
awaiting a job key's owner, numbered in commit order), written inside a batch's commit and read
for a batch's view. A base class of `DuckDBStore`, over its connection."""

from __future__ import annotations

from collections.abc import Collection

import duckdb

from ledger.events import Owner
from ledger.store.hot_tables import insert_rows
from ledger.store.layout import first_row
from ledger.store.port import StateChanges

IDENTITY_DDL = """
CREATE TABLE IF NOT EXISTS job_owners (
    job_key VARCHAR PRIMARY KEY, team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR
);
CREATE TABLE IF NOT EXISTS awaiting_owner (
    seq BIGINT NOT NULL, job_key VARCHAR NOT NULL, txn_id VARCHAR NOT NULL
);
"""


def write_identity(con: duckdb.DuckDBPyConnection, changes: StateChanges) -> None:
    """Write a batch's job owners, awaiting and resolved transactions (see `StateChanges`)."""
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
            "DELETE FROM awaiting_owner WHERE list_contains(?, txn_id)", [list(changes.resolved)]
        )
    if changes.awaiting:
        row = first_row(con.execute("SELECT coalesce(max(seq), 0) FROM awaiting_owner"))
        last = int(row[0]) if row else 0
        held = {
            (str(k), str(t))
            for k, t in con.execute(
                "SELECT job_key, txn_id FROM awaiting_owner WHERE list_contains(?, txn_id)",
                [[t for _, t in changes.awaiting]],
            ).fetchall()
        }
        fresh = list(dict.fromkeys(p for p in changes.awaiting if p not in held))
        insert_rows(
            con, "awaiting_owner", [(last + i, k, t) for i, (k, t) in enumerate(fresh, start=1)]
        )


def _keys_in(con: duckdb.DuckDBPyConnection, table: str, keys: list[str]) -> set[str]:
    rows = con.execute(f"SELECT job_key FROM {table} WHERE list_contains(?, job_key)", [keys])
    return {str(r[0]) for r in rows.fetchall()}


class HotIdentity:
    _con: duckdb.DuckDBPyConnection

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
