"""The writer's DuckDB memory limit and checkpoints (`ledger.store.hot_memory`), against real
DuckDB files."""

import duckdb
import pytest

from ledger.events import encode_batch
from ledger.store.hot import DuckDBStore
from ledger.store.hot_memory import (
    MIB,
    SEAL_THREADS,
    MemoryLimit,
    memory_limit,
    parse_size,
)
from ledger.store.hot_tables import HOT_TABLES_DDL
from ledger.store.rollup_files import LEVELS
from tests.builders import a_process, an_envelope, an_owner
from tests.unit.test_store import ingest, message


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("128MiB", 128 << 20),
        ("1GiB", 1 << 30),
        ("1GB", 1_000_000_000),
        ("500 MB", 500_000_000),
        ("64mib", 64 << 20),
        ("33554432", 32 << 20),
    ],
    ids=["mib", "gib", "gb-decimal", "space", "lower-case", "bare-bytes"],
)
def test_sizes_parse_in_duckdbs_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["lots", "1.5GB", "256 furlongs", "-1GB", "", "16MiB"],
    ids=["words", "fraction", "unknown-unit", "negative", "empty", "below-the-least"],
)
def test_other_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize(
    ("configured", "ids", "limit"),
    [
        (64 * MIB, 0, 64 * MIB),
        (64 * MIB, 1, 80 * MIB),  # one id more: the next step
        (64 * MIB, 200_000, 96 * MIB),  # 64 MiB + 25.6 MB, up to a 16 MiB step
        (100 * MIB, 0, 112 * MIB),
    ],
    ids=["no-ids", "one-id", "bench-sized-set", "off-step"],
)
def test_the_limit_is_the_configured_memory_and_room_for_the_dedupe_index(configured, ids, limit):
    assert memory_limit(configured, ids) == limit


def _setting(con, name):
    return con.execute(f"SELECT current_setting('{name}')").fetchone()[0]


def test_the_dedupe_index_never_fills_the_limit(tmp_path):
    """The primary-key index of `seen_events` does not spill: at a fixed 16 MiB, 250,000 ids
    fail a commit; following the set, the same inserts commit."""

    def insert_ids(follow):
        con = duckdb.connect(str(tmp_path / f"follow-{follow}.duckdb"))
        con.execute(HOT_TABLES_DDL)
        limit = MemoryLimit(con, 16 * MIB)
        limit.follow(0)
        for first in range(0, 250_000, 50_000):
            con.execute(
                "INSERT INTO seen_events SELECT md5(i::VARCHAR), i, 'gpu:x' FROM range(?, ?) t(i)",
                [first, first + 50_000],
            )
            if follow:
                limit.follow(first + 50_000)
        return con

    with pytest.raises(duckdb.Error, match=r"(?i)memory|allocate|pin"):
        insert_ids(follow=False)
    con = insert_ids(follow=True)
    assert con.execute("SELECT count(*) FROM seen_events").fetchone() == (250_000,)


def test_the_writer_checkpoints_at_seals_not_at_commits(tmp_path):
    with DuckDBStore(tmp_path / "ledger", memory_limit=64 * MIB) as store:
        con = store._con
        assert _setting(con, "memory_limit") == "64.0 MiB"
        assert _setting(con, "checkpoint_threshold") == "64.0 MiB"
        wal = store.data_dir / "hot.duckdb.wal"
        ingest(store, message(0, 1, 2), message(1, 3))
        logged = wal.stat().st_size
        ingest(store, message(2, 4))
        assert wal.stat().st_size > logged > 0  # the commits only grew the log
        store.seal()
        assert not wal.exists() or wal.stat().st_size == 0
        store.limit_memory(None)
        assert _setting(con, "memory_limit") != "64.0 MiB"


def _segment_files(store):
    return {
        path.relative_to(store.data_dir): path.read_bytes()
        for path in sorted(store.data_dir.rglob("*.parquet"))
    }


def test_the_seal_copies_checkpointed_rows_and_writes_the_same_files(tmp_path):
    """The seal checkpoints before its copies and runs DuckDB on one thread
    (`ledger.store.hot_memory`): the first segment is written with the log empty, on one thread
    (the connection's own number again after the seal), and every segment, rollup and archive
    file holds the same bytes as a seal that copies the rows from DuckDB's in-memory tables on
    three threads (shared GPUs go through the posting rows, the rest through the usage rows)."""
    shared = (
        a_process(owner=an_owner()),
        a_process(pid=7, owner=an_owner(team="search", project="ranking")),
    )
    batches = [
        [message(0, 1, 2), message(1, 3, partition=1, gpu="GPU-2")],
        [
            message(2, 4),
            message(3, 5, value=encode_batch([an_envelope(processes=shared)])),
            message(4, 6, 7, partition=1, gpu="GPU-2"),
        ],
    ]
    stores = [DuckDBStore(tmp_path / name) for name in ("checkpointed", "in-memory")]
    for store in stores:
        store._con.execute("SET threads = 3")
        for batch in batches:
            ingest(store, *batch)
    checkpointed, in_memory = stores
    con, wal = checkpointed._con, checkpointed.data_dir / "hot.duckdb.wal"
    logged: list[tuple[int, int]] = []
    copy = checkpointed._segments.seal_range

    def observed(kind, *args):
        logged.append((wal.stat().st_size if wal.exists() else 0, _setting(con, "threads")))
        return copy(kind, *args)

    checkpointed._segments.seal_range = observed
    sealed = checkpointed.seal().sealed
    assert len(sealed) == 2 and logged[0] == (0, SEAL_THREADS)
    assert _setting(con, "threads") == 3
    assert in_memory._segments.seal_committed().sealed == sealed  # no checkpoint before copies
    for store in stores:
        store.close()
    files = [_segment_files(store) for store in stores]
    assert len(files[0]) > 2 * len(LEVELS) and files[0] == files[1]
