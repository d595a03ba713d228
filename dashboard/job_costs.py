"""The job-cost table the Finance page (top jobs by cost) and the Team page (cost per job) both
show: its rows from `ledger.read.rollups.JobCost` and each column's label and format, defined
once so the two pages name and format a job's cost alike. Each page adds its own columns
(Finance: the team and when the job used GPUs first and last; Team: the job's state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from dashboard import common
from dashboard.i18n import _
from ledger.read import rollups

TEAM, FIRST_LAST = "team", "first_last"  # the optional column groups


def rows(costs: Sequence[rollups.JobCost], *extra: str) -> dict[str, list[Any]]:
    """The table's columns (job, [team], project, user, pools, GPU-hours, cost, idle waste,
    [first and last usage]) for `costs`, with the `extra` groups asked for."""
    out: dict[str, list[Any]] = {"job": [c.job_id for c in costs]}
    if TEAM in extra:
        out["team"] = [c.team for c in costs]
    out |= {
        "project": [c.project for c in costs],
        "user": [c.user for c in costs],
        "pools": [c.pools for c in costs],
        "gpu_hours": [common.hours(c.gpu_ms) for c in costs],
        "cost": [common.amount(c.money_micros) for c in costs],
        "idle_waste": [common.amount(c.idle_waste_micros) for c in costs],
    }
    if FIRST_LAST in extra:
        out["first"] = [common.timestamp(c.first_us) for c in costs]
        out["last"] = [common.timestamp(c.last_us) for c in costs]
    return out


def column_config(currency: str) -> dict[str, Any]:
    """Every column's label and format (a page shows the columns its frame has)."""
    zone = common.zone_label()
    return {
        "job": _("Job"),
        "team": _("Team"),
        "project": _("Project"),
        "user": _("User"),
        "pools": _("Pool(s)"),
        "gpu_hours": st.column_config.NumberColumn(_("GPU-hours"), format="%.2f"),
        "cost": st.column_config.NumberColumn(_("Cost") + f" ({currency})", format="%.2f"),
        "idle_waste": st.column_config.NumberColumn(
            _("Idle waste") + f" ({currency})", format="%.2f"
        ),
        "first": st.column_config.DatetimeColumn(
            _("First usage ({zone})").format(zone=zone), format="YYYY-MM-DD HH:mm"
        ),
        "last": st.column_config.DatetimeColumn(
            _("Last usage ({zone})").format(zone=zone), format="YYYY-MM-DD HH:mm"
        ),
    }
