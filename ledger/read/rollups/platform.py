"""Rollups behind the Platform page: the fleet now (busy, allocated-but-idle and unallocated
GPUs, and idle shares of busy GPUs), utilisation heatmap, distribution and summary, occupancy,
and when each node was last seen.

These are about when GPUs were used and select by `start_us`; "now" is the newest sealed sample.
The fleet now reads the postings (each GPU's samples, net of their reversals); the heatmap (in
buckets of whole hours) and nodes last seen read each GPU's hours (`{gpus}`,
`ledger.store.rollup_files.GPUS`), the heatmap's parts of an hour at the window's ends from the
postings (`hours.HourSplit`); the utilisation bands and summary and the occupancy (buckets from
the window's start) read the postings of the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger.read.reports import CONSUMER_SQL, IDLE_LEG_SQL, UNALLOCATED_SQL, ReportQueries
from ledger.read.rollups.hours import HourSplit
from ledger.read.rollups.shared import CAPACITY_SQL, DAY_US, HOUR_US, USAGE_SQL
from ledger.store.rollup_files import GPUS


class GpuState(StrEnum):
    """What a GPU (or a slice of it) was doing in its latest sealed sample."""

    BUSY = "busy"
    ALLOCATED_IDLE = "allocated_idle"
    UNALLOCATED = "unallocated"


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """A GPU idle now: allocated-but-idle (with its owner) or unallocated.

    `since_us` is the start of the unbroken run of samples in this state (for allocated-but-idle:
    since the detector flagged it, after its grace period); `gpu_ms` and `money_micros` are that
    run's time and money so far (for unallocated GPUs: the cost of the idle capacity). When the
    run is longer than the lookback, `since_capped` is set and the figures cover the lookback.
    """

    state: GpuState
    gpu_uuid: str
    node: str | None
    pool: str | None
    model: str | None
    team: str | None
    project: str | None
    user: str | None
    job_id: str | None
    util_pct: int | None
    since_us: int
    last_us: int
    gpu_ms: int
    money_micros: int
    since_capped: bool = False
    part_of_busy_gpu: bool = False  # an idle share (or MIG slice) beside a busy holder


@dataclass(frozen=True, slots=True)
class FleetNow:
    """The fleet at the newest sealed sample: GPUs seen in the last `window_us`, idle ones.

    A GPU is one unit, whatever holds parts of it (shares, MIG slices, an unallocated rest):
    busy when any holder of it is busy, allocated-but-idle when it has holders and every one
    is idle, unallocated when nobody holds any of it — so `busy + allocated_idle + unallocated`
    is `gpus`. `idle_shares` counts the holders idle on a GPU that is busy (a share idle beside
    a busy one): they are in `idle` (`part_of_busy_gpu`), their GPU is not. The unallocated
    rest of a GPU somebody holds is not an unallocated GPU and is not in `idle`.
    """

    as_of_us: int | None
    gpus: int
    busy: int
    idle: tuple[IdleGpu, ...]
    allocated_idle: int = 0
    unallocated: int = 0
    idle_shares: int = 0

    def count(self, state: GpuState) -> int:
        """GPUs in `state` (each GPU counted once, by the rule above)."""
        if state is GpuState.BUSY:
            return self.busy
        return self.allocated_idle if state is GpuState.ALLOCATED_IDLE else self.unallocated


_STATE_SQL = (
    "CASE WHEN account LIKE 'unallocated:%' THEN 'unallocated' "
    "WHEN idle THEN 'allocated_idle' ELSE 'busy' END"
)
_OWNER = ("team", "project", "user", "job_id")
# A GPU's state from the states of everything on it in one sample slot (see `FleetNow`).
_GPU_STATE_SQL = (
    "CASE WHEN bool_or(state = 'busy') THEN 'busy' "
    "WHEN bool_or(state = 'allocated_idle') THEN 'allocated_idle' ELSE 'unallocated' END"
)


def _net_usage_sql(name: str, where: str) -> str:
    """A relation `name`: the consumer and unallocated legs of usage per GPU and sample slot,
    net of reversals (`USAGE_SQL`), of the postings `where` selects. A corrected sample's leg
    and its reversal cancel, so a slot shows only what its re-posting charged."""
    return f"""{name} AS (
            SELECT gpu_uuid, start_us, max(end_us) AS end_us, any_value(node) AS node,
                any_value(pool) AS pool, any_value(model) AS model, account, idle, unit,
                team, project, "user", job_id, any_value(util_pct) AS util_pct,
                sum(amount) AS amount
            FROM {{postings}}
            WHERE {USAGE_SQL} AND gpu_uuid <> '' AND ({where})
                AND (account LIKE 'consumer:%' OR account LIKE 'unallocated:%')
            GROUP BY gpu_uuid, start_us, account, idle, unit, team, project, "user", job_id
            HAVING sum(amount) <> 0
        )"""


def fleet_now(
    q: ReportQueries,
    pool: str | None = None,
    window_us: int = HOUR_US,
    lookback_us: int = 35 * DAY_US,
) -> FleetNow:
    """Idle GPUs now: each GPU's latest sample in the last `window_us` of sealed data.

    A holding (a whole GPU's holder, a share, a MIG slice) is allocated-but-idle when its latest
    usage is flagged idle, and unallocated usage is on an `unallocated:` account; each GPU is
    counted once, by the rule of `FleetNow`. GPUs with no sample in the window (stopped
    reporting) are left out. How long a GPU has been idle is looked for in
    the last `lookback_us` only, for the GPUs idle now (so the scan stays bounded on a long
    ledger). A corrected sample (reversed and re-posted to its late-known owner) is what its
    re-posting says (`_net_usage_sql`).
    """
    segments = q.segments()
    newest = max((s.max_end_us for s in segments if s.max_end_us is not None), default=None)
    if newest is None:
        return FleetNow(None, 0, 0, ())
    oldest = min((s.min_start_us for s in segments if s.min_start_us is not None), default=0)
    horizon = newest - lookback_us
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    owner_match = " AND ".join(f'p."{c}" IS NOT DISTINCT FROM c."{c}"' for c in _OWNER)
    recent_sql = _net_usage_sql("recent", f"end_us > ? {pool_sql}")
    # only the GPUs idle now, and only as far back as this pass looks (a bounded scan)
    history_sql = _net_usage_sql(
        "history",
        "start_us >= greatest(?, least(?, (SELECT min(slot) FROM idle_now))) "
        "AND gpu_uuid IN (SELECT gpu_uuid FROM idle_now)",
    )
    sql = f"""
        WITH {recent_sql}, latest AS (
            SELECT gpu_uuid, max(start_us) AS slot FROM recent GROUP BY gpu_uuid
        ), current AS (
            SELECT DISTINCT r.gpu_uuid, r.node, r.pool, r.model, {_STATE_SQL} AS state,
                r.team, r.project, r."user", r.job_id, r.util_pct, l.slot
            FROM recent r JOIN latest l ON r.gpu_uuid = l.gpu_uuid AND r.start_us = l.slot
        ), gpus AS (
            SELECT gpu_uuid, {_GPU_STATE_SQL} AS gpu_state FROM current GROUP BY gpu_uuid
        ), idle_now AS (
            SELECT c.*, g.gpu_state FROM current c JOIN gpus g ON c.gpu_uuid = g.gpu_uuid
            WHERE c.state = 'allocated_idle' OR g.gpu_state = 'unallocated'
        ), {history_sql}, hist AS (
            SELECT c.*, p.start_us, p.end_us, p.unit, p.amount, p.state AS leg_state,
                p.state = c.state AND {owner_match} AS same
            FROM (SELECT *, {_STATE_SQL} AS state FROM history) p
                JOIN idle_now c ON p.gpu_uuid = c.gpu_uuid
            WHERE p.start_us >= greatest(?, least(?, c.slot))
        ), slots AS (
            -- a slot keeps a holding's idle run when the holding is in it, idle; a GPU's
            -- unallocated run when nothing of the GPU was held in it
            SELECT gpu_uuid, state, team, project, "user", job_id, start_us,
                CASE WHEN state = 'unallocated' THEN bool_and(leg_state = 'unallocated')
                    ELSE bool_or(same) END AS kept
            FROM hist GROUP BY gpu_uuid, state, team, project, "user", job_id, start_us
        ), broke AS (
            SELECT gpu_uuid, state, team, project, "user", job_id,
                coalesce(max(start_us) FILTER (NOT kept), -1) AS break_us
            FROM slots GROUP BY ALL
        )
        SELECT h.state, h.gpu_uuid, any_value(h.node), any_value(h.pool), any_value(h.model),
            h.team, h.project, h."user", h.job_id, any_value(h.util_pct),
            min(h.start_us), max(h.end_us),
            coalesce(sum(h.amount) FILTER (h.unit = 'gpu_ms'), 0),
            coalesce(sum(h.amount) FILTER (h.unit = 'money_micros'), 0),
            any_value(b.break_us) = -1, any_value(h.gpu_state)
        FROM hist h JOIN broke b ON h.gpu_uuid = b.gpu_uuid AND h.state = b.state
            AND h.team IS NOT DISTINCT FROM b.team AND h.project IS NOT DISTINCT FROM b.project
            AND h."user" IS NOT DISTINCT FROM b."user"
            AND h.job_id IS NOT DISTINCT FROM b.job_id
        WHERE h.same AND h.start_us > b.break_us
        GROUP BY h.state, h.gpu_uuid, h.team, h.project, h."user", h.job_id
        ORDER BY h.state, 14 DESC, h.gpu_uuid
        """
    counts = q.rows(
        f"""
        WITH {recent_sql}, states AS (
            SELECT gpu_uuid, start_us, {_STATE_SQL} AS state, team, project, "user", job_id
            FROM recent
        ), latest AS (SELECT gpu_uuid, max(start_us) AS slot FROM states GROUP BY gpu_uuid
        ), now AS (
            SELECT DISTINCT r.gpu_uuid, r.state, r.team, r.project, r."user", r.job_id, l.slot
            FROM states r JOIN latest l ON r.gpu_uuid = l.gpu_uuid AND r.start_us = l.slot
        ), per_gpu AS (
            SELECT gpu_uuid, {_GPU_STATE_SQL} AS gpu_state,
                count(*) FILTER (state = 'allocated_idle') AS idle_parts, any_value(slot) AS slot
            FROM now GROUP BY gpu_uuid
        )
        SELECT count(*), count(*) FILTER (gpu_state = 'busy'),
            count(*) FILTER (gpu_state = 'allocated_idle'),
            count(*) FILTER (gpu_state = 'unallocated'),
            coalesce(sum(idle_parts) FILTER (gpu_state = 'busy'), 0),
            min(slot) FILTER (idle_parts > 0 OR gpu_state = 'unallocated')
        FROM per_gpu
        """,
        [newest - window_us, *pool_params],
        (newest - window_us, newest + 1),
    )[0]
    # Look back a day first, then further while a run found no earlier sample of another state
    # (its last column): a run found whole is the same whatever lies before it. Each pass lists
    # only the segments that can hold what it reads: a sample ending in the window, or one
    # started since `since` or since the earliest latest slot of a GPU idle now (`counts`' last
    # column: the history reads from the earlier of the two), not the whole look-back's.
    since = max(horizon, newest - max(DAY_US, 2 * window_us))
    first_slot = newest if counts[5] is None else int(counts[5])
    while True:
        rows = q.rows(
            sql,
            [newest - window_us, *pool_params, horizon, since, horizon, since],
            (min(since, first_slot, newest - window_us), newest + 1),
        )
        if since <= horizon or not any(r[14] for r in rows):
            break
        since = max(horizon, newest - 4 * (newest - since))
    idle = tuple(
        IdleGpu(
            GpuState(r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            util_pct=None if r[9] is None else int(r[9]),
            since_us=int(r[10]),
            last_us=int(r[11]),
            gpu_ms=int(r[12]),
            money_micros=int(r[13]),
            since_capped=bool(r[14]) and oldest < horizon,
            part_of_busy_gpu=r[15] == GpuState.BUSY,
        )
        for r in rows
    )
    gpus, busy, allocated_idle, unallocated, idle_shares = (int(c) for c in counts[:5])
    return FleetNow(newest, gpus, busy, idle, allocated_idle, unallocated, idle_shares)


@dataclass(frozen=True, slots=True)
class HeatCell:
    """Utilisation of one GPU in one time bucket: GPU-time-weighted mean of `util_pct`."""

    gpu_uuid: str
    node: str | None
    pool: str | None
    model: str | None
    bucket_us: int
    util_pct: float
    gpu_ms: int


def utilisation_heatmap(
    q: ReportQueries, since_us: int, until_us: int, bucket_us: int, pool: str | None = None
) -> tuple[HeatCell, ...]:
    """GPU × time utilisation from the capacity leg of each usage transaction: in buckets of
    whole hours from each GPU's hours (`{gpus}`, the window's parts of an hour at its ends from
    the postings), in shorter ones from the postings."""
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    if bucket_us % HOUR_US == 0:
        split = HourSplit(since_us, until_us)
        source, params = split.source(GPUS)
        rows = q.rows(
            f"SELECT gpu_uuid, any_value(node), any_value(pool), any_value(model), "
            f"start_us - start_us % {int(bucket_us)} AS bucket, "
            "-sum(util_weighted) / nullif(-sum(util_gpu_ms), 0), -sum(capacity_gpu_ms) "
            f"FROM {source} WHERE capacity_end_us IS NOT NULL AND gpu_uuid <> '' {pool_sql} "
            "GROUP BY gpu_uuid, bucket ORDER BY 3, 2, gpu_uuid, bucket",
            [*params, *pool_params],
            split.started,
            edges=split.edges,
        )
        return tuple(
            HeatCell(r[0], r[1], r[2], r[3], int(r[4]), float(r[5] or 0.0), int(r[6])) for r in rows
        )
    rows = q.rows(
        f"SELECT gpu_uuid, any_value(node), any_value(pool), any_value(model), "
        f"start_us - start_us % {int(bucket_us)} AS bucket, "
        "sum(util_pct * -amount) / nullif(sum(-amount) FILTER (util_pct IS NOT NULL), 0), "
        "-sum(amount) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND {CAPACITY_SQL} AND unit = 'gpu_ms' "
        f"AND gpu_uuid <> '' AND start_us >= ? AND start_us < ? {pool_sql} "
        "GROUP BY gpu_uuid, bucket ORDER BY 3, 2, gpu_uuid, bucket",
        [since_us, until_us, *pool_params],
        (since_us, until_us),
    )
    return tuple(
        HeatCell(r[0], r[1], r[2], r[3], int(r[4]), float(r[5] or 0.0), int(r[6])) for r in rows
    )


@dataclass(frozen=True, slots=True)
class UtilisationBand:
    """GPU time of one pool and model spent at utilisation `[low_pct, low_pct + 10)`
    (the last band includes 100 %), allocated to an owner or not."""

    pool: str | None
    model: str | None
    low_pct: int
    allocated: bool
    gpu_ms: int


def utilisation_distribution(
    q: ReportQueries, since_us: int, until_us: int, pool: str | None = None
) -> tuple[UtilisationBand, ...]:
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", least(util_pct // 10, 9) * 10 AS band, '
        f"{CONSUMER_SQL} AS allocated, sum(amount) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND util_pct IS NOT NULL "
        f"AND ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND start_us >= ? AND start_us < ? "
        f'{pool_sql} GROUP BY ALL ORDER BY "pool", "model", band, allocated',
        [since_us, until_us, *pool_params],
        (since_us, until_us),
    )
    return tuple(UtilisationBand(r[0], r[1], int(r[2]), bool(r[3]), int(r[4])) for r in rows)


@dataclass(frozen=True, slots=True)
class UtilisationSummary:
    """One pool and model over a time range: GPU time, the part allocated, and the
    GPU-time-weighted mean utilisation of all and of allocated time (display floats)."""

    pool: str | None
    model: str | None
    physical_gpu_ms: int
    allocated_gpu_ms: int
    mean_util_pct: float
    mean_allocated_util_pct: float


def utilisation_summary(
    q: ReportQueries, since_us: int, until_us: int, pool: str | None = None
) -> tuple[UtilisationSummary, ...]:
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", coalesce(sum(amount), 0), '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        "coalesce(sum(util_pct * amount) / nullif(sum(amount), 0), 0), "
        f"coalesce(sum(util_pct * amount) FILTER ({CONSUMER_SQL}) "
        f"/ nullif(sum(amount) FILTER ({CONSUMER_SQL}), 0), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND util_pct IS NOT NULL "
        f"AND ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND start_us >= ? AND start_us < ? "
        f'{pool_sql} GROUP BY ALL ORDER BY "pool", "model"',
        [since_us, until_us, *pool_params],
        (since_us, until_us),
    )
    return tuple(
        UtilisationSummary(r[0], r[1], int(r[2]), int(r[3]), float(r[4]), float(r[5])) for r in rows
    )


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Allocated and physical GPU time of one pool and model in one bucket (`None`: all)."""

    bucket_us: int
    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    idle_gpu_ms: int
    physical_gpu_ms: int

    @property
    def share(self) -> float:
        """Share of GPU time allocated (display only)."""
        return self.allocated_gpu_ms / self.physical_gpu_ms if self.physical_gpu_ms else 0.0


