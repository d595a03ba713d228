"""The FOCUS 1.2 cost and usage export of one billing period, as CSV or Parquet.

This module owns the mapping from sealed postings to FOCUS rows.

Row grain. One row per ledger account (consumer or unallocated) × dimensions (team, project,
user, job, cost centre) × GPU × idle flag × charge period, summed from the postings *booked
into* the billing period (`period`):
- usage (`kind = usage`): the charge period is the UTC hour in which the sample's interval
  starts (`[hour, hour + 1h)`), the same rule that puts a posting in a period;
- every other kind (adjustments, reversals, …): one row per transaction and account, its charge
  period the transaction's own interval widened to whole seconds; `x_TransactionId` names it.
Rows whose GPU time and money both sum to zero are left out. Budget, capacity and any other
accounts are not costs and never appear. So BilledCost (and EffectiveCost, ListCost,
ContractedCost: there are no discounts or commitments) sums exactly to the money debited to
consumer and unallocated accounts in the period, which for usage is the capacity accounts' total.

Column mapping (the 21 mandatory columns, then conditional/recommended ones, then `x_` ones):
- BilledCost = EffectiveCost = ListCost = ContractedCost: the row's money, exact, from
  micro-units (Decimal(38, 6));
- BillingAccountId/Name, InvoiceIssuerName, ProviderName, PublisherName, ServiceName: from
  `FocusContext` (the organisation running Tally); BillingCurrency: the ledger currency;
- BillingPeriodStart/End: the month, `[first instant, first instant of the next month)`;
- ChargeCategory: "Usage" for usage; otherwise "Credit" when the row's money is negative, else
  "Adjustment"; ChargeClass: "Correction" when the row's interval began before the billing
  period (late usage or a correction booked into a later open period), else null — its
  ChargePeriod then lies in the period in which the cost was incurred, as the spec requires;
- ChargePeriodStart/End: as above, always Start < End;
- PricingQuantity / PricingUnit: GPU-hours / "GPU-Hours" (null only for adjustments carrying
  no GPU time); ConsumedQuantity / ConsumedUnit: the same, on "Usage" rows only (null
  otherwise, as the spec requires). Hours are GPU-ms / 3,600,000 rounded half-even to 9 places
  (a GPU-ms is not a finite decimal number of hours); `x_GpuMilliseconds` carries the exact
  integer;
- ResourceId: the GPU UUID (ResourceType "GPU"); the job is in Tags;
- ServiceCategory "AI and Machine Learning", ServiceSubcategory "Machine Learning";
- SubAccountId/Name: the team; unallocated capacity is "tally:unallocated" /
  "Unallocated capacity" (team names cannot contain ':');
- Tags (JSON object, null-valued keys left out): user-defined `team`, `project`, `user`, `job`,
  `cost_centre`; provider-defined keys carry the `tally/` prefix the spec asks for:
  `tally/idle` (allocated-but-idle, consumer rows) and `tally/unallocated` (capacity rows).
Date/times are UTC: `YYYY-MM-DDTHH:MM:SSZ` in CSV, `timestamp[ms, UTC]` holding whole seconds in
Parquet. Decimals are plain decimal text in CSV (no exponent, no sign for positives) and
Decimal128 in Parquet.
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

from ledger.periods import Period
from ledger.read.reports import ReportQueries

FOCUS_VERSION = "1.2"
GPU_HOURS_UNIT = "GPU-Hours"
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
_HOURS = (
    f"CAST(CAST({_NANO_HOURS} AS DECIMAL(38, 0)) * CAST(0.000000001 AS DECIMAL(38, 9)) "
    "AS DECIMAL(38, 9))"
)
_PRICED = "(kind = 'usage' OR gpu_ms <> 0)"

# Braces are doubled: `ReportQueries` formats `{postings}` into the text.
_FOCUS_SQL = f"""
WITH ctx AS (
    SELECT ? AS label, ?::BIGINT AS start_us, ?::BIGINT AS end_us, ? AS account_id,
        ? AS account_name, ? AS currency, ? AS issuer, ? AS provider, ? AS publisher,
        ? AS service_category, ? AS service_name, ? AS service_subcategory
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
        CASE WHEN p.kind = 'usage' THEN p.start_us - p.start_us % 3600000000
            ELSE p.start_us - p.start_us % 1000000 END AS charge_start_us,
        CASE WHEN p.kind = 'usage' THEN p.start_us - p.start_us % 3600000000 + 3600000000
            ELSE greatest(p.end_us + (1000000 - p.end_us % 1000000) % 1000000,
                          p.start_us - p.start_us % 1000000 + 1000000) END AS charge_end_us,
        p.unit, p.amount
    FROM {{postings}} AS p, ctx
    WHERE p.period = ctx.label
        AND (p.account LIKE 'consumer:%' OR p.account LIKE 'unallocated:%')
        AND p.unit IN ('gpu_ms', 'money_micros')
), grain AS (
    SELECT account, kind, team, project, "user", job_id, cost_centre, gpu_uuid, model, pool,
        unallocated, idle, prior, txn_id, charge_start_us, charge_end_us,
        coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0) AS gpu_ms,
        coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money
    FROM legs
    GROUP BY ALL
    HAVING coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0) <> 0
        OR coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) <> 0
)
SELECT
    {_cost("money")} AS BilledCost,
    ctx.account_id AS BillingAccountId,
    ctx.account_name AS BillingAccountName,
    ctx.currency AS BillingCurrency,
    ctx.start_us // 1000000 AS BillingPeriodStart,
    ctx.end_us // 1000000 AS BillingPeriodEnd,
    CASE WHEN kind = 'usage' THEN 'Usage' WHEN money < 0 THEN 'Credit' ELSE 'Adjustment' END
        AS ChargeCategory,
    CASE WHEN prior THEN 'Correction' END AS ChargeClass,
    CASE
        WHEN kind = 'usage' AND unallocated THEN 'Unallocated GPU capacity'
        WHEN kind = 'usage' AND idle THEN 'Allocated but idle GPU time'
        WHEN kind = 'usage' THEN 'GPU time'
        ELSE 'Ledger ' || replace(kind, '_', ' ') || ' (' || txn_id || ')'
    END || coalesce(' on ' || model, '') || coalesce(' in pool ' || pool, '')
        || CASE WHEN prior THEN ', incurred in '
            || strftime(make_timestamp(charge_start_us), '%Y-%m') || ' and booked late'
            ELSE '' END
        AS ChargeDescription,
    CASE WHEN kind = 'usage' THEN 'Usage-Based' ELSE 'One-Time' END AS ChargeFrequency,
    charge_start_us // 1000000 AS ChargePeriodStart,
    charge_end_us // 1000000 AS ChargePeriodEnd,
    CASE WHEN kind = 'usage' THEN {_HOURS} END AS ConsumedQuantity,
    CASE WHEN kind = 'usage' THEN '{GPU_HOURS_UNIT}' END AS ConsumedUnit,
    {_cost("money")} AS ContractedCost,
    {_cost("money")} AS EffectiveCost,
    ctx.issuer AS InvoiceIssuerName,
    {_cost("money")} AS ListCost,
    CASE WHEN {_PRICED} THEN {_HOURS} END AS PricingQuantity,
    CASE WHEN {_PRICED} THEN '{GPU_HOURS_UNIT}' END AS PricingUnit,
    ctx.provider AS ProviderName,
    ctx.publisher AS PublisherName,
    gpu_uuid AS ResourceId,
    CASE WHEN gpu_uuid IS NOT NULL THEN 'GPU' END AS ResourceType,
    ctx.service_category AS ServiceCategory,
    ctx.service_name AS ServiceName,
    ctx.service_subcategory AS ServiceSubcategory,
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
    gpu_ms AS x_GpuMilliseconds,
    money AS x_CostMicros
