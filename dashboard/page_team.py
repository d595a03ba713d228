"""Team: a team's jobs (waiting and why, running, finished), what each costs, the budget and
quota left, fair-share standing, and why a chosen job waits or was stopped — for researchers.

Job states, waits and preemptions come from the scheduler's events on the jobs topic, read out
of the ledger's raw-event archive (`ledger.read.job_history` through `ledger.read.rollups`);
costs from the ledger's postings by job id; the budget from the balances projection; quotas
from the admin log.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import common, i18n, job_costs
from dashboard.i18n import _
from ledger.read import job_history, rollups
from ledger.read.job_history import JobRow, JobState
from ledger.units import Unit

MAX_ROWS = 500  # newest ended jobs listed


def _gpu_hours_text(gpu_ms: int) -> str:
    return _("{hours} GPU-hours").format(hours=i18n.number(common.hours(gpu_ms), 1))


def _limit(value: int | None) -> str:
    if value is None:
        return _("unlimited")
    return (_("{count} GPU") if value == 1 else _("{count} GPUs")).format(count=i18n.number(value))


cur = common.currency()
st.title(_("Team: jobs, budget and quota"))
tr = i18n.translator()  # the sentences the read models write, in this session's language
extent: rollups.Extent = common.query("extent")
topic = common.jobs_topic()
history: rollups.JobHistory = common.query("job_history", topic)
teams = sorted(set(extent.teams) | set(history.teams))
if not teams:
    common.no_jobs()
    st.stop()
filters = common.current_filters()
if filters.team is not None:
    team = filters.team
else:
    team = st.selectbox(
        _("Team"),
        teams,
        key="team_page",
        help=_("Or choose a team in the sidebar: the sidebar's choice applies to every page."),
    )
as_of = max((t for t in (extent.newest_us, history.newest_us) if t is not None), default=0)
period = common.period(filters.period)
scope = _(", ").join(
    part
    for part in (
        _("period {period}").format(period=filters.period) if filters.period else _("all periods"),
        _("pool {pool}").format(pool=filters.pool) if filters.pool else "",
    )
    if part
)
st.caption(
    _(
        "Team **{team}** · {scope} · as of {when} (the newest sealed usage or job event) · "
        "amounts in {currency}. Jobs are those active in the period (submitted before its end, "
        "not ended before its start) on the pool; jobs that asked for any pool and never ran are "
        "shown only without a pool filter."
    ).format(team=team, scope=scope, when=common.when(as_of), currency=cur)
)
if history.undecodable:
    st.warning(
        _(
            "{count} message(s) on the jobs topic `{topic}` could not be read; the jobs they "
            "describe may be incomplete here (the worker's dead letters say why)."
        ).format(count=i18n.number(history.undecodable), topic=topic)
    )

jobs: tuple[JobRow, ...] = job_history.select_jobs(history.rows, team, period, filters.pool)
waiting = sorted((j for j in jobs if j.state is JobState.WAITING), key=lambda j: j.since_us)
running = sorted((j for j in jobs if j.state.active), key=lambda j: j.since_us)
ended = sorted((j for j in jobs if j.state.ended), key=lambda j: -j.since_us)
# A job's cost so far: all its postings, whatever period or pool they fall in.
listed = tuple(sorted({j.job_id for j in jobs}))
totals = {c.job_id: c for c in common.query("job_costs", rollups.Filters(None, team, None), listed)}
budget: rollups.TeamBudget = common.query("team_budget", team, filters.period)
money = budget.status.line(Unit.MONEY.value) if budget.status else None
share: rollups.FairShare = common.query("fair_share", as_of, common.half_life_us())
standing = share.of(team)


def cost_of(job_id: str) -> float:
    found = totals.get(job_id)
    return common.amount(found.money_micros) if found else 0.0


def hours_of(job_id: str) -> float:
    found = totals.get(job_id)
    return common.hours(found.gpu_ms) if found else 0.0


m = st.columns(4)
m[0].metric(_("Jobs waiting"), f"{len(waiting):,}")
m[1].metric(
    _("Jobs running"),
    f"{len(running):,}",
    help=_("{count} GPUs held by them.").format(
        count=i18n.number(sum(len(j.gpu_uuids) or j.gpus for j in running))
    ),
)
m[2].metric(
    _("Budget left"),
    _("no budget") if money is None else common.money(money.remaining),
    help=(
        _("Granted − used − reserved by running jobs, in period {period}. See Budget below.")
        if budget.period
        else _(
            "Granted − used − reserved by running jobs, in the current period. See Budget below."
        )
    ).format(period=budget.period),
)
m[3].metric(
    _("Fair-share order"),
    "—"
    if standing is None
    else _("{rank} of {count}").format(rank=standing.rank, count=len(share.rows)),
    help=_("1 is served first when teams compete for the same GPUs. See Fair share below."),
)

if not jobs:
    common.no_jobs(
        _("team {team} in {scope}").format(team=team, scope=scope)
        if filters.period or filters.pool
        else _("team {team}").format(team=team)
    )

# ---------------------------------------------------------------------- waiting
st.header(_("Waiting"))
if waiting:
    st.dataframe(
        pd.DataFrame(
            {
                "job": [j.job_id for j in waiting],
                "reason": [job_history.wait_text(j, tr) for j in waiting],
                "note": [j.wait_detail for j in waiting],
                "since": [common.timestamp(j.since_us) for j in waiting],
                "waited": [common.duration_hours(as_of - j.since_us) for j in waiting],
                "user": [j.user for j in waiting],
                "project": [j.project for j in waiting],
                "queue": [j.queue for j in waiting],
                "gpus": [j.gpus for j in waiting],
                "model": [j.model or "any" for j in waiting],
                "pool": [j.pool or "any" for j in waiting],
                "stopped": [len(j.preemptions) for j in waiting],
            }
        ),
        hide_index=True,
        column_config={
            "job": _("Job"),
            "user": _("User"),
            "project": _("Project"),
            "queue": _("Queue"),
            "gpus": st.column_config.NumberColumn(_("GPUs asked"), format="%d"),
            "model": _("GPU model asked"),
            "pool": _("Pool"),
            "since": st.column_config.DatetimeColumn(
                _("Waiting since ({zone})").format(zone=common.zone_label()),
                format="YYYY-MM-DD HH:mm",
            ),
            "waited": st.column_config.NumberColumn(_("Waiting for (hours)"), format="%.1f"),
            "reason": _("Why it waits"),
            "note": _("Scheduler's note"),
            "stopped": st.column_config.NumberColumn(_("Times stopped for others"), format="%d"),
        },
    )
else:
    st.success(_("No job of {team} is waiting.").format(team=team))

# ---------------------------------------------------------------------- explanation
st.header(_("Why is this job waiting?"))
st.caption(_("Choose any of the team's jobs: why it waits, why it was stopped, or how it ended."))
choices = [j.job_id for j in (*waiting, *running, *ended)]
if choices:
    states = {j.job_id: job_history.state_text(j.state, tr) for j in jobs}
    preempted = [j for j in sorted(jobs, key=lambda j: -j.last_event_us) if j.preemptions]
    first = next(iter(waiting or preempted), None)  # the job a researcher most likely asks about
    chosen = st.selectbox(
        _("Job"),
        choices,
        index=0 if first is None else choices.index(first.job_id),
        format_func=lambda job: f"{job} · {states[job]}",
        key="explain_job",
    )
    why: job_history.Explanation = common.query(
        "job_explanation", topic, chosen, as_of, tr, common.zone()
    )
    if why.state is JobState.WAITING:
        st.warning(why.headline, icon=":material/hourglass_top:")
    elif why.state in (JobState.FAILED, JobState.RECLAIMED):
        st.error(why.headline, icon=":material/error:")
    else:
        st.info(why.headline, icon=":material/info:")
    if why.advice:
        st.markdown(_("**What you can do.**") + " " + why.advice)
    e = st.columns(3)
    e[0].metric(_("Waited in total"), job_history.duration_text(why.waited_us, tr))
    e[1].metric(_("Times stopped for other jobs"), f"{why.preemptions:,}")
    e[2].metric(
        _("Cost so far"), common.money(totals[chosen].money_micros if chosen in totals else 0)
    )
    if why.timeline:
        st.subheader(_("What happened"))
        st.dataframe(
            pd.DataFrame(
                {
                    "time": [common.timestamp(t.time_us) for t in why.timeline],
                    "what": [t.text for t in why.timeline],
                }
            ),
            hide_index=True,
            column_config={
                "time": st.column_config.DatetimeColumn(
                    _("Time ({zone})").format(zone=common.zone_label()),
                    format="YYYY-MM-DD HH:mm:ss",
                ),
                "what": st.column_config.TextColumn(_("What happened"), width="large"),
            },
        )
    st.caption(
        _(
            "From the scheduler's decisions (its events on the jobs topic, as the ledger archived "
            "them); `tally job explain <job>` gives the same answer on the command line."
        )
    )
else:
    st.info(_("No job of {team} to explain in {scope}.").format(team=team, scope=scope))

# ---------------------------------------------------------------------- running
st.header(_("Running"))
if running:
    st.dataframe(
        pd.DataFrame(
            {
                "job": [j.job_id for j in running],
                "since": [common.timestamp(j.since_us) for j in running],
                "running": [common.duration_hours(as_of - j.since_us) for j in running],
                "cost": [cost_of(j.job_id) for j in running],
                "gpu_hours": [hours_of(j.job_id) for j in running],
                "gpus": [len(j.gpu_uuids) or j.gpus for j in running],
                "model": [j.model for j in running],
                "pool": [j.pool for j in running],
                "user": [j.user for j in running],
                "project": [j.project for j in running],
                "queue": [j.queue for j in running],
                "state": [job_history.state_text(j.state, tr) for j in running],
            }
        ),
        hide_index=True,
        column_config={
            "job": _("Job"),
            "user": _("User"),
            "project": _("Project"),
            "queue": _("Queue"),
            "gpus": st.column_config.NumberColumn(_("GPUs"), format="%d"),
            "model": _("GPU model"),
            "pool": _("Pool"),
            "since": st.column_config.DatetimeColumn(
                _("Running since ({zone})").format(zone=common.zone_label()),
                format="YYYY-MM-DD HH:mm",
            ),
            "running": st.column_config.NumberColumn(_("Running for (hours)"), format="%.1f"),
            "gpu_hours": st.column_config.NumberColumn(_("GPU-hours so far"), format="%.2f"),
            "cost": st.column_config.NumberColumn(_("Cost so far") + f" ({cur})", format="%.2f"),
            "state": _("State"),
        },
    )
    st.caption(
        _(
            "Cost so far: the ledger's postings with the job's id, over all periods and pools, up "
            "to the newest sealed usage (a few seconds to minutes behind real time)."
        )
    )
else:
    st.info(_("No job of {team} is running.").format(team=team))

# ---------------------------------------------------------------------- ended
st.header(_("Finished, failed and cancelled"))
if ended:
    shown = ended[:MAX_ROWS]
    st.dataframe(
        pd.DataFrame(
            {
                "job": [j.job_id for j in shown],
                "outcome": [job_history.outcome_text(j, tr) for j in shown],
                "ended": [common.timestamp(j.since_us) for j in shown],
                "runtime": [common.duration_hours(j.ran_us) for j in shown],
                "cost": [cost_of(j.job_id) for j in shown],
                "gpu_hours": [hours_of(j.job_id) for j in shown],
                "waited": [common.duration_hours(j.waited_us) for j in shown],
                "user": [j.user for j in shown],
                "project": [j.project for j in shown],
                "attempts": [j.attempts for j in shown],
            }
        ),
        hide_index=True,
        column_config={
            "job": _("Job"),
            "user": _("User"),
            "project": _("Project"),
            "outcome": _("Outcome"),
            "ended": st.column_config.DatetimeColumn(
                _("Ended ({zone})").format(zone=common.zone_label()), format="YYYY-MM-DD HH:mm"
            ),
            "runtime": st.column_config.NumberColumn(_("Runtime (hours)"), format="%.2f"),
            "waited": st.column_config.NumberColumn(_("Waited (hours)"), format="%.2f"),
            "gpu_hours": st.column_config.NumberColumn(_("GPU-hours"), format="%.2f"),
            "cost": st.column_config.NumberColumn(_("Cost") + f" ({cur})", format="%.2f"),
            "attempts": st.column_config.NumberColumn(_("Attempts"), format="%d"),
        },
    )
    if len(ended) > MAX_ROWS:
        st.caption(
            _("The {shown} most recent of {count} ended jobs.").format(
                shown=i18n.number(MAX_ROWS), count=i18n.number(len(ended))
            )
        )
else:
    st.info(_("No job of {team} ended in {scope}.").format(team=team, scope=scope))

# ---------------------------------------------------------------------- cost per job
st.header(_("Cost per job"))
costs: tuple[rollups.JobCost, ...] = common.query(
    "job_costs", rollups.Filters(filters.period, team, filters.pool)
)
if costs:
    scheduled = {j.job_id: job_history.state_text(j.state, tr) for j in history.rows}
    table = job_costs.rows(costs)
    table["state"] = [scheduled.get(c.job_id, _("not run by Tally's scheduler")) for c in costs]
    st.dataframe(
        pd.DataFrame(table),
        hide_index=True,
        column_config=job_costs.column_config(cur) | {"state": _("State")},
    )
    st.caption(
        _(
            "Costs booked in {scope}: the ledger's postings to team {team} grouped by job id "
            "(idle waste is the part spent while the job held GPUs it did not use). Total {total}."
        ).format(scope=scope, team=team, total=common.money(sum(c.money_micros for c in costs)))
    )
else:
    st.info(_("No usage with a job id for team {team} in {scope}.").format(team=team, scope=scope))

# ---------------------------------------------------------------------- budget
st.header(_("Budget"))
if budget.status is None:
    st.info(
        _(
            "No budget was ever granted to team {team}, so no budget limits its jobs. Budgets are "
            "granted under `budgets:` in the configuration and applied with `tally admin apply` "
            "(they post to `budget:{team}`); the Finance page shows spend without one."
        ).format(team=team)
    )
else:
    st.caption(
        (
            _("Period {period} (the current one).") if budget.current else _("Period {period}.")
        ).format(period=budget.period)
        + " "
        + _(
            "Left = granted − used − reserved; reserved is what running jobs hold against the "
            "budget until their usage is metered (open holds). The scheduler admits a job only if "
            "what is left covers its expected cost."
        )
    )
    for line in budget.status.lines:
        show = common.money if line.unit == Unit.MONEY.value else _gpu_hours_text
        b = st.columns(4)
        b[0].metric(_("Granted"), show(line.granted))
        b[1].metric(_("Used"), show(line.consumed))
        b[2].metric(_("Reserved by running jobs"), show(line.open_holds))
        b[3].metric(_("Left"), show(line.remaining))
        if line.remaining < 0:
            st.error(
                _(
                    "Team {team} is over budget by {over}: new jobs that need budget wait "
                    "(reason *budget used up*) until more is granted."
                ).format(team=team, over=show(-line.remaining))
            )

# ---------------------------------------------------------------------- quota
st.header(_("Quota"))
quotas: rollups.TeamQuotas = common.query("team_quotas", team, topic)
if quotas.problem is not None:
    st.warning(
        _(
            "The ledger's admin log could not be read ({problem}). Quotas are set under "
            "`quotas:` in the configuration file; `tally queue list` shows what the scheduler "
            "uses."
        ).format(problem=quotas.problem)
    )
elif not quotas.lines:
    st.info(
        _(
            "No quota for team {team} is recorded in the ledger. Quotas are set under `quotas:` "
            "in the configuration file and applied with `tally admin apply`; `tally queue list` "
            "shows what the scheduler uses."
        ).format(team=team)
    )
else:
    st.dataframe(
        pd.DataFrame(
            {
                "pool": [q.pool for q in quotas.lines],
                "model": [q.model for q in quotas.lines],
                "nominal": [q.nominal_gpus for q in quotas.lines],
                "in_use": [q.in_use_gpus for q in quotas.lines],
                "borrowed": [q.borrowed_gpus for q in quotas.lines],
                "borrow": [_limit(q.borrowing_limit) for q in quotas.lines],
                "lend": [_limit(q.lending_limit) for q in quotas.lines],
            }
        ),
        hide_index=True,
        column_config={
            "pool": _("Pool"),
            "model": _("GPU model"),
            "nominal": st.column_config.NumberColumn(_("Quota (GPUs)"), format="%d"),
            "in_use": st.column_config.NumberColumn(_("In use now"), format="%d"),
            "borrowed": st.column_config.NumberColumn(_("Of them borrowed"), format="%d"),
            "borrow": _("May borrow beyond quota"),
            "lend": _("May lend to others"),
        },
    )
    st.caption(
        _(
            "Quota: GPUs the team is guaranteed (from the `quotas:` admin events). Beyond it a "
            "team may borrow other teams' unused quota up to its limit; borrowed GPUs can be taken "
            "back, which stops (preempts) the job using them. In use now: GPUs held by the team's "
            "running jobs, from the scheduler's events."
        )
    )

# ---------------------------------------------------------------------- fair share
st.header(_("Fair share"))
half_life_h = share.half_life_us / rollups.HOUR_US
if standing is not None:
    st.markdown(
        _(
            "Team **{team}** is **{rank} of {count}** in fair-share order: when teams compete for "
            "the same GPUs, the team with the least recent usage per quota GPU goes first."
        ).format(team=team, rank=standing.rank, count=len(share.rows))
    )
st.dataframe(
    pd.DataFrame(
        {
            "rank": [r.rank for r in share.rows],
            "team": [r.team for r in share.rows],
            "usage": [common.hours(r.decayed_gpu_ms) for r in share.rows],
            "weight": [r.weight for r in share.rows],
            "per_gpu": [r.hours_per_gpu for r in share.rows],
        }
    ),
    hide_index=True,
    column_config={
        "rank": st.column_config.NumberColumn(_("Order"), format="%d"),
        "team": _("Team"),
        "usage": st.column_config.NumberColumn(
            _("Recent usage (decayed GPU-hours)"), format="%.1f"
        ),
        "weight": st.column_config.NumberColumn(_("Quota GPUs (weight)"), format="%d"),
        "per_gpu": st.column_config.NumberColumn(_("GPU-hours per quota GPU"), format="%.2f"),
    },
)
st.caption(
    _(
        "Recent usage: the team's metered GPU time in the ledger, decayed with a half-life of "
        "{half} hours (a GPU-hour used {half} hours ago counts half, {double} hours ago a "
        "quarter), as of {when}. Weight: the team's quota GPUs (1 without a quota); a `weight:` "
        "set in the scheduler's configuration is not in the ledger and not applied here. The "
        "period and pool filters do not apply."
    ).format(
        half=i18n.number(half_life_h),
        double=i18n.number(2 * half_life_h),
        when=common.when(share.as_of_us),
    )
    + ("" if share.quotas_known else _(" No quotas are recorded, so every team weighs 1."))
)
