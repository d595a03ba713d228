"""Report latency over a generated sealed ledger: `report cost --by team,project`, the idle
report and the FOCUS export of one month, beside a plain DuckDB scan of the same segments.

The ledger is written directly as sealed Parquet segments plus a manifest (DuckDB `range()`
SQL, in the postings schema), so generating it costs seconds rather than an ingest run: a year
(2026) of 1,000 GPUs in four pools, each sample one usage transaction of four postings
(consumer or unallocated GPU-ms and money, capacity credits). A sample belongs to the job
running on its GPU then, or to nobody (`fleet_jobs`: jobs shaped like the Philly trace's, each
with one owner among 20 teams × 5 projects × 60 users, one GPU set, idle gaps between them):
about 75 % of samples owned, 8 % of all samples allocated but idle. `TALLY_BENCH_SHAPE=random`
draws each sample's owner and job at random instead (the earlier worst case for rollups).
Segments hold 1,000,000 postings each, in offset (= time) order, as sealing and compaction
leave them.

Size: 10 million postings by default (one sample per GPU every 3.5 h); set
`TALLY_BENCH_POSTINGS=100000000` for the issue's 100 million (every 21 min).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from ledger.periods import Period
from ledger.read.focus import ExportFormat, FocusContext, export_focus
from ledger.read.reports import IdleSharing, ReportQueries, cost_report, idle_report
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.rollup_files import LEVELS, RollupInfo, RollupLevel, write_rollup
from ledger.store.schema import POSTINGS_SCHEMA
from ledger.store.segments import (
    Manifest,
    SegmentInfo,
    file_sha256,
    segment_path,
    summarise_segment,
)
from tests.benchmarks import fleet_jobs
from tests.benchmarks.harness import Figure, Progress

BENCH = "reports"
GPUS = 1_000
LEGS = 4
SEGMENT_POSTINGS = 1_000_000
YEAR_START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
YEAR_US = 365 * 86_400 * 1_000_000
MONTH = "2026-06"
REPEATS = 7
EXPORT_REPEATS = 3
TOPIC = "bench.samples"
INCARNATION = "bench"
# pool, model, micro-units per GPU-hour
POOLS = (
    ("h100", "NVIDIA H100 80GB HBM3", 3_200_000),
    ("a100", "NVIDIA A100-SXM4-80GB", 2_100_000),
    ("l40s", "NVIDIA L40S", 1_100_000),
    ("l4", "NVIDIA L4", 600_000),
)


def _postings() -> int:
    wanted = int(os.environ.get("TALLY_BENCH_POSTINGS", "10000000"))
    unit = GPUS * LEGS
    return max(unit, wanted // unit * unit)


def _owners(shape: str) -> str:
    """The SQL columns of a sample's owner: the random worst case hashes each sample; the jobs
    shape reads the sample's job from `owners` (`fleet_jobs.timeline`) and hashes the job, so a
    job keeps one owner."""
    if shape == "random":
        return """h % 100 AS r100, (h // 100) % 20 AS team_n, (h // 2000) % 5 AS proj_n,
          (h // 10000) % 60 AS user_n, (h // 600000) % 50000 AS job_n,
          h % 100 < 75 AS owned, h % 100 < 8 AS idle_flag"""
    return """h % 100 AS r100, jh % 20 AS team_n, (jh // 20) % 5 AS proj_n,
          (jh // 100) % 60 AS user_n, job AS job_n,
          job >= 0 AS owned, job >= 0 AND h % 100 < 11 AS idle_flag"""


def _segment_sql(lo: int, hi: int, interval_us: int, path: Path, shape: str = "random") -> str:
    """COPY transactions `lo..hi-1` (× 4 legs) to `path`, columns in POSTINGS_SCHEMA order; the
    jobs shape reads each transaction's job from the relation `owners` (i, job)."""
    pools = " ".join(
        f"WHEN {n} THEN {value}" for n, value in enumerate(f"'{p}'" for p, _, _ in POOLS)
    )
    models = " ".join(f"WHEN {n} THEN '{m}'" for n, (_, m, _) in enumerate(POOLS))
    rates = " ".join(f"WHEN {n} THEN {r}" for n, (_, _, r) in enumerate(POOLS))
    ms = interval_us // 1_000
    source = (
        f"SELECT i, -1 AS job FROM range({lo}, {hi}) r(i)"
        if shape == "random"
        else f"SELECT i, job FROM owners WHERE i >= {lo} AND i < {hi}"
    )
    return f"""
    COPY (
      WITH t AS (
        SELECT i, i % {GPUS} AS g, i // {GPUS} AS k, hash(i) AS h, job, hash(job) AS jh
        FROM ({source})
      ), o AS (
        SELECT i, g, {YEAR_START_US} + k * {interval_us} AS start_us, {_owners(shape)},
          CASE g * {len(POOLS)} // {GPUS} {pools} END AS pool,
          CASE g * {len(POOLS)} // {GPUS} {models} END AS model,
          {ms}::BIGINT * CASE g * {len(POOLS)} // {GPUS} {rates} END // 3600000 AS money
        FROM t
      )
      SELECT 'b' || i AS txn_id, leg::SMALLINT AS leg, 'usage' AS kind,
        CASE WHEN leg >= 2 THEN 'capacity:' || pool || '/' || model
             WHEN owned THEN 'consumer:team-' || team_n || '/proj-' || proj_n
             ELSE 'unallocated:' || pool || '/' || model END AS account,
        CASE WHEN leg % 2 = 0 THEN 'gpu_ms' ELSE 'money_micros' END AS unit,
        (CASE WHEN leg % 2 = 0 THEN {ms} ELSE money END)
          * (CASE WHEN leg >= 2 THEN -1 ELSE 1 END)::BIGINT AS amount,
        CASE WHEN leg < 2 AND owned THEN 'team-' || team_n END AS team,
        CASE WHEN leg < 2 AND owned THEN 'proj-' || proj_n END AS project,
        CASE WHEN leg < 2 AND owned THEN 'user-' || user_n END AS "user",
        CASE WHEN leg < 2 AND owned THEN 'job-' || job_n END AS job_id,
        CASE WHEN leg < 2 AND owned THEN 'cc-' || (team_n % 4) END AS cost_centre,
        'GPU-' || g AS gpu_uuid, model, pool, 'node-' || (g // 8) AS node,
        start_us::BIGINT AS start_us, (start_us + {interval_us})::BIGINT AS end_us,
        'b' || i AS cause, '{INCARNATION}' AS incarnation, '{TOPIC}' AS src_topic,
        0::INTEGER AS src_partition, i::BIGINT AS src_offset,
        strftime(make_timestamp(start_us::BIGINT), '%Y-%m') AS period,
        (CASE WHEN idle_flag AND owned THEN 2 ELSE 30 + r100 % 70 END)::SMALLINT AS util_pct,
        idle_flag AND owned AS idle
      FROM o, range({LEGS}) l(leg)
      ORDER BY i, leg
    ) TO '{path}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)
    """


def write_segment(
    con: duckdb.DuckDBPyConnection, lo: int, hi: int, samples: int, interval_us: int, path: Path
) -> None:
    """Write transactions `lo..hi-1` of a ledger of `samples` samples per GPU, one every
    `interval_us`, to `path`, in the shape `TALLY_BENCH_SHAPE` says (`fleet_jobs`)."""
    kind = fleet_jobs.shape()
    cursor = con.cursor()  # its own: `con` may hold an unfinished result
    try:
        if kind == "jobs":
            owner = fleet_jobs.timeline(samples, interval_us, GPUS, len(POOLS)).ravel()
            if hi > len(owner):
                raise ValueError(f"transaction {hi - 1} is past the fleet's timeline")
            owners = pa.table({"i": pa.array(np.arange(lo, hi)), "job": pa.array(owner[lo:hi])})
            cursor.register("owners", owners)
        cursor.execute(_segment_sql(lo, hi, interval_us, path, kind))
    finally:
        cursor.close()


def write_level(
    con: duckdb.DuckDBPyConnection, root: Path, rel: str, level: RollupLevel
) -> RollupInfo:
    """Write `level`'s rollup of the segment `rel` under `root` as the seal does."""
    path = level.path(rel)
    count = write_rollup(con, root / rel, root / path, level)
    return RollupInfo(path, count, file_sha256(root / path))


def generate(data_dir: Path, postings: int, progress: Progress, rollups: bool = True) -> list[Path]:
    """A sealed ledger of `postings` rows in `data_dir`, each segment with its rollups of every
    level (as the seal writes them, `ledger.store.rollup_files`) unless `rollups` is
    False; returns the segment files."""
    root = data_dir / SEGMENTS_DIR
    root.mkdir(parents=True)
    transactions = postings // LEGS
    samples = transactions // GPUS
    per_segment = SEGMENT_POSTINGS // LEGS
    con = duckdb.connect(":memory:")
    infos: list[SegmentInfo] = []
    files: list[Path] = []
    for lo in range(0, transactions, per_segment):
        hi = min(lo + per_segment, transactions)
        rel = segment_path(INCARNATION, TOPIC, 0, lo, hi - 1)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        write_segment(con, lo, hi, samples, YEAR_US // samples, target)
        stats = con.execute(
            f"SELECT count(*), min(start_us), max(end_us) FROM read_parquet('{target}')"
        ).fetchone()
        assert stats is not None
        levels = {lv.name: write_level(con, root, rel, lv) if rollups else None for lv in LEVELS}
        infos.append(
            SegmentInfo(
                rel, INCARNATION, TOPIC, 0, lo, hi - 1, int(stats[0]), file_sha256(target),
                int(stats[1]), int(stats[2]), summarise_segment(con, target), **levels,
            )
        )  # fmt: skip
        files.append(target)
        if len(files) % 10 == 0:
            progress(f"generated {len(files)} segments ({hi * LEGS:,} postings)")
    con.close()
    schema = (
        duckdb.connect(":memory:")
        .execute(f"DESCRIBE SELECT * FROM read_parquet('{files[0]}')")
        .fetchall()
    )
    assert [row[0] for row in schema] == POSTINGS_SCHEMA.names, "generated schema drifted"
    Manifest(root).save(infos)
    return files


def _latencies(action: Callable[[], object], repeats: int) -> list[float]:
    action()  # warm: file metadata, imports
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1_000)
    return times


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def run(progress: Progress) -> list[Figure]:
    postings = _postings()
    with tempfile.TemporaryDirectory(prefix="tally-bench-reports-") as tmp:
        data_dir = Path(tmp) / "ledger"
        progress(f"generating a sealed ledger of {postings:,} postings")
        started = time.perf_counter()
        files = generate(data_dir, postings, progress)
        generated_s = time.perf_counter() - started
        listed = ", ".join(f"'{f}'" for f in files)
        scan = duckdb.connect(":memory:")
        queries = ReportQueries(data_dir)

        def baseline() -> object:
            return scan.execute(f"SELECT sum(amount) FROM read_parquet([{listed}])").fetchall()

        def cost() -> object:
            return cost_report(queries, ("team", "project"), MONTH)

        def cost_shared() -> object:
            return cost_report(queries, ("team", "project"), MONTH, IdleSharing.WEIGHTED)

        def idle() -> object:
            return idle_report(queries, MONTH)

        out = Path(tmp) / "focus.parquet"
        rows: list[int] = []

        def focus() -> object:
            result = export_focus(
                queries,
                Period.month(MONTH),
                out,
                ExportFormat.PARQUET,
                FocusContext(currency="USD"),
            )
            rows.append(result.rows)
            return result

        progress("measuring: plain scan")
        base = _latencies(baseline, REPEATS)
        progress("measuring: report cost --by team,project")
        measured = {"report cost --by team,project": _latencies(cost, REPEATS)}
        measured["report cost … --idle-sharing weighted"] = _latencies(cost_shared, REPEATS)
        progress("measuring: report idle")
        measured["report idle"] = _latencies(idle, REPEATS)
        progress("measuring: export focus (parquet)")
        measured["export focus"] = _latencies(focus, EXPORT_REPEATS)
        queries.close()
        scan.close()
    size = (
        f"{postings:,} postings, {len(files)} segments, {GPUS:,} GPUs over 2026; month {MONTH}"
        f" (generated in {generated_s:.0f}s; TALLY_BENCH_POSTINGS=100000000 for the issue's"
        " 100 M)"
    )
    figures: list[Figure] = []
    for name, times in measured.items():
        note = size if not figures else None
        if name == "export focus":
            note = f"{rows[-1]:,} FOCUS rows for {MONTH}"
        for label, value, base_value in (
            ("p50", statistics.median(times), statistics.median(base)),
            ("p95", _p95(times), _p95(base)),
        ):
            figures.append(
                Figure(
                    BENCH,
                    f"{name} {label}",
                    value,
                    "ms",
                    f"plain scan sum(amount) {label}",
                    base_value,
                    higher_is_better=False,
                    target="p95 ≤ 2 s" if name.startswith("report") else "p95 ≤ 30 s",
                    note=note if label == "p50" else None,
                )
            )
    return figures
