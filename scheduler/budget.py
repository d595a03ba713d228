"""Budgets: the hold a job's admission places, and whether a team's balance covers it.

- hold = expected usage: GPU-ms = GPUs × estimated runtime (ms, rounded up); money = that
  GPU-ms at the flavor's price (`ledger.pricing.cost_of`, the ledger's one rounding rule); a
  MIG instance is held as a whole GPU of its model (an upper bound: the ledger charges its
  slices, and the metered usage settles the hold);
- a job fits the budget when, for every budgeted dimension,
  balance − open holds − hold ≥ −overdraft;
- a team with no balance, or a dimension that is None, is not limited;
- holds are released when the job ends; the ledger settles the metered usage into the balance.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.errors import PricingError
from ledger.fractional import priced_model
from ledger.job_events import JobSpec
from ledger.pricing import PriceBook, cost_of
from ledger.units import US_PER_MS
from scheduler.model import NO_HOLD, Balance, Flavor, Holds


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    fits: bool
    hold: Holds
    priced: bool = True  # False: a money budget applies but the flavor has no price
    detail: str = ""


def expected_gpu_ms(spec: JobSpec) -> int:
    return spec.gpus * -(-spec.estimated_runtime_us // US_PER_MS)


def check_budget(
    spec: JobSpec,
    flavor: Flavor,
    balance: Balance | None,
    open_holds: Holds,
    prices: PriceBook | None,
    now_us: int,
) -> BudgetCheck:
    """The hold for `spec` in `flavor`, and whether the team's balance covers it."""
    gpu_ms = expected_gpu_ms(spec)
    if balance is None or (balance.money_micros is None and balance.gpu_ms is None):
        return BudgetCheck(True, Holds(0, gpu_ms))
    money = 0
    if balance.money_micros is not None:
        try:
            book = prices or PriceBook(())
            rate = book.rate_at(priced_model(flavor.model), flavor.pool, now_us)
        except PricingError:
            return BudgetCheck(False, NO_HOLD, priced=False, detail=f"no price for {flavor}")
        money = cost_of(gpu_ms, rate)
    hold = Holds(money, gpu_ms)
    if balance.money_micros is not None:
        left = balance.money_micros - open_holds.money_micros - money
        if left < -balance.overdraft_micros:
            return BudgetCheck(
                False,
                hold,
                detail=f"money: balance {balance.money_micros} − holds "
                f"{open_holds.money_micros} − hold {money} < −overdraft "
                f"{balance.overdraft_micros} (micro-units)",
            )
    if balance.gpu_ms is not None:
        left = balance.gpu_ms - open_holds.gpu_ms - gpu_ms
        if left < -balance.overdraft_gpu_ms:
            return BudgetCheck(
                False,
                hold,
                detail=f"GPU time: balance {balance.gpu_ms} − holds {open_holds.gpu_ms} − hold "
                f"{gpu_ms} < −overdraft {balance.overdraft_gpu_ms} (GPU-ms)",
            )
    return BudgetCheck(True, hold)
