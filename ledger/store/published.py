"""The writer of a data directory whose sealed ledger lives on an object store: the DuckDB
store (`ledger.store.hot`) with every seal published by a `ledger.store.replica.Publisher`
before its hot rows are dropped, and again after its compaction and side files."""

from __future__ import annotations

from pathlib import Path

from ledger.store.hot import DuckDBStore
from ledger.store.port import SealResult
from ledger.store.replica import Publisher


class PublishedStore(DuckDBStore):
    """`DuckDBStore` whose seals are published to `publisher`'s store; a publish that keeps
    failing fails the seal with a `SealError` and the sealed rows stay hot."""

    def __init__(self, data_dir: Path | str, publisher: Publisher) -> None:
        super().__init__(data_dir)
        self.publisher = publisher
        self._segments.publish = publisher.push

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        result = super().seal(compact_below_rows, compact_min_segments)
        self.publisher.push()  # what the seal compacted, aligned and exported after its rows
        return result
