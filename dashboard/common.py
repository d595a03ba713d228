"""What every dashboard page shares: where the ledger is, which topic carries the scheduler's
job events, cached queries, the sidebar filters and how amounts are written.

Pages hold no business logic: every number comes from a `ledger` query called through `query`,
which caches its result with `st.cache_data` keyed by the ledger's version (the manifest's
bytes and the closed-period records), so a newly sealed segment invalidates the cache and an
unchanged ledger renders from memory.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Callable
from datetime import datetime, tzinfo
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import streamlit as st

from dashboard import i18n
from dashboard.i18n import N_, _
from ledger.audit import AuditRecord, verify_chain
from ledger.periods import Period, local_time, zone_name
from ledger.pricing import PriceBook, decode_price_book
from ledger.read import job_history, rollups
from ledger.read.audit import audit_trail
from ledger.read.focus import ExportFormat, FocusContext
from ledger.read.reports import IdleSharing, ReportQueries, cost_report, idle_report
from ledger.read.statements import team_statement
from ledger.store import replica
from ledger.store.identity import recorded_zone
from ledger.units import MICROS_PER_UNIT, MS_PER_HOUR

ALL = "(all)"
SHARING_HELP = {
    IdleSharing.NONE: N_("none — unallocated GPUs stay a separate line nobody pays for"),
    IdleSharing.WEIGHTED: N_(
        "weighted — each row pays a share in proportion to its GPU time on that pool and model"
    ),
    IdleSharing.EVEN: N_("even — each row that used the pool and model pays an equal share"),
}  # N_: translate with _() where shown


def data_dir() -> Path:
    """The ledger's directory; with the sealed ledger on an object store ($TALLY_SEGMENTS_URL),
    its read cache under it, pulled from the store at most every `_PULL_EVERY_S`."""
    directory = Path(os.environ.get("TALLY_DATA_DIR", ".tally/data"))
    store = replica.store_from_env(os.environ)
    if store is None:
        return directory
    cache = directory / replica.REPLICA_DIR
    now = time.monotonic()
    if now - _pulled_at.get(str(cache), -_PULL_EVERY_S) >= _PULL_EVERY_S:
        replica.pull(store, cache)
        _pulled_at[str(cache)] = now
    return cache


_PULL_EVERY_S = 5.0
_pulled_at: dict[str, float] = {}


def zone() -> tzinfo:
    """The ledger's time zone (`ledger.store.identity`): its months and days."""
    return recorded_zone(data_dir())


def period(label: str | None) -> Period | None:
    """The month `label` of the ledger's time zone (None: all periods)."""
    return rollups.period_of(label, zone())


def currency() -> str:
    return os.environ.get("TALLY_CURRENCY", "USD")


def jobs_topic() -> str:
    """The topic whose archived messages are the scheduler's job events ($TALLY_JOBS_TOPIC,
    the configuration's `topics.jobs`; default `tally.jobs`)."""
    return os.environ.get("TALLY_JOBS_TOPIC") or job_history.DEFAULT_JOBS_TOPIC


def half_life_us() -> int:
    """The fair-share half-life ($TALLY_FAIR_SHARE_HALF_LIFE_HOURS, the configuration's
    `scheduler.fair_share_half_life_hours`; default 168 hours, the scheduler's default)."""
    try:
        hours = float(os.environ.get("TALLY_FAIR_SHARE_HALF_LIFE_HOURS", ""))
    except ValueError:
        return rollups.DEFAULT_HALF_LIFE_US
    return int(hours * rollups.HOUR_US) if hours > 0 else rollups.DEFAULT_HALF_LIFE_US


def prices() -> PriceBook | None:
    """The configuration's price book ($TALLY_PRICES, set by `tally up` and `tally dashboard`),
    or None when unset or unreadable: the FOCUS export then prices with applied prices only."""
    text = os.environ.get("TALLY_PRICES")
    if not text:
        return None
    try:
        return decode_price_book(text)
    except ValueError:
        return None


def _focus(q: ReportQueries, period: str, fmt: str, cur: str) -> tuple[bytes, int]:
    context = FocusContext(currency=cur)
    return rollups.focus_bytes(q, period, ExportFormat(fmt), context, prices())


def _statement(q: ReportQueries, team: str, period: str, cur: str, sharing: str) -> Any:
    return team_statement(q, team, period, cur, IdleSharing(sharing))


