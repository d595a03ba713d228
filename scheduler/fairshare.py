"""Fair share from decayed metered usage.

Usage arrives as GPU-ms per team, measured by the ledger (not requested by jobs). It decays
exponentially with a configurable half-life, so last week's usage counts half as much as
today's when the half-life is a week. A team's standing is its decayed usage divided by its
weight (by default its nominal GPUs); lower standing is served first.

Invariants:
- decayed usage is integer GPU-ms; the decay factor is the only float, and the product is
  rounded down once per decay step, here (`decay`);
- decay is monotone: usage never grows without new metering, and never goes below zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.errors import ConfigError

DEFAULT_HALF_LIFE_US = 7 * 24 * 3_600_000_000
STANDING_SCALE = 1_000_000  # standing is usage × STANDING_SCALE // weight, an integer


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """A team's decayed GPU-ms as of a time."""

    gpu_ms: int = 0
    as_of_us: int = 0


def decay(gpu_ms: int, elapsed_us: int, half_life_us: int) -> int:
    """`gpu_ms` after `elapsed_us` of exponential decay, rounded down."""
    if half_life_us <= 0:
        raise ConfigError("fair share: the half-life must be positive")
    if elapsed_us <= 0 or gpu_ms == 0:
        return gpu_ms
    return int(gpu_ms * 2.0 ** (-elapsed_us / half_life_us))


def accrue(usage: DecayedUsage, gpu_ms: int, at_us: int, half_life_us: int) -> DecayedUsage:
    """Add metered `gpu_ms` at `at_us`. Metering that arrives late is added without decay."""
    if gpu_ms < 0:
        raise ValueError("metered usage must not be negative")
    if at_us <= usage.as_of_us:
        return DecayedUsage(usage.gpu_ms + gpu_ms, usage.as_of_us)
    decayed = decay(usage.gpu_ms, at_us - usage.as_of_us, half_life_us)
    return DecayedUsage(decayed + gpu_ms, at_us)


def usage_at(usage: DecayedUsage, now_us: int, half_life_us: int) -> int:
    return decay(usage.gpu_ms, now_us - usage.as_of_us, half_life_us)


def usage_now(usages: Mapping[str, DecayedUsage], now_us: int, half_life_us: int) -> dict[str, int]:
    """Every team's decayed usage at `now_us`."""
    return {team: usage_at(u, now_us, half_life_us) for team, u in usages.items()}


def standing(usage_gpu_ms: int, weight: int) -> int:
    """Usage per unit of weight; lower is served first."""
    return usage_gpu_ms * STANDING_SCALE // max(1, weight)


def meter_all(
    usages: Mapping[str, DecayedUsage],
    metered: Iterable[tuple[str, int]],
    at_us: int,
    half_life_us: int,
) -> dict[str, DecayedUsage]:
    """A new usage table with `metered` (team, GPU-ms) added at `at_us`."""
    table = dict(usages)
    for team, gpu_ms in metered:
        table[team] = accrue(table.get(team, DecayedUsage(0, at_us)), gpu_ms, at_us, half_life_us)
    return table
