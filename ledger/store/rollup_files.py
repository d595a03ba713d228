"""Rollups: a small pre-aggregated Parquet file beside every sealed postings segment.

A postings segment's rollup holds its postings summed per

    period, kind, account, unit, idle, team, project, user, cost_centre, job_id, model, pool,
    and the UTC hour its interval started in,

with the summed `amount`, the number of `postings`, the group's first `start_us` and last
`end_us`. It is written by the seal (and by the compaction that merges segments) from the
segment file just written, named after it (`<first>-<last>.rollup.parquet` beside
`<first>-<last>.parquet`) and recorded in the segment's manifest entry (`SegmentInfo.rollup`,
with its sha256), so one atomic manifest write makes a segment and its rollup visible together;
the publisher stores a rollup with its segment, before the manifest that names both.

The columns keep the names (and meaning under summing) of the postings' columns, so a query that
uses only these columns, `sum(amount)`, `min(start_us)` and `max(end_us)` reads the same from
the rollups as from the postings (`ledger.read.queries`' `{rollups}`; hour and day buckets and
month boundaries of a zone whose offsets are whole hours never split a group). A segment
without a rollup (sealed before rollups existed) is read as its postings in the same shape.
`ledger.store.verify` recomputes every rollup from its segment and compares exactly.

Beside it, the segment's **coarse rollup** (`<first>-<last>.coarse.parquet`, `SegmentInfo.coarse`)
is the same without `user` and `job_id`, grouped also by the UTC hour its intervals *ended* in
(`(end_us - 1) // HOUR_US`): what the pages' headline figures and charts read (`{coarse}`). With
neither job nor user its size follows teams × projects × models × pools per hour, whatever the
sampling rate; grouping by the end hour too lets `max(end_us)` stand for every posting's end
hour (fair share decays usage by the hour it ended). The **daily rollup**
(`<first>-<last>.daily.parquet`, `SegmentInfo.daily`) has the coarse keys per UTC day of the
start (`{daily}`: the Capacity page's daily usage over all history), and the **metered
rollup** (`<first>-<last>.metered.parquet`, `SegmentInfo.metered`) only the consumer GPU time
per team and UTC hour it ended in (`{metered}`: fair share). The **jobs rollup**
(`<first>-<last>.jobs.parquet`, `SegmentInfo.jobs`) holds each job's consumer totals per booked
period — one row per period, team, project, user, job, model and pool, with its GPU time, money
and their idle parts as columns of their own (`gpu_ms`, `money_micros`, `idle_gpu_ms`,
`idle_money_micros`) — what the pages' per-job tables read (`{jobs}`). The **gpus rollup**
(`<first>-<last>.gpus.parquet`, `SegmentInfo.gpus`) holds each GPU's usage per UTC hour of its
start (pool, model, node, GPU): its physical, consumer, idle and unallocated GPU time, the
utilisation its capacity legs carry and their last end — what the Platform and Capacity pages'
per-GPU and per-node figures read (`{gpus}`). Each level is one
`RollupLevel` (its keys, hour buckets, the postings it rolls up and its `Measure`s): the seal
writes, `verify` checks and readers read each the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from pathlib import Path

import duckdb

from ledger.store.layout import first_row, sql_path

HOUR_US = 3_600_000_000
# The grouping columns, then the sums; all named and typed as in the postings.
ROLLUP_KEYS = (
    "period",
    "kind",
    "account",
    "unit",
    "idle",
    "team",
    "project",
    "user",
    "cost_centre",
    "job_id",
    "model",
    "pool",
)
ROLLUP_COLUMNS = (*ROLLUP_KEYS, "amount", "postings", "start_us", "end_us")
# The dimensions (`ledger.read.queries.DIMENSIONS`) a rollup can group by.
ROLLUP_DIMENSIONS = frozenset(ROLLUP_KEYS) & {
    "cost_centre",
    "team",
    "project",
    "user",
    "job_id",
    "model",
    "pool",
}
# The coarse rollup's grouping columns: the rollup's without job and user.
COARSE_KEYS = tuple(k for k in ROLLUP_KEYS if k not in ("user", "job_id"))
COARSE_DIMENSIONS = ROLLUP_DIMENSIONS - {"user", "job_id"}


@dataclass(frozen=True, slots=True)
class Measure:
    """One value a rollup row holds for its group: `agg` (`sum`, `min`, `max`) of `posting`,
    SQL giving one posting's BIGINT value (a segment without the level is read one posting per
    row, each row holding `posting`)."""

    name: str
    posting: str
    agg: str = "sum"
    # SQL giving the same value of one row of a finer rollup (`RollupLevel.derived_from`):
    # a sum of amounts sums alike; a count of postings sums the finer rows' counts
    rolled: str | None = None

    def of_rollup(self) -> str:
        return self.posting if self.rolled is None else self.rolled


COUNT = Measure("postings", "CAST(1 AS BIGINT)", rolled="postings")
# What the fine, coarse, daily and metered levels hold: the postings' summed amount, their
# count, the group's first start and last end, named as in the postings.
AMOUNTS = (
    Measure("amount", "amount"),
    COUNT,
    Measure("start_us", "start_us", "min"),
    Measure("end_us", "end_us", "max"),
)


@dataclass(frozen=True, slots=True)
class RollupLevel:
    """One kind of per-segment rollup: the postings' columns it groups by (`keys`), the hour
    buckets it also groups by (SQL over a posting, not stored), its file's suffix, the postings
    it rolls up (`where`) and what each row holds for its group (`measures`)."""

    name: str
    keys: tuple[str, ...]
    hours: tuple[str, ...]
    suffix: str
    where: str = "TRUE"  # the postings it sums (SQL over a posting)
    measures: tuple[Measure, ...] = AMOUNTS
    # The level the seal aggregates this one from instead of the segment (None: the segment):
    # a level whose keys hold this one's, and whose groups each fall in one of this one's
    # buckets, so `hours` and `where` read the same of its rows as of their postings
    derived_from: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.keys, *(m.name for m in self.measures))

    def keys_sql(self) -> str:
        return ", ".join(f'"{k}"' for k in self.keys)

    def columns_sql(self) -> str:
        return ", ".join(f'"{c}"' for c in self.columns)

    def path(self, segment_rel: str) -> str:
        """The file's path beside the segment at `segment_rel`."""
        return f"{segment_rel.removesuffix('.parquet')}{self.suffix}"