def _cost_report(q: ReportQueries, dims: tuple[str, ...], period: str | None, sharing: str) -> Any:
    return cost_report(q, dims, period, IdleSharing(sharing))


def _idle_report(q: ReportQueries, period: str | None, sharing: str) -> Any:
    return idle_report(q, period, IdleSharing(sharing))


# The queries a page may call, by name (the cache key names the query, never a closure).
QUERIES: dict[str, Callable[..., Any]] = {
    "fleet_health": rollups.fleet_health,
    "extent": rollups.extent,
    "cost_over_time": rollups.cost_over_time,
    "cost_table": rollups.cost_table,
    "top_jobs": rollups.top_jobs,
    "idle_waste": rollups.idle_waste,
    "budget_burn": rollups.budget_burn,
    "fleet_now": rollups.fleet_now,
    "utilisation_heatmap": rollups.utilisation_heatmap,
    "utilisation_distribution": rollups.utilisation_distribution,
    "utilisation_summary": rollups.utilisation_summary,
    "occupancy": rollups.occupancy,
    "nodes_last_seen": rollups.nodes_last_seen,
    "daily_usage": rollups.daily_usage,
    "usage_trend": rollups.usage_trend,
    "model_trends": rollups.model_trends,
    "demand": rollups.demand,
    "job_history": rollups.job_history_of,
    "job_explanation": rollups.job_explanation,
    "job_costs": rollups.job_costs,
    "team_budget": rollups.team_budget,
    "team_quotas": rollups.team_quotas,
    "fair_share": rollups.fair_share,
    "requests": rollups.requests,
    "queue_wait_trends": rollups.queue_wait_trends,
    "observed_queue_waits": rollups.observed_queue_waits,
    "focus": _focus,
    "statement": _statement,
    "cost_report": _cost_report,
    "idle_report": _idle_report,
}


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(name: str, directory: str, version: str, args: tuple[Any, ...]) -> Any:
    del version  # part of the cache key only
    queries = ReportQueries(directory)
    try:
        return QUERIES[name](queries, *args)
    finally:
        queries.close()


@st.cache_data(show_spinner=False, max_entries=8)
def _audit(directory: str, version: str) -> tuple[tuple[AuditRecord, ...], str | None]:
    del version  # part of the cache key only
    records = tuple(audit_trail(directory))
    broken = verify_chain(records)
    return records, None if broken is None else str(broken)


def audit() -> tuple[tuple[AuditRecord, ...], str | None]:
    """The sealed audit trail, and where its hash chain breaks (None: intact), cached per
    ledger version (the trail grows only at a seal, which rewrites the archive manifest)."""
    directory = data_dir()
    return _audit(str(directory), rollups.ledger_version(directory))


def query(name: str, *args: Any) -> Any:
    """The result of ledger query `name` over the sealed ledger, cached per ledger version."""
    directory = data_dir()
    return _cached(name, str(directory), rollups.ledger_version(directory), args)


def closed_periods() -> tuple[str, ...]:
    return rollups.closed_periods(data_dir())


# ------------------------------------------------------------------------------ filters


def sidebar_filters(
    extent: rollups.Extent, job_teams: tuple[str, ...] = (), only_team: str | None = None
) -> rollups.Filters:
    """The period, team and pool selectors (in the sidebar); their values as `Filters`.

    Teams are those with usage in the ledger and, from `job_teams`, those with scheduled jobs;
    `only_team` (a signed-in team role's) is then the one team offered and always chosen.
    """
    closed = set(closed_periods())
    teams = sorted(set(extent.teams) | set(job_teams))
    choices = [ALL, *teams] if only_team is None else [only_team]
    periods = [ALL, *extent.periods]

    def period_label(label: str) -> str:
        if label == ALL:
            return _("All periods")
        return (_("{period} · closed") if label in closed else _("{period} · open")).format(
            period=label
        )

    with st.sidebar:
        st.header(_("Filters"))
        period = st.selectbox(
            _("Accounting period"),
            periods,
            index=1 if len(periods) > 1 else 0,
            format_func=period_label,
            key="period",
            help=_(
                "A month ({zone}, the ledger's time zone). Costs count in the month they were "
                "booked into; a closed month never changes."
            ).format(zone=zone_name(zone())),
        )
        team = st.selectbox(
            _("Team"),
            choices,
            format_func=lambda t: _("All teams") if t == ALL else t,
            key="team",
        )
        pool = st.selectbox(
            _("GPU pool"),
            [ALL, *extent.pools],
            format_func=lambda p: _("All pools") if p == ALL else p,
            key="pool",
        )
    return rollups.Filters(
        period=None if period in (ALL, None) else period,
        team=None if team in (ALL, None) else team,
        pool=None if pool in (ALL, None) else pool,
    )


