"""What one batch moves the running balances by: (account, unit, period, amount) summed in Arrow
before the store's one upsert of the `balances` table.

A commit used to sum inside that upsert (the postings' rows and the usage rows unpivoted into
their legs, `USAGE_BALANCES_SQL`, grouped and upserted in one statement: ~8 ms a batch of 2,000
samples). Summed here first, the upsert takes a few dozen rows (accounts × units × periods)
and no aggregate. The amounts are the same: per (account, capacity, period) of column-built
usage the holder account moves by +GPU-ms, +money and, when any row of the group has energy,
+energy, the capacity account by the opposite (`ledger.posting_columns.LEG_UNITS`); a postings
row moves its account by its amount; a key moved by zero still gets its balance row. Sums are
exact integers: where a column's sum could leave int64 the sum is taken in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ledger.errors import StoreError
from ledger.posting_columns import LEG_UNITS

_INT64_LIMIT = 1 << 63
BALANCE_MOVES_SCHEMA = pa.schema(
    [
        ("account", pa.string()),
        ("unit", pa.string()),
        ("period", pa.string()),
        ("amount", pa.int64()),
    ]
)
Key = tuple[str, str, str]


def _int64_safe(table: pa.Table, columns: Sequence[str]) -> bool:
    """Whether summing `columns` of `table` in int64 cannot overflow, whatever the grouping."""
    for name in columns:
        bounds = pc.min_max(table.column(name))
        largest = max(abs(bounds["min"].as_py() or 0), abs(bounds["max"].as_py() or 0))
        if largest * table.num_rows >= _INT64_LIMIT:
            return False
    return True


def _grouped(
    table: pa.Table, keys: list[str], sums: list[str], flags: Sequence[str] = ()
) -> list[tuple[Any, ...]]:
    """Rows of `keys`, the sums of `sums` and the any-of of `flags`, one per group."""
    if _int64_safe(table, sums):
        aggregates = [(c, "sum") for c in sums] + [(c, "any") for c in flags]
        out = table.group_by(keys, use_threads=False).aggregate(aggregates)
        names = keys + [f"{c}_sum" for c in sums] + [f"{c}_any" for c in flags]
        return list(zip(*(out.column(n).to_pylist() for n in names), strict=True))
    totals: dict[tuple[Any, ...], list[int]] = {}
    anys: dict[tuple[Any, ...], list[bool]] = {}
    width = len(keys)
    columns = [table.column(n).to_pylist() for n in (*keys, *sums, *flags)]
    for row in zip(*columns, strict=True):
        key = row[:width]
        total = totals.setdefault(key, [0] * len(sums))
        seen = anys.setdefault(key, [False] * len(flags))
        for i in range(len(sums)):
            total[i] += int(row[width + i])
        for i in range(len(flags)):
            seen[i] = seen[i] or bool(row[width + len(sums) + i])
    return [(*key, *totals[key], *anys[key]) for key in totals]


def balance_moves(postings: pa.Table | None, usage: pa.Table | None) -> pa.Table:
    """The balance movements of a batch's postings (`POSTINGS_SCHEMA` rows) and column-built
    usage (`usage_to_arrow` rows), one row per (account, unit, period), `BALANCE_MOVES_SCHEMA`."""
    moves: dict[Key, int] = {}

    def move(rows: Iterable[tuple[str, str, str, int]]) -> None:
        for account, unit, period, amount in rows:
            key = (account, unit, period)
            moves[key] = moves.get(key, 0) + amount

    if postings is not None and postings.num_rows:
        move(_grouped(postings, ["account", "unit", "period"], ["amount"]))
    if usage is not None and usage.num_rows:
        flagged = usage.select(
            ["account", "capacity", "period", "gpu_ms", "money", "energy_mj"]
        ).append_column("energy", pc.not_equal(usage.column("energy_mj"), 0))
        groups = _grouped(
            flagged,
            ["account", "capacity", "period"],
            ["gpu_ms", "money", "energy_mj"],
            ["energy"],
        )
        for account, capacity, period, ms, money, energy, has_energy in groups:
            amounts = (ms, money, energy) if has_energy else (ms, money)
            for unit, amount in zip(LEG_UNITS, amounts, strict=False):
                move(
                    ((account, unit.value, period, amount), (capacity, unit.value, period, -amount))
                )
    keys = list(moves)
    try:
        amounts = pa.array(list(moves.values()), pa.int64())
    except (OverflowError, pa.ArrowInvalid) as exc:
        raise StoreError(f"a balance moves past the 64-bit range: {exc}") from exc
    return pa.table(
        [
            pa.array([k[0] for k in keys], pa.string()),
            pa.array([k[1] for k in keys], pa.string()),
            pa.array([k[2] for k in keys], pa.string()),
            amounts,
        ],
        schema=BALANCE_MOVES_SCHEMA,
    )