FINE = RollupLevel("rollup", ROLLUP_KEYS, (f"start_us // {HOUR_US}",), ".rollup.parquet")
COARSE = RollupLevel(
    "coarse",
    COARSE_KEYS,
    (f"start_us // {HOUR_US}", f"(end_us - 1) // {HOUR_US}"),
    ".coarse.parquet",
)
DAY_US = 24 * HOUR_US
# The coarse keys per UTC day of the start: the capacity charts' daily usage over all history.
# From the fine rollup: a fine group's postings all start in one UTC hour, so in one UTC day.
DAILY = RollupLevel(
    "daily", COARSE_KEYS, (f"start_us // {DAY_US}",), ".daily.parquet", derived_from="rollup"
)
# Consumer GPU time per team and UTC hour its usage ended in: metered usage for fair share.
# From the coarse rollup: a coarse group's postings all end in one UTC hour.
METERED = RollupLevel(
    "metered",
    ("team",),
    (f"(end_us - 1) // {HOUR_US}",),
    ".metered.parquet",
    "account LIKE 'consumer:%' AND unit = 'gpu_ms' AND team IS NOT NULL",
    derived_from="coarse",
)


def _of(unit: str, idle: bool = False) -> str:
    """One consumer posting's amount if it is in `unit` (and idle, with `idle`), else 0."""
    return f"CASE WHEN unit = '{unit}'{' AND idle' if idle else ''} THEN amount ELSE 0 END"


