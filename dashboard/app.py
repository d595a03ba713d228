"""The dashboard's entry point: page navigation and the sidebar filters every page shares.

Run with `streamlit run dashboard/app.py` (`tally up` does); the ledger directory comes from
$TALLY_DATA_DIR (set by `tally up`) or `.tally/data`, the currency from $TALLY_CURRENCY.
The pages are the `page_*.py` scripts beside it; they read the sealed ledger through
`dashboard.common`. The scheduler's job events are read from the ledger's raw-event archive, on
the topic named by $TALLY_JOBS_TOPIC (default `tally.jobs`). The FOCUS download's unit prices
come from the configuration's price book in $TALLY_PRICES (JSON, set by `tally up`). With
single sign-on ($TALLY_OIDC_LOGIN) only a signed-in person sees anything, and only the pages and
team their role allows (`dashboard.access`). Every page is in the session's language
(`dashboard.i18n`: the sidebar's switch).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import access, common, i18n
from dashboard.i18n import N_, _

st.set_page_config(page_title="Tally", page_icon="▦", layout="wide")

HERE = Path(__file__).parent
PAGES = [  # (script, title, icon, url path); the first visible one is the default
    ("page_finance.py", N_("Finance"), ":material/payments:", "finance"),
    ("page_platform.py", N_("Platform"), ":material/memory:", "platform"),
    ("page_team.py", N_("Team"), ":material/group:", "team"),
    ("page_capacity.py", N_("Capacity planning"), ":material/trending_up:", "capacity"),
    ("page_whatif.py", N_("What-if"), ":material/alt_route:", "whatif"),
    ("page_audit.py", N_("Audit"), ":material/policy:", "audit"),
    ("page_portal.py", N_("My jobs"), ":material/rocket_launch:", "jobs"),
    ("page_requests.py", N_("Requests"), ":material/approval:", "requests"),
]

i18n.start()  # the session's language, before anything is written

viewer = access.viewer()  # with single sign-on: the login screen until someone signs in
shown = [p for p in PAGES if p[3] in viewer.pages]
page = st.navigation(
    [
        st.Page(HERE / script, title=_(title), icon=icon, url_path=path, default=i == 0)
        for i, (script, title, icon, path) in enumerate(shown)
    ]
)
extent = common.query("extent")
history = common.query("job_history", common.jobs_topic())
st.session_state["filters"] = common.sidebar_filters(extent, history.teams, viewer.team)
with st.sidebar:
    st.caption(
        _("Sealed up to {when} · amounts in {currency}").format(
            when=common.when(extent.newest_us), currency=common.currency()
        )
    )
i18n.switch()
page.run()
