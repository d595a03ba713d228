"""The writer's upkeep between batches: sealing committed rows into segments (and compacting
them), pruning the dedupe window, and what is still hot. A prune that changed anything is
recorded in `ledger_meta` (`PRUNE_WINDOW_KEY`, `PRUNED_BEFORE_KEY`) and archived with the next
batch (`DuckDBStore.commit`), so a rebuild runs it again at the same place. A base class of
`DuckDBStore`, over its connection, segmenter and dedupe set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from ledger.errors import SealError
from ledger.store.hot_audit import HotAudit
from ledger.store.hot_dedupe import DedupeSet, Pruned
from ledger.store.hot_memory import SEAL_THREADS, MemoryLimit
from ledger.store.hot_reads import HotReads
from ledger.store.layout import HOT_DB_NAME, first_row
from ledger.store.port import SealResult
from ledger.store.sealing import Segmenter, io_reason
from ledger.store.segments import SegmentInfo

# The ledger_meta keys of the prunes run since the last archived batch (archived with the next).
PRUNE_WINDOW_KEY, PRUNED_BEFORE_KEY = "prune_window_us", "pruned_before_us"


class HotUpkeep(HotReads, HotAudit):
    _con: duckdb.DuckDBPyConnection
    data_dir: Path
    _segments: Segmenter
    _dedupe: DedupeSet
    _memory: MemoryLimit
    _batch_seq: int
    _pruned_before: int | None
    _prune_window: int | None

    def _meta(self, key: str) -> str | None:
        row = first_row(self._con.execute("SELECT value FROM ledger_meta WHERE key = ?", [key]))
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: object) -> None:
        self._con.execute(
            "INSERT INTO ledger_meta VALUES (?, ?) "
            "ON CONFLICT DO UPDATE SET value = excluded.value",
            [key, str(value)],
        )

    # ------------------------------------------------------------------ sealing

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        """Seal every committed, unsealed range into segments and archive segments; then compact
        small ones of each.

        The archive manifest is written before the postings manifest, so the archive never lags
        the postings a reader sees; an interrupted seal leaves its ranges unsealed, and the next
        one writes the same files again. The writer checkpoints before a seal's copies, so they
        read the committed rows from the database file rather than beside DuckDB's in-memory
        copies of them, and after a seal that sealed anything, when the log holds the rows just
        dropped; DuckDB runs the seal on `SEAL_THREADS` thread (`ledger.store.hot_memory`). A
        file the system refuses to write (the disk is full) raises a `SealError` and leaves the
        committed rows where they were (see `ledger.store.sealing`).
        """
        threads = first_row(self._con.execute("SELECT current_setting('threads')"))
        self._con.execute(f"SET threads = {SEAL_THREADS}")
        try:
            result = self._segments.seal_committed(before_copies=self._checkpoint)
            if result.sealed:
                self._checkpoint()
            result.compacted = self.compact(compact_below_rows, compact_min_segments)
            result.archive_compacted = self._segments.align_archive()
            self._segments.remove_unlisted_files()
            self.export_closed_periods()  # after sealing: a closed period's rows are all sealed
            self.export_refused()
            self.export_inventory()
            if not self._admin_log_exported:
                self.export_admin_log()
            self.export_audit()
        except OSError as exc:  # a side file, a manifest or a directory could not be written
            raise SealError(str(exc.filename or self.segments_root), io_reason(exc)) from exc
        finally:
            self._con.execute(f"SET threads = {threads[0] if threads else SEAL_THREADS}")
        return result

    def _checkpoint(self) -> None:
        """Fold the write-ahead log into the database file; a file the system refuses to
        write raises a `SealError` (the log, and every committed row, stay as they were)."""
        try:
            self._con.execute("CHECKPOINT")
        except duckdb.IOException as exc:
            raise SealError(str(self.data_dir / HOT_DB_NAME), io_reason(exc)) from exc

    def compact(self, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        """Merge runs of ≥ `min_segments` adjacent small segments of a partition into one."""
        return self._segments.compact(self._segments.postings, below_rows, min_segments)

    def remove_unlisted_files(self) -> int:
        """Delete segment and archive files their manifest does not name."""
        return self._segments.remove_unlisted_files()

    # ------------------------------------------------------------------ inspection

    def hot_rows(self) -> int:
        row = first_row(self._con.execute("SELECT count(*) FROM postings"))
        return int(row[0]) if row else 0

    def hot_archived(self) -> int:
        """Archived messages not sealed yet."""
        row = first_row(self._con.execute("SELECT count(*) FROM raw_events"))
        return int(row[0]) if row else 0

    @property
    def batch_seq(self) -> int:
        """The sequence number of the last archived batch (0: none yet)."""
        return self._batch_seq

    def prune_seen_events(self, window_us: int) -> int:
        """Per dedupe scope, raise its forgotten-before cutoff to its newest applied time less
        `window_us`, and forget its ids older than the cutoff; returns how many were forgotten.

        The window is measured in each scope's own event time, so replaying old data dedupes
        the same way as live data, and a scope that fell silent keeps its ids and cutoff where
        its last event left them. A prune that changed anything is recorded with the next
        archived batch (with no batch between them, prunes compose to the smallest window), so
        a rebuild runs it on the same state before applying that batch.
        """
        window = window_us if self._prune_window is None else min(window_us, self._prune_window)
        return self._prune(
            lambda: self._dedupe.prune_to_window(window_us), PRUNE_WINDOW_KEY, window
        )

    def prune_seen_before(self, cutoff_us: int) -> int:
        """Forget every applied id older than `cutoff_us`, whatever its scope, and raise every
        scope's cutoff to it; returns how many were forgotten (see `LedgerStore`). Recorded
        with the next archived batch like `prune_seen_events` (the greatest cutoff since)."""
        cutoff = cutoff_us if self._pruned_before is None else max(cutoff_us, self._pruned_before)
        return self._prune(lambda: self._dedupe.prune_before(cutoff_us), PRUNED_BEFORE_KEY, cutoff)

    def _prune(self, prune: Callable[[], Pruned], meta: str, recorded: int) -> int:
        """Run `prune` in one transaction; when it changed anything, record `recorded` (the
        window or cutoff) under `meta` for the next archived batch."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            pruned = prune()
            changed = bool(pruned[0] or pruned[1])
            if changed:
                self._set_meta(meta, recorded)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if changed:
            if meta == PRUNE_WINDOW_KEY:
                self._prune_window = recorded
            else:
                self._pruned_before = recorded
            self._dedupe.forgotten(pruned)
            self._memory.follow(len(self._dedupe.ids()))
        return len(pruned[0])
