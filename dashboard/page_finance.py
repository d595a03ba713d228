"""Finance: what GPUs cost, who pays, against which budget, and the chargeback exports.

Every figure comes from `ledger.read.rollups` / `ledger.read.reports` over the sealed ledger.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import common, i18n, job_costs
from dashboard.i18n import _
from ledger.read import rollups
from ledger.read.reports import IdleSharing

DIMENSION_LABELS = {
    "cost_centre": _("Cost centre"),
    "team": _("Team"),
    "project": _("Project"),
    "user": _("User"),
}
STATUS = {  # rollups.BudgetStatus's values
    "no budget": _("no budget"),
    "over budget": _("over budget"),
    "forecast over budget": _("forecast over budget"),
    "on track": _("on track"),
}
BUCKETS = {"hour": rollups.HOUR_US, "day": rollups.DAY_US}

cur = common.currency()
st.title(_("Finance: GPU cost"))
extent: rollups.Extent = common.query("extent")
if extent.empty:
    common.no_data(_("cost"))
    st.stop()
filters = common.current_filters()
closed = common.closed_periods()
common.sealed_caption(extent)

if filters.period is None:
    st.info(
        _(
            "All accounting periods together. Choose a month in the sidebar for its budget, "
            "its month-end forecast and its exports."
        )
    )
elif filters.period in closed:
    st.success(
        _("**{period} is closed**: these figures are final and will never change.").format(
            period=filters.period
        ),
        icon=":material/lock:",
    )
else:
    st.warning(
        _(
            "**{period} is open**: late usage and corrections can still be booked into it, so "
            "its figures may change until it is closed."
        ).format(period=filters.period),
        icon=":material/lock_open:",
    )
scope = _(", ").join(
    part
    for part in (
        _("period {period}").format(period=filters.period) if filters.period else _("all periods"),
        _("team {team}").format(team=filters.team) if filters.team else "",
        _("pool {pool}").format(pool=filters.pool) if filters.pool else "",
    )
    if part
)

sharing = IdleSharing(
    st.radio(
        _("Idle-cost sharing"),
        [s.value for s in IdleSharing],
        format_func=lambda s: _(common.SHARING_HELP[IdleSharing(s)]),
        horizontal=False,
        key="sharing",
        help=_(
            "How the cost of unallocated GPUs (capacity nobody held) is shown. Sharing only "
            "changes this page and the exports' presentation; the ledger itself never changes."
        ),
    )
)

# ---------------------------------------------------------------------- headline figures
by_team: rollups.CostTable = common.query("cost_table", "team", filters, sharing.value)
waste: rollups.IdleWaste = common.query("idle_waste", filters)
spent = by_team.money_micros
gpu_ms = sum(r.gpu_ms for r in by_team.rows)
cols = st.columns(4)
cols[0].metric(
    _("GPU cost"), common.money(spent), help=_("Consumer cost for {scope}.").format(scope=scope)
)
cols[1].metric(_("GPU-hours used"), i18n.number(common.hours(gpu_ms), 1))
cols[2].metric(
    _("Idle waste"),
    common.money(waste.idle_waste_micros),
    help=_("Cost of GPUs that were allocated to someone but sat idle (included in GPU cost)."),
)
cols[3].metric(
    _("Unallocated capacity"),
    common.money(by_team.unallocated_micros),
    help=_("Cost of GPUs nobody held (not included in GPU cost unless shared)."),
)

# ---------------------------------------------------------------------- cost over time
st.header(_("Cost over time"))
c1, c2 = st.columns(2)
dim = c1.radio(
    _("Break down by"),
    list(DIMENSION_LABELS),
    index=1,
    format_func=DIMENSION_LABELS.__getitem__,
    horizontal=True,
    key="cost_dim",
)
granularity = c2.radio(
    _("Bucket"),
    list(BUCKETS),
    index=1,
    format_func=lambda b: _("hour") if b == "hour" else _("day"),
    horizontal=True,
    key="bucket",
)
per = _("hour") if granularity == "hour" else _("day")
label = DIMENSION_LABELS[dim]
series: tuple[rollups.TimeCost, ...] = common.query(
    "cost_over_time", dim, BUCKETS[granularity], filters
)
st.subheader(_("Cost by {dimension} per {bucket}").format(dimension=label.lower(), bucket=per))
cost_col, hours_col = _("Cost") + f" ({cur})", _("GPU-hours")
if series:
    frame = pd.DataFrame(
        {
            "time": [common.timestamp(s.bucket_us) for s in series],
            label: [s.key or _("(none)") for s in series],
            cost_col: [common.amount(s.money_micros) for s in series],
            hours_col: [common.hours(s.gpu_ms) for s in series],
        }
    )
    st.altair_chart(
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X(
                "time:T",
                scale=alt.Scale(type="utc"),
                title=_("Time ({zone}, per {bucket})").format(zone=common.zone_label(), bucket=per),
            ),
            y=alt.Y(f"sum({cost_col}):Q", title=_("Cost") + f" ({cur})"),
            color=alt.Color(f"{label}:N"),
            tooltip=[
                alt.Tooltip("utcyearmonthdatehoursminutes(time):T", title=_("Time")),
                f"{label}:N",
                f"{cost_col}:Q",
                f"{hours_col}:Q",
            ],
        ),
        width="stretch",
    )
else:
    st.info(_("No GPU usage by anyone in {scope}.").format(scope=scope))

table: rollups.CostTable = (
    by_team if dim == "team" else common.query("cost_table", dim, filters, sharing.value)
)
st.subheader(_("Total by {dimension}").format(dimension=label.lower()))
st.caption(
    _(
        "{scope}. Cost is what the owners' usage was charged; idle waste is the part of it spent "
        "on GPUs they held but did not use."
    ).format(scope=scope)
    + " "
    + (
        _("Shared idle is each row's share of unallocated capacity ({mode}).").format(
            mode=sharing.value
        )
        if sharing is not IdleSharing.NONE
        else _("Unallocated capacity is not shared (choose a sharing mode above to share it).")
    )
)
if table.rows:
    st.dataframe(
        pd.DataFrame(
            {
                dim: [r.key or _("(none)") for r in table.rows],
                "gpu_hours": [common.hours(r.gpu_ms) for r in table.rows],
                "cost": [common.amount(r.money_micros) for r in table.rows],
                "idle_waste": [common.amount(r.idle_waste_micros) for r in table.rows],
                "shared_idle": [common.amount(r.shared_idle_micros) for r in table.rows],
                "total": [common.amount(r.total_micros) for r in table.rows],
            }
        ),
        hide_index=True,
        column_config={
            dim: st.column_config.TextColumn(label),
            "gpu_hours": st.column_config.NumberColumn(_("GPU-hours"), format="%.2f"),
            "cost": st.column_config.NumberColumn(_("Cost") + f" ({cur})", format="%.2f"),
            "idle_waste": st.column_config.NumberColumn(
                _("Idle waste") + f" ({cur})", format="%.2f"
            ),
            "shared_idle": st.column_config.NumberColumn(
                _("Shared idle") + f" ({cur})", format="%.2f"
            ),
            "total": st.column_config.NumberColumn(_("Total") + f" ({cur})", format="%.2f"),
        },
    )
    unshared = table.unallocated_micros - table.shared_micros
    st.caption(
        _("Unallocated capacity in the selected pool(s): {money} for {hours} GPU-hours").format(
            money=common.money(table.unallocated_micros),
            hours=i18n.number(common.hours(table.unallocated_gpu_ms), 1),
        )
        + (
            _("; {shared} of it is shared into the rows above and {unshared} is not.").format(
                shared=common.money(table.shared_micros), unshared=common.money(unshared)
            )
            if sharing is not IdleSharing.NONE
            else _(".")
        )
    )
else:
    st.info(_("No cost in {scope}.").format(scope=scope))

# ---------------------------------------------------------------------- budget
st.header(_("Budget"))
if filters.period is None:
    st.info(_("Choose a month in the sidebar to see month-to-date spend against budget."))
else:
    burns: tuple[rollups.BudgetBurn, ...] = common.query(
        "budget_burn", filters.period, extent.newest_us, filters.team
    )
    granted = [b for b in burns if b.granted_micros is not None]
    st.caption(
        _("Month-to-date as of {when} (the newest sealed usage).").format(
            when=common.when(burns[0].as_of_us if burns else extent.newest_us)
        )
        + " "
        + rollups.forecast_method(7, i18n.translator())
    )
    if not granted:
        who = _("team {team}").format(team=filters.team) if filters.team else _("any team")
        st.info(
            _(
                "No money budget was granted to {who} for {period}. Budgets come from "
                "budget grants (`budget_grant` postings on `budget:<team>`): one-off grants for a "
                "month, or a recurring budget (`every: month` in the config's `budgets:`) that the "
                "ledger grants each month; once one is granted, its burn-down appears here. Spend "
                "and the month-end forecast are shown below."
            ).format(who=who, period=filters.period)
        )
    st.dataframe(
        pd.DataFrame(
            {
                "team": [b.team for b in burns],
                "budget": [
                    None if b.granted_micros is None else common.amount(b.granted_micros)
                    for b in burns
                ],
                "allowance": [
                    None if b.allowance_micros is None else common.amount(b.allowance_micros)
                    for b in burns
                ],
                "carried": [
                    None if b.carried_micros is None else common.amount(b.carried_micros)
                    for b in burns
                ],
                "spent": [common.amount(b.spent_micros) for b in burns],
                "remaining": [
                    None if b.remaining_micros is None else common.amount(b.remaining_micros)
                    for b in burns
                ],
                "forecast": [common.amount(b.forecast_micros) for b in burns],
                "status": [STATUS.get(b.status.value, b.status.value) for b in burns],
            }
        ),
        hide_index=True,
        column_config={
            "team": st.column_config.TextColumn(_("Team")),
            "budget": st.column_config.NumberColumn(_("Budget") + f" ({cur})", format="%.2f"),
            "allowance": st.column_config.NumberColumn(
                _("Allowance") + f" ({cur})",
                format="%.2f",
                help=_("What the team's recurring budget granted for this month."),
            ),
            "carried": st.column_config.NumberColumn(
                _("Carried over") + f" ({cur})",
                format="%.2f",
                help=_(
                    "Unspent budget of the previous month carried into this one by the "
                    "recurring budget's carry-over rule (part of the budget)."
                ),
            ),
            "spent": st.column_config.NumberColumn(_("Spent to date") + f" ({cur})", format="%.2f"),
            "remaining": st.column_config.NumberColumn(_("Remaining") + f" ({cur})", format="%.2f"),
            "forecast": st.column_config.NumberColumn(
                _("Month-end forecast") + f" ({cur})", format="%.2f"
            ),
            "status": st.column_config.TextColumn(_("Status")),
        },
    )
    if granted:
        names = [b.team for b in granted]
        chosen = st.selectbox(_("Burn-down of team"), names, key="burn_team")
        burn = next(b for b in granted if b.team == chosen)
        assert burn.granted_micros is not None
        period = common.period(filters.period)
        assert period is not None
        spent_series, forecast_series = _("spent"), _("forecast")
        points = [(common.timestamp(period.start_us), 0.0, spent_series)]
        points += [
            (common.timestamp(day + rollups.DAY_US), common.amount(total), spent_series)
            for day, total in burn.daily
            if day + rollups.DAY_US <= period.end_us
        ]
        points += [
            (common.timestamp(burn.as_of_us), common.amount(burn.spent_micros), forecast_series),
            (common.timestamp(period.end_us), common.amount(burn.forecast_micros), forecast_series),
        ]
        line = pd.DataFrame(points, columns=["time", "amount", "series"])
        budget_rule = pd.DataFrame({"budget": [common.amount(burn.granted_micros)]})
        chart = (
            alt.Chart(line)
            .mark_line(point=True)
            .encode(
                x=alt.X(
                    "time:T",
                    scale=alt.Scale(type="utc"),
                    title=_("Day ({zone})").format(zone=common.zone_label()),
                ),
                y=alt.Y("amount:Q", title=_("Cumulative spend") + f" ({cur})"),
                color=alt.Color("series:N", title=""),
                strokeDash=alt.StrokeDash("series:N", legend=None),
            )
        ) + alt.Chart(budget_rule).mark_rule(color="red").encode(
            y=alt.Y("budget:Q", title=_("Cumulative spend") + f" ({cur})"),
            tooltip=[alt.Tooltip("budget:Q", title=_("Budget") + f" ({cur})", format=",.2f")],
        )
        st.altair_chart(chart, width="stretch")
        c = st.columns(3)
        budget_help = None
        if burn.allowance_micros is not None:
            carried = burn.carried_micros or 0
            one_off = burn.granted_micros - burn.allowance_micros - carried
            budget_help = _("Allowance {allowance} + carried over {carried}").format(
                allowance=common.money(burn.allowance_micros), carried=common.money(carried)
            ) + (
                _(" + one-off grants {money}").format(money=common.money(one_off))
                if one_off
                else ""
            )
        c[0].metric(_("Budget"), common.money(burn.granted_micros), help=budget_help)
        c[1].metric(
            _("Spent to date"),
            common.money(burn.spent_micros),
            help=_("All of the team's cost booked into the month, corrections included."),
        )
        over = burn.forecast_over_micros or 0
        c[2].metric(
            _("Month-end forecast"),
            common.money(burn.forecast_micros),
            delta=(
                _("over budget by {money}") if over > 0 else _("under budget by {money}")
            ).format(money=common.money(abs(over))),
            delta_color="inverse" if over > 0 else "normal",
        )

# ---------------------------------------------------------------------- top jobs
st.header(_("Top jobs by cost"))
jobs: tuple[rollups.JobCost, ...] = common.query("top_jobs", filters, 20)
if jobs:
    st.dataframe(
        pd.DataFrame(job_costs.rows(jobs, job_costs.TEAM, job_costs.FIRST_LAST)),
        hide_index=True,
        column_config=job_costs.column_config(cur),
    )
else:
    st.info(_("No usage with a job id in {scope}.").format(scope=scope))

# ---------------------------------------------------------------------- idle waste
st.header(_("Idle waste"))
st.caption(
    _(
        "Allocated but idle: GPUs held by a team below the idle threshold for longer than the "
        "grace period; the owner is still charged, so this money is part of its cost. Unallocated "
        "capacity: GPUs nobody held."
    )
)
w1, w2 = st.columns(2)
with w1:
    st.subheader(_("Allocated but idle, by team"))
    ordered = waste.by_team()
    if ordered:
        st.dataframe(
            pd.DataFrame(
                {
                    "team": [r.team or _("(none)") for r in ordered],
                    "idle_hours": [common.hours(r.idle_gpu_ms) for r in ordered],
                    "idle_share": [
                        r.idle_gpu_ms / r.allocated_gpu_ms if r.allocated_gpu_ms else 0.0
                        for r in ordered
                    ],
                    "waste": [common.amount(r.idle_waste_micros) for r in ordered],
                }
            ),
            hide_index=True,
            column_config={
                "team": _("Team"),
                "idle_hours": st.column_config.NumberColumn(_("Idle GPU-hours"), format="%.2f"),
                "idle_share": st.column_config.NumberColumn(
                    _("Share of its GPU time"), format="percent"
                ),
                "waste": st.column_config.NumberColumn(
                    _("Idle waste") + f" ({cur})", format="%.2f"
                ),
            },
        )
    else:
        st.info(_("No allocated usage in the selection."))
with w2:
    st.subheader(_("Unallocated capacity, by pool"))
    if waste.unallocated:
        st.dataframe(
            pd.DataFrame(
                {
                    "pool": [u.pool for u in waste.unallocated],
                    "model": [u.model for u in waste.unallocated],
                    "hours": [common.hours(u.gpu_ms) for u in waste.unallocated],
                    "cost": [common.amount(u.money_micros) for u in waste.unallocated],
                }
            ),
            hide_index=True,
            column_config={
                "pool": _("Pool"),
                "model": _("GPU model"),
                "hours": st.column_config.NumberColumn(_("GPU-hours"), format="%.2f"),
                "cost": st.column_config.NumberColumn(_("Cost") + f" ({cur})", format="%.2f"),
            },
        )
    else:
        st.info(_("No unallocated capacity in the selection."))

# ---------------------------------------------------------------------- exports
st.header(_("Exports"))
if filters.period is None:
    st.info(_("Choose a month in the sidebar to download its FOCUS export and team statements."))
else:
    period_label = filters.period
    state = _("closed, final") if period_label in closed else _("open, may still change")
    st.caption(
        _(
            "FOCUS 1.2 cost and usage rows of {period} ({state}), exactly what "
            "`tally export focus --period {period}` writes: BilledCost sums to the ledger's "
            "cost of the month, unallocated capacity included. Team and pool filters do not apply."
        ).format(period=period_label, state=state)
    )
    e1, e2 = st.columns(2)
    e1.download_button(
        _("Download FOCUS export (CSV)"),
        data=lambda: common.query("focus", period_label, "csv", cur)[0],
        file_name=f"tally-focus-{period_label}.csv",
        mime="text/csv",
        on_click="ignore",
        key="focus_csv",
    )
    e2.download_button(
        _("Download FOCUS export (Parquet)"),
        data=lambda: common.query("focus", period_label, "parquet", cur)[0],
        file_name=f"tally-focus-{period_label}.parquet",
        mime="application/vnd.apache.parquet",
        on_click="ignore",
        key="focus_parquet",
    )
    st.subheader(_("Team statement"))
    team_names = list(extent.teams)
    if not team_names:
        st.info(_("No team has usage yet."))
    else:
        default = team_names.index(filters.team) if filters.team in team_names else 0
        statement_team = st.selectbox(
            _("Statement for team"), team_names, index=default, key="statement_team"
        )
        statement = common.query("statement", statement_team, period_label, cur, sharing.value)
        text = statement.render_text(i18n.translator())
        headers, rows = statement.rows()
        d1, d2 = st.columns(2)
        d1.download_button(
            _("Download statement of {team} for {period} (text)").format(
                team=statement_team, period=period_label
            ),
            data=text,
            file_name=f"tally-statement-{statement_team}-{period_label}.txt",
            mime="text/plain",
            on_click="ignore",
            key="statement_text",
        )
        d2.download_button(
            _("Download statement of {team} for {period} (CSV)").format(
                team=statement_team, period=period_label
            ),
            data=common.csv_text(headers, rows),
            file_name=f"tally-statement-{statement_team}-{period_label}.csv",
            mime="text/csv",
            on_click="ignore",
            key="statement_csv",
        )
        with st.expander(
            _("Statement of {team}, {period}").format(team=statement_team, period=period_label),
            expanded=False,
        ):
            st.code(text, language=None)
