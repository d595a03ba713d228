"""The writer's DuckDB memory: its limit (`ledger.duckdb_memory_limit`) and when it checkpoints.

DuckDB's default memory limit is 80 % of the machine's memory, and the writer's buffer pool
grows towards it: the ingest benchmark's worker held ~190 MiB more at its peak than with a limit
of 128 MiB, for no gain in throughput. The limit is not set by default: every primary-key index
of the hot tables (balances per account and period, job owners, …) lives in memory whole, and
only the dedupe set's is accounted for below, so a small limit on a long-lived ledger could fail
its commits; an operator who sets one sizes it for the fleet. The configured limit is the
working memory of the writer's statements (inserts, the seal's sorts and copies spill to
`hot.duckdb.tmp` beyond it). One thing cannot spill: the dedupe set's primary-key index
(`seen_events`), which DuckDB keeps in memory whole (~75 bytes per applied id, measured; a limit
the index fills fails every commit). So the limit set is the configured one plus
`INDEX_BYTES_PER_ID` per id kept in the dedupe window, followed as the set grows and is pruned
(`MemoryLimit.follow`).

Checkpoints: DuckDB checkpoints (writes the committed rows into the database file) when a
commit finds the write-ahead log past `checkpoint_threshold`, 16 MB by default, which made
about every commit of a busy worker a checkpoint: half its COMMIT time and a quarter of its CPU
(when a commit wrote four to six posting rows per sample). The writer checkpoints at each seal
instead: before the seal's copies and after them, when the hot tables have just lost the sealed
rows. Until a checkpoint, DuckDB holds the committed rows uncompressed in memory it cannot evict
without writing them to its temporary file (on the ingest bench's real-time data, ~88 MiB for
64,000 samples); the checkpoint before the copies writes them compressed into the database file
(~25 MiB), whose blocks the copies read and DuckDB can drop again, so a copy's sort and Parquet
writer run beside a quarter of that rather than on top of it. `CHECKPOINT_THRESHOLD` bounds the
log between seals for the same reason: a worker whose seals fall far apart (a long
`seal_interval_s`, a seal that keeps failing) folds its log into the file every 64 MiB rather
than holding every unsealed row uncompressed; a seal every few seconds never reaches it. Either
way each committed row is compressed into the file once. The log is durable either way (DuckDB
replays it when the database is opened), so exactly-once does not depend on when checkpoints
run.

The seal runs DuckDB on `SEAL_THREADS` thread: a copy's sort and Parquet writer keep state per
thread, so their memory grew with the host's cores (on the bench's two, single copies still rose
~55 MiB above the worker's steady level, with one they stay below it), and a seal is copies of
one range at a time that gain little from more (the seal's CPU is the same, its wall time on
two cores about the same).
"""

from __future__ import annotations

import re

import duckdb

MIB = 1 << 20
DEFAULT_MEMORY_LIMIT: int | None = None  # DuckDB's own (80 % of the machine's memory)
BENCH_MEMORY_LIMIT = 128 * MIB  # what the ingest bench sets (`ledger.duckdb_memory_limit`)
INDEX_BYTES_PER_ID = 128  # the dedupe index's ~75 bytes per id, with room to spare
_STEP = 16 * MIB  # the limit moves in steps of this much: no SET per batch
CHECKPOINT_THRESHOLD = "64MiB"
SEAL_THREADS = 1

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
MIN_MEMORY_LIMIT = 32 * MIB


def parse_size(text: str) -> int:
    """Bytes in a size such as '256MiB', '1GB' or '500 MB' (DuckDB's units: MB is 1000², MiB
    1024²); raises ValueError for anything else, or under `MIN_MEMORY_LIMIT`."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size such as 256MiB or 1GB")
    size = int(match.group(1)) * _UNITS[unit]
    if size < MIN_MEMORY_LIMIT:
        raise ValueError(f"{text!r} is below the least memory limit, 32MiB")
    return size


def memory_limit(configured: int, applied_ids: int) -> int:
    """The limit to set: `configured` plus room for the dedupe index of `applied_ids` ids,
    rounded up to a step."""
    wanted = configured + applied_ids * INDEX_BYTES_PER_ID
    return -(-wanted // _STEP) * _STEP


class MemoryLimit:
    """Keeps one writer connection's memory limit at `memory_limit` of the ids applied (None
    leaves DuckDB's default)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, configured: int | None) -> None:
        self._con = con
        self.configured = configured
        self.current: int | None = None

    def follow(self, applied_ids: int) -> None:
        if self.configured is None:
            return
        limit = memory_limit(self.configured, applied_ids)
        if limit != self.current:
            self._con.execute(f"SET memory_limit = '{limit}B'")
            self.current = limit
