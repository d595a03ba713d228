"""Every dashboard page (Streamlit AppTest) on the seeded ledger and on an empty one: the numbers
shown equal the ledger queries, and the filters change them as they should."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import common
from ledger.pricing import Price, PriceBook, decode_price_book, encode_price_book
from ledger.read import rollups
from ledger.read.focus import ExportFormat, FocusContext
from ledger.read.reports import IdleSharing, ReportQueries, cost_report
from ledger.read.statements import team_statement
from tally.config import load_config
from tally.stack import ledger_env
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config
from tests.unit.test_dashboard_seed import A100, END_US, H100, seed_ledger
from tests.unit.test_recurring_ingest import ALLOWANCE, recurring_ledger

APP = str(REPO / "dashboard" / "app.py")
PLATFORM = "page_platform.py"
CAPACITY = "page_capacity.py"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_ledger(tmp_path_factory.mktemp("pages") / "ledger")


@pytest.fixture
def q(seeded):
    queries = ReportQueries(seeded)
    yield queries
    queries.close()


def _app(monkeypatch, data_dir: Path, page: str | None = None) -> AppTest:
    monkeypatch.setenv("TALLY_DATA_DIR", str(data_dir))
    monkeypatch.setenv("TALLY_CURRENCY", "USD")
    app = AppTest.from_file(APP, default_timeout=60).run()
    if page is not None:
        app.switch_page(page).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def _frame(app: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page with `column`."""
    for element in app.dataframe:
        if column in element.value.columns:
            return element.value
    raise AssertionError(f"no table with a {column!r} column")


def _metric(app: AppTest, label: str) -> str:
    return next(m.value for m in app.metric if m.label == label)


def _money(micros: int) -> float:
    return round(micros / 1e6, 6)


# ---------------------------------------------------------------------- finance


