"""The FOCUS 1.2 cost and usage export of one billing period, as CSV or Parquet.

This module owns the mapping from sealed postings to FOCUS rows.

Row grain. One row per ledger account (consumer or unallocated) × dimensions (team, project,
user, job, cost centre) × GPU × idle flag × charge period × price, summed from the postings
*booked into* the billing period (`period`):
- usage (`kind = usage`): the charge period is the hour in which the sample's interval starts
  (`[hour, hour + 1h)`, hours counted from the billing period's first instant, so they are the
  ledger's time zone's hours), the same rule that puts a posting in a period; the price is the
  price-list entry in force at the sample's start (`ledger.read.focus_prices`). Energy is a
  row of its own (PricingUnit "kWh") beside the GPU-time row, when the price book prices it;
- every other kind (adjustments, reversals, …): one row per transaction and account, its charge
  period the transaction's own interval widened to whole seconds; `x_TransactionId` names it.
Rows whose GPU time, energy and money all sum to zero are left out. Budget, capacity and any
other accounts are not costs and never appear. So BilledCost (and EffectiveCost: there are no
discounts or commitments) sums exactly to the money debited to consumer and unallocated accounts
in the period, which for usage is the capacity accounts' total.

Energy. The ledger folds a sample's energy cost into its money posting. An energy row's cost is
its price × its kWh (below); the GPU-time row beside it carries the rest of the money, so
the two still sum exactly to what the ledger posted.

Column mapping (the 21 mandatory columns, then conditional/recommended ones, then `x_` ones):
- BilledCost = EffectiveCost: the row's money, exact, from micro-units (Decimal(38, 6));
- ListUnitPrice = ContractedUnitPrice: the price-list rate per GPU-hour or kWh (no negotiated
  prices), null on non-usage rows; ListCost = ContractedCost = unit price × PricingQuantity
  rounded half-even to the micro-unit, exactly (BilledCost where there is no unit price). On a
  GPU-time row ListCost differs from BilledCost only by the ledger's rounding of each sample
  (at most half a micro-unit per sample) and the energy row's rounding;
- SkuId, SkuPriceId, SkuMeter: the price-list entry (`ledger.read.focus_prices`);
  PricingCategory "Standard" where there is a unit price;
- InvoiceId: `<BillingAccountId>:<YYYY-MM>`, one chargeback per account and month;
- BillingAccountId/Name, InvoiceIssuerName, ProviderName, PublisherName, ServiceName: from
  `FocusContext` (the organisation running Tally); BillingCurrency: the ledger currency;
- BillingPeriodStart/End: the month in the ledger's time zone (`ledger.timezone`),
  `[first instant, first instant of the next month)`, written in UTC as the spec requires
  (2026-11 in Asia/Shanghai: 2026-10-31T16:00:00Z to 2026-11-30T16:00:00Z);
- ChargeCategory: "Usage" for usage; "Adjustment" for every ledger correction (reversals and
  adjustments, of either sign: they amend charges, they are not credits granted);
  ChargeClass: "Correction" when the row's interval began before the billing
  period (late usage or a correction booked into a later open period), else null — its
  ChargePeriod then lies in the period in which the cost was incurred, as the spec requires;
- ChargePeriodStart/End: as above, always Start < End;
- PricingQuantity / PricingUnit: GPU-hours / "GPU-Hours" (null only for adjustments carrying
  no GPU time), or kWh / "kWh" on energy rows; ConsumedQuantity / ConsumedUnit: the same, on
  "Usage" rows only (null otherwise, as the spec requires). Hours are GPU-ms / 3,600,000 and
  kWh are mJ / 3,600,000,000, rounded half-even to 9 places; `x_GpuMilliseconds` and
  `x_EnergyMillijoules` carry the exact integers;
- ResourceId: the GPU UUID (ResourceType "GPU", ResourceName "<model> <UUID>"); the job is in
  Tags;
- ServiceCategory "AI and Machine Learning", ServiceSubcategory "Machine Learning";
- SubAccountId/Name: the team; unallocated capacity is "tally:unallocated" /
  "Unallocated capacity" (team names cannot contain ':');
- Tags (JSON object, null-valued keys left out): user-defined `team`, `project`, `user`, `job`,
  `cost_centre`; provider-defined keys carry the `tally/` prefix the spec asks for:
  `tally/idle` (allocated-but-idle, consumer rows) and `tally/unallocated` (capacity rows).
Date/times are UTC: `YYYY-MM-DDTHH:MM:SSZ` in CSV, `timestamp[ms, UTC]` holding whole seconds in
Parquet. Decimals are plain decimal text in CSV (no exponent, no sign for positives) and
Decimal128 in Parquet. `FocusVersion` 1.0 writes the same rows in 1.0's columns
(`ledger.read.focus_versions`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ledger.periods import Period, zone_name
from ledger.pricing import PriceBook
from ledger.read.focus_prices import (
    ENERGY_SKU,
    energy_price_pieces,
    gpu_price_pieces,
    gpu_sku,
    ledger_price_book,
    usage_combos,
)
from ledger.read.focus_versions import FocusVersion, project_version
from ledger.read.reports import ReportQueries

FOCUS_VERSION = FocusVersion.V1_2
GPU_HOURS_UNIT = "GPU-Hours"
ENERGY_UNIT = "kWh"
GPU_SKU_PREFIX = gpu_sku("")
UNALLOCATED_SUB_ACCOUNT = "tally:unallocated"
DATETIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
COST_TYPE = pa.decimal128(38, 6)
QUANTITY_TYPE = pa.decimal128(38, 9)
DATETIME_TYPE = pa.timestamp("ms", tz="UTC")  # Parquet has no seconds unit; values are whole s
_SECONDS = pa.timestamp("s", tz="UTC")
_BATCH_ROWS = 65_536
_CURRENCY = re.compile(r"[A-Z]{3}")

Progress = Callable[[int, int], None]


class ChargeCategory(StrEnum):
    USAGE = "Usage"
    PURCHASE = "Purchase"
    TAX = "Tax"
    CREDIT = "Credit"
    ADJUSTMENT = "Adjustment"


class ChargeClass(StrEnum):
    CORRECTION = "Correction"


class ServiceCategory(StrEnum):
    AI_AND_MACHINE_LEARNING = "AI and Machine Learning"
    COMPUTE = "Compute"


class ExportFormat(StrEnum):
    CSV = "csv"
    PARQUET = "parquet"


MANDATORY_COLUMNS = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ContractedCost",
    "EffectiveCost",
    "ListCost",
    "InvoiceIssuerName",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
)
DATETIME_COLUMNS = (
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
)
COST_COLUMNS = ("BilledCost", "ContractedCost", "EffectiveCost", "ListCost")
UNIT_PRICE_COLUMNS = ("ContractedUnitPrice", "ListUnitPrice")


@dataclass(frozen=True, slots=True)
class FocusContext:
    """Who bills whom: the fixed columns of an export. `currency` is the ledger currency."""

    currency: str = "USD"
    billing_account_id: str = "tally"
    billing_account_name: str = "Tally GPU fleet"
    invoice_issuer_name: str = "Tally"
    provider_name: str = "Tally"
    publisher_name: str = "Tally"
    service_name: str = "GPU Compute"
    service_category: ServiceCategory = ServiceCategory.AI_AND_MACHINE_LEARNING
    service_subcategory: str = "Machine Learning"

    def __post_init__(self) -> None:
        if not _CURRENCY.fullmatch(self.currency):
            raise ValueError(f"{self.currency!r} is not an ISO 4217 currency code such as USD")


@dataclass(frozen=True, slots=True)
class FocusExport:
    """What an export wrote: rows, and the totals it must agree with the ledger on."""

    period: str
    path: Path
    format: ExportFormat
    rows: int
    billed_micros: int
    gpu_ms: int
    version: FocusVersion = FOCUS_VERSION


def _cost(column: str) -> str:
    """SQL: integer micro-units as an exact DECIMAL(38, 6)."""
    return (
        f"CAST(CAST({column} AS DECIMAL(38, 0)) * CAST(0.000001 AS DECIMAL(38, 6)) "
        "AS DECIMAL(38, 6))"
    )


# GPU-ms → nano-GPU-hours = ms × 2500 / 9, rounded to nearest (9 is odd: there are no ties, so
# this is half-even); DuckDB's // and % truncate towards zero, hence the sign.
_NANO_HOURS = (
    "(CAST(gpu_ms AS HUGEINT) * 2500 // 9 + CASE WHEN 2 * abs(CAST(gpu_ms AS HUGEINT) * 2500 % 9)"
    " > 9 THEN sign(gpu_ms) ELSE 0 END)"
)
_PRICED = "(kind = 'usage' OR gpu_ms <> 0)"


def _round_div(numerator: str, denominator: int) -> str:
    """SQL: integer `numerator / denominator` rounded half-even (any sign), as HUGEINT."""
    n = f"CAST({numerator} AS HUGEINT)"
    return (
        f"({n} // {denominator} + CASE WHEN 2 * abs({n} % {denominator}) > {denominator} "
        f"OR (2 * abs({n} % {denominator}) = {denominator} AND ({n} // {denominator}) % 2 <> 0) "
        f"THEN sign({n}) ELSE 0 END)"
    )


def _decimal9(column: str) -> str:
    """SQL: an integer count of 10^-9 units as an exact DECIMAL(38, 9)."""
    return (
        f"CAST(CAST({column} AS DECIMAL(38, 0)) * CAST(0.000000001 AS DECIMAL(38, 9)) "
        "AS DECIMAL(38, 9))"
    )


# Energy: millijoules → nano-kWh = mJ × 10^9 / 3.6 × 10^9 = mJ × 5 / 18, half-even.
_NANO_KWH = _round_div("energy_mj * 5", 18)
# Price × quantity: micro-units per unit × nano-units → micro-units (half-even).
_LIST_COST = _round_div("rate * nano_qty", 1_000_000_000)
_ENERGY_MONEY = _round_div("energy_rate * nano_kwh", 1_000_000_000)

# How far into its hour a posting starts, hours counted from the billing period's first instant
# (a local midnight: so hours are the ledger's time zone's; whole UTC hours in UTC). Modulo of a
# negative difference (late usage) is made non-negative.
_HOUR_INTO = "((p.start_us - ctx.start_us) % 3600000000 + 3600000000) % 3600000000"

# Braces are doubled: `ReportQueries` formats `{postings}` into the text.
_FOCUS_SQL = f"""
WITH ctx AS (
    SELECT ? AS label, ?::BIGINT AS start_us, ?::BIGINT AS end_us, ? AS account_id,
        ? AS account_name, ? AS currency, ? AS issuer, ? AS provider, ? AS publisher,
        ? AS service_category, ? AS service_name, ? AS service_subcategory, ? AS invoice_id,
        ? AS zone
), legs AS (
    SELECT p.account, p.kind,
        coalesce(p.team, CASE WHEN p.account LIKE 'consumer:%'
            THEN split_part(split_part(p.account, ':', 2), '/', 1) END) AS team,
        p.project, p."user", p.job_id, p.cost_centre,
        nullif(p.gpu_uuid, '') AS gpu_uuid, nullif(p.model, '') AS model,
        nullif(p.pool, '') AS pool,
        p.account LIKE 'unallocated:%' AS unallocated,
        (p.idle AND p.account LIKE 'consumer:%') AS idle,
        NOT (p.start_us >= ctx.start_us AND p.start_us < ctx.end_us) AS prior,
        CASE WHEN p.kind = 'usage' THEN NULL ELSE p.txn_id END AS txn_id,
        CASE WHEN p.kind = 'usage' THEN p.start_us - {_HOUR_INTO}
            ELSE p.start_us - p.start_us % 1000000 END AS charge_start_us,
        CASE WHEN p.kind = 'usage' THEN p.start_us - {_HOUR_INTO} + 3600000000
            ELSE greatest(p.end_us + (1000000 - p.end_us % 1000000) % 1000000,
                          p.start_us - p.start_us % 1000000 + 1000000) END AS charge_end_us,
        g.rate AS gpu_rate, g.price_id AS gpu_price_id,
        e.rate AS energy_rate, e.price_id AS energy_price_id,
        p.unit, p.amount
    FROM {{postings}} AS p CROSS JOIN ctx
    LEFT JOIN focus_gpu_prices AS g ON p.kind = 'usage' AND g.model = p.model
        AND g.pool = p.pool AND p.start_us >= g.from_us AND p.start_us < g.to_us
    LEFT JOIN focus_energy_prices AS e ON p.kind = 'usage' AND e.pool = p.pool
        AND p.start_us >= e.from_us AND p.start_us < e.to_us
    WHERE p.period = ctx.label
        AND (p.account LIKE 'consumer:%' OR p.account LIKE 'unallocated:%')
        AND p.unit IN ('gpu_ms', 'money_micros', 'energy_mj')
), grain AS (
    SELECT account, kind, team, project, "user", job_id, cost_centre, gpu_uuid, model, pool,
        unallocated, idle, prior, txn_id, charge_start_us, charge_end_us,
        gpu_rate, gpu_price_id, energy_rate, energy_price_id,
        coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0) AS gpu_ms,
        coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money,
        coalesce(sum(amount) FILTER (unit = 'energy_mj'), 0) AS energy_mj
    FROM legs
    GROUP BY ALL
    HAVING coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0) <> 0
        OR coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) <> 0
        OR coalesce(sum(amount) FILTER (unit = 'energy_mj'), 0) <> 0
), quantities AS (
    SELECT *, {_NANO_HOURS} AS nano_hours, {_NANO_KWH} AS nano_kwh,
        kind = 'usage' AND energy_rate IS NOT NULL AND energy_mj <> 0 AS energy_line
    FROM grain
), split AS (
    SELECT *, CASE WHEN energy_line THEN {_ENERGY_MONEY} ELSE 0 END AS energy_money
    FROM quantities
), lines AS (
    SELECT *, 'gpu' AS line, nano_hours AS nano_qty, gpu_rate AS rate,
        gpu_price_id AS price_id, money - energy_money AS cost, gpu_ms AS line_ms,
        CASE WHEN energy_line THEN 0 ELSE energy_mj END AS line_mj
    FROM split
    WHERE kind <> 'usage' OR gpu_ms <> 0 OR money - energy_money <> 0 OR NOT energy_line
    UNION ALL
    SELECT *, 'energy' AS line, nano_kwh AS nano_qty, energy_rate AS rate,
        energy_price_id AS price_id, energy_money AS cost, 0 AS line_ms, energy_mj AS line_mj
    FROM split
    WHERE energy_line
), costed AS (
    SELECT *, CASE WHEN rate IS NOT NULL THEN {_LIST_COST} ELSE cost END AS list_cost
    FROM lines
)
SELECT
    {_cost("cost")} AS BilledCost,
    ctx.account_id AS BillingAccountId,
    ctx.account_name AS BillingAccountName,
    ctx.currency AS BillingCurrency,
    ctx.end_us // 1000000 AS BillingPeriodEnd,
    ctx.start_us // 1000000 AS BillingPeriodStart,
    CASE WHEN kind = 'usage' THEN 'Usage' ELSE 'Adjustment' END AS ChargeCategory,
    CASE WHEN prior THEN 'Correction' END AS ChargeClass,
    CASE
        WHEN line = 'energy' AND unallocated THEN 'Energy of unallocated GPU capacity'
        WHEN line = 'energy' AND idle THEN 'Energy of allocated but idle GPU time'
        WHEN line = 'energy' THEN 'Energy of GPU time'
        WHEN kind = 'usage' AND unallocated THEN 'Unallocated GPU capacity'
        WHEN kind = 'usage' AND idle THEN 'Allocated but idle GPU time'
        WHEN kind = 'usage' THEN 'GPU time'
        ELSE 'Ledger ' || replace(kind, '_', ' ') || ' (' || txn_id || ')'
    END || coalesce(' on ' || model, '') || coalesce(' in pool ' || pool, '')
        || CASE WHEN prior THEN ', incurred in '
            || strftime(timezone(ctx.zone, timezone('UTC', make_timestamp(charge_start_us))),
                '%Y-%m') || ' and booked late'
            ELSE '' END
        AS ChargeDescription,
    CASE WHEN kind = 'usage' THEN 'Usage-Based' ELSE 'One-Time' END AS ChargeFrequency,
    charge_end_us // 1000000 AS ChargePeriodEnd,
    charge_start_us // 1000000 AS ChargePeriodStart,
    CASE WHEN kind = 'usage' THEN {_decimal9("nano_qty")} END AS ConsumedQuantity,
    CASE WHEN kind <> 'usage' THEN NULL WHEN line = 'energy' THEN '{ENERGY_UNIT}'
        ELSE '{GPU_HOURS_UNIT}' END AS ConsumedUnit,
    {_cost("list_cost")} AS ContractedCost,
    {_cost("rate")} AS ContractedUnitPrice,
    {_cost("cost")} AS EffectiveCost,
    ctx.invoice_id AS InvoiceId,
    ctx.issuer AS InvoiceIssuerName,
    {_cost("list_cost")} AS ListCost,
    {_cost("rate")} AS ListUnitPrice,
    CASE WHEN rate IS NOT NULL THEN 'Standard' END AS PricingCategory,
    CASE WHEN {_PRICED} THEN {_decimal9("nano_qty")} END AS PricingQuantity,
    CASE WHEN NOT {_PRICED} THEN NULL WHEN line = 'energy' THEN '{ENERGY_UNIT}'
        ELSE '{GPU_HOURS_UNIT}' END AS PricingUnit,
    ctx.provider AS ProviderName,
    ctx.publisher AS PublisherName,
    gpu_uuid AS ResourceId,
    CASE WHEN gpu_uuid IS NOT NULL THEN coalesce(model || ' ', '') || gpu_uuid END
        AS ResourceName,
    CASE WHEN gpu_uuid IS NOT NULL THEN 'GPU' END AS ResourceType,
    ctx.service_category AS ServiceCategory,
    ctx.service_name AS ServiceName,
    ctx.service_subcategory AS ServiceSubcategory,
    CASE WHEN kind <> 'usage' THEN NULL WHEN line = 'energy' THEN '{ENERGY_SKU}'
        ELSE '{GPU_SKU_PREFIX}' || model END AS SkuId,
    CASE WHEN kind <> 'usage' THEN NULL WHEN line = 'energy' THEN 'Energy'
        ELSE 'GPU time' END AS SkuMeter,
    price_id AS SkuPriceId,
    CASE WHEN unallocated THEN '{UNALLOCATED_SUB_ACCOUNT}' ELSE team END AS SubAccountId,
    CASE WHEN unallocated THEN 'Unallocated capacity' ELSE team END AS SubAccountName,
    json_merge_patch('{{{{}}}}', json_object(
        'team', team, 'project', project, 'user', "user", 'job', job_id,
        'cost_centre', cost_centre,
        'tally/idle', CASE WHEN NOT unallocated THEN idle END,
        'tally/unallocated', CASE WHEN unallocated THEN TRUE END))::VARCHAR AS Tags,
    account AS x_Account,
    kind AS x_TransactionKind,
    txn_id AS x_TransactionId,
    pool AS x_Pool,
    model AS x_GpuModel,
    idle AS x_Idle,
    line_ms AS x_GpuMilliseconds,
    line_mj AS x_EnergyMillijoules,
    cost AS x_CostMicros
