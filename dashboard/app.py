"""The dashboard's entry point: page navigation and the sidebar filters every page shares.

Run with `streamlit run dashboard/app.py` (`tally up` does); the ledger directory comes from
$TALLY_DATA_DIR (set by `tally up`) or `.tally/data`, the currency from $TALLY_CURRENCY.
The pages are the `page_*.py` scripts beside it; they read the sealed ledger through
`dashboard.common`. The scheduler's job events are read from the ledger's raw-event archive, on
the topic named by $TALLY_JOBS_TOPIC (default `tally.jobs`). The FOCUS download's unit prices
come from the configuration's price book in $TALLY_PRICES (JSON, set by `tally up`).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import common

st.set_page_config(page_title="Tally", page_icon="▦", layout="wide")

HERE = Path(__file__).parent
PAGES = [
    st.Page(
        HERE / "page_finance.py",
        title="Finance",
        icon=":material/payments:",
        url_path="finance",
        default=True,
    ),
    st.Page(
        HERE / "page_platform.py",
        title="Platform",
        icon=":material/memory:",
        url_path="platform",
    ),
    st.Page(
        HERE / "page_team.py",
        title="Team",
        icon=":material/group:",
        url_path="team",
    ),
    st.Page(
        HERE / "page_capacity.py",
        title="Capacity planning",
        icon=":material/trending_up:",
        url_path="capacity",
    ),
    st.Page(
        HERE / "page_whatif.py",
        title="What-if",
        icon=":material/alt_route:",
        url_path="whatif",
    ),
    st.Page(
        HERE / "page_audit.py",
        title="Audit",
        icon=":material/policy:",
        url_path="audit",
    ),
]

page = st.navigation(PAGES)
extent = common.query("extent")
history = common.query("job_history", common.jobs_topic())
st.session_state["filters"] = common.sidebar_filters(extent, history.teams)
with st.sidebar:
    st.caption(f"Sealed up to {common.when(extent.newest_us)} · amounts in {common.currency()}")
page.run()
