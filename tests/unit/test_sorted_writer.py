"""The seal's sliced writer (`ledger.store.sorted_writer`): slices of offsets cut by rows, and a
file written slice by slice holding exactly the rows one whole sort gives, in its order."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from ledger.errors import StoreError
from ledger.store import sorted_writer
from ledger.store.sorted_writer import offset_slices, write_sorted_range


@pytest.mark.parametrize(
    ("counts", "limit", "slices"),
    [
        pytest.param([], 10, [], id="no-rows-no-slices"),
        pytest.param([(5, 3)], 10, [(5, 5)], id="one-offset"),
        pytest.param([(0, 4), (1, 4), (2, 4)], 8, [(0, 1), (2, 2)], id="cut-when-full"),
        pytest.param([(0, 4), (1, 4), (2, 4)], 12, [(0, 2)], id="exactly-the-limit"),
        pytest.param([(0, 2), (7, 30), (9, 1)], 8, [(0, 0), (7, 7), (9, 9)], id="big-offset-alone"),
        pytest.param([(3, 1), (4, 1), (10, 1)], 2, [(3, 4), (10, 10)], id="gaps-in-offsets"),
    ],
)
def test_offset_slices(counts, limit, slices):
    assert offset_slices(counts, limit) == slices


ORDER = "src_offset, txn_id, leg"
IN_RANGE = "src_partition = $part AND src_offset BETWEEN $first AND $last"


def hot_table(rows: int, seed: int) -> duckdb.DuckDBPyConnection:
    """A hot postings-like table: rows of offsets 0..99 of partitions 0 and 1, inserted in a
    random order, several transactions per offset and two legs each."""
    rng = random.Random(seed)
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE hot (src_partition INTEGER, src_offset BIGINT, txn_id VARCHAR, "
        "leg SMALLINT, account VARCHAR, amount BIGINT)"
    )
    values = [
        (rng.randrange(2), rng.randrange(100), f"t{rng.randrange(10_000):05d}", leg, "a", n)
        for n in range(rows // 2)
        for leg in (0, 1)
    ]
    rng.shuffle(values)
    con.executemany("INSERT INTO hot VALUES (?, ?, ?, ?, ?, ?)", values)
    return con


@pytest.mark.parametrize(
    ("slice_rows", "first", "last"),
    [
        pytest.param(1, 0, 99, id="an-offset-per-slice"),
        pytest.param(37, 0, 99, id="slices-across-offsets"),
        pytest.param(1_000_000, 0, 99, id="one-slice"),
        pytest.param(37, 20, 60, id="part-of-the-offsets"),
    ],
)
def test_a_sliced_file_holds_what_one_sort_gives(tmp_path: Path, slice_rows, first, last):
    con = hot_table(2_000, seed=slice_rows + first)
    params = {"part": 1, "first": first, "last": last}
    target = tmp_path / "segment.parquet"
    rows = write_sorted_range(con, "hot", IN_RANGE, "src_offset", ORDER, params, target, slice_rows)
    whole = con.execute(f"SELECT * FROM hot WHERE {IN_RANGE} ORDER BY {ORDER}", params).fetchall()
    written = con.execute(f"SELECT * FROM read_parquet('{target}')").fetchall()
    assert rows == len(whole) > 0
    assert written == whole
    assert pq.ParquetFile(target).metadata.num_row_groups == len(
        offset_slices(
            con.execute(
                f"SELECT src_offset, count(*) FROM hot WHERE {IN_RANGE} GROUP BY 1 ORDER BY 1",
                params,
            ).fetchall(),
            slice_rows,
        )
    )


def test_an_empty_range_is_a_file_with_the_columns_and_no_rows(tmp_path: Path):
    con = hot_table(100, seed=1)
    target = tmp_path / "segment.parquet"
    params = {"part": 0, "first": 1_000, "last": 2_000}
    assert write_sorted_range(con, "hot", IN_RANGE, "src_offset", ORDER, params, target) == 0
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{target}')").fetchall()
    assert [(d[0], d[1]) for d in described] == [
        (d[0], d[1]) for d in con.execute("DESCRIBE hot").fetchall()
    ]
    assert con.execute(f"SELECT count(*) FROM read_parquet('{target}')").fetchone() == (0,)


def test_rows_that_change_between_the_count_and_the_copy_are_refused(tmp_path: Path, monkeypatch):
    con = hot_table(200, seed=2)
    real = sorted_writer._slice

    def slice_then_lose_a_row(*args, **kwargs):
        rows = real(*args, **kwargs)
        return rows.slice(1)

    monkeypatch.setattr(sorted_writer, "_slice", slice_then_lose_a_row)
    params = {"part": 0, "first": 0, "last": 99}
    with pytest.raises(StoreError, match="wrote"):
        write_sorted_range(
            con, "hot", IN_RANGE, "src_offset", ORDER, params, tmp_path / "segment.parquet"
        )


def test_merged_files_come_out_in_order_with_a_column_one_of_them_lacks(tmp_path: Path):
    """Compaction's source: sealed files by name, one from before a column was added."""
    con = hot_table(400, seed=3)
    total = f"{ORDER}, src_partition"  # both partitions: no ties
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    con.execute(
        f"COPY (SELECT * EXCLUDE (amount) FROM hot WHERE src_offset < 50 ORDER BY {total}) "
        f"TO '{old}' (FORMAT parquet)"
    )
    con.execute(
        f"COPY (SELECT * FROM hot WHERE src_offset >= 50 ORDER BY {total}) TO '{new}' "
        "(FORMAT parquet)"
    )
    source = f"read_parquet(['{new}', '{old}'], union_by_name = true)"
    target = tmp_path / "merged.parquet"
    rows = write_sorted_range(con, source, "TRUE", "src_offset", total, {}, target, 50)
    expected = con.execute(
        "SELECT src_partition, src_offset, txn_id, leg, account, "
        f"CASE WHEN src_offset < 50 THEN NULL ELSE amount END FROM hot ORDER BY {total}"
    ).fetchall()
    merged = con.execute(
        "SELECT src_partition, src_offset, txn_id, leg, account, amount "
        f"FROM read_parquet('{target}')"
    ).fetchall()
    assert rows == len(expected) == 400
    assert merged == expected
