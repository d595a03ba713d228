"""The FOCUS 1.2 export, checked column by column against the spec's rules.

The ledger is `tests.unit.test_reports.build_fleet`: usage on three pools, allocated-but-idle
time, unallocated capacity, late usage from October, a credit and an adjustment.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ledger.periods import Period
from ledger.pricing import Price, PriceBook
from ledger.read.focus import (
    COST_COLUMNS,
    DATETIME_COLUMNS,
    MANDATORY_COLUMNS,
    ChargeCategory,
    ExportFormat,
    FocusContext,
    ServiceCategory,
    export_focus,
    focus_table,
)
from ledger.read.reports import ReportQueries, ledger_money_total
from tests.builders import T0_US
from tests.ledger_builders import ADA, CY, HOUR_US, NOV, NOV_TOTAL, LedgerBuilder, build_fleet

PERIOD = Period.month(NOV)
# The fleet's money per GPU-ms: H100 1 µ, A100 2 µ, L4 500,000 µ per 3,600,000 ms.
PRICES = PriceBook((Price("H100", 3_600_000), Price("A100", 7_200_000), Price("L4", 500_000)))
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")  # no sign for positives, no exponent, no separators
NOT_NULL = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeDescription",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SubAccountId",
)
STRING_COLUMNS = (
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ConsumedUnit",
    "InvoiceIssuerName",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ServiceCategory",
    "ServiceName",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The November export of the fleet ledger, as CSV and as Parquet."""
    root = tmp_path_factory.mktemp("focus")
    data_dir = build_fleet(root / "ledger").seal()
    queries = ReportQueries(data_dir)
    context = FocusContext(currency="EUR")
    csv_result = export_focus(
        queries, PERIOD, root / "nov.csv", ExportFormat.CSV, context, prices=PRICES
    )
    pq_result = export_focus(
        queries, PERIOD, root / "nov.parquet", ExportFormat.PARQUET, context, prices=PRICES
    )
    parquet = pq.read_table(root / "nov.parquet")
    text = pacsv.read_csv(
        root / "nov.csv",
        convert_options=pacsv.ConvertOptions(
            column_types={name: pa.string() for name in parquet.column_names},
            strings_can_be_null=True,
        ),
    )
    yield {
        "queries": queries,
        "csv_result": csv_result,
        "pq_result": pq_result,
        "parquet": parquet,
        "rows": parquet.to_pylist(),
        "csv": text,
        "csv_rows": text.to_pylist(),
        "csv_path": root / "nov.csv",
    }
    queries.close()


def test_every_mandatory_column_is_present(exported):
    for table in (exported["parquet"], exported["csv"]):
        missing = [c for c in MANDATORY_COLUMNS if c not in table.column_names]
        assert missing == []
    assert len(MANDATORY_COLUMNS) == 21


def test_custom_columns_carry_the_x_prefix(exported):
    focus = {*MANDATORY_COLUMNS, "ChargeFrequency", "ConsumedQuantity", "ConsumedUnit",
             "ResourceId", "ResourceType", "ServiceSubcategory", "SubAccountId", "SubAccountName",
             "Tags", "ContractedUnitPrice", "InvoiceId", "ListUnitPrice", "PricingCategory",
             "ResourceName", "SkuId", "SkuMeter", "SkuPriceId"}  # fmt: skip
    others = [c for c in exported["parquet"].column_names if c not in focus]
    assert others and all(c.startswith("x_") for c in others)


@pytest.mark.parametrize("column", NOT_NULL)
def test_columns_that_must_not_be_null(exported, column):
    assert exported["parquet"].column(column).null_count == 0
    assert all(row[column] not in (None, "") for row in exported["csv_rows"])


