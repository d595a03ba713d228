"""Usage transactions column by column: the ingest's fast path builds these instead of
`Transaction` objects, and the store writes them as they are.

A `PostingColumns` holds whole usage transactions of a single holder, one row each: where it
came from, the interval, the holder's account and dimensions, the capacity account, and the
GPU time, money and energy it moves. Its postings follow from the row: the holder's legs
(GPU-ms, money, and energy when there is any) then the capacity's legs of the opposite sign, so
every transaction sums to zero per unit by construction. The same transactions as `Transaction`
values (`transactions()`) are exactly what the per-sample path makes; `ledger.ingest.samples`
is property-tested for that.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from ledger.postings import Posting, Transaction, TransactionKind
from ledger.units import Unit

# The fields of a row, in order.
ROW_FIELDS = (
    "txn_id",
    "gpu_uuid",
    "model",
    "pool",
    "node",
    "start_us",
    "end_us",
    "period",
    "util_pct",
    "topic",
    "partition",
    "offset",
    "account",
    "capacity",
    "team",
    "project",
    "user",
    "job_id",
    "cost_centre",
    "gpu_ms",
    "money",
    "energy_mj",
)
UsageRow = tuple[
    str, str, str, str, str, int, int, str, int | None, str, int, int,
    str, str, str | None, str | None, str | None, str | None, str | None, int, int, int,
]  # fmt: skip
LEG_UNITS = (Unit.GPU_MS, Unit.MONEY, Unit.ENERGY_MJ)  # per side, energy only when there is any


@dataclass(slots=True)
class PostingColumns:
    """A buffer of single-holder usage transactions; `idle` holds the indices flagged idle."""

    rows: list[UsageRow] = field(default_factory=list)
    idle: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: UsageRow) -> int:
        """Append one transaction; its index."""
        self.rows.append(row)
        return len(self.rows) - 1

    def columns(self) -> dict[str, tuple[object, ...]]:
        """The rows as columns, by field name (empty tuples when there are none)."""
        if not self.rows:
            return {name: () for name in ROW_FIELDS}
        return dict(zip(ROW_FIELDS, zip(*self.rows, strict=True), strict=True))

    def without(self, drop: Collection[int]) -> PostingColumns:
        """A copy without the transactions at indices `drop`."""
        kept = PostingColumns()
        for index, row in enumerate(self.rows):
            if index not in drop:
                if index in self.idle:
                    kept.idle.add(len(kept.rows))
                kept.rows.append(row)
        return kept

    def transactions(self) -> Iterator[tuple[Transaction, tuple[str, int, int]]]:
        """Each transaction as a value, with its source (topic, partition, offset)."""
        for index, row in enumerate(self.rows):
            (txn_id, gpu, model, pool, node, start, end, period, util, topic, partition,
             offset, account, capacity, team, project, user, job, centre, ms, money,
             energy) = row  # fmt: skip
            amounts = (ms, money, energy) if energy else (ms, money)
            holder = [
                Posting(account, unit, amount, team, project, user, job, centre)
                for unit, amount in zip(LEG_UNITS, amounts, strict=False)
            ]
            other = [
                Posting(capacity, unit, -amount)
                for unit, amount in zip(LEG_UNITS, amounts, strict=False)
            ]
            txn = Transaction(
                txn_id=txn_id,
                kind=TransactionKind.USAGE,
                start_us=start,
                end_us=end,
                gpu_uuid=gpu,
                model=model,
                pool=pool,
                node=node,
                postings=(*holder, *other),
                cause=(txn_id,),
                period=period,
                util_pct=util,
                idle=index in self.idle,
            )
            yield txn, (topic, partition, offset)
