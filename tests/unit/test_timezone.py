"""The accounting time zone (`ledger.timezone`): months and days in the ledger's zone, FOCUS
datetimes in UTC, and the zone as part of the ledger's identity.

One small ledger per zone, on the real DuckDB store: three samples around the first instant of
November in Asia/Shanghai (B = 2026-10-31T16:00:00Z), a one-off budget for 2026-11 and a
recurring allowance. In UTC the same events fall into other months and days.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.batch import booker
from ledger.periods import Period, local_day_start, parse_zone, period_label, zone_name
from ledger.pricing import Price, PriceBook
from ledger.read import rollups
from ledger.read.focus import FocusContext, focus_table
from ledger.read.reports import ReportQueries
from ledger.read.statements import team_statement
from ledger.store.hot import DuckDBStore
from ledger.store.identity import (
    IDENTITY_NAME,
    ZoneChanged,
    check_zone,
    claim_zone,
    recorded_zone,
)
from ledger.store.rebuild import DifferenceKind, rebuild
from ledger.units import Unit
from tally.cli import cli
from tally.config import ConfigError, parse_config
from tests.builders import INTERVAL_US, T0_US, VALID_CONFIG, a_process, an_envelope, an_owner
from tests.conftest import write_config
from tests.unit.test_rebuild import SETTINGS

HOUR = 3_600_000_000
DAY = 24 * HOUR
B = 1_793_462_400_000_000  # 2026-10-31T16:00:00Z = 2026-11-01T00:00 in Asia/Shanghai
OCT_UTC = 1_790_812_800_000_000  # 2026-10-01T00:00:00Z
PRICES = PriceBook((Price("*", 3_600_000),))  # one micro-unit per GPU-ms
SAMPLE_MS = INTERVAL_US // 1000
# Interval starts: straddling B (booked where it starts), at B, and 8 hours later (T0).
STARTS = (B - INTERVAL_US // 2, B, T0_US)
ONE_OFF = BudgetGranted("vision", "2026-11", Unit.MONEY, 5_000_000, "alice", "test", B - HOUR)
POLICY = BudgetPolicySet(
    "vision",
    Unit.GPU_MS,
    7_000_000,
    Cadence.MONTH,
    None,
    None,
    CarryOver.NONE,
    None,
    "alice",
    "test",
    B + HOUR,  # 2026-11-01T01:00 in Shanghai, still 2026-10-31 in UTC
)
ZONES = [pytest.param("UTC", id="utc"), pytest.param("Asia/Shanghai", id="shanghai")]


def iso(time_us: int) -> str:
    return datetime.fromtimestamp(time_us // 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def messages() -> list[ConsumedMessage]:
    admin = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in (ONE_OFF, POLICY)])
    envelopes = [
        an_envelope(
            sample_time_us=start + INTERVAL_US,
            processes=(a_process(owner=an_owner("vision", "detection", "ada", "job-1")),),
        )
        for start in STARTS
    ]
    return [
        ConsumedMessage("admin", 0, 0, admin),
        ConsumedMessage("samples", 0, 0, encode_batch(envelopes)),
    ]


@pytest.fixture(scope="module", params=ZONES)
def ledger(request, tmp_path_factory):
    """(data_dir, zone name) of a sealed ledger kept in that zone."""
    data_dir = tmp_path_factory.mktemp("tz") / "ledger"
    zone = parse_zone(request.param)
    claim_zone(data_dir, zone)  # as the worker does before it opens the store
    with DuckDBStore(data_dir) as store:
        Ingestor(
            store,
            "c",
            PRICES,
            {"vision": "research"},
            topics=OutputTopics("alerts", "dl", None),
            inputs=InputTopics("admin", "jobs"),
            zone=zone,
        ).apply(messages())
        store.seal()
    return data_dir, request.param


@pytest.fixture
def queries(ledger):
    q = ReportQueries(ledger[0])
    yield q
    q.close()


# ------------------------------------------------------------------------------ periods


@pytest.mark.parametrize(
    ("zone", "label", "start", "end"),
    [
        pytest.param("UTC", "2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", id="utc"),
        pytest.param(
            "Asia/Shanghai", "2026-11", "2026-10-31T16:00:00Z", "2026-11-30T16:00:00Z", id="sh"
        ),
        pytest.param(
            "Asia/Shanghai", "2026-12", "2026-11-30T16:00:00Z", "2026-12-31T16:00:00Z", id="sh-dec"
        ),
        pytest.param(  # summer time ends on 1 November: the month is an hour longer
            "America/New_York", "2026-11", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z", id="ny"
        ),
    ],
)
def test_a_month_is_the_zones_month_in_utc_microseconds(zone, label, start, end):
    period = Period.month(label, parse_zone(zone))
    assert (iso(period.start_us), iso(period.end_us)) == (start, end)
    assert period.start_us % 1_000_000 == 0 and period.end_us % 1_000_000 == 0
    assert period_label(period.start_us, parse_zone(zone)) == label
    assert period_label(period.start_us - 1, parse_zone(zone)) < label
    assert period.next().start_us == period.end_us


def test_the_shanghai_boundary_in_exact_integers():
    sh = parse_zone("Asia/Shanghai")
    assert Period.month("2026-11", sh).start_us == B
    assert (period_label(B - 1, sh), period_label(B, sh)) == ("2026-10", "2026-11")
    assert (period_label(B - 1), period_label(B)) == ("2026-10", "2026-10")  # UTC
    assert local_day_start(T0_US, sh) == B and local_day_start(B - 1, sh) == B - DAY


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "utc", " UTC"])
def test_an_unknown_zone_is_refused_by_name(name):
    with pytest.raises(ValueError, match="not an IANA time zone name"):
        parse_zone(name)


def test_the_config_names_a_bad_zone_and_defaults_to_utc():
    assert parse_config(VALID_CONFIG).ledger.zone() is UTC
    good = VALID_CONFIG | {"ledger": {"timezone": "Asia/Shanghai"}}
    assert zone_name(parse_config(good).ledger.zone()) == "Asia/Shanghai"
    bad = VALID_CONFIG | {"ledger": {"timezone": "Asia/Shanghia"}}
    with pytest.raises(ConfigError, match=r"ledger\.timezone: 'Asia/Shanghia' is not an IANA"):
        parse_config(bad)


# ------------------------------------------------------------------------------ booking


@pytest.mark.parametrize(
    ("zone", "time_us", "closed", "booked"),
    [
        pytest.param("UTC", B, (), "2026-10", id="utc"),
        pytest.param("Asia/Shanghai", B - 1, (), "2026-10", id="sh-last-october-us"),
        pytest.param("Asia/Shanghai", B, (), "2026-11", id="sh-first-november-us"),
        pytest.param("Asia/Shanghai", B - 1, ("2026-10",), "2026-11", id="sh-october-closed"),
        pytest.param("UTC", B, ("2026-10",), "2026-11", id="utc-october-closed"),
    ],
)
def test_holds_and_corrections_are_booked_into_the_zones_open_month(zone, time_us, closed, booked):
    assert booker(frozenset(closed), parse_zone(zone))(time_us) == booked


BOOKED = {  # (period, GPU-ms) of the usage; money is one micro-unit per GPU-ms
    "UTC": [("2026-10", 2 * SAMPLE_MS), ("2026-11", SAMPLE_MS)],
    "Asia/Shanghai": [("2026-10", SAMPLE_MS), ("2026-11", 2 * SAMPLE_MS)],
}
GRANTS = {  # (start, period, unit, amount) of the grants into budget:vision
    "UTC": [
        (OCT_UTC, "2026-10", "gpu_ms", 7_000_000),  # the policy was set in UTC October
        (T0_US, "2026-11", "gpu_ms", 7_000_000),
        (T0_US, "2026-11", "money_micros", 5_000_000),  # moved into the UTC month
    ],
    "Asia/Shanghai": [
        (B, "2026-11", "gpu_ms", 7_000_000),
        (B, "2026-11", "money_micros", 5_000_000),
    ],
}


def test_usage_is_booked_into_the_month_of_the_zone_its_interval_starts_in(ledger, queries):
    rows = queries.rows(
        "SELECT period, sum(amount) FILTER (unit = 'gpu_ms'), "
        "sum(amount) FILTER (unit = 'money_micros') FROM {postings} "
        "WHERE kind = 'usage' AND account LIKE 'consumer:%' GROUP BY period ORDER BY period"
    )
    assert [(p, int(ms), int(m)) for p, ms, m in rows] == [
        (p, ms, ms) for p, ms in BOOKED[ledger[1]]
    ]


def test_budgets_and_allowances_are_granted_at_the_zones_month_start(ledger, queries):
    rows = queries.rows(
        "SELECT start_us, period, unit, -amount FROM {postings} "
        "WHERE kind = 'budget_grant' AND account = 'budget:vision' ORDER BY period, unit"
    )
    assert [(int(s), p, u, int(a)) for s, p, u, a in rows] == GRANTS[ledger[1]]


# ------------------------------------------------------------------------------ reading


DAYS = {  # (day start, GPU-ms) of the usage per local day
    "UTC": [(T0_US - DAY, 2 * SAMPLE_MS), (T0_US, SAMPLE_MS)],
    "Asia/Shanghai": [(B - DAY, SAMPLE_MS), (B, 2 * SAMPLE_MS)],
}


def test_cost_by_day_counts_the_zones_days(ledger, queries):
    expected = DAYS[ledger[1]]
    found = rollups.cost_over_time(queries, "team", DAY, rollups.Filters())
    assert [(c.bucket_us, c.key, c.gpu_ms, c.money_micros) for c in found] == [
        (day, "vision", ms, ms) for day, ms in expected
    ]
    assert [(b, ms) for b, _, ms, _ in queries.cost_by_team_over_time(DAY)] == expected


BURN = {  # (local day, cumulative spend) of the usage booked into 2026-11
    "UTC": ((T0_US, SAMPLE_MS),),
    "Asia/Shanghai": ((B, 2 * SAMPLE_MS),),
}


def test_the_budget_burn_down_counts_the_zones_days(ledger, queries):
    (burn,) = rollups.budget_burn(queries, "2026-11", B + 20 * DAY, "vision")
    assert (burn.granted_micros, burn.daily) == (5_000_000, BURN[ledger[1]])


def test_a_statement_is_of_the_zones_month(ledger, queries):
    november = dict(BOOKED[ledger[1]])["2026-11"]
    statement = team_statement(queries, "vision", "2026-11", "USD")
    assert (statement.gpu_ms, statement.money_micros, statement.prior_period_micros) == (
        november,
        november,
        0,
    )


# the Capacity page: the last 7 whole local days before 09:00 on 2026-11-01 in Shanghai
# (01:00 UTC) end at B in Shanghai (one sample before it) and at T0 in UTC (two samples)
LAST_WEEK = {"UTC": (T0_US, 2 * SAMPLE_MS), "Asia/Shanghai": (B, SAMPLE_MS)}


def test_capacity_counts_the_zones_days(ledger, queries):
    zone = parse_zone(ledger[1])
    used = [(d.day_us, d.allocated_gpu_ms) for d in rollups.daily_usage(queries)]
    assert used == DAYS[ledger[1]]
    (trend,) = rollups.model_trends(queries, T0_US + HOUR)
    end, ms = LAST_WEEK[ledger[1]]
    assert local_day_start(T0_US + HOUR, zone) == end
    assert (trend.allocated_last_gpu_ms, trend.allocated_previous_gpu_ms) == (ms, 0)


@pytest.mark.parametrize(
    ("zone", "weekday", "following"),
    [
        pytest.param("UTC", 5, B + 8 * HOUR, id="utc-saturday"),
        pytest.param("Asia/Shanghai", 6, B + DAY, id="shanghai-sunday"),
    ],
)
def test_a_forecasts_days_and_weekdays_are_the_zones(zone, weekday, following):
    """B is Saturday 16:00 in UTC and Sunday 00:00 in Shanghai; 14 days of history with one
    busy day a week put the weekly effect on that local weekday."""
    tz = parse_zone(zone)
    first = local_day_start(B - 13 * DAY, tz)
    series = [(first + k * DAY, 10.0 + (30.0 if k % 7 == 6 else 0.0)) for k in range(14)]
    forecast = rollups.forecast_daily(series, 2, 2, tz)
    assert forecast is not None
    effect = forecast.weekday_effect
    assert effect.index(max(effect)) == weekday
    assert forecast.days[0] == following


FOCUS_HOURS = {  # ChargePeriodStart of the usage booked into 2026-11
    "UTC": (T0_US,),
    "Asia/Shanghai": (B, T0_US),
}
FOCUS_BOUNDS = {
    "UTC": ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"),
    "Asia/Shanghai": ("2026-10-31T16:00:00Z", "2026-11-30T16:00:00Z"),
}


def test_focus_billing_period_is_the_zones_month_written_in_utc(ledger, queries):
    # A UTC Period is given: the export takes the month of its label in the ledger's zone.
    table = focus_table(queries, Period.month("2026-11"), FocusContext())
    bounds = {
        (iso(int(s.timestamp()) * 1_000_000), iso(int(e.timestamp()) * 1_000_000))
        for s, e in zip(
            table.column("BillingPeriodStart").to_pylist(),
            table.column("BillingPeriodEnd").to_pylist(),
            strict=True,
        )
    }
    assert bounds == {FOCUS_BOUNDS[ledger[1]]}
    usage = [
        (iso(int(s.timestamp()) * 1_000_000), cost)
        for s, cost, kind, account in zip(
            table.column("ChargePeriodStart").to_pylist(),
            table.column("BilledCost").to_pylist(),
            table.column("x_TransactionKind").to_pylist(),
            table.column("x_Account").to_pylist(),
            strict=True,
        )
        if kind == "usage" and account.startswith("consumer:")
    ]
    cost = Decimal(SAMPLE_MS) / 1_000_000  # one micro-unit per GPU-ms
    assert usage == [(iso(start), cost) for start in FOCUS_HOURS[ledger[1]]]


# ------------------------------------------------------------------------------ identity


def test_a_ledgers_zone_is_recorded_and_a_change_is_refused(tmp_path):
    data_dir = tmp_path / "ledger"
    assert recorded_zone(data_dir) is UTC  # nothing recorded: UTC, as before the setting
    check_zone(data_dir, parse_zone("Asia/Shanghai"))  # no ledger yet: any zone, nothing written
    assert not data_dir.exists()
    claim_zone(data_dir, parse_zone("Asia/Shanghai"))
    claim_zone(data_dir, parse_zone("Asia/Shanghai"))  # the same zone again: fine
    assert zone_name(recorded_zone(data_dir)) == "Asia/Shanghai"
    with pytest.raises(
        ZoneChanged, match=r"keeps its books in Asia/Shanghai.*ledger\.timezone: UTC"
    ):
        claim_zone(data_dir, UTC)
    assert zone_name(recorded_zone(data_dir)) == "Asia/Shanghai"


def test_a_ledger_made_before_the_setting_stays_utc(tmp_path):
    data_dir = tmp_path / "ledger"
    DuckDBStore(data_dir).close()  # a ledger with no identity file: its books are UTC
    with pytest.raises(ZoneChanged, match="keeps its books in UTC"):
        claim_zone(data_dir, parse_zone("Asia/Shanghai"))
    assert not (data_dir / IDENTITY_NAME).exists()
    claim_zone(data_dir, UTC)
    assert orjson.loads((data_dir / IDENTITY_NAME).read_bytes()) == {
        "version": 1,
        "timezone": "UTC",
    }


def test_a_rebuild_books_into_the_ledgers_own_months(ledger, tmp_path):
    data_dir, name = ledger
    settings = replace(SETTINGS, prices=PRICES, inputs=InputTopics("admin", "jobs"))
    same = rebuild(data_dir, tmp_path / "same", replace(settings, zone=recorded_zone(data_dir)))
    assert same.differences == ()
    assert zone_name(recorded_zone(tmp_path / "same")) == name
    other = parse_zone("Asia/Shanghai" if name == "UTC" else "UTC")
    moved = rebuild(data_dir, tmp_path / "moved", replace(settings, zone=other))
    assert {d.kind for d in moved.differences} >= {DifferenceKind.POSTINGS}


@pytest.mark.parametrize("command", ["worker", "up"])
def test_the_worker_and_the_stack_refuse_a_ledger_kept_in_another_zone(command, tmp_path):
    data_dir = tmp_path / "ledger"
    claim_zone(data_dir, parse_zone("Asia/Shanghai"))
    config = VALID_CONFIG | {"ledger": {"data_dir": str(data_dir)}}  # timezone: UTC, the default
    path = write_config(tmp_path / "tally.yaml", config)
    result = CliRunner().invoke(cli, [command, "--config", str(path)])
    assert result.exit_code == 4, result.output
    assert "keeps its books in Asia/Shanghai" in result.output
    assert "ledger.timezone: UTC" in result.output
    assert sorted(p.name for p in data_dir.iterdir()) == [IDENTITY_NAME]  # nothing started
