"""How the ledger's consumer balances become metered usage for fair share: a team's GPU-ms
total the scheduler sees for the first time is spread over time (`first_metering`), later
increases are metered when they arrive (`Dispatcher.on_balance`). Pure."""

from __future__ import annotations

from datetime import tzinfo

from ledger.balances import BalanceUpdate
from ledger.periods import Period
from ledger.units import US_PER_HOUR, Unit

BEFORE_FIRST_PERIOD_US = 31 * 24 * US_PER_HOUR  # usage older than every open period's rows


def first_metering(
    update: BalanceUpdate, total: int, at_us: int, zone: tzinfo
) -> list[tuple[int, int]]:
    """(time µs, GPU-ms) pieces of a consumer's `total` seen for the first time, in time order:
    the usage of each open period at that period's end (at most `at_us`), the rest a month
    before the first of them. Times are never negative."""
    rows = sorted(
        (r for r in update.periods if r.unit == Unit.GPU_MS.value), key=lambda r: r.period
    )
    in_rows = 0
    metered: list[tuple[int, int]] = []
    for row in rows:
        try:
            end = Period.month(row.period, zone).end_us
        except ValueError:
            continue
        if row.balance > 0:
            metered.append((min(end, at_us), row.balance))
            in_rows += row.balance
    earlier = total - in_rows
    if earlier > 0:
        first = metered[0][0] if metered else at_us
        metered.insert(0, (first - BEFORE_FIRST_PERIOD_US, earlier))
    return [(max(0, when), gpu_ms) for when, gpu_ms in sorted(metered)]