def test_finance_totals_equal_the_cost_report(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    assert app.selectbox(key="period").value == "2026-11"  # the newest period by default
    shown = _frame(app, "team")
    report = cost_report(q, ("team",), "2026-11")
    assert {r.team: round(r.cost, 6) for r in shown.itertuples()} == {
        line.keys[0]: _money(line.money_micros) for line in report.lines
    }
    assert {r.team: round(r.idle_waste, 6) for r in shown.itertuples()} == {
        line.keys[0]: _money(line.idle_waste_micros) for line in report.lines
    }
    assert _metric(app, "GPU cost") == common.money(report.consumer_micros)
    assert _metric(app, "Unallocated capacity") == common.money(report.unallocated_micros)
    assert any("2026-11 is open" in w.value for w in app.warning)


def test_period_filter_selects_the_booked_month_and_marks_it_closed(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    app.selectbox(key="period").set_value("2026-10").run()
    assert not app.exception
    shown = _frame(app, "team")
    report = cost_report(q, ("team",), "2026-10")
    assert {r.team: round(r.cost, 6) for r in shown.itertuples()} == {
        line.keys[0]: _money(line.money_micros) for line in report.lines
    }
    assert any("2026-10 is closed" in s.value for s in app.success)
    app.selectbox(key="period").set_value(common.ALL).run()
    total = cost_report(q, ("team",))
    assert _metric(app, "GPU cost") == common.money(total.consumer_micros)
    assert any("Choose a month" in i.value for i in app.info)


def test_team_and_pool_filters_narrow_every_table(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    app.selectbox(key="team").set_value("vision").run()
    app.radio(key="cost_dim").set_value("project").run()
    assert not app.exception
    shown = _frame(app, "project")
    expected = cost_report(q, ("project",), "2026-11", where={"team": "vision"})
    assert {r.project: round(r.cost, 6) for r in shown.itertuples()} == {
        line.keys[0]: _money(line.money_micros) for line in expected.lines
    }
    jobs = _frame(app, "job")
    assert set(jobs["team"]) == {"vision"}
    app.selectbox(key="pool").set_value("a100").run()
    shown = _frame(app, "project")
    expected = cost_report(q, ("project",), "2026-11", where={"team": "vision", "pool": "a100"})
    assert {r.project: round(r.cost, 6) for r in shown.itertuples()} == {
        line.keys[0]: _money(line.money_micros) for line in expected.lines
    }
    assert set(_frame(app, "job")["pools"]) == {"a100"}


def test_idle_sharing_mode_shares_unallocated_cost(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    for mode in (IdleSharing.WEIGHTED, IdleSharing.EVEN):
        app.radio(key="sharing").set_value(mode.value).run()
        assert not app.exception
        shown = _frame(app, "team")
        report = cost_report(q, ("team",), "2026-11", mode)
        assert {r.team: round(r.shared_idle, 6) for r in shown.itertuples()} == {
            line.keys[0]: _money(line.shared_idle_micros) for line in report.lines
        }
        assert {r.team: round(r.total, 6) for r in shown.itertuples()} == {
            line.keys[0]: _money(line.total_micros) for line in report.lines
        }


def test_budget_burn_down_and_forecast(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    budgets = _frame(app, "budget")
    vision = budgets[budgets.team == "vision"].iloc[0]
    statement = team_statement(q, "vision", "2026-11", "USD")
    (money,) = [b for b in statement.budgets if b.unit.value == "money_micros"]
    assert round(vision.budget, 6) == _money(money.granted)
    assert round(vision.spent, 6) == _money(money.used)
    assert round(vision.remaining, 6) == _money(money.remaining)
    (burn,) = rollups.budget_burn(q, "2026-11", END_US, "vision")
    assert round(vision.forecast, 6) == _money(burn.forecast_micros)
    assert vision.status == "over budget"
    search = budgets[budgets.team == "search"].iloc[0]
    assert search.status == "no budget" and pd.isna(search.budget)
    assert app.selectbox(key="burn_team").value == "vision"
    assert _metric(app, "Month-end forecast") == common.money(burn.forecast_micros)
    app.selectbox(key="team").set_value("search").run()
    assert any("No money budget was granted to team search" in i.value for i in app.info)


def test_top_jobs_and_idle_waste(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    jobs = _frame(app, "job")
    assert list(jobs.columns) == [  # the job-cost table's columns (`dashboard.job_costs`)
        "job", "team", "project", "user", "pools", "gpu_hours", "cost", "idle_waste", "first",
        "last",
    ]  # fmt: skip
    expected = rollups.top_jobs(q, rollups.Filters("2026-11"), 20)
    assert list(jobs["job"]) == [j.job_id for j in expected]
    assert [round(c, 6) for c in jobs["cost"]] == [_money(j.money_micros) for j in expected]
    idle = _frame(app, "idle_hours")
    waste = rollups.idle_waste(q, rollups.Filters("2026-11"))
    assert round(idle["waste"].sum(), 6) == _money(waste.idle_waste_micros) > 0
    pools = _frame(app, "model")
    assert round(pools["cost"].sum(), 6) == _money(waste.unallocated_micros)


@pytest.mark.parametrize(
    ("env", "priced"),
    [
        pytest.param(None, False, id="no-price-book"),
        pytest.param("not json", False, id="unreadable-price-book"),
        pytest.param("book", True, id="the-configs-price-book"),
    ],
)
def test_the_focus_download_prices_with_the_configs_book(monkeypatch, q, env, priced):
    book = PriceBook((Price(H100, 3_000_000), Price(A100, 2_000_000)))
    if env is None:
        monkeypatch.delenv("TALLY_PRICES", raising=False)
    else:
        monkeypatch.setenv("TALLY_PRICES", encode_price_book(book) if env == "book" else env)
    data, rows = common.QUERIES["focus"](q, "2026-11", "parquet", "USD")
    table = pq.read_table(io.BytesIO(data))
    usage = [r for r in table.to_pylist() if r["ChargeCategory"] == "Usage"]
    assert rows == table.num_rows and usage
    assert all((r["ListUnitPrice"] is not None) is priced for r in usage)
    with_book = rollups.focus_bytes(q, "2026-11", ExportFormat.PARQUET, FocusContext(), book)
    assert (pq.read_table(io.BytesIO(with_book[0])) == table) is priced


def test_exports_offer_focus_and_the_team_statement(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded)
    labels = [b.label for b in app.get("download_button")]
    assert "Download FOCUS export (CSV)" in labels
    assert "Download FOCUS export (Parquet)" in labels
    assert any(label.startswith("Download statement of search for 2026-11") for label in labels)
    app.selectbox(key="statement_team").set_value("vision").run()
    statement = team_statement(q, "vision", "2026-11", "USD")
    assert app.code[0].value == statement.render_text()


# ---------------------------------------------------------------------- platform


def test_platform_idle_gpus_now(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, PLATFORM)
    now = rollups.fleet_now(q)
    assert _metric(app, "GPUs reporting") == str(now.gpus) == "6"
    assert _metric(app, "Allocated but idle") == "1"
    assert _metric(app, "Unallocated") == "1"
    assert _metric(app, "Idle shares") == "0"
    assert int(_metric(app, "Busy")) + 1 + 1 == now.gpus  # each GPU counted once
    idle = _frame(app, "waste")
    (gpu,) = [g for g in now.idle if g.state is rollups.GpuState.ALLOCATED_IDLE]
    row = idle.iloc[0]
    assert (row.gpu, row.team, row.job) == ("GPU-H1", "vision", "job-notebook")
    assert round(row.waste, 6) == _money(gpu.money_micros)
    free = _frame(app, "cost")
    assert list(free["gpu"]) == ["GPU-H3"]


def test_platform_pool_and_team_filters(monkeypatch, seeded):
    app = _app(monkeypatch, seeded, PLATFORM)
    app.selectbox(key="pool").set_value("a100").run()
    assert not app.exception
    assert _metric(app, "GPUs reporting") == "2"
    assert _metric(app, "Unallocated") == "0"
    assert any("No allocated GPU is idle" in s.value for s in app.success)
    app.selectbox(key="pool").set_value(common.ALL).run()
    app.selectbox(key="team").set_value("search").run()
    assert _metric(app, "Allocated but idle") == "0"


def test_platform_utilisation_and_occupancy(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, PLATFORM)
    summary = _frame(app, "util_held")
    expected = rollups.utilisation_summary(q, END_US - rollups.DAY_US, END_US)
    assert list(summary["pool"]) == [u.pool for u in expected]
    assert list(summary["util"]) == pytest.approx([u.mean_util_pct / 100 for u in expected])
    occ = rollups.occupancy(q, END_US - rollups.DAY_US, END_US, rollups.DAY_US)
    allocated = sum(o.allocated_gpu_ms for o in occ)
    physical = sum(o.physical_gpu_ms for o in occ)
    assert _metric(app, "Occupancy over the 24 hours") == f"{allocated / physical:.1%}"
    nodes = _frame(app, "status")
    assert sorted(nodes["node"]) == ["node-a1", "node-h1", "node-h2"]
    app.radio(key="window").set_value("6 hours").run()
    occ = rollups.occupancy(q, END_US - 6 * rollups.HOUR_US, END_US, rollups.DAY_US)
    share = sum(o.allocated_gpu_ms for o in occ) / sum(o.physical_gpu_ms for o in occ)
    assert _metric(app, "Occupancy over the 6 hours") == f"{share:.1%}"


# ---------------------------------------------------------------------- capacity


def test_capacity_trend_forecast_and_sizing(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, CAPACITY)
    trends = _frame(app, "previous")
    expected = rollups.model_trends(q, END_US)
    assert list(trends["model"]) == [t.model for t in expected]
    app.selectbox(key="model").set_value(H100).run()
    assert not app.exception
    trend = rollups.usage_trend(q, H100, None, 28, 4)
    assert trend.forecast is not None
    assert any(trend.forecast.method in m.value for m in app.markdown)
    found = rollups.demand(q, H100, END_US - 5 * rollups.DAY_US, END_US)
    found7 = rollups.demand(q, H100, max(END_US - 7 * rollups.DAY_US, found.since_us), END_US)
    assert _metric(app, "GPUs of this model now") == str(found7.gpus) == "4"
    sizing = rollups.size_for_wait(found7, 0.5)
    assert _metric(app, "GPUs needed for p95 wait ≤ 30 min") == f"{sizing.gpus_needed:,}"
    app.number_input(key="target_min").set_value(600).run()
    relaxed = rollups.size_for_wait(found7, 10.0)
    assert _metric(app, "GPUs needed for p95 wait ≤ 600 min") == f"{relaxed.gpus_needed:,}"
    assert relaxed.gpus_needed is not None and sizing.gpus_needed is not None
    assert relaxed.gpus_needed <= sizing.gpus_needed
    app.selectbox(key="pool").set_value("a100").run()
    assert any("pool filter does (pool a100)" in c.value for c in app.caption)


# ---------------------------------------------------------------------- empty


@pytest.mark.parametrize("page", [None, PLATFORM, CAPACITY])
def test_empty_ledger_shows_what_to_expect(monkeypatch, tmp_path, page):
    app = _app(monkeypatch, tmp_path / "nothing-yet", page)
    assert any("No sealed usage yet" in i.value for i in app.info)
    assert len(app.dataframe) == 0


# top_jobs as one aggregate over every job of the selection: the two-pass query must equal it
ONE_PASS_TOP_JOBS = (
    "SELECT job_id, team, project, \"user\", string_agg(DISTINCT pool, ', ' ORDER BY pool), "
    "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
    "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money, "
    "coalesce(sum(amount) FILTER (unit = 'money_micros' AND idle), 0), min(start_us), "
    "max(end_us) FROM {postings} WHERE account LIKE 'consumer:%' AND job_id IS NOT NULL AND "
    '{where} GROUP BY ALL ORDER BY money DESC, job_id, team, project, "user" LIMIT ?'
)


@pytest.mark.parametrize(
    ("filters", "limit"),
    [
        pytest.param(rollups.Filters("2026-11"), 20, id="month"),
        pytest.param(rollups.Filters("2026-11"), 1, id="month-top-one"),
        pytest.param(rollups.Filters(None), 3, id="all-time-top-three"),
        pytest.param(rollups.Filters("2026-11", team="vision"), 20, id="one-team"),
        pytest.param(rollups.Filters("2026-11", pool="a100"), 20, id="one-pool"),
        pytest.param(rollups.Filters("2026-09"), 20, id="empty-period"),
    ],
)
def test_top_jobs_equal_one_aggregate_over_every_job(q, filters, limit):
    where, params = filters.sql()
    rows = q.rows(ONE_PASS_TOP_JOBS.replace("{where}", where), [*params, limit])
    expected = tuple(
        rollups.JobCost(r[0], r[1], r[2], r[3], r[4] or "", *(int(v) for v in r[5:])) for r in rows
    )
    assert rollups.top_jobs(q, filters, limit) == expected
    assert len(expected) <= limit


def test_the_stack_hands_the_dashboard_the_configs_price_book(tmp_path):
    data = a_config_dict(energy_prices=[{"per_kwh": "0.15"}])
    path = write_config(tmp_path / "tally.yaml", data)
    config = load_config(path)
    book = decode_price_book(ledger_env(config, path)["TALLY_PRICES"])
    assert book == config.price_book() and book.energy and book.prices


def test_finance_shows_a_recurring_budgets_allowance_and_carry(monkeypatch, tmp_path):
    november, december = recurring_ledger(tmp_path / "ledger")
    app = _app(monkeypatch, tmp_path / "ledger")
    assert app.selectbox(key="period").value == "2026-12"
    vision = _frame(app, "allowance").iloc[0]
    carried = ALLOWANCE - november.consumed
    assert (round(vision.allowance, 6), round(vision.carried, 6), round(vision.budget, 6)) == (
        _money(ALLOWANCE),
        _money(carried),
        _money(december.granted),
    )
    assert round(vision.spent, 6) == _money(december.consumed)