# A job's consumer totals per booked period: one row per job (its owner, model and pool) per
# period per segment, GPU time and money with their idle parts side by side (`{jobs}`: the
# pages' per-job tables: top jobs, job costs).
JOB_KEYS = ("period", "team", "project", "user", "job_id", "model", "pool")
JOBS = RollupLevel(
    "jobs",
    JOB_KEYS,
    (),
    ".jobs.parquet",
    "account LIKE 'consumer:%' AND job_id IS NOT NULL",
    (
        Measure("gpu_ms", _of("gpu_ms")),
        Measure("money_micros", _of("money_micros")),
        Measure("idle_gpu_ms", _of("gpu_ms", idle=True)),
        Measure("idle_money_micros", _of("money_micros", idle=True)),
        COUNT,
        Measure("start_us", "start_us", "min"),
        Measure("end_us", "end_us", "max"),
    ),
    derived_from="rollup",  # the fine rollup's keys hold the job's, its unit and idle flag
)

# The GPU-time usage legs the gpus level rolls up (usage, and the reversal of a usage:
# `ledger.read.rollups.shared.USAGE_SQL`), and its measures' conditions on one of them.
_GPU_USAGE = "(kind = 'usage' OR kind = 'reversal' AND model <> '') AND unit = 'gpu_ms'"
_CAPACITY = "account LIKE 'capacity:%'"


def _gpu_ms(condition: str) -> str:
    return f"CASE WHEN {condition} THEN amount ELSE 0 END"


# Each GPU's usage per UTC hour of its start: its physical time (the capacity legs, negative),
# split between owners (consumer legs, the idle part apart) and nobody (unallocated legs), with
# the utilisation its capacity legs carry (`util_pct` × GPU-ms, and the GPU-ms whose utilisation
# is known) and the last end of a capacity leg (`{gpus}`: the Platform and Capacity pages'
# per-GPU and per-node figures).
GPU_KEYS = ("pool", "model", "node", "gpu_uuid")
GPUS = RollupLevel(
    "gpus",
    GPU_KEYS,
    (f"start_us // {HOUR_US}",),
    ".gpus.parquet",
    _GPU_USAGE,
    (
        Measure("capacity_gpu_ms", _gpu_ms(_CAPACITY)),
        Measure("consumer_gpu_ms", _gpu_ms("account LIKE 'consumer:%'")),
        Measure("idle_gpu_ms", _gpu_ms("account LIKE 'consumer:%' AND idle")),
        Measure("unallocated_gpu_ms", _gpu_ms("account LIKE 'unallocated:%'")),
        Measure("util_gpu_ms", _gpu_ms(f"{_CAPACITY} AND util_pct IS NOT NULL")),
        Measure(
            "util_weighted",
            f"CASE WHEN {_CAPACITY} AND util_pct IS NOT NULL THEN util_pct * amount ELSE 0 END",
        ),
        Measure("postings", "CAST(1 AS BIGINT)"),
        Measure("start_us", "start_us", "min"),
        Measure("end_us", "end_us", "max"),
        Measure("capacity_end_us", f"CASE WHEN {_CAPACITY} THEN end_us END", "max"),
    ),
)
LEVELS = (FINE, COARSE, DAILY, METERED, JOBS, GPUS)


@dataclass(frozen=True, slots=True)
class RollupInfo:
    """A segment's rollup as its manifest entry records it (path relative to the root)."""

    path: str
    rows: int
    sha256: str

    @classmethod
    def from_dict(cls, entry: dict[str, object]) -> RollupInfo:
        path, rows, sha = entry.get("path"), entry.get("rows"), entry.get("sha256")
        if not isinstance(path, str) or type(rows) is not int or not isinstance(sha, str):
            raise TypeError("rollup: expected path, rows and sha256")
        return cls(path, rows, sha)


def rollup_path(segment_rel: str) -> str:
    """The rollup's path beside the segment at `segment_rel` (`….parquet` → `….rollup.parquet`)."""
    return FINE.path(segment_rel)


