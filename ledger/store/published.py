"""The writer of a data directory whose sealed ledger lives on an object store: the DuckDB
store (`ledger.store.hot`) with every seal published by a `ledger.store.replica.Publisher`
before its hot rows are dropped, and again after its compaction and side files; a shard's
writer publishes its snapshot with each seal (`ledger.store.snapshot`)."""

from __future__ import annotations

from pathlib import Path

from ledger.store.hot import DuckDBStore
from ledger.store.port import SealResult
from ledger.store.replica import Publisher
from ledger.store.snapshot import put_back, write_snapshot


class PublishedStore(DuckDBStore):
    """`DuckDBStore` whose seals are published to `publisher`'s store; a publish that keeps
    failing fails the seal with a `SealError` and the sealed rows stay hot. With `snapshots`,
    every seal that seals rows publishes the snapshot of the state it leaves with them."""

    def __init__(
        self, data_dir: Path | str, publisher: Publisher, *, snapshots: bool = False
    ) -> None:
        super().__init__(data_dir)
        self.publisher = publisher
        self._segments.publish = self._publish_seal if snapshots else publisher.push

    def _publish_seal(self) -> None:
        """Publish the seal in progress (its manifests are written, its rows still hot) with
        the snapshot of the state it leaves; a failed publish puts the previous one back."""
        writer = self.publisher.writer
        previous = write_snapshot(self._con, self.data_dir, 0 if writer is None else writer.epoch)
        try:
            self.publisher.push()
        except BaseException:
            put_back(self.data_dir, previous)
            raise

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        result = super().seal(compact_below_rows, compact_min_segments)
        self.publisher.push()  # what the seal compacted, aligned and exported after its rows
        return result
