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

from dashboard import common
from ledger.read import job_history, rollups
from ledger.read.job_history import JobRow, JobState
from ledger.units import Unit

MAX_ROWS = 500  # newest ended jobs listed


def _gpu_hours_text(gpu_ms: int) -> str:
    return f"{common.hours(gpu_ms):,.1f} GPU-hours"


def _limit(value: int | None) -> str:
    if value is None:
        return "unlimited"
    return f"{value:,} GPU" + ("" if value == 1 else "s")


cur = common.currency()
st.title("Team: jobs, budget and quota")
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
        "Team",
        teams,
        key="team_page",
        help="Or choose a team in the sidebar: the sidebar's choice applies to every page.",
    )
as_of = max((t for t in (extent.newest_us, history.newest_us) if t is not None), default=0)
period = common.period(filters.period)
scope = ", ".join(
    part
    for part in (
        f"period {filters.period}" if filters.period else "all periods",
        f"pool {filters.pool}" if filters.pool else "",
    )
    if part
)
st.caption(
    f"Team **{team}** · {scope} · as of {common.when(as_of)} (the newest sealed usage or job "
    f"event) · amounts in {cur}. Jobs are those active in the period (submitted before its end, "
    "not ended before its start) on the pool; jobs that asked for any pool and never ran are "
    "shown only without a pool filter."
)
if history.undecodable:
    st.warning(
        f"{history.undecodable:,} message(s) on the jobs topic `{topic}` could not be read; "
        "the jobs they describe may be incomplete here (the worker's dead letters say why)."
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
m[0].metric("Jobs waiting", f"{len(waiting):,}")
m[1].metric(
    "Jobs running",
    f"{len(running):,}",
    help=f"{sum(len(j.gpu_uuids) or j.gpus for j in running):,} GPUs held by them.",
)
m[2].metric(
    "Budget left",
    "no budget" if money is None else common.money(money.remaining),
    help="Granted − used − reserved by running jobs, in "
    + (f"period {budget.period}" if budget.period else "the current period")
    + ". See Budget below.",
)
m[3].metric(
    "Fair-share order",
    "—" if standing is None else f"{standing.rank} of {len(share.rows)}",
    help="1 is served first when teams compete for the same GPUs. See Fair share below.",
)

if not jobs:
    common.no_jobs(f"team {team}" + (f" in {scope}" if filters.period or filters.pool else ""))

# ---------------------------------------------------------------------- waiting
st.header("Waiting")
if waiting:
    st.dataframe(
        pd.DataFrame(
            {
                "job": [j.job_id for j in waiting],
                "reason": [job_history.wait_text(j) for j in waiting],
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
            "job": "Job",
            "user": "User",
            "project": "Project",
            "queue": "Queue",
            "gpus": st.column_config.NumberColumn("GPUs asked", format="%d"),
            "model": "GPU model asked",
            "pool": "Pool",
            "since": st.column_config.DatetimeColumn(
                "Waiting since (UTC)", format="YYYY-MM-DD HH:mm"
            ),
            "waited": st.column_config.NumberColumn("Waiting for (hours)", format="%.1f"),
            "reason": "Why it waits",
            "note": "Scheduler's note",
            "stopped": st.column_config.NumberColumn("Times stopped for others", format="%d"),
        },
    )
else:
    st.success(f"No job of {team} is waiting.")

# ---------------------------------------------------------------------- explanation
st.header("Why is this job waiting?")
st.caption("Choose any of the team's jobs: why it waits, why it was stopped, or how it ended.")
choices = [j.job_id for j in (*waiting, *running, *ended)]
if choices:
    states = {j.job_id: j.state.value for j in jobs}
    preempted = [j for j in sorted(jobs, key=lambda j: -j.last_event_us) if j.preemptions]
    first = next(iter(waiting or preempted), None)  # the job a researcher most likely asks about
    chosen = st.selectbox(
        "Job",
        choices,
        index=0 if first is None else choices.index(first.job_id),
        format_func=lambda job: f"{job} · {states[job]}",
        key="explain_job",
    )
    why: job_history.Explanation = common.query("job_explanation", topic, chosen, as_of)
    if why.state is JobState.WAITING:
        st.warning(why.headline, icon=":material/hourglass_top:")
    elif why.state in (JobState.FAILED, JobState.RECLAIMED):
        st.error(why.headline, icon=":material/error:")
    else:
        st.info(why.headline, icon=":material/info:")
    if why.advice:
        st.markdown(f"**What you can do.** {why.advice}")
    e = st.columns(3)
    e[0].metric("Waited in total", job_history.duration_text(why.waited_us))
    e[1].metric("Times stopped for other jobs", f"{why.preemptions:,}")
    e[2].metric("Cost so far", common.money(totals[chosen].money_micros if chosen in totals else 0))
    if why.timeline:
        st.subheader("What happened")
        st.dataframe(
            pd.DataFrame(
                {
                    "time": [common.timestamp(t.time_us) for t in why.timeline],
                    "what": [t.text for t in why.timeline],
                }
            ),
            hide_index=True,
            column_config={
                "time": st.column_config.DatetimeColumn("Time (UTC)", format="YYYY-MM-DD HH:mm:ss"),
                "what": st.column_config.TextColumn("What happened", width="large"),
            },
        )
    st.caption(
        "From the scheduler's decisions (its events on the jobs topic, as the ledger archived "
        "them); `tally job explain <job>` gives the same answer on the command line."
    )
else:
    st.info(f"No job of {team} to explain in {scope}.")

# ---------------------------------------------------------------------- running
st.header("Running")
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
                "state": [j.state.value for j in running],
            }
        ),
        hide_index=True,
        column_config={
            "job": "Job",
            "user": "User",
            "project": "Project",
            "queue": "Queue",
            "gpus": st.column_config.NumberColumn("GPUs", format="%d"),
            "model": "GPU model",
            "pool": "Pool",
            "since": st.column_config.DatetimeColumn(
                "Running since (UTC)", format="YYYY-MM-DD HH:mm"
            ),
            "running": st.column_config.NumberColumn("Running for (hours)", format="%.1f"),
            "gpu_hours": st.column_config.NumberColumn("GPU-hours so far", format="%.2f"),
            "cost": st.column_config.NumberColumn(f"Cost so far ({cur})", format="%.2f"),
            "state": "State",
        },
    )
    st.caption(
        "Cost so far: the ledger's postings with the job's id, over all periods and pools, up "
        "to the newest sealed usage (a few seconds to minutes behind real time)."
    )