def current_filters() -> rollups.Filters:
    """The filters the sidebar holds (set by the navigation shell before a page runs)."""
    value = st.session_state.get("filters")
    return value if isinstance(value, rollups.Filters) else rollups.Filters()


# ------------------------------------------------------------------------------ formatting


def money(micros: int, places: int = 2) -> str:
    """Integer micro-units as text with the currency, rounded half-even (display only)."""
    value = (Decimal(micros) / MICROS_PER_UNIT).quantize(
        Decimal(1).scaleb(-places), ROUND_HALF_EVEN
    )
    return f"{i18n.number(value, places)} {currency()}"


def amount(micros: int) -> float:
    """Micro-units as a float for tables and charts (display only; the ledger stays integer)."""
    return micros / MICROS_PER_UNIT


def hours(gpu_ms: int) -> float:
    return gpu_ms / MS_PER_HOUR


def csv_text(headers: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(["" if v is None else v for v in row] for row in rows)
    return out.getvalue()


def when(time_us: int | None) -> str:
    """`time_us` to the minute on the ledger's zone's clock, the zone named (`—`: none)."""
    if time_us is None:
        return "—"
    return local_when(time_us)


def timestamp(time_us: int) -> datetime:
    """A time a table or chart shows: the ledger's zone's wall clock (`wall_clock`); the
    column's or axis's title names the zone (`zone_label`), a chart reads it on a `utc` scale."""
    return wall_clock(time_us)


def zone_label() -> str:
    """The ledger's time zone as the pages name it (`Asia/Shanghai`, `UTC`)."""
    return zone_name(zone())


def local_when(time_us: int) -> str:
    """`time_us` to the minute on the ledger's zone's clock, the zone named."""
    return i18n.date_time(time_us, zone=zone())


def wall_clock(time_us: int) -> datetime:
    """`time_us` as the ledger's zone's wall-clock time, without a zone (a chart shows it with
    `utc…` time units, a table as it is: the browser's own zone does not move it)."""
    return local_time(time_us, zone()).replace(tzinfo=None)


def no_data(what: str) -> None:
    """The empty state of a page on a ledger with nothing sealed yet."""
    st.info(
        _(
            "No sealed usage yet, so there is no {what} to show. Once the worker has consumed "
            "samples and sealed its first segment (a few seconds after `make up` starts), it "
            "appears here. Ledger directory: `{directory}`."
        ).format(what=what, directory=data_dir())
    )


SUBMIT_EXAMPLE = (
    "\n\n```sh\ntally job submit -q dev -p <project> --gpus 1 --estimate 2h -- python train.py"
    "\ntally job list\n```\n\n"
)


def no_jobs(who: str = "") -> None:
    """The empty state of the team page: no scheduler events yet (for `who`, or anyone)."""
    head = (
        _("No jobs of {who} yet in the ledger's record of the scheduler.").format(who=who)
        if who
        else _("No jobs yet in the ledger's record of the scheduler.")
    )
    st.info(
        head
        + " "
        + _("Submit one with the `tally` CLI (a team's token in `TALLY_TOKEN`):")
        + SUBMIT_EXAMPLE
        + _(
            "It appears here, with why it waits and what it costs, a few seconds after the "
            "scheduler publishes its events and the worker seals them (jobs topic `{topic}`, "
            "ledger directory `{directory}`)."
        ).format(topic=jobs_topic(), directory=data_dir())
    )


def duration_hours(us: int) -> float:
    """Microseconds as hours (display only)."""
    return us / rollups.HOUR_US


def sealed_caption(extent: rollups.Extent) -> None:
    st.caption(
        _("Sealed ledger in `{directory}` · sealed up to {when} · amounts in {currency}").format(
            directory=data_dir(), when=when(extent.newest_us), currency=currency()
        )
    )