def occupancy(
    q: ReportQueries, since_us: int, until_us: int, bucket_us: int, pool: str | None = None
) -> tuple[Occupancy, ...]:
    """Occupancy (allocated ÷ physical GPU time) per time bucket, pool and model; buckets of
    `until_us - since_us` or more give one row per pool and model for the whole range."""
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    width = int(bucket_us)
    rows = q.rows(
        f'SELECT ? + (start_us - ?) // {width} * {width} AS bucket, "pool", "model", '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(sum(amount) FILTER ({IDLE_LEG_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' "
        f"AND start_us >= ? AND start_us < ? {pool_sql} "
        'GROUP BY ALL ORDER BY bucket, "pool", "model"',
        [since_us, since_us, since_us, until_us, *pool_params],
        (since_us, until_us),
    )
    return tuple(Occupancy(int(r[0]), r[1], r[2], *(int(v) for v in r[3:])) for r in rows)


@dataclass(frozen=True, slots=True)
class NodeSeen:
    node: str
    pool: str | None
    gpus: int
    last_us: int


def nodes_last_seen(
    q: ReportQueries, pool: str | None = None, lookback_us: int = 35 * DAY_US
) -> tuple[NodeSeen, ...]:
    """Each node's newest sealed sample and GPU count (the only health signal the ledger has),
    for the nodes that reported in the last `lookback_us` of sealed data (so the scan stays
    bounded on a long ledger: a node silent for longer is not listed). From each GPU's hours
    (`{gpus}`): a GPU-hour whose last capacity leg ended after the cut holds one that did."""
    newest = max((s.max_end_us for s in q.segments() if s.max_end_us is not None), default=None)
    if newest is None:
        return ()
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        "SELECT node, any_value(pool), count(DISTINCT gpu_uuid), max(capacity_end_us) "
        "FROM {gpus} WHERE capacity_end_us > ? "
        f"AND coalesce(node, '') <> '' {pool_sql} GROUP BY node ORDER BY 4, node",
        [newest - lookback_us, *pool_params],
        (newest - lookback_us, newest + 1),
    )
    return tuple(NodeSeen(r[0], r[1], int(r[2]), int(r[3])) for r in rows)
