"""The FOCUS versions an export can be written in, and how a 1.2 table becomes a 1.0 one.

This module owns which columns each FOCUS version carries. The export builds its rows once,
in 1.2's columns; `project_version` turns them into another version's:
- 1.2 (the default): every column the export knows;
- 1.0 (what many finance tools still ingest): without the columns 1.0 does not define
  (InvoiceId and SkuMeter, from 1.1 and 1.2; ServiceSubcategory, from 1.1), and with the
  columns 1.0 lists that Tally has no values for, all null: AvailabilityZone, RegionId,
  RegionName (GPUs are in pools, not provider regions) and the five CommitmentDiscount
  columns (Tally sells no commitments). The values of the shared columns are the same: their
  allowed values (ChargeCategory, ChargeClass, ChargeFrequency, PricingCategory,
  ServiceCategory) did not change between the two versions for what Tally writes.
FOCUS columns come in alphabetical order, then the `x_` ones in the order the export makes them.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa


class FocusVersion(StrEnum):
    V1_0 = "1.0"
    V1_2 = "1.2"


NOT_IN_1_0 = ("InvoiceId", "ServiceSubcategory", "SkuMeter")
NULL_IN_1_0 = (
    "AvailabilityZone",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "RegionId",
    "RegionName",
)


def project_version(table: pa.Table, version: FocusVersion) -> pa.Table:
    """`table` (the export's 1.2 columns) with the columns of FOCUS `version`."""
    columns = {name: table.column(name) for name in table.column_names}
    if version is FocusVersion.V1_0:
        for name in NOT_IN_1_0:
            columns.pop(name, None)
        for name in NULL_IN_1_0:
            columns[name] = pa.nulls(table.num_rows, pa.string())
    focus = sorted(name for name in columns if not name.startswith("x_"))
    custom = [name for name in columns if name.startswith("x_")]
    return pa.table({name: columns[name] for name in [*focus, *custom]})
