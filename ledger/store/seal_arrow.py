"""Writing one sealed segment's rows through Arrow: the rows read from DuckDB unordered, sorted
by Arrow and written by pyarrow's Parquet writer.

A seal writes each committed source range's rows (postings, archived messages) to a Parquet
file in a fixed order. DuckDB's `COPY (… ORDER BY …) TO` spent two thirds of its time on the
sort and its Parquet encoding of the postings' 25 columns; reading the same rows unordered into
Arrow, sorting them there and writing them with pyarrow wrote the same rows in the same order,
with the same Arrow types, in about 45 % of its CPU (measured on the ingest bench's data,
117,000 postings: 0.11 s against 0.25 s). The file differs only in its Parquet encoding
(pyarrow's dictionary pages and zstd level, row groups of `ROW_GROUP_SIZE` rows, and which
columns are flagged required, see `write_sorted`), which every reader of the segments (DuckDB's
`read_parquet`, pyarrow) reads alike; `tests/unit/test_seal_arrow.py` checks row identity
against the DuckDB copy.

The Arrow path holds the range's rows in memory, outside DuckDB's memory limit (once, and a row
group's sorted copy at a time), so a range whose rows weigh more than `ARROW_SEAL_MAX_BYTES`
(estimated before reading, `estimated_bytes`) is copied by DuckDB as before, which streams and
spills. Measured in process on the bench's data (one seal of every range), the seal's peak
above the resident set before it: backfill +84 MiB against DuckDB's +57, real time +58 to +70
against +42 to +53; what Arrow's pool kept is handed back after each range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledger.store.layout import first_row

ROW_GROUP_SIZE = 32_768  # rows per row group, and per sorted copy in memory
ARROW_SEAL_MAX_BYTES = 48 << 20
# An estimate of a range's rows in Arrow, in bytes: a posting row's 25 columns take ~300 bytes
# (the bench's backfill postings: 1,152,000 rows, 330 MiB); an archived message its key and
# value and ~100 bytes of coordinates.
POSTING_ROW_BYTES = 300
MESSAGE_ROW_SQL = 'sum(coalesce(octet_length("value"), 0) + coalesce(octet_length("key"), 0) + 128)'


def estimated_bytes(
    con: duckdb.DuckDBPyConnection, rows: str, params: Mapping[str, object], weight: str
) -> tuple[int, int]:
    """The number of `rows` (a query) and `weight` (an aggregate over them) — their estimated
    size in Arrow."""
    row = first_row(con.execute(f"SELECT count(*), {weight} FROM ({rows})", dict(params)))
    assert row is not None
    return int(row[0]), int(row[1] or 0)


def write_sorted(
    con: duckdb.DuckDBPyConnection,
    source: str,
    rows: str,
    params: Mapping[str, object],
    keys: Sequence[str],
    target: Path,
) -> int:
    """Write the rows of the query `rows` (of the table or view `source`) to the Parquet file
    `target`, ordered by `keys` (ascending; together unique, so the order is total), in row
    groups of `ROW_GROUP_SIZE`; the number of rows written. Raises `OSError` / `duckdb.Error`.

    The rows are streamed from DuckDB into one Arrow table (no second copy of the result), and
    written a row group at a time in the order of their sort indices (no sorted copy).

    Parquet's required/optional flag of each column follows DuckDB's copy where it can: the
    copy of a table marks required the columns its statistics show free of nulls (those it
    declares NOT NULL, and e.g. an archive's keys and values when none is null), the copy
    of a view none; here a table's columns holding no null are written required. The flag
    says nothing of the values (DuckDB's statistics may also count rows deleted since)."""
    reader = con.sql(rows, params=dict(params)).to_arrow_reader(ROW_GROUP_SIZE)
    table = pa.Table.from_batches(list(reader), schema=reader.schema)
    del reader
    order = pc.sort_indices(table, sort_keys=[(key, "ascending") for key in keys])
    schema = table.schema
    is_table = first_row(
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND schema_name = 'main'",
            [source],
        )
    )
    if is_table and is_table[0]:
        schema = pa.schema(
            [f.with_nullable(False) if table.column(f.name).null_count == 0 else f for f in schema]
        )
    # as DuckDB's: the Parquet types alone say the Arrow types
    with pq.ParquetWriter(target, schema, compression="zstd", store_schema=False) as writer:
        for at in range(0, table.num_rows, ROW_GROUP_SIZE):
            part = table.take(order[at : at + ROW_GROUP_SIZE])
            writer.write_table(pa.Table.from_arrays(part.columns, schema=schema))
    written = int(table.num_rows)
    del table, order
    # the pool keeps what the copies freed for reuse; a seal runs once an interval, and what it
    # kept would stay resident until the next
    pa.default_memory_pool().release_unused()
    return written