else:
    st.info(f"No job of {team} is running.")

# ---------------------------------------------------------------------- ended
st.header("Finished, failed and cancelled")
if ended:
    shown = ended[:MAX_ROWS]
    st.dataframe(
        pd.DataFrame(
            {
                "job": [j.job_id for j in shown],
                "outcome": [job_history.outcome_text(j) for j in shown],
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
            "job": "Job",
            "user": "User",
            "project": "Project",
            "outcome": "Outcome",
            "ended": st.column_config.DatetimeColumn("Ended (UTC)", format="YYYY-MM-DD HH:mm"),
            "runtime": st.column_config.NumberColumn("Runtime (hours)", format="%.2f"),
            "waited": st.column_config.NumberColumn("Waited (hours)", format="%.2f"),
            "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
            "cost": st.column_config.NumberColumn(f"Cost ({cur})", format="%.2f"),
            "attempts": st.column_config.NumberColumn("Attempts", format="%d"),
        },
    )
    if len(ended) > MAX_ROWS:
        st.caption(f"The {MAX_ROWS:,} most recent of {len(ended):,} ended jobs.")
else:
    st.info(f"No job of {team} ended in {scope}.")

# ---------------------------------------------------------------------- cost per job
st.header("Cost per job")
costs: tuple[rollups.JobCost, ...] = common.query(
    "job_costs", rollups.Filters(filters.period, team, filters.pool)
)
if costs:
    scheduled = {j.job_id: j.state.value for j in history.rows}
    st.dataframe(
        pd.DataFrame(
            {
                "job": [c.job_id for c in costs],
                "project": [c.project for c in costs],
                "user": [c.user for c in costs],
                "pools": [c.pools for c in costs],
                "gpu_hours": [common.hours(c.gpu_ms) for c in costs],
                "cost": [common.amount(c.money_micros) for c in costs],
                "idle_waste": [common.amount(c.idle_waste_micros) for c in costs],
                "state": [scheduled.get(c.job_id, "not run by Tally's scheduler") for c in costs],
            }
        ),
        hide_index=True,
        column_config={
            "job": "Job",
            "project": "Project",
            "user": "User",
            "pools": "Pool(s)",
            "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
            "cost": st.column_config.NumberColumn(f"Cost ({cur})", format="%.2f"),
            "idle_waste": st.column_config.NumberColumn(f"Idle waste ({cur})", format="%.2f"),
            "state": "State",
        },
    )
    st.caption(
        f"Costs booked in {scope}: the ledger's postings to team {team} grouped by job id "
        "(idle waste is the part spent while the job held GPUs it did not use). Total "
        f"{common.money(sum(c.money_micros for c in costs))}."
    )
else:
    st.info(f"No usage with a job id for team {team} in {scope}.")

# ---------------------------------------------------------------------- budget
st.header("Budget")
if budget.status is None:
    st.info(
        f"No budget was ever granted to team {team}, so no budget limits its jobs. Budgets are "
        "granted under `budgets:` in the configuration and applied with `tally admin apply` "
        "(they post to `budget:" + team + "`); the Finance page shows spend without one."
    )
else:
    st.caption(
        f"Period {budget.period}" + (" (the current one)" if budget.current else "") + ". Left ="
        " granted − used − reserved; reserved is what running jobs hold against the budget "
        "until their usage is metered (open holds). The scheduler admits a job only if what is "
        "left covers its expected cost."
    )
    for line in budget.status.lines:
        show = common.money if line.unit == Unit.MONEY.value else _gpu_hours_text
        b = st.columns(4)
        b[0].metric("Granted", show(line.granted))
        b[1].metric("Used", show(line.consumed))
        b[2].metric("Reserved by running jobs", show(line.open_holds))
        b[3].metric("Left", show(line.remaining))
        if line.remaining < 0:
            st.error(
                f"Team {team} is over budget by {show(-line.remaining)}: new jobs that need "
                "budget wait (reason *budget used up*) until more is granted."
            )

# ---------------------------------------------------------------------- quota
st.header("Quota")
quotas: rollups.TeamQuotas = common.query("team_quotas", team, topic)
if quotas.problem is not None:
    st.warning(
        f"The ledger's admin log could not be read ({quotas.problem}). Quotas are set under "
        "`quotas:` in the configuration file; `tally queue list` shows what the scheduler uses."
    )
elif not quotas.lines:
    st.info(
        f"No quota for team {team} is recorded in the ledger. Quotas are set under `quotas:` in "
        "the configuration file and applied with `tally admin apply`; `tally queue list` shows "
        "what the scheduler uses."
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
            "pool": "Pool",
            "model": "GPU model",
            "nominal": st.column_config.NumberColumn("Quota (GPUs)", format="%d"),
            "in_use": st.column_config.NumberColumn("In use now", format="%d"),
            "borrowed": st.column_config.NumberColumn("Of them borrowed", format="%d"),
            "borrow": "May borrow beyond quota",
            "lend": "May lend to others",
        },
    )
    st.caption(
        "Quota: GPUs the team is guaranteed (from the `quotas:` admin events). Beyond it a team "
        "may borrow other teams' unused quota up to its limit; borrowed GPUs can be taken back, "
        "which stops (preempts) the job using them. In use now: GPUs held by the team's running "
        "jobs, from the scheduler's events."
    )

