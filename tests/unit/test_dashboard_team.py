"""The Team page and the capacity page's queue waits (Streamlit AppTest) on the seeded ledger,
whose jobs-topic history went through the worker's ingest into the raw-event archive: the
numbers shown equal the ledger queries, the filters change them, the explanation names the
wait reason and the preemptor, and an empty ledger shows how to submit a job."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import common
from ledger.balances import budget_status
from ledger.job_events import PreemptReason, WaitReason
from ledger.read import job_history, rollups
from ledger.read.balances import sealed_balances
from ledger.read.reports import ReportQueries, cost_report
from tests.conftest import REPO
from tests.unit.test_dashboard_seed import (
    BIG_NOTE,
    END_US,
    H100,
    HOLD_MICROS,
    JOBS_TOPIC,
    seed_ledger,
)

APP = str(REPO / "dashboard" / "app.py")
TEAM = "page_team.py"
CAPACITY = "page_capacity.py"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_ledger(tmp_path_factory.mktemp("team") / "ledger")


@pytest.fixture
def q(seeded):
    queries = ReportQueries(seeded)
    yield queries
    queries.close()


def _app(monkeypatch, data_dir: Path, page: str = TEAM, team: str | None = None) -> AppTest:
    monkeypatch.setenv("TALLY_DATA_DIR", str(data_dir))
    monkeypatch.setenv("TALLY_CURRENCY", "USD")
    monkeypatch.delenv("TALLY_JOBS_TOPIC", raising=False)
    monkeypatch.delenv("TALLY_FAIR_SHARE_HALF_LIFE_HOURS", raising=False)
    app = AppTest.from_file(APP, default_timeout=60).run()
    app.switch_page(page).run()
    if team is not None:
        app.selectbox(key="team").set_value(team).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def _frame(app: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page with `column`."""
    for element in app.dataframe:
        if column in element.value.columns:
            return element.value
    raise AssertionError(f"no table with a {column!r} column")


def _frames(app: AppTest) -> list[pd.DataFrame]:
    return [element.value for element in app.dataframe]


def _metric(app: AppTest, label: str) -> str:
    return next(m.value for m in app.metric if m.label == label)


def _money(micros: int) -> float:
    return round(micros / 1e6, 6)


# ---------------------------------------------------------------------- jobs and costs


def test_jobs_costs_and_budget_equal_the_ledger(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, team="vision")
    assert app.selectbox(key="period").value == "2026-11"
    waiting = _frame(app, "reason")
    assert list(waiting["job"]) == ["job-v-big"]
    assert list(waiting["reason"]) == [job_history.WAIT_SHORT[WaitReason.QUOTA_EXHAUSTED]]
    assert list(waiting["note"]) == [BIG_NOTE]
    assert _metric(app, "Jobs waiting") == "1"

    totals = {c.job_id: c for c in rollups.job_costs(q, rollups.Filters(None, "vision"))}
    running = _frame(app, "running")
    assert sorted(running["job"]) == ["job-notebook", "job-v4", "job-w4"]
    assert _metric(app, "Jobs running") == "3"
    for row in running.itertuples():
        assert round(row.cost, 6) == _money(totals[row.job].money_micros) > 0
    ended = _frame(app, "outcome")
    # active in November: ended on or after its first day
    assert sorted(ended["job"]) == ["job-v1", "job-v2", "job-v3", "job-w2", "job-w3"]
    for row in ended.itertuples():
        assert round(row.cost, 6) == _money(totals[row.job].money_micros)

    per_job = _frame(app, "idle_waste")
    assert list(per_job.columns) == [  # the job-cost table's (`dashboard.job_costs`), and state
        "job", "project", "user", "pools", "gpu_hours", "cost", "idle_waste", "state",
    ]  # fmt: skip
    expected = rollups.job_costs(q, rollups.Filters("2026-11", "vision"))
    assert list(per_job["job"]) == [c.job_id for c in expected]
    assert [round(c, 6) for c in per_job["cost"]] == [_money(c.money_micros) for c in expected]
    report = cost_report(q, ("team",), "2026-11", where={"team": "vision"})
    assert round(per_job["cost"].sum(), 6) == _money(report.consumer_micros)

    status = budget_status("vision", "2026-11", sealed_balances(seeded))
    assert status is not None
    (money,) = status.lines
    assert _metric(app, "Budget left") == common.money(money.remaining)
    assert _metric(app, "Granted") == common.money(money.granted)
    assert _metric(app, "Used") == common.money(money.consumed)
    assert _metric(app, "Reserved by running jobs") == common.money(HOLD_MICROS)
    assert _metric(app, "Left") == common.money(money.remaining)
    assert any("over budget" in e.value for e in app.error)


