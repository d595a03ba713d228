"""Price-aware placement: which GPU models a job may go to, in which order, and why one was
chosen.

Rules:
- a job accepts one model, several (`JobSpec.accepted_models`), or any; its queue's model
  policy (`Queue.permits`) drops the models it forbids — a job left with none of the models it
  named can never run (the service refuses it at submit; a cycle makes it wait with
  `no_matching_gpus`);
- price-aware order: the candidate flavors cheapest first — the price per GPU-hour at the
  cycle's time, per pool where prices are per pool — then by model and pool name, so the order
  is deterministic; a flavor with no price comes last;
- the note (`placement_note`) a multi-model admission carries says what was chosen at what
  price, which cheaper flavors did not admit the job and why, which were not needed, and which
  models the queue dropped. Flavors are named by model, or pool/model where a model is in
  several pools. Rates show as currency units with at least two decimals.

Pure: prices and time are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ledger.errors import PricingError
from ledger.fractional import priced_model
from ledger.job_events import MAX_DETAIL, WaitReason
from ledger.pricing import PriceBook
from ledger.units import MICROS_PER_UNIT
from scheduler.model import Flavor, Queue

_SHORT: dict[WaitReason, str] = {
    WaitReason.NO_CAPACITY: "full",
    WaitReason.QUOTA_EXHAUSTED: "over quota",
    WaitReason.COHORT_EXHAUSTED: "over quota (cohort has none to lend)",
    WaitReason.QUOTA_LENT: "quota lent out",
    WaitReason.BUDGET_EXHAUSTED: "over budget",
    WaitReason.NO_PRICE: "no price",
    WaitReason.TOPOLOGY: "free GPUs fragmented",
}


def split_by_queue(models: Sequence[str], queue: Queue) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(kept, dropped): the models a job named that its queue permits, and those it forbids."""
    kept = tuple(m for m in models if queue.permits(m))
    dropped = tuple(m for m in models if not queue.permits(m))
    return kept, dropped


def forbidden_detail(dropped: Sequence[str], queue: Queue) -> str:
    return clip(f"queue {queue.name} does not allow model(s) {', '.join(dropped)}")


def rate_of(prices: PriceBook | None, flavor: Flavor, now_us: int) -> int | None:
    """Micro-units per GPU-hour of `flavor` at `now_us`, None when it has no price."""
    if prices is None:
        return None
    try:
        return prices.rate_at(priced_model(flavor.model), flavor.pool, now_us)
    except PricingError:
        return None


def cheapest_first(
    flavors: Iterable[Flavor], prices: PriceBook | None, now_us: int
) -> tuple[Flavor, ...]:
    """`flavors` by price per GPU-hour at `now_us` (unpriced last), then model, then pool."""

    def key(flavor: Flavor) -> tuple[bool, int, str, str]:
        rate = rate_of(prices, flavor, now_us)
        return (rate is None, rate or 0, flavor.model, flavor.pool)

    return tuple(sorted(flavors, key=key))


def format_rate(micros: int | None) -> str:
    """A rate in micro-units as currency units per GPU-hour: 1800000 → `1.80/GPU-h`."""
    if micros is None:
        return "no price"
    whole, frac = divmod(micros, MICROS_PER_UNIT)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{whole}.{digits}/GPU-h"


def placement_note(
    chosen: Flavor,
    flavors: Sequence[Flavor],
    tried: Sequence[tuple[Flavor, WaitReason]],
    prices: PriceBook | None,
    now_us: int,
    dropped: Sequence[str] = (),
    queue: Queue | None = None,
    preempted: bool = False,
) -> str:
    """Why `chosen` out of `flavors` (in the order they were tried): `tried` are those that did
    not admit the job, with why; the flavors after `chosen` were not needed. Empty when the job
    had no choice to explain."""
    if len(flavors) < 2 and not dropped:
        return ""
    by_model = len({f.model for f in flavors}) == len(flavors)  # a model names its flavor

    def label(flavor: Flavor) -> str:
        return flavor.model if by_model else str(flavor)

    def priced(flavor: Flavor) -> str:
        return f"{label(flavor)} {format_rate(rate_of(prices, flavor, now_us))}"

    rate = format_rate(rate_of(prices, chosen, now_us))
    passed = [(f, why) for f, why in tried if f != chosen]
    parts: list[str] = []
    if not passed and not preempted:
        parts.append(f"placed on {label(chosen)}: cheapest acceptable at {rate}")
    else:
        blocked = ", ".join(f"{label(f)} {_SHORT.get(why, why.value)}" for f, why in passed)
        how = " after preemption" if preempted else ""
        parts.append(f"{blocked + ', ' if blocked else ''}{label(chosen)} chosen{how} at {rate}")
    seen = {chosen, *(f for f, _ in passed)}
    spare = [f for f in flavors if f not in seen]
    if spare:
        parts.append(", ".join(priced(f) for f in spare) + " not needed")
    if dropped and queue is not None:
        parts.append(forbidden_detail(dropped, queue))
    return clip("; ".join(parts))


def clip(text: str) -> str:
    """`text` cut to what an event's detail may hold (`MAX_DETAIL`)."""
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"
