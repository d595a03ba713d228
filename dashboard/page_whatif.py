"""What-if: a policy change replayed against the ledger's own history, baseline beside
alternative — the reports `tally whatif … --save NAME` keeps as `whatif/NAME.json` in the
ledger's data directory (the page runs no replay itself: the dashboard imports only `ledger`).

Shows, for the chosen report: the headline changes (p95 wait, cost, utilisation), GPU-hours,
cost and p95 wait per team side by side, the full comparison table, and the checks — recorded
admissions the baseline did not reproduce (with their causes), flags and the capacity sentence.
The sidebar's filters do not apply here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair as alt
import orjson
import pandas as pd
import streamlit as st

from dashboard import common, i18n, whatif_text
from dashboard.i18n import N_, _
from ledger.read.job_history import duration_text

SAVED_DIR = "whatif"  # `tally whatif --save` writes here, under the data directory
SIDES = (N_("baseline"), N_("alternative"))
FIGURES = (_("GPU-hours"), _("cost"), _("p95 wait (h)"))


def _saved(folder: Path) -> dict[str, dict[str, Any]]:
    """The readable saved reports by name, newest file first."""
    out: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        return out
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files:
        try:
            doc = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
            out[str(doc.get("name") or path.stem)] = doc
    return out


st.title(_("What-if: policy replays"))
reports = _saved(common.data_dir() / SAVED_DIR)
if not reports:
    st.info(
        _(
            "No saved what-if yet. Replay a window of history under another configuration and "
            "keep the result for this page: `tally whatif --since 2026-11-01 --until 2026-12-01 "
            "--config-b other.yaml --add-gpus 'NVIDIA H100 80GB HBM3=8' --save nov-more-h100`. "
            "Reports are read from `{directory}`."
        ).format(directory=common.data_dir() / SAVED_DIR)
    )
    st.stop()

name = st.selectbox(_("Saved what-if"), list(reports), key="whatif_report")
doc = reports[name]
st.caption(
    _(
        "Jobs submitted {since} – {until} ({jobs} replayed) · baseline `{baseline}` · "
        "alternative `{alternative}`"
    ).format(
        since=common.when(doc["since_us"]),
        until=common.when(doc["until_us"]),
        jobs=i18n.number(doc["jobs"]),
        baseline=doc.get("baseline_config", "?"),
        alternative=doc.get("alternative_config", "?"),
    )
    + "".join(f" + {n} × {m}" for m, n in (doc.get("added_gpus") or {}).items())
    + _(" · the sidebar's filters do not apply here.")
)

teams = pd.DataFrame(doc.get("teams") or [])
a, b, c, d = st.columns(4)
p95 = doc.get("wait_p95_us") or [0, 0]
a.metric(
    _("p95 wait"),
    duration_text(p95[1], i18n.translator()),
    delta=_("{change} h").format(change=f"{(p95[1] - p95[0]) / 3_600_000_000:+.1f}"),
    delta_color="inverse",
)
if not teams.empty:
    cost = [int(teams[f"{s}_cost_micros"].sum()) for s in SIDES]
    b.metric(_("Cost"), common.money(cost[1]), delta=common.money(cost[1] - cost[0]),
             delta_color="inverse")  # fmt: skip
util = doc.get("utilisation_bp") or [0, 0]
c.metric(
    _("Utilisation"),
    f"{util[1] / 100:.1f}%",
    delta=_("{change} pp").format(change=f"{(util[1] - util[0]) / 100:+.1f}"),
)
d.metric(_("Divergences from the record"), len(doc.get("divergences") or []))

tr = i18n.translator()
if doc.get("capacity"):
    st.success(whatif_text.capacity(doc, tr))
for flag in doc.get("flags") or []:
    st.warning(whatif_text.flag(flag, tr))

if not teams.empty:
    st.header(_("Per team, baseline beside alternative"))
    long = pd.DataFrame(
        [
            (row["team"], _(side), label, value)
            for row in teams.to_dict("records")
            for side in SIDES
            for label, value in (
                (FIGURES[0], common.hours(row[f"{side}_gpu_ms"])),
                (FIGURES[1], common.amount(row[f"{side}_cost_micros"])),
                (FIGURES[2], (row[f"{side}_wait_p95_us"] or 0) / 3_600_000_000),
            )
        ],
        columns=["team", "scenario", "figure", "value"],
    )
    for figure in FIGURES:
        st.subheader(figure)
        st.altair_chart(
            alt.Chart(long[long["figure"] == figure])
            .mark_bar()
            .encode(
                x=alt.X("team:N", title=_("Team")),
                xOffset=alt.XOffset("scenario:N", sort=[_(s) for s in SIDES]),
                y=alt.Y("value:Q", title=figure),
                color=alt.Color("scenario:N", sort=[_(s) for s in SIDES], title=_("Scenario")),
                tooltip=[
                    alt.Tooltip("team:N", title=_("Team")),
                    alt.Tooltip("scenario:N", title=_("Scenario")),
                    alt.Tooltip("value:Q", format=",.2f", title=figure),
                ],
            ),
            width="stretch",
        )

st.header(_("Everything compared"))
rows = pd.DataFrame(doc["rows"], columns=["metric", "scope", "baseline", "alternative"])
st.dataframe(
    pd.DataFrame([whatif_text.row(r, tr) for r in doc["rows"]], columns=rows.columns),
    hide_index=True,
    column_config={
        "metric": _("Metric"),
        "scope": _("Scope"),
        "baseline": _("baseline"),
        "alternative": _("alternative"),
    },
)
st.download_button(
    _("Download CSV"),
    common.csv_text(list(rows.columns), rows.values.tolist()),
    f"whatif-{name}.csv",
    "text/csv",
    key="whatif-csv",
)

st.header(_("Recorded admissions the baseline did not reproduce"))
divergences = doc.get("divergences") or []
if divergences:
    st.dataframe(
        pd.DataFrame(
            [whatif_text.divergence(d, tr) for d in divergences],
            columns=["job_id", "recorded", "replayed", "cause"],
        ),
        hide_index=True,
        column_config={
            "job_id": _("Job"),
            "recorded": _("Recorded"),
            "replayed": _("Replayed"),
            "cause": _("Cause"),
        },
    )
else:
    st.dataframe(
        pd.DataFrame([(_("every recorded admission reproduced"),)], columns=["result"]),
        hide_index=True,
        column_config={"result": _("Result")},
    )
