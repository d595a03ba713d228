"""The writer's dedupe set: the applied ids in `seen_events`, each with its dedupe time and
scope (`ledger.dedupe`), and per scope in `dedupe_scopes` its newest applied time and its
forgotten-before cutoff; with the ids and cutoffs mirrored in memory.

The mirror is read from the tables once, then kept in step by every commit and prune after it
succeeded (only the writer changes those tables), so deduplicating a batch is one set operation
and its cutoffs one dict lookup per scope. Recording a batch's ids is one insert: a scope's
`newest_us` is brought up to its newest id (`_SETTLE_NEWEST`) by the prunes, the only ones that
read it, rather than by every commit (an upsert of every scope a batch touched, ~5 ms a batch,
where a prune runs once per seal). That is exact: a scope's newest id stays in `seen_events`
until a prune forgets it, and a prune forgets it only below a cutoff already past it (a prune by
window keeps the newest; one by a cutoff past it raises the scope's cutoff past it), so a stale
`newest_us` never lowers what a prune computes. A prune is one upsert of the newest times, one
update of the cutoffs and one delete. The caller (`ledger.store.hot.DuckDBStore`) holds the
transaction around each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import duckdb
import pyarrow as pa

from ledger.dedupe import sample_scope, transaction_scope
from ledger.posting_columns import PostingColumns
from ledger.store.port import SourcedTransaction

_SETTLE_NEWEST = (  # each scope's newest applied time, from its ids (module docstring)
    "INSERT INTO dedupe_scopes SELECT scope, max(time_us), NULL FROM seen_events GROUP BY scope "
    "ON CONFLICT DO UPDATE SET newest_us = greatest(newest_us, excluded.newest_us)"
)
_RAISE_TO_WINDOW = (
    "UPDATE dedupe_scopes SET forgotten_before_us = newest_us - $v "
    "WHERE forgotten_before_us IS NULL OR forgotten_before_us < newest_us - $v "
    "RETURNING scope, forgotten_before_us"
)
_RAISE_TO_CUTOFF = (
    "UPDATE dedupe_scopes SET forgotten_before_us = $v "
    "WHERE forgotten_before_us IS NULL OR forgotten_before_us < $v "
    "RETURNING scope, forgotten_before_us"
)
_FORGET = (
    "DELETE FROM seen_events USING dedupe_scopes d "
    "WHERE seen_events.scope = d.scope AND seen_events.time_us < d.forgotten_before_us "
    "RETURNING seen_events.event_id"
)

Pruned = tuple[list[str], list[tuple[str, int]]]  # (ids forgotten, (scope, cutoff) raised)


class DedupeSet:
    """The ids in `seen_events` and the scopes' cutoffs in `dedupe_scopes`, in memory."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self._ids: set[str] | None = None
        self._cutoffs: dict[str, int] = {}

    def ids(self) -> set[str]:
        if self._ids is None:
            rows = self._con.execute("SELECT event_id FROM seen_events").fetchall()
            self._ids = {str(r[0]) for r in rows}
            self._cutoffs = {
                str(scope): int(cutoff)
                for scope, cutoff in self._con.execute(
                    "SELECT scope, forgotten_before_us FROM dedupe_scopes "
                    "WHERE forgotten_before_us IS NOT NULL"
                ).fetchall()
            }
        return self._ids

    def cutoffs(self, scopes: Collection[str]) -> dict[str, int]:
        """The forgotten-before cutoffs of those of `scopes` that have one."""
        self.ids()
        known = self._cutoffs
        return {s: known[s] for s in scopes if s in known}

    def insert(
        self,
        fresh: Sequence[SourcedTransaction],
        extra: Sequence[tuple[str, int, str]],
        built: PostingColumns | None,
    ) -> list[str]:
        """Record the applied ids, each with its dedupe time and scope (the scopes' newest times
        follow at the next prune); the ids recorded (the mirror takes them with `added`, once
        the caller's transaction committed)."""
        ids = [t.txn.txn_id for t in fresh]
        times = [t.txn.end_us for t in fresh]
        scopes = [transaction_scope(t.txn) for t in fresh]
        if built:  # usage: applied at the end of its interval, like `fresh`'s usage
            rows = built.rows
            ids += [r[0] for r in rows]
            times += [r[6] for r in rows]
            scopes += [sample_scope(r[1]) for r in rows]
        if extra:
            ids += [i for i, _, _ in extra]
            times += [t for _, t, _ in extra]
            scopes += [s for _, _, s in extra]
        if not ids:
            return []
        seen = pa.table(
            {
                "event_id": pa.array(ids, pa.string()),
                "time_us": pa.array(times, pa.int64()),
                "scope": pa.array(scopes, pa.string()),
            }
        )
        con = self._con
        con.register("batch_seen", seen)
        try:
            con.execute(
                "INSERT INTO seen_events (event_id, time_us, scope) "
                "SELECT event_id, time_us, scope FROM batch_seen"
            )
        finally:
            con.unregister("batch_seen")
        return ids

    def added(self, ids: Sequence[str]) -> None:
        """Ids a committed batch recorded."""
        if self._ids is not None and ids:
            self._ids.update(ids)

    def prune_to_window(self, window_us: int) -> Pruned:
        """Raise each scope's cutoff to its newest applied time less `window_us`, and forget
        the ids older than their scope's cutoff."""
        self.ids()  # loaded before the tables change
        con = self._con
        con.execute(_SETTLE_NEWEST)
        raised = con.execute(_RAISE_TO_WINDOW, {"v": window_us}).fetchall()
        return [str(r[0]) for r in con.execute(_FORGET).fetchall()], _pairs(raised)

    def prune_before(self, cutoff_us: int) -> Pruned:
        """Raise every scope's cutoff to `cutoff_us` and forget every id older than it (ids
        recorded before dedupe scopes have no scope row: forgotten by their time alone)."""
        self.ids()
        con = self._con
        con.execute(_SETTLE_NEWEST)  # every scope with ids gets its row, and so the cutoff
        raised = con.execute(_RAISE_TO_CUTOFF, {"v": cutoff_us}).fetchall()
        rows = con.execute(_FORGET).fetchall()
        rows += con.execute(
            "DELETE FROM seen_events WHERE time_us < ? RETURNING event_id", [cutoff_us]
        ).fetchall()
        return [str(r[0]) for r in rows], _pairs(raised)

    def forgotten(self, pruned: Pruned) -> None:
        """What a committed prune forgot and raised."""
        ids, cutoffs = pruned
        if self._ids is not None:
            self._ids.difference_update(ids)
            self._cutoffs.update(cutoffs)


def _pairs(rows: Iterable[tuple[object, ...]]) -> list[tuple[str, int]]:
    return [(str(scope), int(str(cutoff))) for scope, cutoff in rows]
