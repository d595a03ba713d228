"""Platform: the fleet now and over the last hours — utilisation, idle GPUs, occupancy, GPU
health (per GPU and node, recent faults with meaning, failure counts, cordons).

Every figure comes from `ledger.read.rollups` over the sealed ledger; "now" is the newest sealed
sample.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import common
from ledger.read import rollups

WINDOWS = {
    "6 hours": (6 * rollups.HOUR_US, 15 * 60_000_000),
    "24 hours": (rollups.DAY_US, rollups.HOUR_US),
    "7 days": (7 * rollups.DAY_US, 6 * rollups.HOUR_US),
}
SILENT_AFTER_US = 15 * 60_000_000

cur = common.currency()
st.title("Platform: the GPU fleet")
extent: rollups.Extent = common.query("extent")
if extent.empty or extent.newest_us is None:
    common.no_data("fleet data")
    st.stop()
filters = common.current_filters()
common.sealed_caption(extent)
if filters.team:
    st.caption(f"Team filter: idle GPUs held by {filters.team} only; fleet charts show all GPUs.")

# ---------------------------------------------------------------------- idle GPUs now
now: rollups.FleetNow = common.query("fleet_now", filters.pool)
st.header("Idle GPUs now")
st.caption(
    f"As of {common.when(now.as_of_us)}: each GPU's latest sealed sample in the last hour. "
    "GPUs that sent nothing in that hour are not counted (see Nodes below)."
)
allocated_idle = [
    g
    for g in now.idle
    if g.state is rollups.GpuState.ALLOCATED_IDLE and filters.team in (None, g.team)
]
unallocated = [g for g in now.idle if g.state is rollups.GpuState.UNALLOCATED]
m = st.columns(4)
m[0].metric("GPUs reporting", f"{now.gpus:,}")
m[1].metric("Busy", f"{now.busy:,}")
m[2].metric(
    "Allocated but idle",
    f"{len({g.gpu_uuid for g in allocated_idle}):,}",
    help="Held by an owner below the idle threshold for longer than the grace period.",
)
m[3].metric("Unallocated", f"{now.count(rollups.GpuState.UNALLOCATED):,}", help="Held by nobody.")

st.subheader("Allocated but idle")
if allocated_idle:
    st.dataframe(
        pd.DataFrame(
            {
                "gpu": [g.gpu_uuid for g in allocated_idle],
                "node": [g.node for g in allocated_idle],
                "pool": [g.pool for g in allocated_idle],
                "team": [g.team for g in allocated_idle],
                "project": [g.project for g in allocated_idle],
                "user": [g.user for g in allocated_idle],
                "job": [g.job_id for g in allocated_idle],
                "util": [g.util_pct for g in allocated_idle],
                "since": [common.timestamp(g.since_us) for g in allocated_idle],
                "idle_hours": [common.hours(g.gpu_ms) for g in allocated_idle],
                "waste": [common.amount(g.money_micros) for g in allocated_idle],
            }
        ),
        hide_index=True,
        column_config={
            "gpu": "GPU",
            "node": "Node",
            "pool": "Pool",
            "team": "Team",
            "project": "Project",
            "user": "User",
            "job": "Job",
            "util": st.column_config.NumberColumn("Utilisation now (%)", format="%d"),
            "since": st.column_config.DatetimeColumn(
                "Flagged idle since (UTC)", format="YYYY-MM-DD HH:mm"
            ),
            "idle_hours": st.column_config.NumberColumn("Idle GPU-hours", format="%.2f"),
            "waste": st.column_config.NumberColumn(f"Waste so far ({cur})", format="%.2f"),
        },
    )
    st.caption(
        "Since: when the idle detector confirmed the GPU idle (after its grace period). Waste so "
        "far: what the owner has been charged for the idle GPU since then."
        + (
            " Some GPUs have been idle for longer than the 35 days looked at: their since and "
            "waste cover those 35 days."
            if any(g.since_capped for g in allocated_idle)
            else ""
        )
    )
else:
    st.success("No allocated GPU is idle right now.")

st.subheader("Unallocated")
if unallocated:
    st.dataframe(
        pd.DataFrame(
            {
                "gpu": [g.gpu_uuid for g in unallocated],
                "node": [g.node for g in unallocated],
                "pool": [g.pool for g in unallocated],
                "model": [g.model for g in unallocated],
                "since": [common.timestamp(g.since_us) for g in unallocated],
                "hours": [common.hours(g.gpu_ms) for g in unallocated],
                "cost": [common.amount(g.money_micros) for g in unallocated],
            }
        ),
        hide_index=True,
        column_config={
            "gpu": "GPU",
            "node": "Node",
            "pool": "Pool",
            "model": "GPU model",
            "since": st.column_config.DatetimeColumn(
                "Unallocated since (UTC)", format="YYYY-MM-DD HH:mm"
            ),
            "hours": st.column_config.NumberColumn("GPU-hours since", format="%.2f"),
            "cost": st.column_config.NumberColumn(f"Idle capacity cost ({cur})", format="%.2f"),
        },
    )
    if any(g.since_capped for g in unallocated):
        st.caption(
            "Some GPUs have been unallocated for longer than the 35 days looked at: their since "
            "and cost cover those 35 days."
        )
else:
    st.success("Every reporting GPU is allocated.")

# ---------------------------------------------------------------------- window
window_name = st.radio("Time window", list(WINDOWS), index=1, horizontal=True, key="window")
span_us, bucket_us = WINDOWS[window_name]
period = common.period(filters.period)
until = extent.newest_us if period is None else min(extent.newest_us, period.end_us)
since = until - span_us
st.caption(
    f"Fleet charts: the {window_name} up to {common.when(until)}"
    + (f" (the end of the data in {period.label})" if period else "")
    + (f", pool {filters.pool}" if filters.pool else "")
    + "."
)

# ---------------------------------------------------------------------- heatmap
st.header("Utilisation heatmap")
cells: tuple[rollups.HeatCell, ...] = common.query(
    "utilisation_heatmap", since, until, bucket_us, filters.pool
)
if cells:
    heat = pd.DataFrame(
        {
            "gpu": [f"{c.node} · {c.gpu_uuid}" for c in cells],
            "pool": [c.pool for c in cells],
            "model": [c.model for c in cells],
            "time": [common.timestamp(c.bucket_us) for c in cells],
            "utilisation": [round(c.util_pct, 1) for c in cells],
        }
    )
    gpu_count = heat["gpu"].nunique()
    st.altair_chart(
        alt.Chart(heat)
        .mark_rect()
        .encode(
            x=alt.X("time:T", title="Time (UTC)"),
            y=alt.Y("gpu:N", title="GPU (node · UUID)", sort=None, axis=alt.Axis(labelLimit=260)),
            color=alt.Color(
                "utilisation:Q",
                title="Utilisation %",
                scale=alt.Scale(domain=[0, 100], scheme="viridis"),
            ),
            tooltip=["gpu:N", "pool:N", "model:N", "time:T", "utilisation:Q"],
        )
        .properties(height=min(max(gpu_count * 14, 120), 1600)),
        width="stretch",
    )
    st.caption(
        "Each cell: the GPU's utilisation (%) averaged over its samples in the bucket, weighted "
        "by GPU time. Dark = idle, bright = busy."
    )
else:
    st.info("No samples in this window.")

# ---------------------------------------------------------------------- distribution
st.header("Utilisation by GPU model and pool")
bands: tuple[rollups.UtilisationBand, ...] = common.query(
    "utilisation_distribution", since, until, filters.pool
)
if bands:
    dist = pd.DataFrame(
        {
            "pool · model": [f"{b.pool} · {b.model}" for b in bands],
            "utilisation band": [
                f"{b.low_pct}–{b.low_pct + 10 if b.low_pct < 90 else 100}%" for b in bands
            ],
            "low": [b.low_pct for b in bands],
            "held by": ["an owner" if b.allocated else "nobody" for b in bands],
            "GPU-hours": [common.hours(b.gpu_ms) for b in bands],
        }
    )
    st.altair_chart(
        alt.Chart(dist)
        .mark_bar()
        .encode(
            x=alt.X(
                "utilisation band:N",
                sort=alt.EncodingSortField("low"),
                title="Utilisation band",
            ),
            y=alt.Y("sum(GPU-hours):Q", title="GPU-hours"),
            color=alt.Color("held by:N", title="GPU held by"),
            column=alt.Column("pool · model:N", title=None),
            tooltip=["pool · model:N", "utilisation band:N", "held by:N", "sum(GPU-hours):Q"],
        )
        .properties(width=220),
    )
    summary: tuple[rollups.UtilisationSummary, ...] = common.query(
        "utilisation_summary", since, until, filters.pool
    )
    st.dataframe(
        pd.DataFrame(
            {
                "pool": [u.pool for u in summary],
                "model": [u.model for u in summary],
                "hours": [common.hours(u.physical_gpu_ms) for u in summary],
                "occupancy": [
                    u.allocated_gpu_ms / u.physical_gpu_ms if u.physical_gpu_ms else 0.0
                    for u in summary
                ],
                "util": [u.mean_util_pct / 100 for u in summary],
                "util_held": [u.mean_allocated_util_pct / 100 for u in summary],
            }
        ),
        hide_index=True,
        column_config={
            "pool": "Pool",
            "model": "GPU model",
            "hours": st.column_config.NumberColumn("GPU-hours", format="%.1f"),
            "occupancy": st.column_config.NumberColumn("Occupancy", format="percent"),
            "util": st.column_config.NumberColumn("Mean utilisation", format="percent"),
            "util_held": st.column_config.NumberColumn(
                "Mean utilisation when held", format="percent"
            ),
        },
    )
    st.caption(
        "Means are weighted by GPU time; occupancy is the share of GPU time held by an owner."
    )
else:
    st.info("No samples in this window.")

# ---------------------------------------------------------------------- occupancy
st.header("Occupancy")
st.caption("Share of GPU time allocated to an owner (allocated ÷ physical GPU time).")
occ: tuple[rollups.Occupancy, ...] = common.query(
    "occupancy", since, until, bucket_us, filters.pool
)
if occ:
    totals: dict[int, list[int]] = {}
    by_pool: dict[int, dict[str, list[int]]] = {}
    for o in occ:
        t = totals.setdefault(o.bucket_us, [0, 0])
        t[0] += o.allocated_gpu_ms
        t[1] += o.physical_gpu_ms
        p = by_pool.setdefault(o.bucket_us, {}).setdefault(f"{o.pool}", [0, 0])
        p[0] += o.allocated_gpu_ms
        p[1] += o.physical_gpu_ms
    occ_frame = pd.DataFrame(
        [
            (common.timestamp(bucket), name, v[0] / v[1] if v[1] else 0.0)
            for bucket, pools in by_pool.items()
            for name, v in pools.items()
        ],
        columns=["time", "pool", "occupancy"],
    )
    st.altair_chart(
        alt.Chart(occ_frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("time:T", title="Time (UTC)"),
            y=alt.Y("occupancy:Q", title="Occupancy", axis=alt.Axis(format="%")),
            color=alt.Color("pool:N", title="Pool"),
        ),
        width="stretch",
    )
    allocated_ms = sum(v[0] for v in totals.values())
    physical_ms = sum(v[1] for v in totals.values())
    st.metric(
        f"Occupancy over the {window_name}",
        f"{allocated_ms / physical_ms:.1%}" if physical_ms else "—",
        help=f"{common.hours(allocated_ms):,.1f} of {common.hours(physical_ms):,.1f} GPU-hours",
    )
else:
    st.info("No samples in this window.")

# ---------------------------------------------------------------------- nodes
st.header("GPU health")
health: rollups.FleetHealth = common.query("fleet_health", filters.pool)
if not health.gpus:
    st.info("No GPU inventory sealed yet: health appears once collectors report their nodes.")
else:
    h = st.columns(5)
    h[0].metric("Healthy", f"{health.count('healthy'):,}")
    h[1].metric("Degraded", f"{health.count('degraded'):,}")
    h[2].metric(
        "Unhealthy",
        f"{health.count('unhealthy'):,}",
        help="No new jobs are placed on an unhealthy GPU; jobs running there are requeued.",
    )
    h[3].metric("Cordoned", f"{health.cordoned:,}", help="tally inventory cordon NODE_OR_GPU")
    h[4].metric("Faults", f"{health.fault_total:,}", help="Every fault recorded, all GPUs.")
    st.subheader("By node")
    st.dataframe(
        pd.DataFrame(
            {
                "node": [n.node for n in health.nodes],
                "pool": [n.pool for n in health.nodes],
                "state": [n.state for n in health.nodes],
                "gpus": [n.gpus for n in health.nodes],
                "degraded": [n.degraded for n in health.nodes],
                "unhealthy": [n.unhealthy for n in health.nodes],
                "cordoned": [n.cordoned for n in health.nodes],
                "faults": [n.faults for n in health.nodes],
            }
        ),
        hide_index=True,
        column_config={"state": st.column_config.TextColumn("State", help="worst GPU state")},
    )
    troubled = [g for g in health.gpus if g.health != "healthy" or g.cordoned or g.faults]
    st.subheader("GPUs with faults or a cordon")
    if troubled:
        st.dataframe(
            pd.DataFrame(
                {
                    "node": [g.node for g in troubled],
                    "index": [g.index for g in troubled],
                    "uuid": [g.uuid for g in troubled],
                    "health": [g.health for g in troubled],
                    "reason": [g.reason for g in troubled],
                    "since": [
                        common.timestamp(g.since_us) if g.since_us else None for g in troubled
                    ],
                    "faults": [g.faults for g in troubled],
                    "cordon": [g.cordon for g in troubled],
                }
            ),
            hide_index=True,
            column_config={
                "since": st.column_config.DatetimeColumn("Since (UTC)", format="YYYY-MM-DD HH:mm"),
            },
        )
    else:
        st.caption("Every GPU is healthy, with no fault recorded and no cordon.")
    st.subheader("Recent faults")
    if health.faults:
        st.dataframe(
            pd.DataFrame(
                {
                    "time": [common.timestamp(f.time_us) for f in health.faults],
                    "node": [f.node for f in health.faults],
                    "uuid": [f.uuid for f in health.faults],
                    "xid": [f.xid for f in health.faults],
                    "meaning": [f.meaning for f in health.faults],
                    "severity": [f.severity for f in health.faults],
                }
            ),
            hide_index=True,
            column_config={
                "time": st.column_config.DatetimeColumn("Time (UTC)", format="YYYY-MM-DD HH:mm"),
                "xid": st.column_config.NumberColumn("XID", format="%d"),
            },
        )
    else:
        st.caption("No faults recorded.")

st.header("Nodes")
st.caption("When each node last sent a sample that reached the sealed ledger.")
nodes: tuple[rollups.NodeSeen, ...] = common.query("nodes_last_seen", filters.pool)
if nodes:
    newest = extent.newest_us
    st.dataframe(
        pd.DataFrame(
            {
                "node": [n.node for n in nodes],
                "pool": [n.pool for n in nodes],
                "gpus": [n.gpus for n in nodes],
                "last": [common.timestamp(n.last_us) for n in nodes],
                "status": [
                    "silent" if newest - n.last_us > SILENT_AFTER_US else "reporting" for n in nodes
                ],
            }
        ),
        hide_index=True,
        column_config={
            "node": "Node",
            "pool": "Pool",
            "gpus": st.column_config.NumberColumn("GPUs seen", format="%d"),
            "last": st.column_config.DatetimeColumn("Last sample (UTC)", format="YYYY-MM-DD HH:mm"),
            "status": st.column_config.TextColumn(
                "Status", help="silent: no sample in the 15 minutes before the newest data"
            ),
        },
    )
