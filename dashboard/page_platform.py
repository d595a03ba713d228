"""Platform: the fleet now and over the last hours — utilisation, idle GPUs, occupancy, GPU
health (per GPU and node, recent faults with meaning, failure counts, cordons).

Every figure comes from `ledger.read.rollups` over the sealed ledger; "now" is the newest sealed
sample.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import common, i18n
from dashboard.i18n import N_, _
from ledger.read import rollups

WINDOWS = {
    N_("6 hours"): (6 * rollups.HOUR_US, 15 * 60_000_000),
    N_("24 hours"): (rollups.DAY_US, rollups.HOUR_US),
    N_("7 days"): (7 * rollups.DAY_US, 6 * rollups.HOUR_US),
}
SILENT_AFTER_US = 15 * 60_000_000

cur = common.currency()
st.title(_("Platform: the GPU fleet"))
extent: rollups.Extent = common.query("extent")
if extent.empty or extent.newest_us is None:
    common.no_data(_("fleet data"))
    st.stop()
filters = common.current_filters()
common.sealed_caption(extent)
if filters.team:
    st.caption(
        _("Team filter: idle GPUs held by {team} only; fleet charts show all GPUs.").format(
            team=filters.team
        )
    )

# ---------------------------------------------------------------------- idle GPUs now
now: rollups.FleetNow = common.query("fleet_now", filters.pool)
st.header(_("Idle GPUs now"))
st.caption(
    _(
        "As of {when}: each GPU's latest sealed sample in the last hour. "
        "GPUs that sent nothing in that hour are not counted (see Nodes below)."
    ).format(when=common.when(now.as_of_us))
)
allocated_idle = [
    g
    for g in now.idle
    if g.state is rollups.GpuState.ALLOCATED_IDLE and filters.team in (None, g.team)
]
unallocated = [g for g in now.idle if g.state is rollups.GpuState.UNALLOCATED]
m = st.columns(5)
m[0].metric(_("GPUs reporting"), f"{now.gpus:,}")
m[1].metric(_("Busy"), f"{now.busy:,}", help=_("Some holder of the GPU (or of a part) uses it."))
m[2].metric(
    _("Allocated but idle"),
    f"{len({g.gpu_uuid for g in allocated_idle if not g.part_of_busy_gpu}):,}",
    help=_(
        "Held, and every holder (of the whole GPU, or of each share or MIG slice held) below the "
        "idle threshold for longer than the grace period."
    ),
)
m[3].metric(
    _("Unallocated"),
    f"{now.count(rollups.GpuState.UNALLOCATED):,}",
    help=_("Nobody holds any of it."),
)
m[4].metric(
    _("Idle shares"),
    f"{sum(g.part_of_busy_gpu for g in allocated_idle):,}",
    help=_(
        "Shares (or MIG slices) idle on a GPU another holder keeps busy: the GPU counts as busy, "
        "the share is listed below."
    ),
)
st.caption(
    _(
        "Each GPU counts once, whatever holds parts of it: busy, allocated but idle, or "
        "unallocated add up to the GPUs reporting."
    )
)

st.subheader(_("Allocated but idle"))
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
                "share": [g.part_of_busy_gpu for g in allocated_idle],
            }
        ),
        hide_index=True,
        column_config={
            "gpu": _("GPU"),
            "node": _("Node"),
            "pool": _("Pool"),
            "team": _("Team"),
            "project": _("Project"),
            "user": _("User"),
            "job": _("Job"),
            "util": st.column_config.NumberColumn(_("Utilisation now (%)"), format="%d"),
            "since": st.column_config.DatetimeColumn(
                _("Flagged idle since ({zone})").format(zone=common.zone_label()),
                format="YYYY-MM-DD HH:mm",
            ),
            "idle_hours": st.column_config.NumberColumn(_("Idle GPU-hours"), format="%.2f"),
            "waste": st.column_config.NumberColumn(_("Waste so far") + f" ({cur})", format="%.2f"),
            "share": st.column_config.CheckboxColumn(_("Idle share of a busy GPU")),
        },
    )
    st.caption(
        _(
            "Since: when the idle detector confirmed the GPU idle (after its grace period). "
            "Waste so far: what the owner has been charged for the idle GPU since then."
        )
        + (
            _(
                " Some GPUs have been idle for longer than the 35 days looked at: their since "
                "and waste cover those 35 days."
            )
            if any(g.since_capped for g in allocated_idle)
            else ""
        )
    )
else:
    st.success(_("No allocated GPU is idle right now."))

st.subheader(_("Unallocated"))
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
            "gpu": _("GPU"),
            "node": _("Node"),
            "pool": _("Pool"),
            "model": _("GPU model"),
            "since": st.column_config.DatetimeColumn(
                _("Unallocated since ({zone})").format(zone=common.zone_label()),
                format="YYYY-MM-DD HH:mm",
            ),
            "hours": st.column_config.NumberColumn(_("GPU-hours since"), format="%.2f"),
            "cost": st.column_config.NumberColumn(
                _("Idle capacity cost") + f" ({cur})", format="%.2f"
            ),
        },
    )
    if any(g.since_capped for g in unallocated):
        st.caption(
            _(
                "Some GPUs have been unallocated for longer than the 35 days looked at: their "
                "since and cost cover those 35 days."
            )
        )
else:
    st.success(_("Every reporting GPU is allocated."))

# ---------------------------------------------------------------------- window
window_key = st.radio(
    _("Time window"), list(WINDOWS), index=1, format_func=_, horizontal=True, key="window"
)
span_us, bucket_us = WINDOWS[window_key]
window_name = _(window_key)
period = common.period(filters.period)
until = extent.newest_us if period is None else min(extent.newest_us, period.end_us)
since = until - span_us
st.caption(
    _("Fleet charts: the {window} up to {when}").format(window=window_name, when=common.when(until))
    + (_(" (the end of the data in {period})").format(period=period.label) if period else "")
    + (_(", pool {pool}").format(pool=filters.pool) if filters.pool else "")
    + _(".")
)

# ---------------------------------------------------------------------- heatmap
st.header(_("Utilisation heatmap"))
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
            x=alt.X(
                "time:T",
                scale=alt.Scale(type="utc"),
                title=_("Time ({zone})").format(zone=common.zone_label()),
            ),
            y=alt.Y(
                "gpu:N", title=_("GPU (node · UUID)"), sort=None, axis=alt.Axis(labelLimit=260)
            ),
            color=alt.Color(
                "utilisation:Q",
                title=_("Utilisation %"),
                scale=alt.Scale(domain=[0, 100], scheme="viridis"),
            ),
            tooltip=[
                alt.Tooltip("gpu:N", title=_("GPU (node · UUID)")),
                alt.Tooltip("pool:N", title=_("Pool")),
                alt.Tooltip("model:N", title=_("GPU model")),
                alt.Tooltip("utcyearmonthdatehoursminutes(time):T", title=_("Time")),
                alt.Tooltip("utilisation:Q", title=_("Utilisation %")),
            ],
        )
        .properties(height=min(max(gpu_count * 14, 120), 1600)),
        width="stretch",
    )
    st.caption(
        _(
            "Each cell: the GPU's utilisation (%) averaged over its samples in the bucket, "
            "weighted by GPU time. Dark = idle, bright = busy."
        )
    )
else:
    st.info(_("No samples in this window."))

# ---------------------------------------------------------------------- distribution
st.header(_("Utilisation by GPU model and pool"))
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
            "held by": [_("an owner") if b.allocated else _("nobody") for b in bands],
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
                title=_("Utilisation band"),
            ),
            y=alt.Y("sum(GPU-hours):Q", title=_("GPU-hours")),
            color=alt.Color("held by:N", title=_("GPU held by")),
            column=alt.Column("pool · model:N", title=None),
            tooltip=[
                alt.Tooltip("pool · model:N", title=_("Pool · GPU model")),
                alt.Tooltip("utilisation band:N", title=_("Utilisation band")),
                alt.Tooltip("held by:N", title=_("GPU held by")),
                alt.Tooltip("sum(GPU-hours):Q", title=_("GPU-hours"), format=",.1f"),
            ],
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
            "pool": _("Pool"),
            "model": _("GPU model"),
            "hours": st.column_config.NumberColumn(_("GPU-hours"), format="%.1f"),
            "occupancy": st.column_config.NumberColumn(_("Occupancy"), format="percent"),
            "util": st.column_config.NumberColumn(_("Mean utilisation"), format="percent"),
            "util_held": st.column_config.NumberColumn(
                _("Mean utilisation when held"), format="percent"
            ),
        },
    )
    st.caption(
        _("Means are weighted by GPU time; occupancy is the share of GPU time held by an owner.")
    )
else:
    st.info(_("No samples in this window."))

# ---------------------------------------------------------------------- occupancy
st.header(_("Occupancy"))
st.caption(_("Share of GPU time allocated to an owner (allocated ÷ physical GPU time)."))
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
            x=alt.X(
                "time:T",
                scale=alt.Scale(type="utc"),
                title=_("Time ({zone})").format(zone=common.zone_label()),
            ),
            y=alt.Y("occupancy:Q", title=_("Occupancy"), axis=alt.Axis(format="%")),
            color=alt.Color("pool:N", title=_("Pool")),
        ),
        width="stretch",
    )
    allocated_ms = sum(v[0] for v in totals.values())
    physical_ms = sum(v[1] for v in totals.values())
    st.metric(
        _("Occupancy over the {window}").format(window=window_name),
        f"{allocated_ms / physical_ms:.1%}" if physical_ms else "—",
        help=_("{used} of {total} GPU-hours").format(
            used=i18n.number(common.hours(allocated_ms), 1),
            total=i18n.number(common.hours(physical_ms), 1),
        ),
    )
else:
    st.info(_("No samples in this window."))

# ---------------------------------------------------------------------- nodes
st.header(_("GPU health"))
health: rollups.FleetHealth = common.query("fleet_health", filters.pool)
if not health.gpus:
    st.info(_("No GPU inventory sealed yet: health appears once collectors report their nodes."))
else:
    h = st.columns(5)
    h[0].metric(_("Healthy"), f"{health.count('healthy'):,}")
    h[1].metric(_("Degraded"), f"{health.count('degraded'):,}")
    h[2].metric(
        _("Unhealthy"),
        f"{health.count('unhealthy'):,}",
        help=_("No new jobs are placed on an unhealthy GPU; jobs running there are requeued."),
    )
    h[3].metric(_("Cordoned"), f"{health.cordoned:,}", help=_("tally inventory cordon NODE_OR_GPU"))
    h[4].metric(_("Faults"), f"{health.fault_total:,}", help=_("Every fault recorded, all GPUs."))
    st.subheader(_("By node"))
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
        column_config={"state": st.column_config.TextColumn(_("State"), help=_("worst GPU state"))},
    )
    troubled = [g for g in health.gpus if g.health != "healthy" or g.cordoned or g.faults]
    st.subheader(_("GPUs with faults or a cordon"))
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
                "since": st.column_config.DatetimeColumn(
                    _("Since ({zone})").format(zone=common.zone_label()), format="YYYY-MM-DD HH:mm"
                ),
            },
        )
    else:
        st.caption(_("Every GPU is healthy, with no fault recorded and no cordon."))
    st.subheader(_("Recent faults"))
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
                "time": st.column_config.DatetimeColumn(
                    _("Time ({zone})").format(zone=common.zone_label()), format="YYYY-MM-DD HH:mm"
                ),
                "xid": st.column_config.NumberColumn(_("XID"), format="%d"),
            },
        )
    else:
        st.caption(_("No faults recorded."))

st.header(_("Nodes"))
st.caption(_("When each node last sent a sample that reached the sealed ledger."))
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
                    _("silent") if newest - n.last_us > SILENT_AFTER_US else _("reporting")
                    for n in nodes
                ],
            }
        ),
        hide_index=True,
        column_config={
            "node": _("Node"),
            "pool": _("Pool"),
            "gpus": st.column_config.NumberColumn(_("GPUs seen"), format="%d"),
            "last": st.column_config.DatetimeColumn(
                _("Last sample ({zone})").format(zone=common.zone_label()),
                format="YYYY-MM-DD HH:mm",
            ),
            "status": st.column_config.TextColumn(
                _("Status"), help=_("silent: no sample in the 15 minutes before the newest data")
            ),
        },
    )
