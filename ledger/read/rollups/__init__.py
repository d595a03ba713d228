"""Rollups for the dashboard: the queries behind each page, as plain values.

This package owns what the Finance, Platform, Capacity-planning and Team pages *show*: every
number on those pages comes from a function here (or from `ledger.read.reports`,
`ledger.read.statements`, `ledger.read.focus`, `ledger.read.balances` and
`ledger.read.job_history`, which these build on). Each function reads the sealed postings
through `ReportQueries.rows` (a DuckDB connection of its own over the
segments the manifest lists), the jobs topic's messages out of the sealed raw-event archive
(`ledger.read.job_history.read_job_event_log`) or the readers' copy of the admin log, and returns
frozen dataclasses; the pages only render them.

Rules every rollup here keeps:
- money and GPU time are integers (micro-units, GPU-ms) in everything computed; floats appear
  only in estimates that are not ledger amounts (utilisation averages, forecasts, queueing
  estimates) and in display;
- a *period* filter selects postings booked into the period (as `ledger.read.reports` does); the
  platform and capacity rollups are about when GPUs were used and select by `start_us`;
- "now" is the newest sealed sample (`LedgerQueries.newest_sealed_us`), never the wall clock, so
  the pages describe the ledger as sealed and a historic ledger reads the same tomorrow;
- one row per usage transaction is its capacity leg (`capacity:%`, unit `gpu_ms`): it carries the
  physical GPU time and the sample's `util_pct`; consumer and unallocated legs split that time
  between owners and nobody;
- usage counts net of its reversals (`shared.USAGE_SQL`): a sample booked to `unallocated:` before
  its job's owner was known, then reversed and re-posted to the owner, counts once, as re-posted.

Modules, one per page, over what they share:
- `shared`: units, SQL fragments, the sidebar's `Filters`, `ledger_version`, `closed_periods`,
  `extent` and the jobs topic's messages (`archived_job_log`);
- `hours`: a time range read from a level grouped by hour, the parts of an hour at its ends
  from the postings (`HourSplit`);
- `finance`: cost over time and by dimension, top jobs, idle waste, budget burn, FOCUS bytes;
- `platform`: the fleet now, utilisation, occupancy, nodes last seen;
- `health`: GPU and node health, cordons, recent faults with meaning (the sealed inventory);
- `capacity`: daily usage, trends and forecasts, demand, Erlang-C sizing, queue waits;
- `team`: job history and explanations, job costs, team budget, quotas, fair share.
This package re-exports their public names (and `IdleSharing` and `period_of` from
`ledger.read.reports`, which its signatures use), so pages use `rollups.<name>`.

SQL is built only from constants and whitelisted dimension names; every value is a bound
parameter.
"""

from ledger.read.reports import IdleSharing, period_of
from ledger.read.rollups.capacity import (
    MAX_SERVERS,
    SIZING_ASSUMPTIONS,
    DailyUsage,
    Demand,
    Forecast,
    ModelTrend,
    Sizing,
    UsageTrend,
    daily_usage,
    demand,
    erlang_c,
    forecast_daily,
    model_trends,
    observed_queue_waits,
    queue_wait_trends,
    size_for_wait,
    usage_forecast_method,
    usage_trend,
    wait_quantile_hours,
)
from ledger.read.rollups.finance import (
    BUDGET_GRANT_KIND,
    BUDGET_PREFIX,
    COST_DIMENSIONS,
    BudgetBurn,
    BudgetStatus,
    CostTable,
    CostTableRow,
    IdleWaste,
    IdleWasteRow,
    JobCost,
    TimeCost,
    UnallocatedRow,
    budget_burn,
    cost_over_time,
    cost_table,
    focus_bytes,
    forecast_method,
    idle_waste,
    top_jobs,
)
from ledger.read.rollups.health import (
    FaultRow,
    FleetHealth,
    GpuHealthRow,
    NodeHealth,
    fleet_health,
    health_of,
)
from ledger.read.rollups.platform import (
    FleetNow,
    GpuState,
    HeatCell,
    IdleGpu,
    NodeSeen,
    Occupancy,
    UtilisationBand,
    UtilisationSummary,
    fleet_now,
    nodes_last_seen,
    occupancy,
    utilisation_distribution,
    utilisation_heatmap,
    utilisation_summary,
)
from ledger.read.rollups.requests import RequestRow, Requests, requests
from ledger.read.rollups.shared import (
    CAPACITY_SQL,
    DAY_US,
    HOUR_US,
    MS_PER_HOUR,
    USAGE_SQL,
    WEEK_US,
    Extent,
    Filters,
    archived_job_log,
    closed_periods,
    extent,
    ledger_version,
)
from ledger.read.rollups.team import (
    DEFAULT_HALF_LIFE_US,
    STANDING_SCALE,
    FairShare,
    FairShareRow,
    JobHistory,
    QuotaLine,
    TeamBudget,
    TeamQuotas,
    fair_share,
    job_costs,
    job_explanation,
    job_history_of,
    team_budget,
    team_quotas,
)

__all__ = [
    "BUDGET_GRANT_KIND",
    "BUDGET_PREFIX",
    "CAPACITY_SQL",
    "COST_DIMENSIONS",
    "DAY_US",
    "DEFAULT_HALF_LIFE_US",
    "HOUR_US",
    "MAX_SERVERS",
    "MS_PER_HOUR",
    "SIZING_ASSUMPTIONS",
    "STANDING_SCALE",
    "USAGE_SQL",
    "WEEK_US",
    "BudgetBurn",
    "BudgetStatus",
    "CostTable",
    "CostTableRow",
    "DailyUsage",
    "Demand",
    "Extent",
    "FairShare",
    "FairShareRow",
    "FaultRow",
    "Filters",
    "FleetHealth",
    "FleetNow",
    "Forecast",
    "GpuHealthRow",
    "GpuState",
    "HeatCell",
    "IdleGpu",
    "IdleSharing",
    "IdleWaste",
    "IdleWasteRow",
    "JobCost",
    "JobHistory",
    "ModelTrend",
    "NodeHealth",
    "NodeSeen",
    "Occupancy",
    "QuotaLine",
    "RequestRow",
    "Requests",
    "Sizing",
    "TeamBudget",
    "TeamQuotas",
    "TimeCost",
    "UnallocatedRow",
    "UsageTrend",
    "UtilisationBand",
    "UtilisationSummary",
    "archived_job_log",
    "budget_burn",
    "closed_periods",
    "cost_over_time",
    "cost_table",
    "daily_usage",
    "demand",
    "erlang_c",
    "extent",
    "fair_share",
    "fleet_health",
    "fleet_now",
    "focus_bytes",
    "forecast_daily",
    "forecast_method",
    "health_of",
    "idle_waste",
    "job_costs",
    "job_explanation",
    "job_history_of",
    "ledger_version",
    "model_trends",
    "nodes_last_seen",
    "observed_queue_waits",
    "occupancy",
    "period_of",
    "queue_wait_trends",
    "requests",
    "size_for_wait",
    "team_budget",
    "team_quotas",
    "top_jobs",
    "usage_forecast_method",
    "usage_trend",
    "utilisation_distribution",
    "utilisation_heatmap",
    "utilisation_summary",
    "wait_quantile_hours",
]
