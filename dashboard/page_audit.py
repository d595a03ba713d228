"""Audit: who changed what, when and from where — the ledger's audit trail (`ledger.audit`),
newest first, filtered by actor, kind and day, with whether its hash chain is intact.

The records come from `ledger.read.audit` over the sealed ledger (through `common.audit`); the
chain check is `ledger.audit.verify_chain`, the one `tally ledger verify` runs. The sidebar's
period, team and pool filters do not apply here.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import pandas as pd
import streamlit as st

from dashboard import common
from ledger.audit import AuditFilter, select

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
