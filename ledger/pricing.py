"""The price book: what one GPU-hour of a model (optionally in a pool) costs, effective-dated.

A price applies from its effective time on, never before: `rate_at` picks the latest entry whose
`effective_us` is not after the time asked. A pool-specific entry beats the model-wide one, and
the model `*` is the fallback for models with no entry of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.errors import PricingError
from ledger.units import MS_PER_HOUR, divide_round_half_even

ANY_MODEL = "*"


@dataclass(frozen=True, slots=True)
class Price:
    model: str
    micros_per_gpu_hour: int
    effective_us: int = 0
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class PriceBook:
    prices: tuple[Price, ...]

    def rate_at(self, model: str, pool: str, time_us: int) -> int:
        """Micro-units per GPU-hour for `model` in `pool` at `time_us`."""
        best: Price | None = None
        best_rank = (-1, -1)
        for price in self.prices:
            if price.effective_us > time_us:
                continue
            if price.model not in (model, ANY_MODEL):
                continue
            if price.pool is not None and price.pool != pool:
                continue
            specificity = (price.model == model) * 2 + (price.pool is not None)
            rank = (specificity, price.effective_us)
            if rank > best_rank:
                best, best_rank = price, rank
        if best is None:
            raise PricingError(f"no price for GPU model {model!r} in pool {pool!r}")
        return best.micros_per_gpu_hour


def cost_of(gpu_ms: int, micros_per_gpu_hour: int) -> int:
    """Money for `gpu_ms` at a rate, rounded half-even to a micro-unit (the one rounding step)."""
    return divide_round_half_even(gpu_ms * micros_per_gpu_hour, MS_PER_HOUR)
