"""The layout of a ledger data directory, and the small SQL helpers every DuckDB user of it
shares.

    <data_dir>/hot.duckdb      the writer's database (`ledger.store.hot`); nothing else opens it
    <data_dir>/segments/       sealed postings segments, their manifest and the side files
    <data_dir>/archive/        sealed raw-event archive segments and their manifest
    <data_dir>/replica/        with the sealed ledger on an object store: a reader's cache of it,
                               laid out as a data directory (`ledger.store.replica`); of a
                               sharded one, each shard under `replica/shards/<name>/` and their
                               union as the data directory (`ledger.store.union`)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from ledger.store.hot_memory import CHECKPOINT_THRESHOLD

HOT_DB_NAME = "hot.duckdb"
SEGMENTS_DIR = "segments"
ARCHIVE_DIR = "archive"

# The writer's connection settings: no progress bar (DuckDB prints one to stdout for long
# queries; the writer's have no one watching), and checkpoints at seals rather than at commits
# (`ledger.store.hot_memory`).
WRITER_SETTINGS = (
    f"SET enable_progress_bar = false;\nSET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}';\n"
)


def has_ledger(data_dir: Path) -> bool:
    """Whether `data_dir` holds a ledger: the writer's database, or a postings manifest (a
    directory that does not exist, or holds neither, is not a ledger; a reader must not treat
    it as an empty one)."""
    from ledger.store.segments import MANIFEST_NAME

    return (data_dir / HOT_DB_NAME).is_file() or (data_dir / SEGMENTS_DIR / MANIFEST_NAME).is_file()


def first_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of a result, read to its end so the connection is free for the next call."""
    rows = result.fetchall()
    return rows[0] if rows else None


def sql_path(path: Path) -> str:
    """`path` as the body of a single-quoted SQL string."""
    return str(path).replace("'", "''")


def sql_list(paths: Iterable[Path]) -> str:
    """`paths` as a SQL list of strings, for `read_parquet([...])`."""
    return ", ".join(f"'{sql_path(p)}'" for p in paths)
