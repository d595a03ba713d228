"""The ledgers `bench_dashboard` reads: the generated ledger with rollups (a cached one completed
with the levels added since it was generated), the same segments read
without them (as a ledger sealed before rollups is), the ledger published to the S3 API server
of the tests (`tests/s3_server.py`'s moto server) and pulled into a reader's cache, and a seal
appended to the writer's ledger and published (what the next visit after a seal pulls)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ledger.store.layout import SEGMENTS_DIR
from ledger.store.objects import ObjectStore, S3Settings, open_object_store
from ledger.store.rollup_files import LEVELS
from ledger.store.segments import (
    MANIFEST_NAME,
    Manifest,
    SegmentInfo,
    file_sha256,
    segment_path,
    summarise_segment,
)
from tests.benchmarks.bench_reports import (
    GPUS,
    INCARNATION,
    LEGS,
    TOPIC,
    YEAR_US,
    write_level,
    write_segment,
)
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY

SEAL_TRANSACTIONS = 5_000  # one seal's worth: 20,000 postings


def without_rollups(rolled: Path, plain: Path) -> Path:
    """A data directory reading the segments of `rolled` (linked, not copied) through a manifest
    that names no rollups."""
    source = rolled / SEGMENTS_DIR
    root = plain / SEGMENTS_DIR
    root.mkdir(parents=True)
    for child in source.iterdir():
        if child.name != MANIFEST_NAME:
            (root / child.name).symlink_to(child, target_is_directory=child.is_dir())
    entries = [
        dataclasses.replace(
            s, rollup=None, coarse=None, daily=None, metered=None, jobs=None, gpus=None
        )
        for s in Manifest(source).load()
    ]
    Manifest(root).save(entries)
    return plain


def add_missing_levels(data_dir: Path) -> int:
    """Write the rollups of every level a segment of `data_dir` is listed without (a cached
    ledger generated before the level existed), as the seal writes them, and list them; how many
    files were written."""
    root = data_dir / SEGMENTS_DIR
    manifest = Manifest(root)
    entries, written = [], 0
    con = duckdb.connect(":memory:")
    try:
        for seg in manifest.load():
            missing = [level for level in LEVELS if seg.rollup_of(level.name) is None]
            added = {level.name: write_level(con, root, seg.path, level) for level in missing}
            entries.append(dataclasses.replace(seg, **added) if added else seg)
            written += len(added)
    finally:
        con.close()
    if written:
        manifest.save(entries)
    return written


def append_seal(data_dir: Path, postings: int, seal: int) -> SegmentInfo:
    """Seal number `seal` after the generated ledger of `postings`: the next
    `SEAL_TRANSACTIONS` samples as one more segment with its rollup, named by the manifest."""
    transactions = postings // LEGS
    lo = transactions + seal * SEAL_TRANSACTIONS
    hi = lo + SEAL_TRANSACTIONS
    root = data_dir / SEGMENTS_DIR
    rel = segment_path(INCARNATION, TOPIC, 0, lo, hi - 1)
    con = duckdb.connect(":memory:")
    try:
        samples = transactions // GPUS
        write_segment(con, lo, hi, samples, YEAR_US // samples, root / rel)
        stats = con.execute(
            f"SELECT count(*), min(start_us), max(end_us) FROM read_parquet('{root / rel}')"
        ).fetchone()
        assert stats is not None
        info = SegmentInfo(
            rel, INCARNATION, TOPIC, 0, lo, hi - 1, int(stats[0]), file_sha256(root / rel),
            int(stats[1]), int(stats[2]), summarise_segment(con, root / rel),
            **{level.name: write_level(con, root, rel, level) for level in LEVELS},
        )  # fmt: skip
    finally:
        con.close()
    manifest = Manifest(root)
    manifest.save([*manifest.load(), info])
    return info


@contextmanager
def s3_store() -> Iterator[ObjectStore]:
    """A bucket on a moto S3 API server on loopback, for as long as the block runs."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from tally.metrics import free_port

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port("127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        ).create_bucket(Bucket="bench")
        settings = S3Settings(endpoint, REGION, ACCESS_KEY, SECRET_KEY, timeout_s=60.0)
        yield open_object_store("s3://bench/ledger", settings)
    finally:
        server.stop()
