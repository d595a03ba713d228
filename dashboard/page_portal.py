"""My jobs: the self-service portal for members and team leads (shown only with single
sign-on). Submit a job from a saved template or by hand, see one's jobs (a team lead: the
team's) with state, wait reason, GPU-hours and cost so far, cancel one, and see the team's
budget and quota left — every call made to the scheduler's API as the signed-in person
(`dashboard.portal_api`), so the API's role checks apply.
"""

from __future__ import annotations

import os
import shlex
import time

import streamlit as st

from dashboard import access, common
from dashboard.portal_api import PortalClient, PortalError, api_url
from dashboard.portal_view import (
    TEMPLATES_ENV,
    Template,
    job_rows,
    left_of,
    submit_body,
    templates_from_json,
)
from ledger.roles import Role

BY_HAND = "(by hand)"

st.title("My jobs")
caller = access.signed_in()
url = api_url()
token = st.user.tokens.get("access") if caller is not None else None
if caller is None or caller.team is None or url is None or not token:
    st.error(
        "The portal needs single sign-on, a team role and the scheduler's API "
        "($TALLY_API_URL, set by `tally dashboard` / `tally up`)."
    )
    st.stop()
client = PortalClient(url, str(token))
team_view = caller.role == Role.TEAM_LEAD
st.caption(
    f"Acting as **{caller.user}** in team **{caller.team}**"
    + (" · you see the team's jobs" if team_view else "")
)

# ------------------------------------------------------------------------------ submit
templates = {t.name: t for t in templates_from_json(os.environ.get(TEMPLATES_ENV))}
chosen = st.selectbox("Template", [*templates, BY_HAND], key="template")
base = templates.get(chosen) or Template(BY_HAND, "", "", 1, None, 1.0, ())
with st.form("submit", border=True):
    left, right = st.columns(2)
    queue = left.text_input("Queue", base.queue)
    project = right.text_input("Project", base.project)
    gpus = left.number_input("GPUs", min_value=1, max_value=1024, value=base.gpus, step=1)
    model = right.text_input("GPU model (empty: any)", base.model or "")
    estimate = left.number_input(
        "Estimated runtime (hours)", min_value=0.01, value=base.estimated_runtime_hours
    )
    command = right.text_input("Command", shlex.join(base.command))
    if st.form_submit_button("Submit job", type="primary"):
        form = Template(
            chosen, queue.strip(), project.strip(), int(gpus), model.strip() or None,
            float(estimate), tuple(shlex.split(command)),
        )  # fmt: skip
        try:
            job = client.submit(submit_body(form, caller.user or ""))
            st.success(f"Submitted {job['job_id']} ({job['state']})")
        except PortalError as exc:
            st.error(str(exc))

# ------------------------------------------------------------------------------ jobs
st.subheader("Team's jobs" if team_view else "Your jobs")
st.button("Refresh", key="refresh")
try:
    jobs = client.jobs(None if team_view else caller.user)
    balances = client.balances()
except PortalError as exc:
    st.error(str(exc))
    st.stop()
rows = job_rows(jobs, time.time_ns() // 1000, common.prices())
if not rows:
    st.info("No jobs yet: submit one above.")
else:
    st.table(
        [
            {
                "job": r.job_id,
                "user": r.user,
                "state": r.state,
                "waits because": r.wait_reason,
                "queue": r.queue,
                "GPUs": r.gpus,
                "GPU-hours": f"{common.hours(r.gpu_ms):.3f}",
                "cost so far": "—" if r.cost_micros is None else common.money(r.cost_micros),
            }
            for r in rows
        ]
    )
    cancellable = [r.job_id for r in rows if r.cancellable]
    if cancellable:
        victim = st.selectbox("Job to cancel", cancellable, key="victim")
        if st.button("Cancel job"):
            try:
                job = client.cancel(victim)
                st.success(f"Cancelled {job['job_id']} ({job['state']})")
            except PortalError as exc:
                st.error(str(exc))


# ------------------------------------------------------------------------------ what is left
def shown(unit: str, value: int) -> str:
    return common.money(value) if unit == "money_micros" else f"{common.hours(value):,.1f} GPU-h"


st.subheader("Budget and quota left")
for balance in balances:
    left_now = left_of(balance)
    if not left_now.budget:
        st.caption(f"Team {balance['team']}: no budget granted for this period.")
    for unit, granted, consumed, available in left_now.budget:
        st.metric(
            f"{balance['team']} · {unit} available",
            shown(unit, available),
            help=f"granted {shown(unit, granted)}, consumed {shown(unit, consumed)}",
        )
    if left_now.quota:
        st.table(
            [
                {"pool": p, "model": m, "nominal GPUs": n, "in use": u}
                for p, m, n, u in left_now.quota
            ]
        )
