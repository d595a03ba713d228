"""`tally admin apply`: the configuration's teams, prices, quotas and budgets become admin events,
diffed against what the ledger applied, so applying the same file twice emits nothing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdminEvent,
    AdminView,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PolicySpec,
    PriceSet,
    QuotaSet,
    TeamDefined,
    describe,
    plan_admin,
)
from ledger.ingest import IngestResult
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.rebuild import ReplaySettings
from ledger.store.side_files import load_admin_log
from ledger.units import Unit
from tally.cli import cli
from tally.components import desired_admin_state
from tally.config import ConfigError, parse_config
from tests.builders import T0_US, a_config_dict
from tests.conftest import write_config
from tests.ledger_harness import Ledger as IngestLedger

NOW = T0_US + 86_400_000_000
H100 = "NVIDIA H100 80GB HBM3"
ADMIN_ONLY = ReplaySettings(PriceBook((Price("*", 1),)), {})  # the admin events set the rest
SECTIONS = {
    "budgets": [
        {"team": "vision", "period": "2026-11", "money": "2500.00", "gpu_hours": 100},
        {"team": "language", "period": "2026-11", "gpu_hours": "12.5"},
    ],
    "quotas": [
        {"team": "vision", "pool": "h100", "model": H100, "nominal": 4, "borrowing_limit": 2}
    ],
}


def config(**changes):
    data = a_config_dict(**SECTIONS)
    data.update(changes)
    return parse_config(data)


def plan(cfg, view):
    return plan_admin(desired_admin_state(cfg), view, "alice", "apply", NOW)


class Ledger(IngestLedger):
    """A store fed through the admin topic, sealed after every batch, and its readers' view of
    the applied admin log."""

    def __init__(self, store: DuckDBStore) -> None:
        super().__init__(store, ADMIN_ONLY, topics=None)

    def send(self, events: Iterable[AdminEvent]) -> IngestResult:
        result = self.admin(*events)
        self.store.seal()
        return result

    def view(self) -> AdminView:
        return AdminView.from_log(load_admin_log(self.store.segments_root))


@pytest.fixture
def ledger(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as store:
        yield Ledger(store)


def test_config_budgets_and_quotas_are_exact_integers():
    cfg = config()
    assert [(b.team, b.money, b.gpu_hours) for b in cfg.budgets] == [
        ("vision", 2_500_000_000, 360_000_000),
        ("language", None, 45_000_000),
    ]
    assert cfg.quotas[0].lending_limit is None


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"budgets": [{"team": "nobody", "period": "2026-11", "money": 1}]}, "unknown team"),
        ({"budgets": [{"team": "vision", "period": "2026-11"}]}, "money, gpu_hours, or both"),
        ({"budgets": [{"team": "vision", "period": "11/2026", "money": 1}]}, "not a month"),
        ({"budgets": [{"team": "vision", "period": "2026-11", "money": 0.1234567}]}, "six"),
        (
            {"budgets": [{"team": "vision", "period": "2026-11", "gpu_hours": "1e-9"}]},
            "whole number of GPU-milliseconds",
        ),
        (
            {"quotas": [{"team": "vision", "pool": "h100", "model": H100, "nominal": -1}]},
            "greater than or equal to 0",
        ),
    ],
    ids=["unknown-team", "no-amount", "bad-period", "money-places", "gpu-ms-fraction", "negative"],
)
def test_invalid_budgets_and_quotas_are_config_errors(sections, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(a_config_dict(**sections))


def test_the_first_apply_emits_the_whole_configuration():
    events = plan(config(), AdminView()).events
    assert [describe(e) for e in events] == [
        "team vision in research: projects detection, segmentation",
        "team language in research: projects pretraining",
        f"price of {H100}: 3200000 µ/GPU-hour",
        f"quota vision h100/{H100}: 4 GPUs (borrow ≤ 2, lend ≤ ∞)",
        "grant +2500000000 money_micros to vision for 2026-11",
        "grant +360000000 gpu_ms to vision for 2026-11",
        "grant +45000000 gpu_ms to language for 2026-11",
    ]
    price = events[2]
    assert isinstance(price, PriceSet) and price.effective_us == 0  # the configured book as is
    assert {e.expected_total for e in events if isinstance(e, BudgetGranted)} == {0}


def test_applying_the_same_file_again_emits_nothing(ledger):
    result = ledger.send(plan(config(), ledger.view()).events)
    assert (result.admin_events, result.dead_letters) == (7, ())
    assert plan(config(), ledger.view()).events == ()
    assert ledger.store.budget_total("vision", "2026-11", Unit.GPU_MS) == 360_000_000


def _changed_price():
    return config(prices=[{"model": H100, "per_gpu_hour": "3.50"}])


def _dated_price():
    return config(
        prices=[
            {"model": H100, "per_gpu_hour": "3.20"},
            {"model": H100, "per_gpu_hour": "2.90", "effective_from": 1_798_761_600},
        ]
    )


def _budget_cut():
    sections = {**SECTIONS, "budgets": [{"team": "vision", "period": "2026-11", "money": 2000}]}
    return config(**sections)


def _new_project():
    data = a_config_dict(**SECTIONS)
    data["organisation"]["cost_centres"][0]["teams"][1]["projects"].append("alignment")
    return parse_config(data)


def _quota_change():
    quota = {**SECTIONS["quotas"][0], "nominal": 6}
    return config(quotas=[quota])


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        pytest.param(
            _changed_price, PriceSet(H100, None, 3_500_000, "alice", "apply", NOW), id="price"
        ),
        pytest.param(
            _dated_price,
            PriceSet(H100, None, 2_900_000, "alice", "apply", 1_798_761_600_000_000),
            id="dated-price",
        ),
        pytest.param(
            _budget_cut,
            BudgetGranted(
                "vision",
                "2026-11",
                Unit.MONEY,
                -500_000_000,
                "alice",
                "apply",
                NOW,
                expected_total=2_500_000_000,
            ),
            id="budget-cut",
        ),
        pytest.param(
            _new_project,
            TeamDefined(
                "language", "research", ("pretraining", "alignment"), (), "alice", "apply", NOW
            ),
            id="new-project",
        ),
        pytest.param(
            _quota_change,
            QuotaSet("vision", "h100", H100, 6, 2, None, "alice", "apply", NOW),
            id="quota",
        ),
    ],
)
def test_a_change_emits_only_the_difference(ledger, changed, expected):
    ledger.send(plan(config(), ledger.view()).events)
    assert plan(changed(), ledger.view()).events == (expected,)
    ledger.send([expected])
    assert plan(changed(), ledger.view()).events == ()


def test_a_plan_sent_twice_before_it_is_applied_grants_once(ledger):
    events = plan(config(), ledger.view()).events
    again = tuple(replace(e, effective_us=NOW + 1) for e in events)  # `apply` run twice
    ledger.send(events)
    result = ledger.send(again)
    assert len(result.dead_letters) == 3
    assert all(d.reason.startswith("stale grant") for d in result.dead_letters)
    assert ledger.store.budget_total("vision", "2026-11", Unit.MONEY) == 2_500_000_000


def test_a_budget_for_a_closed_period_is_not_planned():
    view = AdminView(closed=frozenset({"2026-11"}))
    result = plan(config(), view)
    assert not any(isinstance(e, BudgetGranted) for e in result.events)
    assert len(result.notes) == 3


def test_admin_apply_cli_dry_run_then_nothing_to_change(tmp_path, ledger):
    path = write_config(tmp_path / "tally.yaml", a_config_dict(**SECTIONS))
    args = ["admin", "apply", str(path), "--data-dir", str(ledger.store.data_dir)]
    first = CliRunner().invoke(cli, [*args, "--dry-run", "-o", "json"])
    assert first.exit_code == 0, first.output
    planned = orjson.loads(first.stdout)
    assert [row["event"] for row in planned] == ["team_defined"] * 2 + [
        "price_set",
        "quota_set",
    ] + ["budget_granted"] * 3
    ledger.send(plan(config(), ledger.view()).events)
    second = CliRunner().invoke(cli, args)
    assert second.exit_code == 0, second.output
    assert "nothing to change" in second.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--account", "consumer:vision/a", "--reason", "x"], "needs --amount, --unit, --period"),
        (
            ["--reverse", "t1", "--amount", "5", "--reason", "x"],
            "--reverse takes no --amount",
        ),
        (["--reverse", "t1", "--reason", "x"], "no sealed transaction t1"),
        (
            [
                *("--account", "budget:vision", "--amount", "5", "--unit", "money"),
                *("--period", "2026-11", "--reason", "x"),
            ],
            "not adjusted by hand",
        ),
        (
            [
                *("--account", "consumer:vision/a", "--amount", "1.5", "--unit", "gpu_ms"),
                *("--period", "2026-11", "--reason", "x"),
            ],
            "expected an integer",
        ),
    ],
    ids=["missing", "reverse-and-amount", "reverse-unknown", "budget-account", "fraction"],
)
def test_ledger_adjust_cli_refuses_bad_requests(tmp_path, args, message):
    DuckDBStore(tmp_path).close()  # a fresh ledger, as the worker creates it
    result = CliRunner().invoke(cli, ["ledger", "adjust", *args, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_ledger_adjust_cli_dry_run(tmp_path):
    DuckDBStore(tmp_path).close()
    result = CliRunner().invoke(
        cli,
        [
            *("ledger", "adjust", "--account", "consumer:vision/detection"),
            *("--amount", "-12.50", "--unit", "money", "--period", "2026-11"),
            *("--reason", "credit", "--dry-run", "--data-dir", str(tmp_path)),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        "adjust consumer:vision/detection by -12500000 money_micros in 2026-11 "
        "against adjustments:manual"
    ) in result.output


# ---------------------------------------------------------------------------- recurring budgets

RECURRING = [
    {"team": "vision", "every": "month", "money": "2500.00", "gpu_hours": 100, "carry_over": "25%"},
    {
        "team": "language",
        "every": "quarter",
        "gpu_hours": "12.5",
        "start": "2027-01",
        "end": "2027-12",
        "carry_over": {"gpu_hours": 2},
    },
]


def test_recurring_budgets_become_one_policy_per_unit():
    desired = desired_admin_state(config(budgets=RECURRING))
    assert desired.budgets == ()
    assert desired.policies == (
        PolicySpec(
            "vision", Unit.MONEY, 2_500_000_000, Cadence.MONTH, None, None, CarryOver.PERCENT, 25
        ),
        PolicySpec(
            "vision", Unit.GPU_MS, 360_000_000, Cadence.MONTH, None, None, CarryOver.PERCENT, 25
        ),
        PolicySpec(
            "language",
            Unit.GPU_MS,
            45_000_000,
            Cadence.QUARTER,
            "2027-01",
            "2027-12",
            CarryOver.AMOUNT,
            7_200_000,
        ),
    )


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"period": "2026-11", "every": "month"}, "either a period"),
        ({}, "either a period"),
        ({"period": "2026-11", "carry_over": "all"}, "belong to a recurring budget"),
        ({"every": "week"}, "'month' or 'quarter'"),
        ({"every": "month", "carry_over": "150%"}, "at most 100"),
        ({"every": "month", "carry_over": "some"}, "a percentage such as"),
        ({"every": "month", "carry_over": {"gpu_hours": 1}}, "exactly the budgeted units"),
        ({"every": "month", "start": "2027-02", "end": "2027-01"}, "before start"),
    ],
    ids=[
        "period-and-every",
        "neither",
        "carry-on-a-one-off",
        "weekly",
        "over-100-percent",
        "unknown-carry",
        "cap-of-another-unit",
        "ends-before-start",
    ],
)
def test_invalid_recurring_budgets_are_config_errors(budget, message):
    entry = {"team": "vision", "money": "10.00", **budget}
    with pytest.raises(ConfigError, match=message):
        parse_config(a_config_dict(budgets=[entry]))


def test_two_recurring_budgets_of_one_team_are_refused():
    twice = [{"team": "vision", "every": "month", "money": 1}] * 2
    with pytest.raises(ConfigError, match="two budgets for team 'vision' that recur"):
        parse_config(a_config_dict(budgets=twice))


def test_a_policy_is_planned_once_and_again_when_its_terms_change(ledger):
    first = plan(config(budgets=RECURRING), ledger.view()).events
    assert [describe(e) for e in first if isinstance(e, BudgetPolicySet)] == [
        "recurring budget 2500000000 money_micros every month for vision from this month, "
        "carry-over percent 25%",
        "recurring budget 360000000 gpu_ms every month for vision from this month, "
        "carry-over percent 25%",
        "recurring budget 45000000 gpu_ms every quarter for language from 2027-01 to 2027-12, "
        "carry-over amount 7200000",
    ]
    ledger.send(first)
    assert plan(config(budgets=RECURRING), ledger.view()).events == ()
    changed = [{**RECURRING[0], "carry_over": "all"}, RECURRING[1]]
    again = plan(config(budgets=changed), ledger.view()).events
    assert [(e.unit, e.carry_over, e.carry_limit) for e in again] == [
        (Unit.MONEY, CarryOver.ALL, None),
        (Unit.GPU_MS, CarryOver.ALL, None),
    ]
