"""Team statements over the fleet ledger of `tests.unit.test_reports`, with budgets."""

from __future__ import annotations

import orjson
import pytest

from ledger.read.reports import IdleSharing, ReportQueries
from ledger.read.statements import Budget, StatementLine, team_statement
from ledger.units import Unit
from tests.builders import T0_US
from tests.ledger_builders import HOUR_US, NOV, OCT, build_fleet


@pytest.fixture(scope="module")
def queries(tmp_path_factory):
    builder = build_fleet(tmp_path_factory.mktemp("statement") / "ledger")
    builder.grant("vision", 1_000_000)
    builder.grant("vision", 3_600_000, Unit.GPU_MS)
    builder.grant("vision", 200_000, at_us=T0_US + HOUR_US)  # a second grant adds up
    builder.grant("language", 50_000, period=OCT, at_us=T0_US - 48 * HOUR_US)  # October only
    q = ReportQueries(builder.seal())
    yield q
    q.close()


@pytest.mark.parametrize(
    ("team", "expected"),
    [
        pytest.param(
            "vision",
            {
                "gpu_ms": 136_000,
                "money_micros": 130_000,
                "idle_gpu_ms": 18_000,
                "idle_waste_micros": 18_000,
                "corrections_micros": -6_000,
                "prior_period_micros": 0,
                "cost_centres": ("research",),
            },
            id="vision-idle-waste-and-a-credit",
        ),
        pytest.param(
            "language",
            {
                "gpu_ms": 66_000,
                "money_micros": 134_000,
                "idle_gpu_ms": 0,
                "idle_waste_micros": 0,
                "corrections_micros": 2_000,
                "prior_period_micros": 12_000,
                "cost_centres": ("nlp",),
            },
            id="language-late-usage-and-an-adjustment",
        ),
        pytest.param(
            "robotics",
            {
                "gpu_ms": 0,
                "money_micros": 0,
                "idle_gpu_ms": 0,
                "idle_waste_micros": 0,
                "corrections_micros": 0,
                "prior_period_micros": 0,
                "cost_centres": (),
            },
            id="a-team-without-usage",
        ),
    ],
)
def test_statement_totals(queries, team, expected):
    statement = team_statement(queries, team, NOV, "USD")
    got = {name: getattr(statement, name) for name in expected}
    assert got == expected


def test_cost_by_project_and_by_user(queries):
    statement = team_statement(queries, "vision", NOV, "USD")
    assert statement.by_project == (
        StatementLine("segmentation", 82_000, 82_000, 0, 0),
        StatementLine("detection", 54_000, 48_000, 18_000, 18_000),
    )
    assert statement.by_user == (
        StatementLine("bob", 72_000, 72_000, 0, 0),
        StatementLine("ada", 54_000, 48_000, 18_000, 18_000),
        StatementLine("dee", 10_000, 10_000, 0, 0),
    )
    assert sum(p.money_micros for p in statement.by_project) == statement.money_micros


@pytest.mark.parametrize(
    ("team", "period", "budgets"),
    [
        pytest.param(
            "vision",
            NOV,
            (
                Budget(Unit.GPU_MS, 3_600_000, 136_000),
                Budget(Unit.MONEY, 1_200_000, 130_000),
            ),
            id="money-and-gpu-time-grants",
        ),
        pytest.param("language", NOV, (), id="octobers-grant-is-not-novembers"),
        pytest.param("language", OCT, (Budget(Unit.MONEY, 50_000, 0),), id="october"),
    ],
)
def test_budget_granted_used_remaining(queries, team, period, budgets):
    statement = team_statement(queries, team, period, "USD")
    assert statement.budgets == budgets
    assert [b.remaining for b in statement.budgets] == [b.granted - b.used for b in budgets]


def test_statement_with_idle_sharing_matches_the_team_report(queries):
    plain = team_statement(queries, "vision", NOV, "USD")
    shared = team_statement(queries, "vision", NOV, "USD", IdleSharing.WEIGHTED)
    assert (plain.shared_idle_micros, plain.total_micros) == (0, 130_000)
    assert (shared.shared_idle_micros, shared.total_micros) == (54_001, 184_001)


def test_text_rendering(queries):
    text = team_statement(queries, "vision", NOV, "EUR", IdleSharing.EVEN).render_text()
    for expected in (
        "Statement for team vision, 2026-11 (EUR)",
        "Cost centre: research",
        "Cost:          0.13 EUR for 0.038 GPU-hours",
        "Idle waste:    0.02 EUR for 0.005 GPU-hours allocated but idle",
        "Corrections:   -0.01 EUR",
        "Shared idle:   0.05 EUR of unallocated capacity (even)",
        "By project",
        "PROJECT",
        "segmentation",
        "By user",
        "Budget",
        "GPU-hours",
    ):
        assert expected in text, expected
    assert "no budget" not in text


def test_text_says_when_there_is_no_budget(queries):
    text = team_statement(queries, "language", NOV, "USD").render_text()
    assert "Budget: no budget granted to language for 2026-11" in text


def test_dict_for_json(queries):
    data = team_statement(queries, "vision", NOV, "USD").to_dict()
    assert orjson.loads(orjson.dumps(data)) == data
    assert data["cost"] == {"micros": 130_000, "amount": "0.130000"}
    assert data["idle_waste"] == {"micros": 18_000, "amount": "0.018000"}
    assert data["by_project"][0]["name"] == "segmentation"
    assert data["budget"] == [
        {"unit": "gpu_ms", "granted": 3_600_000, "used": 136_000, "remaining": 3_464_000},
        {"unit": "money_micros", "granted": 1_200_000, "used": 130_000, "remaining": 1_070_000},
    ]
    assert team_statement(queries, "language", NOV, "USD").to_dict()["budget"] is None


def test_rows_for_csv(queries):
    headers, rows = team_statement(queries, "vision", NOV, "USD").rows()
    assert headers == ["section", "name", "gpu_hours", "cost", "idle_gpu_hours", "idle_waste"]
    assert all(len(row) == len(headers) for row in rows)
    assert rows[0] == ["total", "vision", "0.037778", "0.130000", "0.005000", "0.018000"]
    sections = [row[0] for row in rows]
    assert sections == [
        "total",
        "project",
        "project",
        "user",
        "user",
        "user",
        "corrections",
        "prior_period",
        "budget_granted",
        "budget_used",
        "budget_remaining",
        "budget_granted",
        "budget_used",
        "budget_remaining",
    ]
    assert rows[-1] == ["budget_remaining", "money_micros", None, "1.070000", None, None]
