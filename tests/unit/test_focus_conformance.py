"""FOCUS conformance of the export: our own 1.2 column checks, and the FinOps Foundation's
validator on the 1.0 export (it knows FOCUS only up to 1.0).

The ledger is made by the real attribution from samples that report energy, priced by a book
with GPU and energy prices that change inside the month: two owners sharing a GPU, an idle
owner, unallocated capacity, usage from October booked late, and a negative adjustment.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ledger.attribution import attribute_usage
from ledger.periods import Period
from ledger.pricing import EnergyPrice, Price, PriceBook
from ledger.read.focus import ExportFormat, FocusContext, export_focus
from ledger.read.focus_versions import FocusVersion
from ledger.read.reports import ReportQueries, ledger_money_total
from tests.builders import T0_US, a_process, an_envelope, an_owner
from tests.ledger_builders import ADA, HOUR_US, NOV, LedgerBuilder
from tests.unit.focus_validator import OVERRIDES, run_validator, validator_python

PERIOD = Period.month(NOV)
MODEL = "NVIDIA H100 80GB HBM3"
BOOK = PriceBook(
    (Price(MODEL, 2_987_654, 0), Price(MODEL, 3_123_457, T0_US + 2 * HOUR_US)),
    (EnergyPrice(123_457, 0), EnergyPrice(98_765, T0_US + 2 * HOUR_US, "h100")),
)
REQUIRED_1_2 = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
    "InvoiceId", "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory",
    "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "ResourceId",
    "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory",
    "SkuId", "SkuMeter", "SkuPriceId", "SubAccountId", "SubAccountName", "Tags",
)  # fmt: skip
MONEY = pa.decimal128(38, 6)
TYPES = {
    **{c: MONEY for c in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost")},
    **{c: MONEY for c in ("ListUnitPrice", "ContractedUnitPrice")},
    **{c: pa.decimal128(38, 9) for c in ("PricingQuantity", "ConsumedQuantity")},
    **{
        c: pa.timestamp("ms", tz="UTC")
        for c in ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
    },
}
ALLOWED = {
    "ChargeCategory": {"Usage", "Purchase", "Tax", "Credit", "Adjustment"},
    "ChargeClass": {None, "Correction"},
    "ChargeFrequency": {"One-Time", "Recurring", "Usage-Based"},
    "PricingCategory": {None, "Standard", "Dynamic", "Committed", "Other"},
    "ServiceCategory": {"AI and Machine Learning", "Compute"},
    "PricingUnit": {None, "GPU-Hours", "kWh"},
    "ConsumedUnit": {None, "GPU-Hours", "kWh"},
}


def _sample_txn(at_us: int, energy_mj: int, **sample):
    env = an_envelope(sample_time_us=at_us + 10_000_000, energy_delta_mj=energy_mj, **sample)
    return attribute_usage(env, BOOK, {"vision": "research"}).txn


def build_energy_ledger(data_dir: Path) -> LedgerBuilder:
    b = LedgerBuilder(data_dir)
    shared = (
        a_process(1, sm=70, owner=an_owner()),
        a_process(2, sm=30, owner=an_owner("language", "pretraining", "cy", "job-3")),
    )
    for i in range(6):  # two hours either side of the price change, 10 s samples
        at = T0_US + HOUR_US + i * 1_200_000_000 + 7_000_000
        b.txns.append(_sample_txn(at, 2_345_678 + 1_111 * i))
        b.txns.append(_sample_txn(at, 1_987_001 + 7 * i, processes=shared, gpu_uuid="GPU-2"))
        b.txns.append(_sample_txn(at, 555_555, processes=(), gpu_uuid="GPU-3"))  # unallocated
    late = _sample_txn(T0_US - HOUR_US, 3_000_001)
    b.txns.append(replace(late, txn_id="late", period=NOV))
    b.adjustment(ADA, -41_234, at_us=T0_US + 5 * HOUR_US, length_us=HOUR_US)
    b.adjustment(ADA, 7_000, at_us=T0_US + 6 * HOUR_US)
    return b


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    root = tmp_path_factory.mktemp("focus-conformance")
    queries = ReportQueries(build_energy_ledger(root / "ledger").seal())
    yield root, queries
    queries.close()


def _export(ledger, version: FocusVersion, fmt: ExportFormat) -> Path:
    root, queries = ledger
    out = root / f"focus-{version}.{fmt.value}"
    context = FocusContext(currency="EUR")
    export_focus(queries, PERIOD, out, fmt, context, prices=BOOK, version=version)
    return out


@pytest.fixture(scope="module")
def rows(ledger):
    table = pq.read_table(_export(ledger, FocusVersion.V1_2, ExportFormat.PARQUET))
    return table, table.to_pylist()


def _micro(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)


@pytest.mark.parametrize("column", REQUIRED_1_2)
def test_1_2_columns_are_present(rows, column):
    assert column in rows[0].column_names


@pytest.mark.parametrize(("column", "arrow_type"), TYPES.items(), ids=list(TYPES))
def test_1_2_column_types(rows, column, arrow_type):
    assert rows[0].schema.field(column).type == arrow_type


@pytest.mark.parametrize(("column", "allowed"), ALLOWED.items(), ids=list(ALLOWED))
def test_1_2_enumerated_values(rows, column, allowed):
    assert {r[column] for r in rows[1]} <= allowed


@pytest.mark.parametrize(
    ("unit", "price_column", "cost_column"),
    [
        pytest.param("GPU-Hours", "ListUnitPrice", "ListCost", id="gpu-hours-list"),
        pytest.param(
            "GPU-Hours", "ContractedUnitPrice", "ContractedCost", id="gpu-hours-contracted"
        ),
        pytest.param("kWh", "ListUnitPrice", "ListCost", id="energy-list"),
        pytest.param("kWh", "ContractedUnitPrice", "ContractedCost", id="energy-contracted"),
    ],
)
def test_unit_price_times_quantity_is_the_cost_to_the_micro_unit(
    rows, unit, price_column, cost_column
):
    priced = [r for r in rows[1] if r["ChargeCategory"] == "Usage" and r["PricingUnit"] == unit]
    assert len(priced) >= 4
    for row in priced:
        assert row[price_column] is not None
        assert _micro(row[price_column] * row["PricingQuantity"]) == row[cost_column]


def test_usage_rows_name_their_sku_price_and_pricing_category(rows):
    usage = [r for r in rows[1] if r["ChargeCategory"] == "Usage"]
    for row in usage:
        assert row["PricingCategory"] == "Standard"
        assert row["SkuId"] in (f"gpu-hours:{MODEL}", "energy:kwh")
        assert row["SkuPriceId"].startswith(row["SkuId"])
    # both GPU prices and both energy prices of the month are in use
    assert len({r["SkuPriceId"] for r in usage}) == 4


def test_energy_is_its_own_rows_and_billed_at_its_price(rows):
    energy = [r for r in rows[1] if r["PricingUnit"] == "kWh"]
    assert {r["SubAccountId"] for r in energy} == {"vision", "language", "tally:unallocated"}
    for row in energy:
        assert row["BilledCost"] == row["EffectiveCost"] == row["ListCost"]
        assert row["ConsumedQuantity"] == row["PricingQuantity"] > 0
        assert row["x_GpuMilliseconds"] == 0 and row["x_EnergyMillijoules"] > 0
        exact = Decimal(row["x_EnergyMillijoules"]) / 3_600_000_000
        assert abs(row["PricingQuantity"] - exact) <= Decimal("0.0000000005")
    gpu = [r for r in rows[1] if r["PricingUnit"] == "GPU-Hours" and r["ChargeCategory"] == "Usage"]
    assert all(r["x_EnergyMillijoules"] == 0 for r in gpu)


def test_billed_cost_sums_exactly_to_the_ledger(ledger, rows):
    total = ledger_money_total(ledger[1], NOV)
    assert sum(r["x_CostMicros"] for r in rows[1]) == total
    assert sum(r["BilledCost"] for r in rows[1]) == Decimal(total).scaleb(-6)
    assert sum(r["EffectiveCost"] for r in rows[1]) == Decimal(total).scaleb(-6)
    # the list cost differs only by the ledger's rounding of each sample (≤ ½ µ per sample)
    assert abs(sum(r["ListCost"] for r in rows[1]) - Decimal(total).scaleb(-6)) < Decimal(
        "0.000040"
    )


@pytest.mark.parametrize(
    ("kind", "sign", "category", "charge_class"),
    [
        pytest.param("adjustment", -1, "Adjustment", None, id="negative-adjustment-not-credit"),
        pytest.param("adjustment", 1, "Adjustment", None, id="positive-adjustment"),
        pytest.param("usage", 1, "Usage", "Correction", id="late-usage-is-a-correction"),
    ],
)
def test_adjustments_and_corrections_are_categorised_as_the_spec_intends(
    rows, kind, sign, category, charge_class
):
    got = [
        r
        for r in rows[1]
        if r["x_TransactionKind"] == kind
        and r["BilledCost"] * sign > 0
        and (r["ChargeClass"] == charge_class)
        and (kind != "usage" or r["ChargePeriodStart"] < r["BillingPeriodStart"])
    ]
    assert got and all(r["ChargeCategory"] == category for r in got)
    if kind != "usage":
        assert all(r["ListUnitPrice"] is None and r["SkuId"] is None for r in got)


def test_every_row_names_the_invoice(rows):
    assert {r["InvoiceId"] for r in rows[1]} == {f"tally:{NOV}"}


def test_csv_dates_are_utc(ledger):
    text = pacsv.read_csv(
        _export(ledger, FocusVersion.V1_2, ExportFormat.CSV),
        convert_options=pacsv.ConvertOptions(column_types={"ChargePeriodStart": pa.string()}),
    )
    assert all(v.endswith("Z") for v in text.column("ChargePeriodStart").to_pylist())


def test_the_1_0_export_has_the_1_0_columns(ledger):
    table = pq.read_table(_export(ledger, FocusVersion.V1_0, ExportFormat.PARQUET))
    names = set(table.column_names)
    assert {"RegionId", "CommitmentDiscountId", "ListUnitPrice", "SkuPriceId"} <= names
    assert not names & {"InvoiceId", "ServiceSubcategory", "SkuMeter"}
    assert all(json.loads(t) is not None for t in table.column("Tags").to_pylist())


@pytest.fixture(scope="module")
def validator():
    return validator_python()  # installs on first use; an install failure is an error


def test_the_foundation_validator_passes_the_1_0_export(ledger, validator, tmp_path):
    outcome = run_validator(
        validator, _export(ledger, FocusVersion.V1_0, ExportFormat.CSV), tmp_path / "r.xml"
    )
    pinned = {
        line.strip().removeprefix("- ")
        for line in OVERRIDES.read_text().splitlines()
        if line.strip().startswith("- ")
    }
    assert len(outcome.checks) > 100
    assert outcome.failed == ()
    assert set(outcome.skipped) == pinned


BREAKAGES = [
    pytest.param("ChargeFrequency", "Hourly", "ChargeFrequency_Enum", id="bad-enum"),
    pytest.param("BillingCurrency", "EURO", "BillingCurrency_IsCurrencyCode", id="bad-currency"),
    pytest.param("ListUnitPrice", None, "ListUnitPrice_Required", id="missing-column"),
]


@pytest.fixture(scope="module")
def broken_outcome(ledger, validator):
    """The validator's verdict on a 1.0 export with every breakage below applied (one run)."""
    table = pacsv.read_csv(_export(ledger, FocusVersion.V1_0, ExportFormat.CSV))
    for column, value, _ in (p.values for p in BREAKAGES):
        index = table.column_names.index(column)
        if value is None:
            table = table.remove_column(index)
        else:
            table = table.set_column(index, column, pa.array([value] * table.num_rows))
    broken = ledger[0] / "broken.csv"
    pacsv.write_csv(table, broken)
    return run_validator(validator, broken, ledger[0] / "broken.xml")


@pytest.mark.parametrize(("column", "value", "rule"), BREAKAGES)
def test_the_validator_catches_a_broken_export(broken_outcome, column, value, rule):
    assert rule in broken_outcome.failed