def test_quota_and_fair_share_equal_the_ledger(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, team="vision")
    quotas = _frame(app, "nominal")
    expected = rollups.team_quotas(q, "vision", JOBS_TOPIC)
    assert list(quotas["pool"]) == [x.pool for x in expected.lines]
    assert list(quotas["nominal"]) == [x.nominal_gpus for x in expected.lines] == [1, 2]
    assert list(quotas["in_use"]) == [x.in_use_gpus for x in expected.lines]
    share = rollups.fair_share(q, END_US, rollups.DEFAULT_HALF_LIFE_US)
    shown = _frame(app, "per_gpu")
    assert list(shown["team"]) == [r.team for r in share.rows]
    assert list(shown["usage"]) == pytest.approx([r.decayed_gpu_ms / 3_600_000 for r in share.rows])
    assert list(shown["weight"]) == [r.weight for r in share.rows]
    standing = share.of("vision")
    assert standing is not None
    assert _metric(app, "Fair-share order") == f"{standing.rank} of {len(share.rows)}"
    assert any("half-life of 168 hours" in c.value for c in app.caption)
    monkeypatch.setenv("TALLY_FAIR_SHARE_HALF_LIFE_HOURS", "24")
    app.run()
    shorter = rollups.fair_share(q, END_US, 24 * rollups.HOUR_US)
    assert list(_frame(app, "per_gpu")["usage"]) == pytest.approx(
        [r.decayed_gpu_ms / 3_600_000 for r in shorter.rows]
    )
    assert any("half-life of 24 hours" in c.value for c in app.caption)


def test_filters_change_the_jobs_and_their_costs(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, team="vision")
    app.selectbox(key="period").set_value("2026-10").run()
    assert not app.exception
    assert any("No job of vision is waiting" in s.value for s in app.success)
    assert "job-v0" in list(_frame(app, "outcome")["job"])
    per_job = _frame(app, "idle_waste")
    assert list(per_job.columns) == [  # the job-cost table's (`dashboard.job_costs`), and state
        "job", "project", "user", "pools", "gpu_hours", "cost", "idle_waste", "state",
    ]  # fmt: skip
    october = rollups.job_costs(q, rollups.Filters("2026-10", "vision"))
    assert [round(c, 6) for c in per_job["cost"]] == [_money(c.money_micros) for c in october]
    budget = rollups.team_budget(q, "vision", "2026-10")
    assert budget.status is not None
    assert _metric(app, "Budget left") == common.money(budget.status.lines[0].remaining)

    app.selectbox(key="period").set_value("2026-11").run()
    app.selectbox(key="pool").set_value("a100").run()
    assert list(_frame(app, "running")["job"]) == ["job-w4"]
    pooled = rollups.job_costs(q, rollups.Filters("2026-11", "vision", "a100"))
    assert list(_frame(app, "idle_waste")["job"]) == [c.job_id for c in pooled]

    app.selectbox(key="team").set_value("search").run()
    app.selectbox(key="pool").set_value(common.ALL).run()
    assert list(_frame(app, "reason")["job"]) == ["job-s-pre"]
    assert _metric(app, "Budget left") == "no budget"
    assert any("No budget was ever granted to team search" in i.value for i in app.info)