def rollup_sql(source: str, level: RollupLevel = FINE, rolled: bool = False) -> str:
    """SQL aggregating the postings of `source` (a relation) into `level`'s rows, in a fixed
    order; with `rolled`, `source` holds the rows of a finer rollup (`derived_from`) instead,
    which aggregate to the same rows."""
    keys = level.keys_sql()
    values = ", ".join(
        f'CAST({m.agg}({m.of_rollup() if rolled else m.posting}) AS BIGINT) AS "{m.name}"'
        for m in level.measures
    )
    if not level.hours:
        return (
            f"SELECT {keys}, {values} FROM {source} WHERE {level.where} "
            f"GROUP BY {keys} ORDER BY {keys}"
        )
    hours = ", ".join(f"{expr} AS _h{n}" for n, expr in enumerate(level.hours))
    buckets = ", ".join(f"_h{n}" for n in range(len(level.hours)))
    return (
        f"SELECT {keys}, {values} FROM (SELECT *, {hours} FROM {source} WHERE {level.where}) "
        f"GROUP BY {keys}, {buckets} ORDER BY {buckets}, {keys}"
    )


def postings_as_rollup_sql(source: str, level: RollupLevel = FINE) -> str:
    """SQL reading the postings of `source` in `level`'s shape (one posting per row)."""
    values = ", ".join(f'{m.posting} AS "{m.name}"' for m in level.measures)
    return f"SELECT {level.keys_sql()}, {values} FROM {source} WHERE {level.where}"


def rollup_columns_sql(level: RollupLevel = FINE) -> str:
    return level.columns_sql()


def write_rollup(
    con: duckdb.DuckDBPyConnection,
    segment: Path,
    target: Path,
    level: RollupLevel = FINE,
    rolled: bool = False,
) -> int:
    """Write `level`'s rollup of the postings segment file `segment` to `target` (through a
    temporary name, fsynced); its number of rows. With `rolled`, `segment` is the file of the
    segment's rollup `level` is derived from (`derived_from`). Raises `OSError` /
    `duckdb.Error`."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        query = rollup_sql(f"read_parquet('{sql_path(segment)}')", level, rolled)
        # COPY answers with the number of rows it wrote
        row = first_row(
            con.execute(f"COPY ({query}) TO '{sql_path(tmp)}' (FORMAT parquet, COMPRESSION zstd)")
        )
        assert row is not None
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return int(row[0])


def rollup_differences(
    con: duckdb.DuckDBPyConnection, segment: Path, rollup: Path, level: RollupLevel = FINE
) -> int:
    """How many rows differ between the rollup file and `level`'s aggregation of its segment's
    postings (0: equal, exact integers, every column): rows of either that the other lacks,
    counted with their multiplicity (as `EXCEPT ALL` both ways counts them; each row's count in
    one minus its count in the other, summed as absolute values — a third of the two `EXCEPT
    ALL`s' time)."""
    fresh = rollup_sql(f"read_parquet('{sql_path(segment)}')", level)
    stored = f"SELECT {level.columns_sql()} FROM read_parquet('{sql_path(rollup)}')"
    columns = level.columns_sql()
    row = first_row(
        con.execute(
            f"SELECT coalesce(sum(abs(n)), 0) FROM (SELECT {columns}, sum(side) AS n FROM ("
            f"SELECT *, 1 AS side FROM ({fresh}) UNION ALL SELECT *, -1 AS side FROM ({stored})"
            f") GROUP BY {columns})"
        )
    )
    assert row is not None
    return int(row[0])


@lru_cache(maxsize=64)
def hour_aligned(zone: tzinfo) -> bool:
    """Whether every UTC offset `zone` had or will have (1970–2100) is a whole number of hours,
    so its hours, days and months begin on UTC hours and never split a rollup's group."""
    if zone is UTC:
        return True
    moment = datetime(1970, 1, 1, tzinfo=UTC)
    end = datetime(2100, 1, 1, tzinfo=UTC)
    while moment < end:
        offset = moment.astimezone(zone).utcoffset()
        if offset is None or offset % timedelta(hours=1):
            return False
        moment += timedelta(days=15)
    return True