FROM costed, ctx
ORDER BY charge_start_us, charge_end_us, account, kind, txn_id NULLS FIRST,
    team NULLS FIRST, project NULLS FIRST, "user" NULLS FIRST, job_id NULLS FIRST,
    cost_centre NULLS FIRST, gpu_uuid NULLS FIRST, model NULLS FIRST, pool NULLS FIRST,
    idle, prior, line DESC, price_id NULLS FIRST
"""


def focus_table(
    queries: ReportQueries,
    period: Period,
    context: FocusContext,
    prices: PriceBook | None = None,
    version: FocusVersion = FOCUS_VERSION,
) -> pa.Table:
    """The FOCUS rows of `period` as an Arrow table in the Parquet representation.

    `prices` is the configuration's price book (None: none configured); the prices applied
    through the ledger's admin log are added to it, as the ingest adds them. The billing period
    is the month of `period`'s label in the ledger's time zone (`queries.zone`), whatever zone
    `period` was made in; its bounds are written in UTC.
    """
    period = Period.month(period.label, queries.zone)
    book = ledger_price_book(queries, prices if prices is not None else PriceBook(()))
    combos = usage_combos(queries, period)
    tables = {
        "focus_gpu_prices": gpu_price_pieces(book, combos),
        "focus_energy_prices": energy_price_pieces(book, (pool for _, pool in combos)),
    }
    params: list[Any] = [
        period.label,
        period.start_us,
        period.end_us,
        context.billing_account_id,
        context.billing_account_name,
        context.currency,
        context.invoice_issuer_name,
        context.provider_name,
        context.publisher_name,
        str(context.service_category),
        context.service_name,
        context.service_subcategory,
        f"{context.billing_account_id}:{period.label}",
        zone_name(queries.zone),
    ]
    raw = queries.arrow(_FOCUS_SQL, params, tables)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name in raw.column_names:
        column = raw.column(name)
        if name in DATETIME_COLUMNS:
            column = column.cast(pa.int64()).cast(_SECONDS).cast(DATETIME_TYPE)
        elif name in COST_COLUMNS or name in UNIT_PRICE_COLUMNS:
            column = column.cast(COST_TYPE)
        elif name in ("ConsumedQuantity", "PricingQuantity"):
            column = column.cast(QUANTITY_TYPE)
        elif name in ("x_GpuMilliseconds", "x_EnergyMillijoules", "x_CostMicros"):
            column = column.cast(pa.int64())
        columns[name] = column
    return project_version(pa.table(columns), version)


def as_csv_table(table: pa.Table) -> pa.Table:
    """`table` with date/times rendered as `YYYY-MM-DDTHH:MM:SSZ` text, as the CSV carries them."""
    columns = {
        name: pc.strftime(table.column(name).cast(_SECONDS), format=DATETIME_FORMAT)
        if name in DATETIME_COLUMNS
        else table.column(name)
        for name in table.column_names
    }
    return pa.table(columns)


def write_focus(
    table: pa.Table, path: Path, fmt: ExportFormat, progress: Progress | None = None
) -> None:
    """Write `table` to `path` atomically (a reader sees no file or the whole file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    total = table.num_rows
    done = 0
    try:
        if fmt is ExportFormat.PARQUET:
            with pq.ParquetWriter(tmp, table.schema, compression="zstd") as writer:
                for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
                    writer.write_batch(batch)
                    done += batch.num_rows
                    if progress is not None:
                        progress(done, total)
        else:
            text = as_csv_table(table)
            options = pacsv.WriteOptions(quoting_style="needed")
            with pacsv.CSVWriter(tmp, text.schema, write_options=options) as csv_writer:
                for batch in text.to_batches(max_chunksize=_BATCH_ROWS):
                    csv_writer.write_batch(batch)
                    done += batch.num_rows
                    if progress is not None:
                        progress(done, total)
        if progress is not None and total == 0:
            progress(0, 0)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def export_focus(
    queries: ReportQueries,
    period: Period,
    out: Path,
    fmt: ExportFormat,
    context: FocusContext,
    progress: Progress | None = None,
    prices: PriceBook | None = None,
    version: FocusVersion = FOCUS_VERSION,
) -> FocusExport:
    """Build the FOCUS `version` rows of `period` and write them to `out`."""
    table = focus_table(queries, period, context, prices, version)
    write_focus(table, out, fmt, progress)
    billed = pc.sum(table.column("x_CostMicros")).as_py() or 0
    gpu_ms = pc.sum(table.column("x_GpuMilliseconds")).as_py() or 0
    return FocusExport(
        period.label, Path(out), fmt, table.num_rows, int(billed), int(gpu_ms), version
    )
