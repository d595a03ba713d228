"""Requests: quota and budget change requests in the dashboard (shown only with single
sign-on). A team lead (or member) files one for their team with a reason; everyone who may read
requests sees them with their status (a team role: its team's); finance, admins and operators
approve or reject an open one with a comment. Every call goes to the scheduler's API as the
signed-in person (`dashboard.portal_api`), so the API's permission table and approval policy
decide — a refused decision shows the API's reason as it is. What is sent and shown is
`dashboard.requests_view`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import streamlit as st

from dashboard import access, common, i18n
from dashboard.i18n import N_, _
from dashboard.portal_api import PortalClient, PortalError, api_url
from dashboard.requests_view import (
    STATUS_LABELS,
    RequestForm,
    request_body,
    request_rows,
    status_counts,
    status_text,
)
from ledger.roles import Action, scope_of

KINDS = {"budget": N_("budget"), "quota": N_("quota")}
UNITS = {"money": N_("money"), "gpu_hours": N_("GPU-hours")}
FLASH = "requests_flash"

st.title(_("Requests"))
caller = access.signed_in()
url = api_url()
token = st.user.tokens.get("access") if caller is not None else None
if caller is None or url is None or not token:
    st.error(
        _(
            "Requests need single sign-on and the scheduler's API ($TALLY_API_URL, set by "
            "`tally dashboard` / `tally up`)."
        )
    )
    st.stop()
client = PortalClient(url, str(token))
can_open = scope_of(caller.role, Action.REQUEST_OPEN) is not None
can_decide = scope_of(caller.role, Action.REQUEST_DECIDE) is not None
st.caption(
    _(
        "Quota and budget changes are requested with a reason and approved or rejected with a "
        "comment; an approved request becomes the admin change, which the ledger applies."
    )
)
if FLASH in st.session_state:
    st.success(st.session_state.pop(FLASH))

# ------------------------------------------------------------------------------ file one
if can_open:
    st.subheader(_("Ask for a change"))
    kind = st.radio(
        _("Kind"), list(KINDS), format_func=lambda k: _(KINDS[k]), horizontal=True, key="kind"
    )
    with st.form("request", border=True):
        left, right = st.columns(2)
        if caller.team is not None:
            team = left.text_input(_("Team"), caller.team, disabled=True)
        else:
            team = left.text_input(_("Team"))
        if kind == "budget":
            period = right.text_input(
                _("Period (YYYY-MM)"), datetime.now(common.zone()).strftime("%Y-%m")
            )
            unit = left.radio(
                _("In"), list(UNITS), format_func=lambda u: _(UNITS[u]), horizontal=True
            )
            amount = right.text_input(
                _("Change (negative gives back)"), help=_("Money: e.g. 500.00; GPU-hours: whole")
            )
            form = RequestForm(kind, team.strip(), "", period=period, unit=unit, amount=amount)
        else:
            pool = left.text_input(_("Pool"))
            model = right.text_input(_("GPU model"))
            gpus = left.number_input(_("Nominal GPUs"), min_value=0, max_value=1_000_000)
            borrowing = right.text_input(_("Borrowing limit (empty: unlimited)"))
            lending = left.text_input(_("Lending limit (empty: unlimited)"))
            form = RequestForm(
                kind, team.strip(), "", pool=pool, model=model, gpus=int(gpus),
                borrowing_limit=borrowing, lending_limit=lending,
            )  # fmt: skip
        reason = st.text_area(_("Reason"), max_chars=1000)
        if st.form_submit_button(_("File request"), type="primary"):
            body = request_body(replace(form, reason=reason))
            if isinstance(body, str):
                st.error(_(body))
            else:
                try:
                    made = client.open_request(body)
                    st.success(
                        _("Filed {request}: {approvers} may approve it").format(
                            request=made["request_id"], approvers=", ".join(made["approvers"])
                        )
                    )
                except PortalError as exc:
                    st.error(str(exc))

# ------------------------------------------------------------------------------ decide
try:
    rows = request_rows(client.requests(), common.money, i18n.translator())
except PortalError as exc:
    st.error(str(exc))
    st.stop()
pending = [r for r in rows if r.decidable]
if can_decide:
    st.subheader(_("Approve or reject"))
    if not pending:
        st.info(_("No request waits for a decision."))
    else:
        with st.form("decide", border=True):
            chosen = st.selectbox(
                _("Request"),
                [r.request_id for r in pending],
                format_func=lambda i: next(
                    f"{r.request_id} · {r.team} · {r.change} · {r.requested_by}"
                    for r in pending
                    if r.request_id == i
                ),
            )
            comment = st.text_input(_("Comment"), max_chars=1000)
            left, right = st.columns(2)
            approve = left.form_submit_button(_("Approve"), type="primary")
            reject = right.form_submit_button(_("Reject"))
            if approve or reject:
                try:
                    done = client.decide(str(chosen), approve, comment.strip())
                    st.session_state[FLASH] = _("{request} is {status}").format(
                        request=done["request_id"],
                        status=_(STATUS_LABELS.get(done["status"], done["status"])),
                    )
                    st.rerun()
                except PortalError as exc:
                    st.error(str(exc))

# ------------------------------------------------------------------------------ the table
st.subheader(_("Team's requests") if caller.team else _("All requests"))
st.button(_("Refresh"), key="refresh_requests")
if not rows:
    st.info(_("No requests yet."))
else:
    st.caption(
        " · ".join(f"{_(STATUS_LABELS.get(s, s))}: {n}" for s, n in status_counts(rows).items())
    )
    st.table(
        [
            {
                _("request"): r.request_id,
                _("team"): r.team,
                _("change"): r.change,
                _("status"): status_text(r, _),
                _("requested by"): r.requested_by,
                _("reason"): r.reason,
                _("approvers"): r.approvers,
                _("decided by"): r.decided_by,
                _("comment"): r.comment,
                _("applied as"): r.effect,
            }
            for r in rows
        ]
    )
    st.caption(
        _(
            "An approved request names the admin event it became (applied as); the ledger "
            "applies it, or refuses it if its period was closed meanwhile (`tally request "
            "show` reads the ledger's record)."
        )
    )
