"""The writer's outbox and what it refused: messages owed to the broker (alerts, dead letters,
inventory records, balance updates) until it acknowledges them, those it refused for their
content (`undeliverable`, with the broker's reason), and the dead letters recorded. A base
class of `DuckDBStore`, over its connection."""

from __future__ import annotations

import time
from collections.abc import Sequence

import duckdb

from ledger.excerpts import bounded
from ledger.store.port import OutboxMessage, Undeliverable


def now_us() -> int:
    return time.time_ns() // 1_000


class HotOutbox:
    _con: duckdb.DuckDBPyConnection
    # True once `pending_outbox` found nothing and no commit since could have queued anything
    # (the writer's `commit` clears it): the worker asks after every batch, and most batches
    # of a ledger that publishes no balances queue nothing
    _outbox_settled: bool = False

    def pending_outbox(self, limit: int = 1000) -> list[OutboxMessage]:
        if self._outbox_settled:
            return []
        rows = self._con.execute(
            'SELECT id, topic, "key", "value" FROM outbox WHERE NOT sent '
            "ORDER BY created_at_us, rowid LIMIT ?",
            [limit],
        ).fetchall()
        self._outbox_settled = not rows
        return [OutboxMessage(str(i), str(t), k, v) for i, t, k, v in rows]

    def mark_sent(self, ids: Sequence[str]) -> None:
        """Forget messages the broker acknowledged (the outbox holds only what is owed)."""
        if ids:
            self._con.execute("DELETE FROM outbox WHERE id IN (SELECT unnest(?))", [list(ids)])

    def mark_undeliverable(self, message_id: str, reason: str) -> None:
        """Move a refused outbox message to `undeliverable`, with the broker's reason."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(
                'INSERT INTO undeliverable SELECT id, topic, "key", "value", ?, ? FROM outbox '
                "WHERE id = ?",
                [bounded(reason), now_us(), message_id],
            )
            con.execute("DELETE FROM outbox WHERE id = ?", [message_id])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def undeliverable(self) -> list[Undeliverable]:
        rows = self._con.execute(
            'SELECT id, topic, "key", "value", reason FROM undeliverable '
            "ORDER BY recorded_at_us, rowid"
        ).fetchall()
        return [
            Undeliverable(OutboxMessage(str(i), str(t), k, v), str(r)) for i, t, k, v, r in rows
        ]

    def dead_letters(self) -> list[tuple[object, ...]]:
        return self._con.execute(
            'SELECT topic, "partition", "offset", event_id, reason FROM dead_letters '
            "ORDER BY recorded_at_us"
        ).fetchall()
