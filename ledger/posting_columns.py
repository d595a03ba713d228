"""Usage transactions column by column: the ingest's fast path builds these instead of
`Transaction` objects, and the store writes them as they are.

A `PostingColumns` holds whole usage transactions: the `txn_*` lists one entry per transaction,
the posting lists one entry per posting (`txn_index` names its transaction, legs are numbered in
order within it). The same transactions as `Transaction` values (`transactions()`) are exactly
what the per-sample path makes; `ledger.ingest.samples` is property-tested for that.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from ledger.events import Owner
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.units import Unit


@dataclass(slots=True)
class PostingColumns:
    """A column buffer of usage transactions and where each came from."""

    txn_id: list[str] = field(default_factory=list)
    gpu_uuid: list[str] = field(default_factory=list)
    model: list[str] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    node: list[str] = field(default_factory=list)
    start_us: list[int] = field(default_factory=list)
    end_us: list[int] = field(default_factory=list)
    period: list[str] = field(default_factory=list)
    util_pct: list[int | None] = field(default_factory=list)
    idle: list[bool] = field(default_factory=list)
    topic: list[str] = field(default_factory=list)
    partition: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    txn_index: list[int] = field(default_factory=list)
    leg: list[int] = field(default_factory=list)
    account: list[str] = field(default_factory=list)
    unit: list[str] = field(default_factory=list)
    amount: list[int] = field(default_factory=list)
    team: list[str | None] = field(default_factory=list)
    project: list[str | None] = field(default_factory=list)
    user: list[str | None] = field(default_factory=list)
    job_id: list[str | None] = field(default_factory=list)
    cost_centre: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.txn_id)

    def add_usage(
        self,
        head: tuple[str, str, str, str, str, int, int, str, int | None],
        source: tuple[str, int, int],
        holder: tuple[str, Owner | None, str | None],
        capacity: str,
        amounts: tuple[int, int, int],
    ) -> int:
        """Append one usage transaction of a single holder; its index.

        `head`: (txn id, GPU, model, pool, node, start, end, period, util); `source`: (topic,
        partition, offset); `holder`: (account, owner or None for unallocated, cost centre);
        `amounts`: (GPU-ms, money, energy mJ; energy 0 posts no energy legs).
        """
        index = len(self.txn_id)
        txn_id, gpu, model, pool, node, start, end, period, util = head
        self.txn_id.append(txn_id)
        self.gpu_uuid.append(gpu)
        self.model.append(model)
        self.pool.append(pool)
        self.node.append(node)
        self.start_us.append(start)
        self.end_us.append(end)
        self.period.append(period)
        self.util_pct.append(util)
        self.idle.append(False)
        self.topic.append(source[0])
        self.partition.append(source[1])
        self.offset.append(source[2])
        account, owner, centre = holder
        ms, money, energy = amounts
        units = (Unit.GPU_MS, Unit.MONEY, Unit.ENERGY_MJ) if energy else (Unit.GPU_MS, Unit.MONEY)
        values = (ms, money, energy)
        dims = (
            (owner.team, owner.project, owner.user, owner.job_id, centre)
            if owner is not None
            else (None, None, None, None, None)
        )
        leg = 0
        for side_account, sign, side_dims in (
            (account, 1, dims),
            (capacity, -1, (None, None, None, None, None)),
        ):
            for unit, value in zip(units, values, strict=False):
                self.txn_index.append(index)
                self.leg.append(leg)
                self.account.append(side_account)
                self.unit.append(unit.value)
                self.amount.append(sign * value)
                self.team.append(side_dims[0])
                self.project.append(side_dims[1])
                self.user.append(side_dims[2])
                self.job_id.append(side_dims[3])
                self.cost_centre.append(side_dims[4])
                leg += 1
        return index

    def without(self, drop: Collection[int]) -> PostingColumns:
        """A copy without the transactions at indices `drop`."""
        kept = PostingColumns()
        renumber: dict[int, int] = {}
        for i in range(len(self)):
            if i in drop:
                continue
            renumber[i] = len(kept.txn_id)
            for name in _TXN_FIELDS:
                getattr(kept, name).append(getattr(self, name)[i])
        for p, txn in enumerate(self.txn_index):
            if txn in renumber:
                kept.txn_index.append(renumber[txn])
                for name in _POSTING_FIELDS:
                    getattr(kept, name).append(getattr(self, name)[p])
        return kept

    def transactions(self) -> Iterator[tuple[Transaction, tuple[str, int, int]]]:
        """Each transaction as a value, with its source (topic, partition, offset)."""
        legs: list[list[Posting]] = [[] for _ in range(len(self))]
        for p, owner_txn in enumerate(self.txn_index):
            legs[owner_txn].append(
                Posting(
                    self.account[p],
                    Unit(self.unit[p]),
                    self.amount[p],
                    self.team[p],
                    self.project[p],
                    self.user[p],
                    self.job_id[p],
                    self.cost_centre[p],
                )
            )
        for i in range(len(self)):
            txn = Transaction(
                txn_id=self.txn_id[i],
                kind=TransactionKind.USAGE,
                start_us=self.start_us[i],
                end_us=self.end_us[i],
                gpu_uuid=self.gpu_uuid[i],
                model=self.model[i],
                pool=self.pool[i],
                node=self.node[i],
                postings=tuple(legs[i]),
                cause=(self.txn_id[i],),
                period=self.period[i],
                util_pct=self.util_pct[i],
                idle=self.idle[i],
            )
            yield txn, (self.topic[i], self.partition[i], self.offset[i])


_TXN_FIELDS = (
    "txn_id",
    "gpu_uuid",
    "model",
    "pool",
    "node",
    "start_us",
    "end_us",
    "period",
    "util_pct",
    "idle",
    "topic",
    "partition",
    "offset",
)
_POSTING_FIELDS = (
    "leg",
    "account",
    "unit",
    "amount",
    "team",
    "project",
    "user",
    "job_id",
    "cost_centre",
)