FROM grain, ctx
ORDER BY charge_start_us, charge_end_us, account, kind, txn_id NULLS FIRST,
    team NULLS FIRST, project NULLS FIRST, "user" NULLS FIRST, job_id NULLS FIRST,
    cost_centre NULLS FIRST, gpu_uuid NULLS FIRST, model NULLS FIRST, pool NULLS FIRST,
    idle, prior
"""


def focus_table(queries: ReportQueries, period: Period, context: FocusContext) -> pa.Table:
    """The FOCUS rows of `period` as an Arrow table in the Parquet representation."""
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
    ]
    raw = queries.arrow(_FOCUS_SQL, params)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name in raw.column_names:
        column = raw.column(name)
        if name in DATETIME_COLUMNS:
            column = column.cast(pa.int64()).cast(_SECONDS).cast(DATETIME_TYPE)
        elif name in COST_COLUMNS:
            column = column.cast(COST_TYPE)
        elif name in ("ConsumedQuantity", "PricingQuantity"):
            column = column.cast(QUANTITY_TYPE)
        elif name in ("x_GpuMilliseconds", "x_CostMicros"):
            column = column.cast(pa.int64())
        columns[name] = column
    return pa.table(columns)


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
) -> FocusExport:
    """Build the FOCUS rows of `period` and write them to `out`."""
    table = focus_table(queries, period, context)
    write_focus(table, out, fmt, progress)
    billed = pc.sum(table.column("x_CostMicros")).as_py() or 0
    gpu_ms = pc.sum(table.column("x_GpuMilliseconds")).as_py() or 0
    return FocusExport(period.label, Path(out), fmt, table.num_rows, int(billed), int(gpu_ms))