def test_without_a_sidebar_team_the_page_offers_every_team(monkeypatch, seeded):
    app = _app(monkeypatch, seeded)
    choice = app.selectbox(key="team_page")
    assert choice.options == ["search", "vision"]
    choice.set_value("vision").run()
    assert list(_frame(app, "reason")["job"]) == ["job-v-big"]


def test_usage_without_scheduler_events_says_how_to_submit_a_job(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, team="vision")
    monkeypatch.setenv("TALLY_JOBS_TOPIC", "another.jobs")  # a topic the archive does not hold
    app.run()
    assert not app.exception
    assert any(
        "No jobs of team vision" in i.value and "tally job submit" in i.value for i in app.info
    )
    assert _metric(app, "Jobs waiting") == "0"
    per_job = _frame(app, "idle_waste")  # costs still come from the postings
    expected = rollups.job_costs(q, rollups.Filters("2026-11", "vision"))
    assert list(per_job["job"]) == [c.job_id for c in expected]
    assert set(per_job["state"]) == {"not run by Tally's scheduler"}


# ---------------------------------------------------------------------- explanation


def test_the_explanation_names_the_reason_and_the_preemptor(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, team="search")
    assert app.selectbox(key="explain_job").value == "job-s-pre"  # the waiting job first
    (warning,) = app.warning
    assert job_history.WAIT_PLAIN[WaitReason.COHORT_EXHAUSTED] in warning.value
    assert "by job-v4 of team vision" in warning.value
    assert job_history.PREEMPT_PLAIN[PreemptReason.RECLAIM_LENT_QUOTA] in warning.value
    why = rollups.job_explanation(q, JOBS_TOPIC, "job-s-pre", END_US)
    assert warning.value == why.headline
    assert list(_frame(app, "what")["what"]) == [t.text for t in why.timeline]
    assert any(why.advice in m.value for m in app.markdown)
    assert _metric(app, "Times stopped for other jobs") == "1"

    app.selectbox(key="explain_job").set_value("job-a1").run()
    (error,) = app.error
    assert "failed" in error.value and "(exit code 1)" in error.value

    app.selectbox(key="team").set_value("vision").run()
    (warning,) = app.warning
    assert job_history.WAIT_PLAIN[WaitReason.QUOTA_EXHAUSTED] in warning.value
    assert BIG_NOTE in warning.value
    assert "waiting for 3 h 00 min" in warning.value


# ---------------------------------------------------------------------- capacity: queue waits


def test_capacity_shows_queue_waits_beside_the_erlang_estimate(monkeypatch, seeded, q):
    app = _app(monkeypatch, seeded, CAPACITY)
    shown = _frame(app, "p95")
    trends = sorted(rollups.queue_wait_trends(q, JOBS_TOPIC), key=lambda d: (-d.day_us, d.pool))
    assert list(zip(shown["pool"], shown["jobs"], strict=True)) == [
        (d.pool, d.jobs) for d in trends
    ]
    assert list(shown["p95"]) == pytest.approx([d.p95_us / 60_000_000 for d in trends])
    assert list(shown["p50"]) == pytest.approx([d.p50_us / 60_000_000 for d in trends])
    app.selectbox(key="model").set_value(H100).run()
    found = rollups.demand(q, H100, END_US - 5 * rollups.DAY_US, END_US)
    seen = rollups.observed_queue_waits(q, JOBS_TOPIC, H100, found.since_us, END_US)
    assert _metric(app, "Observed p95 wait") == f"{seen.p95_us / 60_000_000:,.0f} min"
    app.selectbox(key="pool").set_value("a100").run()
    assert set(_frame(app, "p95")["pool"]) == {"a100"}


# ---------------------------------------------------------------------- empty


def test_an_empty_ledger_says_how_to_submit_a_job(monkeypatch, tmp_path):
    app = _app(monkeypatch, tmp_path / "nothing-yet")
    (info,) = app.info
    assert "No jobs yet" in info.value and "tally job submit" in info.value
    assert len(app.dataframe) == 0
    capacity = _app(monkeypatch, tmp_path / "nothing-yet", CAPACITY)
    assert any("No sealed usage yet" in i.value for i in capacity.info)