@pytest.mark.parametrize(
    ("column", "arrow_type"),
    [
        *[pytest.param(c, pa.decimal128(38, 6), id=c) for c in COST_COLUMNS],
        *[pytest.param(c, pa.timestamp("ms", tz="UTC"), id=c) for c in DATETIME_COLUMNS],
        pytest.param("PricingQuantity", pa.decimal128(38, 9), id="PricingQuantity"),
        pytest.param("ConsumedQuantity", pa.decimal128(38, 9), id="ConsumedQuantity"),
        *[pytest.param(c, pa.string(), id=c) for c in STRING_COLUMNS],
    ],
)
def test_parquet_types_follow_the_spec(exported, column, arrow_type):
    assert exported["parquet"].schema.field(column).type == arrow_type


def test_csv_datetimes_are_iso8601_utc(exported):
    for row in exported["csv_rows"]:
        for column in DATETIME_COLUMNS:
            assert DATETIME.match(row[column]), (column, row[column])


def test_csv_numbers_are_plain_decimals(exported):
    columns = (*COST_COLUMNS, "PricingQuantity", "ConsumedQuantity")
    for row in exported["csv_rows"]:
        for column in columns:
            if row[column] is not None:
                assert DECIMAL.match(row[column]), (column, row[column])


def test_billing_period_is_the_month(exported):
    start = datetime(2026, 11, 1, tzinfo=UTC)
    end = datetime(2026, 12, 1, tzinfo=UTC)
    assert {(r["BillingPeriodStart"], r["BillingPeriodEnd"]) for r in exported["rows"]} == {
        (start, end)
    }
    assert {r["BillingPeriodStart"] for r in exported["csv_rows"]} == {"2026-11-01T00:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in exported["csv_rows"]} == {"2026-12-01T00:00:00Z"}


def test_charge_period_start_is_before_its_end(exported):
    for row in exported["rows"]:
        assert row["ChargePeriodStart"] < row["ChargePeriodEnd"]


def test_allowed_values(exported):
    rows = exported["rows"]
    assert {r["ChargeCategory"] for r in rows} <= {c.value for c in ChargeCategory}
    assert {r["ChargeClass"] for r in rows} <= {None, "Correction"}
    assert {r["ServiceCategory"] for r in rows} <= {c.value for c in ServiceCategory}
    assert {r["BillingCurrency"] for r in rows} == {"EUR"}
    assert {r["PricingUnit"] for r in rows} <= {None, "GPU-Hours"}
    assert {r["ConsumedUnit"] for r in rows} <= {None, "GPU-Hours"}


def test_pricing_and_consumed_quantity_nullability(exported):
    for row in exported["rows"]:
        regular = row["ChargeClass"] is None
        if row["ChargeCategory"] == "Usage" and regular:
            assert row["PricingQuantity"] is not None and row["PricingUnit"] is not None
            assert row["ConsumedQuantity"] > 0 and row["ConsumedUnit"] == "GPU-Hours"
        if row["ChargeCategory"] != "Usage":
            assert row["ConsumedQuantity"] is None and row["ConsumedUnit"] is None
        assert (row["PricingQuantity"] is None) == (row["PricingUnit"] is None)
        assert (row["ResourceId"] is None) == (row["ResourceType"] is None)


def test_costs_sum_exactly_to_the_ledger(exported):
    total = Decimal(NOV_TOTAL) / 1_000_000
    assert ledger_money_total(exported["queries"], NOV) == NOV_TOTAL
    for column in ("BilledCost", "EffectiveCost"):
        assert sum(r[column] for r in exported["rows"]) == total
        assert sum(Decimal(r[column]) for r in exported["csv_rows"]) == total
    # list and contracted cost are price × quantity: the unallocated H100 sample's 54,001 µ
    # is 54,000 µ at the list price
    for column in ("ListCost", "ContractedCost"):
        assert sum(r[column] for r in exported["rows"]) == total - Decimal("0.000001")
    assert sum(r["x_CostMicros"] for r in exported["rows"]) == NOV_TOTAL
    assert exported["csv_result"].billed_micros == exported["pq_result"].billed_micros == NOV_TOTAL
    assert exported["csv_result"].gpu_ms == 202_000 + 3_684_000


def test_costs_are_the_posted_micro_units_exactly(exported):
    for row in exported["rows"]:
        assert row["BilledCost"] == Decimal(row["x_CostMicros"]).scaleb(-6)
        assert row["EffectiveCost"] == row["BilledCost"]
        if row["ListUnitPrice"] is None:
            assert row["ListCost"] == row["ContractedCost"] == row["BilledCost"]


def test_gpu_hours_are_gpu_ms_rounded_to_nine_places(exported):
    for row in exported["rows"]:
        if row["PricingQuantity"] is not None:
            exact = Decimal(row["x_GpuMilliseconds"]) / 3_600_000
            assert abs(row["PricingQuantity"] - exact) <= Decimal("0.0000000005")


def _rows_of(exported, account):
    return [r for r in exported["rows"] if r["x_Account"] == account]


@pytest.mark.parametrize(
    ("account", "expected"),
    [
        pytest.param(
            "consumer:vision/detection",
            [
                # two samples in the same hour, same owner and GPU: one row
                ("Usage", None, "2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", 36_000, False),
                ("Usage", None, "2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", 18_000, True),
                ("Adjustment", None, "2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", -6_000, False),
            ],
            id="vision-detection-usage-idle-and-a-negative-adjustment",
        ),
        pytest.param(
            "consumer:language/pretraining",
            [
                (
                    "Usage",
                    "Correction",
                    "2026-10-31T23:00:00Z",
                    "2026-11-01T00:00:00Z",
                    12_000,
                    False,
                ),
                ("Usage", None, "2026-11-01T00:00:00Z", "2026-11-01T01:00:00Z", 120_000, False),
                ("Adjustment", None, "2026-11-01T06:00:00Z", "2026-11-01T06:00:10Z", 2_000, False),
            ],
            id="language-late-usage-and-an-adjustment",
        ),
        pytest.param(
            "unallocated:h100/H100",
            [("Usage", None, "2026-11-01T03:00:00Z", "2026-11-01T04:00:00Z", 54_001, False)],
            id="unallocated-is-never-idle-waste",
        ),
    ],
)
def test_row_grain_and_charge_categories(exported, account, expected):
    got = [
        (
            r["ChargeCategory"],
            r["ChargeClass"],
            r["ChargePeriodStart"].strftime("%Y-%m-%dT%H:%M:%SZ"),
            r["ChargePeriodEnd"].strftime("%Y-%m-%dT%H:%M:%SZ"),
            r["x_CostMicros"],
            r["x_Idle"],
        )
        for r in _rows_of(exported, account)
    ]
    assert got == expected


def test_corrections_name_their_transaction_and_carry_no_consumed_quantity(exported):
    credit = next(r for r in exported["rows"] if r["x_CostMicros"] == -6_000)
    assert credit["x_TransactionKind"] == "adjustment"
    assert credit["x_TransactionId"] is not None
    assert credit["PricingQuantity"] is None and credit["ConsumedQuantity"] is None
    assert "adjustment" in credit["ChargeDescription"]
    usage = [r for r in exported["rows"] if r["ChargeCategory"] == "Usage"]
    assert all(r["x_TransactionId"] is None for r in usage)


def test_late_usage_is_a_correction_dated_when_incurred(exported):
    late = [r for r in exported["rows"] if r["ChargeClass"] == "Correction"]
    assert len(late) == 1
    assert late[0]["ChargePeriodStart"] < late[0]["BillingPeriodStart"]
    assert "incurred in 2026-10" in late[0]["ChargeDescription"]


@pytest.mark.parametrize(
    ("account", "sub_account", "tags"),
    [
        pytest.param(
            "consumer:vision/detection",
            ("vision", "vision"),
            {
                "team": "vision",
                "project": "detection",
                "user": "ada",
                "job": "j1",
                "cost_centre": "research",
                "tally/idle": True,
            },
            id="idle-consumer",
        ),
        pytest.param(
            "unallocated:l4/L4",
            ("tally:unallocated", "Unallocated capacity"),
            {"tally/unallocated": True},
            id="unallocated",
        ),
    ],
)
def test_sub_account_and_tags(exported, account, sub_account, tags):
    rows = _rows_of(exported, account)
    tagged = [json.loads(r["Tags"]) for r in rows]
    assert tags in tagged
    row = rows[tagged.index(tags)]
    assert (row["SubAccountId"], row["SubAccountName"]) == sub_account
    assert row["ResourceId"] is not None


def test_csv_and_parquet_agree(exported):
    def as_text(value):
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, datetime):
            return value.strftime("%Y-%m-%dT%H:%M:%SZ")
        return str(value)

    assert exported["csv"].column_names == exported["parquet"].column_names
    parquet_rows = [{k: as_text(v) for k, v in row.items()} for row in exported["rows"]]
    assert exported["csv_rows"] == parquet_rows
    assert exported["csv_result"].rows == exported["pq_result"].rows == len(parquet_rows) == 11


