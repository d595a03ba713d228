"""Capacity planning: GPU usage and queue-wait trends per model and pool, a forecast, and how
many GPUs keep queueing short.

Every figure comes from `ledger.read.rollups` over the sealed ledger (usage) and the scheduler's job
events in its raw-event archive (queue waits); the forecast and the queueing estimate state their
method on the page, and the estimate is shown beside the p95 wait actually observed.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import common
from ledger.read import job_history, rollups

st.title("Capacity planning")
extent: rollups.Extent = common.query("extent")
if extent.empty or extent.newest_us is None or not extent.models:
    common.no_data("usage history")
    st.stop()
filters = common.current_filters()
common.sealed_caption(extent)
st.caption(
    "Capacity planning uses all history up to the newest sealed sample: the period and team "
    "filters do not apply here"
    + (f"; the pool filter does (pool {filters.pool})." if filters.pool else ".")
)

# ---------------------------------------------------------------------- trends per model
st.header("Usage per GPU model and pool")
trends: tuple[rollups.ModelTrend, ...] = common.query(
    "model_trends", extent.newest_us, filters.pool
)
if trends:
    st.dataframe(
        pd.DataFrame(
            {
                "pool": [t.pool for t in trends],
                "model": [t.model for t in trends],
                "gpus": [t.gpus for t in trends],
                "last": [common.hours(t.allocated_last_gpu_ms) / 7 for t in trends],
                "previous": [common.hours(t.allocated_previous_gpu_ms) / 7 for t in trends],
                "occupancy": [
                    t.allocated_last_gpu_ms / t.physical_last_gpu_ms
                    if t.physical_last_gpu_ms
                    else 0.0
                    for t in trends
                ],
            }
        ),
        hide_index=True,
        column_config={
            "pool": "Pool",
            "model": "GPU model",
            "gpus": st.column_config.NumberColumn("GPUs (last 7 days)", format="%d"),
            "last": st.column_config.NumberColumn("Used GPU-hours/day, last 7 days", format="%.1f"),
            "previous": st.column_config.NumberColumn(
                "Used GPU-hours/day, 7 days before", format="%.1f"
            ),
            "occupancy": st.column_config.NumberColumn("Occupancy, last 7 days", format="percent"),
        },
    )
    st.caption(
        f"Whole UTC days before {common.when(extent.newest_us - extent.newest_us % rollups.DAY_US)}"
        "; used = GPU time allocated to an owner."
    )

# ---------------------------------------------------------------------- queue waits
st.header("Queue waits per GPU model and pool")
topic = common.jobs_topic()
waits: tuple[job_history.QueueWaitDay, ...] = common.query(
    "queue_wait_trends", topic, None, None, filters.pool
)
if waits:
    wait_frame = pd.DataFrame(
        [
            (common.timestamp(w.day_us), f"{w.pool} · {w.model}", label, value / 60_000_000)
            for w in waits
            for label, value in (("p50", w.p50_us), ("p95", w.p95_us))
        ],
        columns=["day", "pool · model", "quantile", "minutes"],
    )
    st.altair_chart(
        alt.Chart(wait_frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("day:T", title="Day of first start (UTC)"),
            y=alt.Y("minutes:Q", title="Wait from submission to start (minutes)"),
            color=alt.Color("pool · model:N", title="Pool · GPU model"),
            strokeDash=alt.StrokeDash("quantile:N", title="Quantile"),
            tooltip=[
                "day:T",
                "pool · model:N",
                "quantile:N",
                alt.Tooltip("minutes:Q", format=".1f"),
            ],
        ),
        width="stretch",
    )
    newest_first = sorted(waits, key=lambda w: (-w.day_us, w.pool or "", w.model or ""))
    st.dataframe(
        pd.DataFrame(
            {
                "day": [common.timestamp(w.day_us) for w in newest_first],
                "pool": [w.pool for w in newest_first],
                "model": [w.model for w in newest_first],
                "jobs": [w.jobs for w in newest_first],
                "p50": [w.p50_us / 60_000_000 for w in newest_first],
                "p95": [w.p95_us / 60_000_000 for w in newest_first],
                "max": [w.max_us / 60_000_000 for w in newest_first],
            }
        ),
        hide_index=True,
        column_config={
            "day": st.column_config.DatetimeColumn("Day (UTC)", format="YYYY-MM-DD"),
            "pool": "Pool",
            "model": "GPU model",
            "jobs": st.column_config.NumberColumn("Jobs started", format="%d"),
            "p50": st.column_config.NumberColumn("p50 wait (min)", format="%.1f"),
            "p95": st.column_config.NumberColumn("p95 wait (min)", format="%.1f"),
            "max": st.column_config.NumberColumn("Longest wait (min)", format="%.1f"),
        },
    )
    st.caption(
        "Wait: from a job's submission to its first start, from the scheduler's events; per UTC "
        "day the jobs first started, pool and GPU model they ran on. p50 and p95 are the nearest "
        "observed ranks. Jobs still waiting are not in these figures (see the sizing below), and "
        "waits after a preemption are not counted."
    )
else:
    st.info(
        "No queue history yet: waits come from the scheduler's events on the jobs topic "
        f"(`{topic}`), which the ledger archives. Jobs run outside Tally's scheduler have usage "
        "but no queue history."
    )

# ---------------------------------------------------------------------- forecast
st.header("Trend and forecast")
c1, c2 = st.columns(2)
model = c1.selectbox("GPU model", list(extent.models), key="model")
horizon = c2.slider("Forecast horizon (days)", 7, 90, 28, key="horizon")
trend: rollups.UsageTrend = common.query("usage_trend", model, filters.pool, horizon, 4)
history = pd.DataFrame(
    [
        (common.timestamp(day), series, common.hours(ms))
        for day, allocated, physical in trend.days
        for series, ms in (("used", allocated), ("capacity", physical))
    ],
    columns=["day", "series", "GPU-hours"],
)
layers = [
    alt.Chart(history)
    .mark_line(point=True)
    .encode(
        x=alt.X("day:T", title="Day (UTC)"),
        y=alt.Y("GPU-hours:Q", title="GPU-hours per day"),
        color=alt.Color("series:N", title=""),
    )
]
forecast = trend.forecast
if forecast is not None:
    ahead = pd.DataFrame(
        {
            "day": [common.timestamp(d) for d in forecast.days],
            "GPU-hours": list(forecast.values),
            "low": list(forecast.low),
            "high": list(forecast.high),
            "series": ["forecast"] * len(forecast.days),
        }
    )
    layers.append(alt.Chart(ahead).mark_area(opacity=0.2).encode(x="day:T", y="low:Q", y2="high:Q"))
    layers.append(
        alt.Chart(ahead)
        .mark_line(strokeDash=[6, 3])
        .encode(x="day:T", y="GPU-hours:Q", color=alt.Color("series:N", title=""))
    )
st.subheader(f"{model}" + (f" in pool {filters.pool}" if filters.pool else ", all pools"))
st.altair_chart(alt.layer(*layers), width="stretch")
if forecast is None:
    st.info(
        "A forecast needs at least three complete days of history; "
        f"the ledger has {len(trend.complete)} for this model."
    )
else:
    st.markdown(f"**Method.** {forecast.method}")
    st.caption(
        f"In {horizon} days: {forecast.values[-1]:,.1f} GPU-hours/day used "
        f"(range {forecast.low[-1]:,.1f}–{forecast.high[-1]:,.1f})."
    )

# ---------------------------------------------------------------------- sizing
st.header("How many GPUs keep queueing short?")
s1, s2, s3 = st.columns(3)
target_min = s1.number_input(
    "Target p95 queueing delay (minutes)",
    min_value=1,
    max_value=7 * 24 * 60,
    value=30,
    key="target_min",
)
window_days = s2.slider("Demand observed over the last (days)", 1, 60, 7, key="demand_days")
growth = s3.slider("Expected demand growth (%)", 0, 300, 0, step=5, key="growth")
until = extent.newest_us
since = max(until - window_days * rollups.DAY_US, extent.first_us or until)
found: rollups.Demand = common.query("demand", model, since, until, filters.pool)
sizing = rollups.size_for_wait(found, target_min / 60, 0.95, int(growth))
observed: job_history.ObservedWaits = common.query(
    "observed_queue_waits", topic, model, since, until, filters.pool
)
m = st.columns(5)
m[0].metric("GPUs of this model now", f"{found.gpus:,}")
m[1].metric("Average GPUs in use", f"{found.mean_busy_gpus * (1 + growth / 100):,.1f}")
if sizing.gpus_needed is None:
    m[2].metric("GPUs needed", "—")
    st.info(
        "No jobs of this model in the window, so there is no arrival rate or job length to "
        "model queueing from. Widen the window or choose another model."
    )
else:
    m[2].metric(
        f"GPUs needed for p95 wait ≤ {target_min} min",
        f"{sizing.gpus_needed:,}",
        delta=f"{sizing.gpus_needed - found.gpus:+,} vs now",
        delta_color="inverse",
    )
    wait_now = sizing.wait_now_hours
    m[3].metric(
        "Estimated p95 wait with today's GPUs",
        "unbounded (demand exceeds capacity)"
        if wait_now is None or math.isinf(wait_now)
        else f"{wait_now * 60:,.0f} min",
    )
    st.dataframe(
        pd.DataFrame(
            {
                "input": [
                    "Jobs arriving per hour (λ)",
                    "Mean job duration, hours (S)",
                    "GPUs per job (k)",
                    "Offered load, concurrent jobs (λ·S)",
                    "Offered load, GPUs (λ·S·k)",
                ],
                "value": [
                    sizing.arrivals_per_hour,
                    sizing.service_hours,
                    sizing.gpus_per_job,
                    sizing.load_jobs,
                    sizing.load_jobs * sizing.gpus_per_job,
                ],
            }
        ),
        hide_index=True,
        column_config={
            "input": "Model input",
            "value": st.column_config.NumberColumn(format="%.3f"),
        },
    )
m[4].metric(
    "Observed p95 wait",
    f"{observed.p95_us / 60_000_000:,.0f} min" if observed.started else "—",
    help=f"{observed.started:,} jobs of this model first started in the window (p50 "
    f"{observed.p50_us / 60_000_000:,.0f} min, longest {observed.max_us / 60_000_000:,.0f} min); "
    f"{observed.waiting:,} still waiting at its end.",
)
if observed.started:
    st.caption(
        f"Observed over the same window: p95 {job_history.duration_text(observed.p95_us)} and "
        f"p50 {job_history.duration_text(observed.p50_us)} from submission to start, over "
        f"{observed.started:,} jobs"
        + (
            f"; {observed.waiting:,} job(s) still waiting, the longest for "
            f"{job_history.duration_text(observed.longest_waiting_us)}"
            if observed.waiting
            else ""
        )
        + ". The estimate assumes first-come first-served without quotas; where they differ, "
        "quotas, priorities, budgets or preemption are shaping the real waits."
    )
else:
    st.caption(
        "No job of this model first started in the window, so there is no observed wait to "
        "compare the estimate with (waits come from the scheduler's job events)."
    )
st.markdown(
    f"**Method.** Observed from {common.when(since)} to {common.when(until)}: "
    f"{found.arrivals:,} jobs started, {found.jobs:,} ran. {sizing.assumptions}"
)
