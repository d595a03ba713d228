"""My jobs: the self-service portal for members and team leads (shown only with single
sign-on). Submit a job from a template — the configuration's, shared and read-only, or one's
own, saved from this form and deleted here (`dashboard.template_store`) — or by hand, see one's
jobs (a team lead: the team's, and the team's quota and budget requests with their status)
with state, wait reason, GPU-hours and cost so far, cancel one, and see the team's budget and
quota left — every call made to the scheduler's API as the signed-in person
(`dashboard.portal_api`), so the API's role checks apply.
"""

from __future__ import annotations

import os
import shlex
import time

import streamlit as st

from dashboard import access, common, i18n, template_store
from dashboard.i18n import _
from dashboard.portal_api import PortalClient, PortalError, api_url
from dashboard.portal_view import (
    TEMPLATES_ENV,
    Template,
    job_rows,
    left_of,
    state_shown,
    submit_body,
    templates_from_json,
    wait_shown,
)
from dashboard.requests_view import request_rows, status_text
from ledger.roles import Role

BY_HAND = "(by hand)"
SHARED, MINE = "shared:", "mine:"
FLASH, PICK = "portal_flash", "template_pick"
tr = i18n.translator()

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
user = caller.user or ""
subject = access.subject()  # personal templates are the subject's: none without one
store = template_store.store() if subject is not None else None
person = template_store.Person(subject or "", caller.user)
templates = {SHARED + t.name: t for t in templates_from_json(os.environ.get(TEMPLATES_ENV))}
mine = {MINE + t.name: t for t in (store.mine(person) if store is not None else ())}


def template_label(key: str) -> str:
    if key == BY_HAND:
        return _("(by hand)")
    if key.startswith(MINE):
        return _("{name} (mine)").format(name=key.removeprefix(MINE))
    return key.removeprefix(SHARED)


if FLASH in st.session_state:
    st.success(st.session_state.pop(FLASH))
if PICK in st.session_state:  # a template just saved (or None: just deleted), chosen here
    picked = st.session_state.pop(PICK)
    if picked is None:
        st.session_state.pop("template", None)
    else:
        st.session_state["template"] = picked
chosen = st.selectbox(
    _("Template"), [*templates, *mine, BY_HAND], format_func=template_label, key="template"
)
base = templates.get(chosen) or mine.get(chosen) or Template(BY_HAND, "", "", 1, None, 1.0, ())
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
    name = left.text_input(
        _("Save as my template, named"),
        base.name if chosen.startswith(MINE) else "",
        max_chars=64,
        disabled=store is None,
    )
    submitted = st.form_submit_button(_("Submit job"), type="primary")
    saved = st.form_submit_button(_("Save as my template"), disabled=store is None)
    form: Template | None = None
    if submitted or saved:
        try:
            form = Template(
                name.strip(), queue.strip(), project.strip(), int(gpus), model.strip() or None,
                float(estimate), tuple(shlex.split(command)),
            )  # fmt: skip
        except ValueError as exc:  # unbalanced quotes
            st.error(_("Command: {problem}").format(problem=exc))
    if submitted and form is not None:
        try:
            job = client.submit(submit_body(form, user))
            st.success(
                _("Submitted {job} ({state})").format(
                    job=job["job_id"], state=state_shown(str(job["state"]), tr)
                )
            )
        except PortalError as exc:
            st.error(str(exc))
    if saved and form is not None and store is not None:
        try:
            store.save(person, form)
            st.session_state[FLASH] = _("Saved your template {name}").format(name=form.name)
            st.session_state[PICK] = MINE + form.name
            st.rerun()
        except template_store.TemplateError as exc:
            st.error(_("Not saved: {problem}").format(problem=exc))
if chosen.startswith(MINE) and store is not None:
    gone = chosen.removeprefix(MINE)
    if st.button(_("Delete my template {name}").format(name=gone)):
        try:
            store.delete(person, gone)
            st.session_state[PICK] = None
            st.session_state[FLASH] = _("Deleted your template {name}").format(name=gone)
            st.rerun()
        except template_store.TemplateError as exc:
            st.error(_("Not deleted: {problem}").format(problem=exc))

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
                _("state"): state_shown(r.state, tr),
                _("waits because"): wait_shown(r.wait_reason, tr),
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
                    _("Cancelled {job} ({state})").format(
                        job=job["job_id"], state=state_shown(str(job["state"]), tr)
                    )
                )
            except PortalError as exc:
                st.error(str(exc))


if team_view:  # the team lead's view of the team's requests (filed on the Requests page)
    st.subheader(_("Team's requests"))
    try:
        requests = request_rows(client.requests(), common.money, tr)
    except PortalError as exc:
        requests = []
        st.error(str(exc))
    if not requests:
        st.caption(_("No requests yet: file one on the Requests page."))
    else:
        st.table(
            [
                {
                    _("request"): r.request_id,
                    _("change"): r.change,
                    _("status"): status_text(r, _),
                    _("requested by"): r.requested_by,
                    _("decided by"): r.decided_by,
                    _("comment"): r.comment,
                }
                for r in requests
            ]
        )


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
