"""Cost by team over time, from the sealed ledger (`ledger.queries`).

Run with `streamlit run dashboard/app.py`; the ledger directory comes from $TALLY_DATA_DIR
(set by `tally up`) or `.tally/data`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import streamlit as st

from ledger.queries import LedgerQueries
from ledger.units import MICROS_PER_UNIT

st.set_page_config(page_title="Tally · cost by team", layout="wide")

data_dir = Path(os.environ.get("TALLY_DATA_DIR", ".tally/data"))
currency = os.environ.get("TALLY_CURRENCY", "USD")
queries = LedgerQueries(data_dir)

st.title("GPU cost by team")
st.caption(f"Sealed ledger in `{data_dir}` · amounts in {currency}")

buckets = {"hour": 3_600_000_000, "day": 86_400_000_000}
granularity = st.radio("Bucket", list(buckets), horizontal=True, key="bucket")
rows = queries.cost_by_team_over_time(bucket_us=buckets[granularity])

if not rows:
    st.info(
        "No sealed usage yet. Once the worker has consumed samples and sealed its first segment "
        "(a few seconds after `make up` starts), cost by team appears here."
    )
    st.stop()

frame = pd.DataFrame(rows, columns=["bucket_us", "team", "gpu_ms", "money_micros"])
frame["time"] = frame["bucket_us"].map(lambda us: datetime.fromtimestamp(us / 1e6, tz=UTC))
frame["cost"] = frame["money_micros"] / MICROS_PER_UNIT  # display only; the ledger stays integer
frame["gpu_hours"] = frame["gpu_ms"] / 3_600_000

chart = frame.pivot_table(index="time", columns="team", values="cost", aggfunc="sum").fillna(0)
st.subheader(f"Cost per {granularity}")
st.bar_chart(chart, y_label=currency)

totals = (
    frame.groupby("team", as_index=False)[["money_micros", "gpu_ms"]]
    .sum()
    .sort_values("money_micros", ascending=False)
)
totals["cost"] = totals["money_micros"] / MICROS_PER_UNIT
totals["gpu_hours"] = totals["gpu_ms"] / 3_600_000
st.subheader("Total by team")
st.dataframe(
    totals[["team", "gpu_hours", "cost"]],
    hide_index=True,
    column_config={
        "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
        "cost": st.column_config.NumberColumn(f"Cost ({currency})", format="%.2f"),
    },
)
newest = queries.newest_sealed_us()
if newest:
    st.caption(f"Sealed up to {datetime.fromtimestamp(newest / 1e6, tz=UTC):%Y-%m-%d %H:%M:%S} UTC")
