"""Capacity planning: GPU usage and queue-wait trends per model and pool, a forecast, and how
many GPUs keep queueing short.

Days are the ledger's time zone's (`ledger.timezone`), as on the other pages, and so are the
times written on the page; chart axes show local dates (wall-clock times handed to Vega as UTC,
read back with `utc` time units, so the browser's own zone does not shift them).

Every figure comes from `ledger.read.rollups` over the sealed ledger (usage) and the scheduler's job
events in its raw-event archive (queue waits); the forecast and the queueing estimate state their
method on the page, and the estimate is shown beside the p95 wait actually observed.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import common, i18n
from dashboard.i18n import _
from ledger.periods import local_day_start
from ledger.read import job_history, rollups

LOCAL_DAY = "utcyearmonthdate"  # the wall-clock days of `common.wall_clock`, as they are
tr = i18n.translator()  # the sentences the read models write, in this session's language
st.title(_("Capacity planning"))
extent: rollups.Extent = common.query("extent")
if extent.empty or extent.newest_us is None or not extent.models:
    common.no_data(_("usage history"))
    st.stop()
filters = common.current_filters()
common.sealed_caption(extent)
st.caption(
    _(
        "Capacity planning uses all history up to the newest sealed sample: the period and team "
        "filters do not apply here"
    )
    + (
        _("; the pool filter does (pool {pool}).").format(pool=filters.pool)
        if filters.pool
        else _(".")
    )
)

# ---------------------------------------------------------------------- trends per model
st.header(_("Usage per GPU model and pool"))
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
            "pool": _("Pool"),
            "model": _("GPU model"),
            "gpus": st.column_config.NumberColumn(_("GPUs (last 7 days)"), format="%d"),
            "last": st.column_config.NumberColumn(
                _("Used GPU-hours/day, last 7 days"), format="%.1f"
            ),
            "previous": st.column_config.NumberColumn(
                _("Used GPU-hours/day, 7 days before"), format="%.1f"
            ),
            "occupancy": st.column_config.NumberColumn(
                _("Occupancy, last 7 days"), format="percent"
            ),
        },
    )
    st.caption(
        _("Whole days ({zone}) before {when}; used = GPU time allocated to an owner.").format(
            zone=common.zone_label(),
            when=common.local_when(local_day_start(extent.newest_us, common.zone())),
        )
    )

# ---------------------------------------------------------------------- queue waits
st.header(_("Queue waits per GPU model and pool"))
topic = common.jobs_topic()
waits: tuple[job_history.QueueWaitDay, ...] = common.query(
    "queue_wait_trends", topic, None, None, filters.pool
)
if waits:
    wait_frame = pd.DataFrame(
        [
            (common.wall_clock(w.day_us), f"{w.pool} · {w.model}", label, value / 60_000_000)
            for w in waits
            for label, value in (("p50", w.p50_us), ("p95", w.p95_us))
        ],
        columns=["day", "pool · model", "quantile", "minutes"],
    )
    st.altair_chart(
        alt.Chart(wait_frame)
        .mark_line(point=True)
        .encode(
            x=alt.X(
                f"{LOCAL_DAY}(day):T",
                title=_("Day of first start ({zone})").format(zone=common.zone_label()),
            ),
            y=alt.Y("minutes:Q", title=_("Wait from submission to start (minutes)")),
            color=alt.Color("pool · model:N", title=_("Pool · GPU model")),
            strokeDash=alt.StrokeDash("quantile:N", title=_("Quantile")),
            tooltip=[
                alt.Tooltip(f"{LOCAL_DAY}(day):T", title=_("Day")),
                alt.Tooltip("pool · model:N", title=_("Pool · GPU model")),
                alt.Tooltip("quantile:N", title=_("Quantile")),
                alt.Tooltip("minutes:Q", format=".1f", title=_("Minutes")),
            ],
        ),
        width="stretch",
    )
    newest_first = sorted(waits, key=lambda w: (-w.day_us, w.pool or "", w.model or ""))
    st.dataframe(
        pd.DataFrame(
            {
                "day": [common.wall_clock(w.day_us) for w in newest_first],
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
            "day": st.column_config.DatetimeColumn(
                _("Day ({zone})").format(zone=common.zone_label()), format="YYYY-MM-DD"
            ),
            "pool": _("Pool"),
            "model": _("GPU model"),
            "jobs": st.column_config.NumberColumn(_("Jobs started"), format="%d"),
            "p50": st.column_config.NumberColumn(_("p50 wait (min)"), format="%.1f"),
            "p95": st.column_config.NumberColumn(_("p95 wait (min)"), format="%.1f"),
            "max": st.column_config.NumberColumn(_("Longest wait (min)"), format="%.1f"),
        },
    )
    st.caption(
        _(
            "Wait: from a job's submission to its first start, from the scheduler's events; per "
            "day ({zone}) the jobs first started, pool and GPU model they ran on. p50 and p95 are "
            "the nearest observed ranks. Jobs still waiting are not in these figures (see the "
            "sizing below), and waits after a preemption are not counted."
        ).format(zone=common.zone_label())
    )
else:
    st.info(
        _(
            "No queue history yet: waits come from the scheduler's events on the jobs topic "
            "(`{topic}`), which the ledger archives. Jobs run outside Tally's scheduler have "
            "usage but no queue history."
        ).format(topic=topic)
    )

# ---------------------------------------------------------------------- forecast
st.header(_("Trend and forecast"))
c1, c2 = st.columns(2)
model = c1.selectbox(_("GPU model"), list(extent.models), key="model")
horizon = c2.slider(_("Forecast horizon (days)"), 7, 90, 28, key="horizon")
trend: rollups.UsageTrend = common.query("usage_trend", model, filters.pool, horizon, 4)
history = pd.DataFrame(
    [
        (common.wall_clock(day), series, common.hours(ms))
        for day, allocated, physical in trend.days
        for series, ms in ((_("used"), allocated), (_("capacity"), physical))
    ],
    columns=["day", "series", "GPU-hours"],
)
day_title = _("Day ({zone})").format(zone=common.zone_label())
layers = [
    alt.Chart(history)
    .mark_line(point=True)
    .encode(
        x=alt.X(f"{LOCAL_DAY}(day):T", title=day_title),
        y=alt.Y("GPU-hours:Q", title=_("GPU-hours per day")),
        color=alt.Color("series:N", title=""),
        tooltip=[
            alt.Tooltip(f"{LOCAL_DAY}(day):T", title=_("Day")),
            alt.Tooltip("series:N", title=_("Series")),
            alt.Tooltip("GPU-hours:Q", format=".1f", title=_("GPU-hours")),
        ],
    )
]
forecast = trend.forecast
if forecast is not None:
    ahead = pd.DataFrame(
        {
            "day": [common.wall_clock(d) for d in forecast.days],
            "GPU-hours": list(forecast.values),
            "low": list(forecast.low),
            "high": list(forecast.high),
            "series": [_("forecast")] * len(forecast.days),
        }
    )
    layers.append(
        alt.Chart(ahead)
        .mark_area(opacity=0.2)
        .encode(
            x=alt.X(f"{LOCAL_DAY}(day):T", title=day_title),
            y=alt.Y("low:Q", title=_("GPU-hours per day")),
            y2="high:Q",
        )
    )
    layers.append(
        alt.Chart(ahead)
        .mark_line(strokeDash=[6, 3])
        .encode(
            x=alt.X(f"{LOCAL_DAY}(day):T", title=day_title),
            y=alt.Y("GPU-hours:Q", title=_("GPU-hours per day")),
            color=alt.Color("series:N", title=""),
            tooltip=[
                alt.Tooltip(f"{LOCAL_DAY}(day):T", title=_("Day")),
                alt.Tooltip("GPU-hours:Q", format=".1f", title=_("Forecast GPU-hours")),
                alt.Tooltip("low:Q", format=".1f", title=_("Low")),
                alt.Tooltip("high:Q", format=".1f", title=_("High")),
            ],
        )
    )
st.subheader(
    _("{model} in pool {pool}").format(model=model, pool=filters.pool)
    if filters.pool
    else _("{model}, all pools").format(model=model)
)
st.altair_chart(alt.layer(*layers), width="stretch")
if forecast is None:
    st.info(
        _(
            "A forecast needs at least three complete days of history; the ledger has {days} "
            "for this model."
        ).format(days=len(trend.complete))
    )
else:
    st.markdown(
        _("**Method.**")
        + " "
        + rollups.usage_forecast_method(
            forecast.fitted_days, forecast.slope_per_day, forecast.residual_sd, tr
        )
    )
    st.caption(
        _("In {days} days: {value} GPU-hours/day used (range {low}–{high}).").format(
            days=horizon,
            value=i18n.number(forecast.values[-1], 1),
            low=i18n.number(forecast.low[-1], 1),
            high=i18n.number(forecast.high[-1], 1),
        )
    )

# ---------------------------------------------------------------------- sizing
st.header(_("How many GPUs keep queueing short?"))
s1, s2, s3 = st.columns(3)
target_min = s1.number_input(
    _("Target p95 queueing delay (minutes)"),
    min_value=1,
    max_value=7 * 24 * 60,
    value=30,
    key="target_min",
)
window_days = s2.slider(_("Demand observed over the last (days)"), 1, 60, 7, key="demand_days")
growth = s3.slider(_("Expected demand growth (%)"), 0, 300, 0, step=5, key="growth")
until = extent.newest_us
since = max(until - window_days * rollups.DAY_US, extent.first_us or until)
found: rollups.Demand = common.query("demand", model, since, until, filters.pool)
sizing = rollups.size_for_wait(found, target_min / 60, 0.95, int(growth))
observed: job_history.ObservedWaits = common.query(
    "observed_queue_waits", topic, model, since, until, filters.pool
)
m = st.columns(5)
m[0].metric(_("GPUs of this model now"), f"{found.gpus:,}")
m[1].metric(_("Average GPUs in use"), f"{found.mean_busy_gpus * (1 + growth / 100):,.1f}")
if sizing.gpus_needed is None:
    m[2].metric(_("GPUs needed"), "—")
    st.info(
        _(
            "No jobs of this model in the window, so there is no arrival rate or job length to "
            "model queueing from. Widen the window or choose another model."
        )
    )
else:
    m[2].metric(
        _("GPUs needed for p95 wait ≤ {minutes} min").format(minutes=target_min),
        i18n.number(sizing.gpus_needed),
        delta=_("{change} vs now").format(change=f"{sizing.gpus_needed - found.gpus:+,}"),
        delta_color="inverse",
    )
    wait_now = sizing.wait_now_hours
    m[3].metric(
        _("Estimated p95 wait with today's GPUs"),
        _("unbounded (demand exceeds capacity)")
        if wait_now is None or math.isinf(wait_now)
        else _("{minutes} min").format(minutes=i18n.number(wait_now * 60)),
    )
    st.dataframe(
        pd.DataFrame(
            {
                "input": [
                    _("Jobs arriving per hour (λ)"),
                    _("Mean job duration, hours (S)"),
                    _("GPUs per job (k)"),
                    _("Offered load, concurrent jobs (λ·S)"),
                    _("Offered load, GPUs (λ·S·k)"),
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
            "input": _("Model input"),
            "value": st.column_config.NumberColumn(format="%.3f"),
        },
    )
m[4].metric(
    _("Observed p95 wait"),
    _("{minutes} min").format(minutes=i18n.number(observed.p95_us / 60_000_000))
    if observed.started
    else "—",
    help=_(
        "{started} jobs of this model first started in the window (p50 {p50} min, longest "
        "{longest} min); {waiting} still waiting at its end."
    ).format(
        started=i18n.number(observed.started),
        p50=i18n.number(observed.p50_us / 60_000_000),
        longest=i18n.number(observed.max_us / 60_000_000),
        waiting=i18n.number(observed.waiting),
    ),
)
if observed.started:
    st.caption(
        _(
            "Observed over the same window: p95 {p95} and p50 {p50} from submission to start, "
            "over {started} jobs"
        ).format(
            p95=job_history.duration_text(observed.p95_us, tr),
            p50=job_history.duration_text(observed.p50_us, tr),
            started=i18n.number(observed.started),
        )
        + (
            _("; {waiting} job(s) still waiting, the longest for {longest}").format(
                waiting=i18n.number(observed.waiting),
                longest=job_history.duration_text(observed.longest_waiting_us, tr),
            )
            if observed.waiting
            else ""
        )
        + _(
            ". The estimate assumes first-come first-served without quotas; where they differ, "
            "quotas, priorities, budgets or preemption are shaping the real waits."
        )
    )
else:
    st.caption(
        _(
            "No job of this model first started in the window, so there is no observed wait to "
            "compare the estimate with (waits come from the scheduler's job events)."
        )
    )
st.markdown(
    _("**Method.** Observed from {since} to {until}: {started} jobs started, {ran} ran.").format(
        since=common.local_when(since),
        until=common.local_when(until),
        started=i18n.number(found.arrivals),
        ran=i18n.number(found.jobs),
    )
    + " "
    + tr(sizing.assumptions)
)