# ---------------------------------------------------------------------- fair share
st.header("Fair share")
half_life_h = share.half_life_us / rollups.HOUR_US
if standing is not None:
    st.markdown(
        f"Team **{team}** is **{standing.rank} of {len(share.rows)}** in fair-share order: "
        "when teams compete for the same GPUs, the team with the least recent usage per quota "
        "GPU goes first."
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
        "rank": st.column_config.NumberColumn("Order", format="%d"),
        "team": "Team",
        "usage": st.column_config.NumberColumn("Recent usage (decayed GPU-hours)", format="%.1f"),
        "weight": st.column_config.NumberColumn("Quota GPUs (weight)", format="%d"),
        "per_gpu": st.column_config.NumberColumn("GPU-hours per quota GPU", format="%.2f"),
    },
)
st.caption(
    f"Recent usage: the team's metered GPU time in the ledger, decayed with a half-life of "
    f"{half_life_h:,.0f} hours (a GPU-hour used {half_life_h:,.0f} hours ago counts half, "
    f"{2 * half_life_h:,.0f} hours ago a quarter), as of {common.when(share.as_of_us)}. Weight: "
    "the team's quota GPUs (1 without a quota); a `weight:` set in the scheduler's configuration "
    "is not in the ledger and not applied here. The period and pool filters do not apply."
    + ("" if share.quotas_known else " No quotas are recorded, so every team weighs 1.")
)