def test_exports_are_deterministic(exported, tmp_path):
    again = tmp_path / "again.csv"
    context = FocusContext(currency="EUR")
    export_focus(exported["queries"], PERIOD, again, ExportFormat.CSV, context, prices=PRICES)
    assert again.read_bytes() == exported["csv_path"].read_bytes()


def test_large_amounts_stay_exact(tmp_path):
    data_dir = (
        LedgerBuilder(tmp_path / "big")
        .usage(CY, 7 * HOUR_US // 1000, 123_456_789_012_345)
        .adjustment(ADA, -987_654_321_098_765, -1_000, at_us=T0_US + HOUR_US)
        .seal()
    )
    prices = PriceBook((Price("H100", 99_999_999_999),))
    table = focus_table(ReportQueries(data_dir), PERIOD, FocusContext(), prices)
    assert table.column("ListCost").to_pylist() == [
        Decimal("699999.999993"),
        Decimal("-987654321.098765"),
    ]
    assert table.column("BilledCost").to_pylist() == [
        Decimal("123456789.012345"),
        Decimal("-987654321.098765"),
    ]
    # 7 h exactly; −1 s = −0.000277777… h rounds to −0.000277778
    assert table.column("PricingQuantity").to_pylist() == [
        Decimal("7.000000000"),
        Decimal("-0.000277778"),
    ]
    assert table.column("ChargeCategory").to_pylist() == ["Usage", "Adjustment"]


def test_an_empty_period_exports_a_header_and_no_rows(tmp_path):
    data_dir = LedgerBuilder(tmp_path / "l").usage(ADA, 1, 1).seal()
    queries = ReportQueries(data_dir)
    out = tmp_path / "dec.csv"
    result = export_focus(queries, Period.month("2026-12"), out, ExportFormat.CSV, FocusContext())
    assert (result.rows, result.billed_micros) == (0, 0)
    assert out.read_text().splitlines()[0].startswith('"BilledCost"')
    parquet = tmp_path / "dec.parquet"
    export_focus(queries, Period.month("2026-12"), parquet, ExportFormat.PARQUET, FocusContext())
    assert pq.read_table(parquet).num_rows == 0


def test_progress_is_reported_to_the_last_row(tmp_path):
    data_dir = build_fleet(tmp_path / "l").seal()
    seen: list[tuple[int, int]] = []
    export_focus(
        ReportQueries(data_dir),
        PERIOD,
        tmp_path / "p.parquet",
        ExportFormat.PARQUET,
        FocusContext(),
        lambda done, total: seen.append((done, total)),
    )
    assert seen[-1] == (11, 11)


@pytest.mark.parametrize("currency", ["usd", "EURO", "E1R"])
def test_the_currency_must_be_an_iso_code(currency):
    with pytest.raises(ValueError, match="ISO 4217"):
        FocusContext(currency=currency)
