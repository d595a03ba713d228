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

from dashboard import access, common, i18n
from dashboard.i18n import _
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

st.title(_("My jobs"))
caller = access.signed_in()
url = api_url()
token = st.user.tokens.get("access") if caller is not None else None
if caller is None or caller.team is None or url is None or not token:
    st.error(
        _(
            "The portal needs single sign-on, a team role and the scheduler's API "
            "($TALLY_API_URL, set by `tally dashboard` / `tally up`)."
        )
    )
    st.stop()
client = PortalClient(url, str(token))
team_view = caller.role == Role.TEAM_LEAD
st.caption(
    _("Acting as **{user}** in team **{team}**").format(user=caller.user, team=caller.team)
    + (_(" · you see the team's jobs") if team_view else "")
)

# ------------------------------------------------------------------------------ submit
templates = {t.name: t for t in templates_from_json(os.environ.get(TEMPLATES_ENV))}
chosen = st.selectbox(
    _("Template"),
    [*templates, BY_HAND],
    format_func=lambda t: _("(by hand)") if t == BY_HAND else t,
    key="template",
)
base = templates.get(chosen) or Template(BY_HAND, "", "", 1, None, 1.0, ())
with st.form("submit", border=True):
    left, right = st.columns(2)
    queue = left.text_input(_("Queue"), base.queue)
    project = right.text_input(_("Project"), base.project)
    gpus = left.number_input(_("GPUs"), min_value=1, max_value=1024, value=base.gpus, step=1)
    model = right.text_input(_("GPU model (empty: any)"), base.model or "")
    estimate = left.number_input(
        _("Estimated runtime (hours)"), min_value=0.01, value=base.estimated_runtime_hours
    )
    command = right.text_input(_("Command"), shlex.join(base.command))
    if st.form_submit_button(_("Submit job"), type="primary"):
        form = Template(
            chosen, queue.strip(), project.strip(), int(gpus), model.strip() or None,
            float(estimate), tuple(shlex.split(command)),
        )  # fmt: skip
        try:
            job = client.submit(submit_body(form, caller.user or ""))
            st.success(_("Submitted {job} ({state})").format(job=job["job_id"], state=job["state"]))
        except PortalError as exc:
            st.error(str(exc))

# ------------------------------------------------------------------------------ jobs
st.subheader(_("Team's jobs") if team_view else _("Your jobs"))
st.button(_("Refresh"), key="refresh")
try:
    jobs = client.jobs(None if team_view else caller.user)
    balances = client.balances()
except PortalError as exc:
    st.error(str(exc))
    st.stop()
rows = job_rows(jobs, time.time_ns() // 1000, common.prices())
if not rows:
    st.info(_("No jobs yet: submit one above."))
else:
    st.table(
        [
            {
                _("job"): r.job_id,
                _("user"): r.user,
                _("state"): r.state,
                _("waits because"): r.wait_reason,
                _("queue"): r.queue,
                _("GPUs"): r.gpus,
                _("GPU-hours"): i18n.number(common.hours(r.gpu_ms), 3),
                _("cost so far"): "—" if r.cost_micros is None else common.money(r.cost_micros),
            }
            for r in rows
        ]
    )
    cancellable = [r.job_id for r in rows if r.cancellable]
    if cancellable:
        victim = st.selectbox(_("Job to cancel"), cancellable, key="victim")
        if st.button(_("Cancel job")):
            try:
                job = client.cancel(victim)
                st.success(
                    _("Cancelled {job} ({state})").format(job=job["job_id"], state=job["state"])
                )
            except PortalError as exc:
                st.error(str(exc))


# ------------------------------------------------------------------------------ what is left
def shown(unit: str, value: int) -> str:
    if unit == "money_micros":
        return common.money(value)
    return _("{hours} GPU-h").format(hours=i18n.number(common.hours(value), 1))


st.subheader(_("Budget and quota left"))
for balance in balances:
    left_now = left_of(balance)
    if not left_now.budget:
        st.caption(
            _("Team {team}: no budget granted for this period.").format(team=balance["team"])
        )
    for unit, granted, consumed, available in left_now.budget:
        st.metric(
            _("{team} · {unit} available").format(team=balance["team"], unit=unit),
            shown(unit, available),
            help=_("granted {granted}, consumed {consumed}").format(
                granted=shown(unit, granted), consumed=shown(unit, consumed)
            ),
        )
    if left_now.quota:
        st.table(
            [
                {_("pool"): p, _("model"): m, _("nominal GPUs"): n, _("in use"): u}
                for p, m, n, u in left_now.quota
            ]
        )
