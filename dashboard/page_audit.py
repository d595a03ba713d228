"""Audit: who changed what, when and from where — the ledger's audit trail (`ledger.audit`),
newest first, filtered by actor, kind and day, with whether its hash chain is intact; and the
quota and budget requests with their status (read-only: `rollups.requests`; they are filed
and decided with `tally request` or `/v1/requests`, the dashboard having no login yet).

The records come from `ledger.read.audit` over the sealed ledger (through `common.audit`); the
chain check is `ledger.audit.verify_chain`, the one `tally ledger verify` runs. The sidebar's
period, team and pool filters do not apply here.
"""

from __future__ import annotations

import time as clock
from datetime import date, datetime, time, timedelta

import pandas as pd
import streamlit as st

from dashboard import common, i18n
from dashboard.i18n import _
from ledger.audit import AuditFilter, select
from ledger.read import rollups

st.title(_("Audit: who changed what"))
records, broken = common.audit()
if not records:
    st.info(
        _(
            "No audit records yet. Admin changes (`tally admin apply`, `tally ledger adjust`, "
            "`tally ledger close`) and job submissions and cancellations through the scheduler's "
            "API appear here once the worker has applied and sealed them. Ledger directory: "
            "`{directory}`."
        ).format(directory=common.data_dir())
    )
    st.stop()
st.caption(
    _(
        "Every state-changing action the ledger recorded, as of the last seal; the sidebar's "
        "period, team and pool filters do not apply here."
    )
)

COLUMNS = {  # the CSV's headers (stable) → what the table shows
    "seq": _("Seq"),
    "time": _("Time"),
    "kind": _("Kind"),
    "actor": _("Actor"),
    "role": _("Role"),
    "client": _("Client"),
    "subject": _("Subject"),
    "reason": _("Reason"),
    "before": _("Before"),
    "after": _("After"),
    "request": _("Request"),
    "team": _("Team"),
    "status": _("Status"),
    "change": _("Change"),
    "requested_by": _("Requested by"),
    "approvers": _("Approvers"),
    "opened": _("Opened"),
    "expires": _("Expires"),
    "decided_by": _("Decided by"),
    "comment": _("Comment"),
}
STATUS = {
    "open": _("open"),
    "approved": _("approved"),
    "rejected": _("rejected"),
    "expired": _("expired"),
}


def shown_as(value: str) -> str:
    return _("(all)") if value == common.ALL else STATUS.get(value, value)


actors = sorted({r.entry.actor for r in records})
kinds = sorted({r.entry.kind for r in records})
families = sorted({k.split(".")[0] for k in kinds})
left, middle, right = st.columns(3)
actor = left.selectbox(_("Actor"), [common.ALL, *actors], format_func=shown_as, key="audit_actor")
kind = middle.selectbox(
    _("Kind"), [common.ALL, *families, *kinds], format_func=shown_as, key="audit_kind"
)
first_day = common.timestamp(records[0].entry.time_us).date()
last_day = common.timestamp(records[-1].entry.time_us).date()
days = right.date_input(
    _("Days ({zone})").format(zone=common.zone_label()), (first_day, last_day), key="audit_days"
)


def _start_us(day: date) -> int:
    """The first microsecond of `day` on the ledger's zone's clock."""
    return int(datetime.combine(day, time(), tzinfo=common.zone()).timestamp()) * 1_000_000


since_us = until_us = None
if isinstance(days, tuple) and len(days) == 2:
    since_us, until_us = _start_us(days[0]), _start_us(days[1] + timedelta(days=1))
where = AuditFilter(
    None if actor == common.ALL else actor,
    None if kind == common.ALL else kind,
    since_us,
    until_us,
)
shown = list(reversed(select(records, where)))

a, b, c = st.columns(3)
a.metric(
    _("Records shown"),
    _("{shown} of {total}").format(shown=i18n.number(len(shown)), total=i18n.number(len(records))),
)
b.metric(_("Actors"), len({r.entry.actor for r in shown}))
c.metric(_("Hash chain"), _("intact") if broken is None else _("BROKEN"))
if broken is not None:
    st.error(
        _("The audit trail's hash chain is broken: {where}. Run `tally ledger verify`.").format(
            where=broken
        )
    )

headers = ["seq", "time", "kind", "actor", "role", "client", "subject", "reason", "before", "after"]
rows = [
    [
        r.seq,
        common.when(r.entry.time_us),
        r.entry.kind,
        r.entry.actor,
        r.entry.role,
        r.entry.client,
        r.entry.subject,
        r.entry.reason,
        r.entry.before or "",
        r.entry.after or "",
    ]
    for r in shown
]
st.dataframe(pd.DataFrame(rows, columns=headers), hide_index=True, column_config=COLUMNS)
st.download_button(
    _("Download CSV"), common.csv_text(headers, rows), "audit.csv", "text/csv", key="audit-csv"
)

st.header(_("Requests"))
now_us = int(clock.time() // 60) * 60_000_000  # to the minute: one cache entry a minute
found: rollups.Requests = common.query("requests", now_us)
if found.problem is not None:
    st.error(_("The admin log could not be read: {problem}").format(problem=found.problem))
elif not found.rows:
    st.info(
        _(
            "No quota or budget requests yet. A team lead files one with `tally request budget` / "
            "`tally request quota` (or `POST /v1/requests`); finance or an admin decides it with "
            "`tally request approve|reject`."
        )
    )
else:
    status = st.selectbox(
        _("Status"), [common.ALL, *STATUS], format_func=shown_as, key="requests_status"
    )
    listed = [q for q in found.rows if status in (common.ALL, q.status)]
    request_headers = [
        "request", "team", "status", "change", "requested_by", "reason", "approvers",
        "opened", "expires", "decided_by", "comment",
    ]  # fmt: skip
    table = [
        [
            q.request_id,
            q.team,
            STATUS.get(q.status, q.status),
            q.change,
            q.requested_by,
            q.reason,
            q.approvers,
            common.when(q.opened_us),
            common.when(q.expires_us),
            q.decided_by or "",
            q.comment or "",
        ]
        for q in listed
    ]
    st.dataframe(
        pd.DataFrame(table, columns=request_headers), hide_index=True, column_config=COLUMNS
    )
    st.caption(
        _(
            "Newest first, as of the last seal; an open request past its expiry shows as expired. "
            "Approving one grants its budget or quota in the ledger, with the approver as actor."
        )
    )
