"""The price book: what one GPU-hour of a model (optionally in a pool) costs, effective-dated.

A price applies from its effective time on, never before: `rate_at` picks the latest entry whose
`effective_us` is not after the time asked, and `rates_between` cuts an interval at every price
change inside it. A pool-specific entry beats the model-wide one, and
the model `*` is the fallback for models with no entry of their own. Energy, when priced, has
its own effective-dated rates per kWh (`EnergyPrice`), optionally per pool.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise

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
class EnergyPrice:
    """Energy at this many micro-units per kWh from `effective_us` on (in `pool`, or any)."""

    micros_per_kwh: int
    effective_us: int = 0
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class PriceBook:
    prices: tuple[Price, ...]
    energy: tuple[EnergyPrice, ...] = ()
    _cache: dict[tuple[str, str], tuple[Price, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _points: dict[tuple[str, str], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Per (model, pool) with a price: (the last time its price may change, the rate from then on)
    _steady: dict[tuple[str, str], tuple[int, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def _candidates(self, model: str, pool: str) -> tuple[Price, ...]:
        """Prices that may apply to `model` in `pool`, best first for any given time."""
        key = (model, pool)
        found = self._cache.get(key)
        if found is None:
            usable = [
                p
                for p in self.prices
                if p.model in (model, ANY_MODEL) and (p.pool is None or p.pool == pool)
            ]
            usable.sort(
                key=lambda p: ((p.model == model) * 2 + (p.pool is not None), p.effective_us),
                reverse=True,
            )
            found = self._cache[key] = tuple(usable)
        return found

    def _change_points(self, model: str, pool: str) -> tuple[int, ...]:
        key = (model, pool)
        found = self._points.get(key)
        if found is None:
            found = self._points[key] = tuple(
                sorted({p.effective_us for p in self._candidates(model, pool)})
            )
        return found

    def price_at(self, model: str, pool: str, time_us: int) -> Price | None:
        """The price entry in force for `model` in `pool` at `time_us`, or None."""
        for price in self._candidates(model, pool):
            if price.effective_us <= time_us:
                return price
        return None

    def change_points(self, model: str, pool: str) -> tuple[int, ...]:
        """The times at which the price of `model` in `pool` may change, ascending."""
        return self._change_points(model, pool)

    def rate_at(self, model: str, pool: str, time_us: int) -> int:
        """Micro-units per GPU-hour for `model` in `pool` at `time_us`."""
        price = self.price_at(model, pool, time_us)
        if price is None:
            raise PricingError(f"no price for GPU model {model!r} in pool {pool!r}")
        return price.micros_per_gpu_hour

    def energy_rate_at(self, pool: str, time_us: int) -> int | None:
        """Micro-units per kWh in `pool` at `time_us`, or None when energy is not priced."""
        price = self.energy_price_at(pool, time_us)
        return None if price is None else price.micros_per_kwh

    def energy_price_at(self, pool: str, time_us: int) -> EnergyPrice | None:
        """The energy price entry in force in `pool` at `time_us`, or None."""
        best: EnergyPrice | None = None
        for price in self.energy:
            if price.effective_us > time_us or price.pool not in (None, pool):
                continue
            if best is None or (price.pool is not None, price.effective_us) > (
                best.pool is not None,
                best.effective_us,
            ):
                best = price
        return best

    def rates_between(
        self, model: str, pool: str, start_us: int, end_us: int
    ) -> list[tuple[int, int, int]]:
        """`(from_us, to_us, rate)` pieces covering `[start_us, end_us)`, one per price in force.

        A price that takes effect inside the interval applies to the part after it only.
        """
        steady = self._steady.get((model, pool))
        if steady is not None and start_us >= steady[0]:  # after the last change: one piece
            return [(start_us, end_us, steady[1])]
        points = self._change_points(model, pool)
        if points and steady is None:
            last = self.price_at(model, pool, points[-1])
            if last is not None:
                self._steady[(model, pool)] = (points[-1], last.micros_per_gpu_hour)
        first = bisect_right(points, start_us)
        if first == len(points) or points[first] >= end_us:  # no change inside: one piece
            return [(start_us, end_us, self.rate_at(model, pool, start_us))]
        changes = [p for p in points[first:] if p < end_us]
        pieces: list[tuple[int, int, int]] = []
        for lo, hi in pairwise([start_us, *changes, end_us]):
            rate = self.rate_at(model, pool, lo)
            if pieces and pieces[-1][2] == rate:
                pieces[-1] = (pieces[-1][0], hi, rate)
            else:
                pieces.append((lo, hi, rate))
        return pieces


MJ_PER_KWH = 3_600_000_000


def energy_cost(energy_mj: int, micros_per_kwh: int) -> int:
    """Money for `energy_mj` at a rate per kWh, rounded half-even to a micro-unit."""
    return divide_round_half_even(energy_mj * micros_per_kwh, MJ_PER_KWH)


def cost_of(gpu_ms: int, micros_per_gpu_hour: int) -> int:
    """Money for `gpu_ms` at a rate, rounded half-even to a micro-unit (the one rounding step)."""
    return divide_round_half_even(gpu_ms * micros_per_gpu_hour, MS_PER_HOUR)


def encode_price_book(book: PriceBook) -> str:
    """`book` as JSON text (integers only), for a process that cannot read the configuration."""
    return json.dumps(
        {
            "prices": [
                [p.model, p.micros_per_gpu_hour, p.effective_us, p.pool] for p in book.prices
            ],
            "energy": [[e.micros_per_kwh, e.effective_us, e.pool] for e in book.energy],
        },
        separators=(",", ":"),
    )


def decode_price_book(text: str) -> PriceBook:
    """The book `encode_price_book` wrote. Raises ValueError for anything else."""
    try:
        data = json.loads(text)
        prices = tuple(
            Price(str(m), _integer(r), _integer(t), None if p is None else str(p))
            for m, r, t, p in data["prices"]
        )
        energy = tuple(
            EnergyPrice(_integer(r), _integer(t), None if p is None else str(p))
            for r, t, p in data["energy"]
        )
    except (TypeError, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a price book: {exc}") from exc
    return PriceBook(prices, energy)


def _integer(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return value
