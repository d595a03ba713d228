"""Sealing through Arrow (`ledger.store.seal_arrow`) writes the same rows as DuckDB's copy.

Two stores take the same batches (column-built usage, shared GPUs folded one posting at a
time, packed messages archived compressed, garbage, a message without a key, a partition whose
range has no postings, a seal between batches); one seals through Arrow in row groups of a few
rows, the other through DuckDB's `COPY … ORDER BY` (what the seal does above
`ARROW_SEAL_MAX_BYTES`). Every Parquet file of both — postings and archive segments, every
rollup — holds the same rows in the same order with the same column names and Arrow types, and
`verify` passes on both. (Which columns are flagged required may differ: DuckDB's copy flags
those its statistics show free of nulls, statistics that still count rows an earlier seal
deleted; the Arrow path flags a table's columns that hold no null.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage
from ledger.store import seal_arrow, sealing
from ledger.store.hot import DuckDBStore
from ledger.store.verify import verify_ledger
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.unit.test_store import TOPIC, ingest, message


def shared(offset: int, t: int, partition: int) -> ConsumedMessage:
    """A sample of a GPU two teams share: folded one posting at a time (`posting_rows`)."""
    owners = (an_owner(team="vision"), an_owner(team="search", job_id="job-2"))
    envelope = an_envelope(
        gpu_uuid="GPU-S",
        sample_time_us=T0_US + t * INTERVAL_US,
        processes=tuple(a_process(pid=n, owner=o) for n, o in enumerate(owners)),
    )
    return ConsumedMessage(TOPIC, partition, offset, encode_batch([envelope]), b"GPU-S")


def batches() -> list[list[ConsumedMessage]]:
    packed = message(2, *range(10, 30), partition=1, gpu="GPU-2")  # > 1 KiB: archived zstd
    return [
        [
            message(0, 1, 2),
            message(1, 3, gpu="GPU-3"),
            shared(0, 4, partition=1),
            message(0, value=b"[]", partition=2),  # a range without postings: an empty segment
        ],
        [packed, message(2, 5), message(3, value=b"not json"), shared(3, 6, partition=1)],
        [message(4, 7, 8, 9), shared(4, 40, partition=1)],
    ]


def sealed(root: Path, arrow: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    with monkeypatch.context() as patch:
        patch.setattr(sealing, "ARROW_SEAL_MAX_BYTES", 1 << 30 if arrow else -1)
        patch.setattr(seal_arrow, "ROW_GROUP_SIZE", 5)  # several row groups per segment
        with DuckDBStore(root) as store:
            for number, batch in enumerate(batches()):
                ingest(store, *batch)
                if number == 1:
                    store.seal()
            store.seal()
    assert verify_ledger(root).ok
    files = sorted(root.rglob("*.parquet"))
    assert any("archive" in str(f) for f in files) and any("rollup" in str(f) for f in files)
    return {str(f.relative_to(root)): pq.read_table(f) for f in files}


def test_arrow_and_duckdb_seals_write_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_arrow = sealed(tmp_path / "arrow", True, monkeypatch)
    through_duckdb = sealed(tmp_path / "duckdb", False, monkeypatch)
    assert through_arrow.keys() == through_duckdb.keys()
    for name, table in through_arrow.items():
        other = through_duckdb[name]
        assert [(f.name, f.type) for f in table.schema] == [
            (f.name, f.type) for f in other.schema
        ], name
        assert table.to_pylist() == other.to_pylist(), name  # the rows, in order
    postings = [t for n, t in through_arrow.items() if n.startswith("segments")]
    assert sum(t.num_rows for t in postings) > 0 and min(t.num_rows for t in postings) == 0
    segment = next(n for n in through_arrow if n.startswith("segments") and n.count(".") == 1)
    assert pq.ParquetFile(tmp_path / "arrow" / segment).metadata.num_row_groups > 1
