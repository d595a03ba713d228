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
from datetime import UTC, date, datetime, time, timedelta

import pandas as pd
import streamlit as st

from dashboard import common
from ledger.audit import AuditFilter, select
from ledger.read import rollups

st.title("Audit: who changed what")
records, broken = common.audit()
if not records:
    st.info(
        "No audit records yet. Admin changes (`tally admin apply`, `tally ledger adjust`, "
        "`tally ledger close`) and job submissions and cancellations through the scheduler's "
        "API appear here once the worker has applied and sealed them. Ledger directory: "
        f"`{common.data_dir()}`."
    )
    st.stop()
st.caption(
    "Every state-changing action the ledger recorded, as of the last seal; the sidebar's "
    "period, team and pool filters do not apply here."
)

actors = sorted({r.entry.actor for r in records})
kinds = sorted({r.entry.kind for r in records})
families = sorted({k.split(".")[0] for k in kinds})
left, middle, right = st.columns(3)
actor = left.selectbox("Actor", [common.ALL, *actors], key="audit_actor")
kind = middle.selectbox("Kind", [common.ALL, *families, *kinds], key="audit_kind")
first_day = common.timestamp(records[0].entry.time_us).date()
last_day = common.timestamp(records[-1].entry.time_us).date()
days = right.date_input("Days", (first_day, last_day), key="audit_days")


def _start_us(day: date) -> int:
    return int(datetime.combine(day, time(), tzinfo=UTC).timestamp()) * 1_000_000


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
a.metric("Records shown", f"{len(shown):,} of {len(records):,}")
b.metric("Actors", len({r.entry.actor for r in shown}))
c.metric("Hash chain", "intact" if broken is None else "BROKEN")
if broken is not None:
    st.error(f"The audit trail's hash chain is broken: {broken}. Run `tally ledger verify`.")

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
st.dataframe(pd.DataFrame(rows, columns=headers), hide_index=True)
st.download_button(
    "Download CSV", common.csv_text(headers, rows), "audit.csv", "text/csv", key="audit-csv"
)

st.header("Requests")
now_us = int(clock.time() // 60) * 60_000_000  # to the minute: one cache entry a minute
found: rollups.Requests = common.query("requests", now_us)
if found.problem is not None:
    st.error(f"The admin log could not be read: {found.problem}")
elif not found.rows:
    st.info(
        "No quota or budget requests yet. A team lead files one with `tally request budget` / "
        "`tally request quota` (or `POST /v1/requests`); finance or an admin decides it with "
        "`tally request approve|reject`."
    )
else:
    status = st.selectbox(
        "Status", [common.ALL, "open", "approved", "rejected", "expired"], key="requests_status"
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
            q.status,
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
    st.dataframe(pd.DataFrame(table, columns=request_headers), hide_index=True)
    st.caption(
        "Newest first, as of the last seal; an open request past its expiry shows as expired. "
        "Approving one grants its budget or quota in the ledger, with the approver as actor."
    )
