"""Builders for sealed ledgers of hand-written transactions, for the report tests: what the
reports read, without the ingest that would book it (that is `tests.ledger_harness`).

`LedgerBuilder` writes transactions (usage, adjustments, budget grants) through the real
`DuckDBStore` and seals them; `build_fleet` is a month of a small fleet whose totals are worked
out by hand, shared by the cost, idle, FOCUS, statement and CLI report tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.accounts import capacity_account, consumer_account, unallocated_account
from ledger.periods import period_label
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.store.hot import DuckDBStore
from ledger.store.port import OffsetRange, SourcedTransaction
from ledger.units import Unit
from tests.builders import T0_US

HOUR_US = 3_600_000_000
NOV = "2026-11"
OCT = "2026-10"


@dataclass(frozen=True, slots=True)
class Who:
    team: str
    project: str
    user: str | None = None
    job: str | None = None
    centre: str | None = None


@dataclass
class LedgerBuilder:
    """Writes hand-made transactions through the real store and seals them."""

    data_dir: Path
    txns: list[Transaction] = field(default_factory=list)

    def _add(
        self,
        kind: TransactionKind,
        postings: list[Posting],
        *,
        at_us: int = T0_US,
        length_us: int = 10_000_000,
        gpu: str = "GPU-1",
        model: str = "H100",
        pool: str = "h100",
        period: str | None = None,
        idle: bool = False,
    ) -> None:
        self.txns.append(
            Transaction(
                txn_id=f"t{len(self.txns):04d}",
                kind=kind,
                start_us=at_us,
                end_us=at_us + length_us,
                gpu_uuid=gpu,
                model=model,
                pool=pool,
                node="node-01",
                postings=tuple(postings),
                cause=(f"cause-{len(self.txns)}",),
                period=period or period_label(at_us),
                util_pct=3 if idle else 90,
                idle=idle,
            )
        )

    def usage(
        self,
        who: Who | None,
        gpu_ms: int,
        micros: int,
        *,
        pool: str = "h100",
        model: str = "H100",
        **txn: Any,
    ) -> LedgerBuilder:
        """One sample's transaction: `who` (None: unallocated) debited, capacity credited."""
        if who is None:
            account = unallocated_account(pool, model)
            legs = [Posting(account, Unit.GPU_MS, gpu_ms), Posting(account, Unit.MONEY, micros)]
        else:
            account = consumer_account(who.team, who.project)
            dims = (who.team, who.project, who.user, who.job, who.centre)
            legs = [
                Posting(account, Unit.GPU_MS, gpu_ms, *dims),
                Posting(account, Unit.MONEY, micros, *dims),
            ]
        capacity = capacity_account(pool, model)
        legs += [Posting(capacity, Unit.GPU_MS, -gpu_ms), Posting(capacity, Unit.MONEY, -micros)]
        self._add(TransactionKind.USAGE, legs, pool=pool, model=model, **txn)
        return self

    def adjustment(
        self,
        who: Who,
        micros: int,
        gpu_ms: int = 0,
        *,
        pool: str = "h100",
        model: str = "H100",
        **txn: Any,
    ) -> LedgerBuilder:
        """A correction of `who`'s charges, balanced against the capacity account."""
        account = consumer_account(who.team, who.project)
        dims = (who.team, who.project, who.user, who.job, who.centre)
        capacity = capacity_account(pool, model)
        legs = [Posting(account, Unit.MONEY, micros, *dims), Posting(capacity, Unit.MONEY, -micros)]
        if gpu_ms:
            legs += [
                Posting(account, Unit.GPU_MS, gpu_ms, *dims),
                Posting(capacity, Unit.GPU_MS, -gpu_ms),
            ]
        self._add(TransactionKind.ADJUSTMENT, legs, pool=pool, model=model, **txn)
        return self

    def grant(self, team: str, amount: int, unit: Unit = Unit.MONEY, **txn: Any) -> LedgerBuilder:
        """A budget grant: `budget:<team>` credited (negative), the funding account debited."""
        legs = [Posting(f"budget:{team}", unit, -amount), Posting(f"funding:{team}", unit, amount)]
        self._add(TransactionKind.BUDGET_GRANT, legs, gpu="", model="", pool="", **txn)
        return self

    def seal(self) -> Path:
        with DuckDBStore(self.data_dir) as store:
            items = [SourcedTransaction(t, "tx", 0, i) for i, t in enumerate(self.txns)]
            if items:
                store.commit("inc", [OffsetRange("tx", 0, 0, len(items) - 1)], items)
            store.seal()
        return self.data_dir


ADA = Who("vision", "detection", "ada", "j1", "research")
BOB = Who("vision", "segmentation", "bob", "j2", "research")
DEE = Who("vision", "segmentation", "dee", "j4", "research")
CY = Who("language", "pretraining", "cy", "j3", "nlp")


def build_fleet(data_dir: Path) -> LedgerBuilder:
    """November 2026 (and a little October) on three pools; totals worked out by hand:

    consumer  vision   136,000 ms  130,000 µ  (18,000 ms / 18,000 µ allocated but idle;
                                              a −6,000 µ credit)
              language  66,000 ms  134,000 µ  (6,000 ms / 12,000 µ late from October;
                                              a +2,000 µ adjustment)
    unalloc.  h100      54,000 ms   54,001 µ  (its transaction flagged idle: still not waste)
              a100      30,000 ms   60,000 µ
              l4     3,600,000 ms  500,000 µ  (nobody used l4)
    November money total 878,001 µ.
    """
    b = LedgerBuilder(data_dir)
    b.usage(ADA, 18_000, 18_000, gpu="GPU-1", at_us=T0_US)
    b.usage(ADA, 18_000, 18_000, gpu="GPU-1", at_us=T0_US + 20_000_000)  # same hour: one row
    b.usage(ADA, 18_000, 18_000, gpu="GPU-1", at_us=T0_US + 40_000_000, idle=True)
    b.usage(BOB, 72_000, 72_000, gpu="GPU-2", at_us=T0_US + HOUR_US)
    b.usage(DEE, 10_000, 10_000, gpu="GPU-2", at_us=T0_US + 2 * HOUR_US)
    b.usage(CY, 60_000, 120_000, pool="a100", model="A100", gpu="GPU-3", at_us=T0_US)
    b.usage(None, 54_000, 54_001, gpu="GPU-2", at_us=T0_US + 3 * HOUR_US, idle=True)
    b.usage(None, 30_000, 60_000, pool="a100", model="A100", gpu="GPU-3", at_us=T0_US + HOUR_US)
    b.usage(None, 3_600_000, 500_000, pool="l4", model="L4", gpu="GPU-4", at_us=T0_US)
    # late usage: incurred in October, booked into November
    b.usage(
        CY, 6_000, 12_000, pool="a100", model="A100", gpu="GPU-3", at_us=T0_US - HOUR_US, period=NOV
    )
    # October's own usage
    b.usage(ADA, 36_000, 36_000, gpu="GPU-1", at_us=T0_US - 48 * HOUR_US)
    b.adjustment(ADA, -6_000, at_us=T0_US + 5 * HOUR_US, length_us=HOUR_US)
    b.adjustment(CY, 2_000, pool="a100", model="A100", gpu="GPU-3", at_us=T0_US + 6 * HOUR_US)
    return b


NOV_TOTAL = 878_001
