"""The price list behind a FOCUS export: which price entry was in force for each usage posting.

This module owns the FOCUS SKU and SKU-price identifiers and the tables the export joins its
usage postings to. A usage posting is priced as of its interval's start, the instant the ingest
looked its price up (`ledger.attribution`): GPU time by (GPU model, pool) from the price book
(`PriceBook.price_at`), energy by pool (`PriceBook.energy_price_at`). Each table holds one row
per price in force over `[from_us, to_us)`; times before the first price have no row.

Identifiers (stable text, one per price-list entry):
- SkuId `gpu-hours:<model>` for GPU time of a model, `energy:kwh` for energy;
- SkuPriceId `<SkuId>:<pool or *>@<effective date/time, UTC>` for GPU time (the entry's own
  model, `*` for the fallback entry) and `energy:kwh:<pool or *>@<…>` for energy.

The price book is the configuration's plus every `PriceSet` applied through the admin log, the
same book the ingest prices with (`AdminView.price_book`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import pyarrow as pa

from ledger.admin import AdminView
from ledger.periods import Period
from ledger.pricing import PriceBook
from ledger.read.reports import ReportQueries
from ledger.store.side_files import load_admin_log

ENERGY_SKU = "energy:kwh"
_FOREVER_US = 2**62
_PIECES_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("pool", pa.string()),
        ("from_us", pa.int64()),
        ("to_us", pa.int64()),
        ("rate", pa.int64()),
        ("price_id", pa.string()),
    ]
)


def gpu_sku(model: str) -> str:
    return f"gpu-hours:{model}"


def _when(effective_us: int) -> str:
    return datetime.fromtimestamp(effective_us // 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ledger_price_book(queries: ReportQueries, configured: PriceBook) -> PriceBook:
    """`configured` plus the prices applied through the ledger's admin log."""
    return AdminView.from_log(load_admin_log(queries.root)).price_book(configured)


def gpu_price_pieces(book: PriceBook, combos: Iterable[tuple[str, str]]) -> pa.Table:
    """Per (model, pool) in `combos`, the GPU-hour price in force over each time range."""
    rows: list[tuple[str, str, int, int, int, str]] = []
    for model, pool in sorted(set(combos)):
        points = book.change_points(model, pool)
        for index, start in enumerate(points):
            price = book.price_at(model, pool, start)
            if price is None:
                continue
            end = points[index + 1] if index + 1 < len(points) else _FOREVER_US
            price_id = f"{gpu_sku(price.model)}:{price.pool or '*'}@{_when(price.effective_us)}"
            rows.append((model, pool, start, end, price.micros_per_gpu_hour, price_id))
    return _table(rows)


def energy_price_pieces(book: PriceBook, pools: Iterable[str]) -> pa.Table:
    """Per pool in `pools`, the energy price per kWh in force over each time range."""
    rows: list[tuple[str, str, int, int, int, str]] = []
    for pool in sorted(set(pools)):
        points = sorted({e.effective_us for e in book.energy if e.pool in (None, pool)})
        for index, start in enumerate(points):
            price = book.energy_price_at(pool, start)
            if price is None:
                continue
            end = points[index + 1] if index + 1 < len(points) else _FOREVER_US
            price_id = f"{ENERGY_SKU}:{price.pool or '*'}@{_when(price.effective_us)}"
            rows.append(("", pool, start, end, price.micros_per_kwh, price_id))
    return _table(rows)


def _table(rows: list[tuple[str, str, int, int, int, str]]) -> pa.Table:
    columns: list[list[object]] = [[row[i] for row in rows] for i in range(len(_PIECES_SCHEMA))]
    return pa.table(
        [pa.array(c, type=f.type) for c, f in zip(columns, _PIECES_SCHEMA, strict=True)],
        schema=_PIECES_SCHEMA,
    )


def usage_combos(queries: ReportQueries, period: Period) -> list[tuple[str, str]]:
    """The (GPU model, pool) pairs of the usage booked into `period`."""
    rows = queries.rows(
        "SELECT DISTINCT model, pool FROM {postings} WHERE period = ? AND kind = 'usage'",
        [period.label],
    )
    return [(str(model), str(pool)) for model, pool in rows]
