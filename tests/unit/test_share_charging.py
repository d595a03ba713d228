"""The ledger charges a GPU-share job what it held — its per-mille × the time it held it —
whatever its processes used, and the unheld rest of the GPU goes to unallocated capacity, so a
GPU's charges sum exactly to its physical time (`ledger.attribution.share_holders`,
`cumulative_parts`): pure table tests on the attribution, then the scheduler's `GpuAssigned`
through the real ingest into DuckDB."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.accounts import capacity_account, consumer_account, unallocated_account
from ledger.assignments import Holding, assign, owners_over, release, shares_over
from ledger.attribution import attribute_usage, cumulative_parts, physical_gpu_ms
from ledger.events import Owner, envelope_for
from ledger.fractional import share_key
from ledger.job_events import GpuAssigned, GpuReleased
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.units import Unit
from tests.builders import T0_US, a_process, a_sample, an_owner
from tests.unit.test_ingest_assignments import Ledger

GPU = a_sample().gpu_uuid
POOL, MODEL = a_sample().pool, a_sample().model
HOUR_PRICE = 3_600_000  # one micro per GPU-ms
SEC = 1_000_000


def job(name: str, team: str = "vision") -> Owner:
    return Owner(team, "p", "u", name)


@dataclass(frozen=True)
class ChargeCase:
    interval_us: int
    shares: tuple[tuple[str, int, int, int | None], ...]  # job, per-mille, from, to (µs in)
    expected_ms: dict[str | None, int]  # job → GPU-ms (None: unallocated)
    prices: tuple[Price, ...] = (Price("*", HOUR_PRICE),)
    expected_micros: dict[str | None, int] | None = None


CHARGE_CASES = {
    "one-quarter-share": ChargeCase(10 * SEC, (("a", 250, 0, None),), {"a": 2_500, None: 7_500}),
    "three-shares-fill-most-of-the-gpu": ChargeCase(
        10 * SEC,
        (("a", 500, 0, None), ("b", 250, 0, None), ("c", 125, 0, None)),
        {"a": 5_000, "b": 2_500, "c": 1_250, None: 1_250},
    ),
    "thirds-round-so-the-parts-sum-to-the-gpu": ChargeCase(
        10 * SEC,
        (("a", 333, 0, None), ("b", 333, 0, None), ("c", 333, 0, None)),
        {"a": 3_330, "b": 3_330, "c": 3_330, None: 10},
    ),
    "odd-interval-rounds-cumulatively": ChargeCase(
        7_000_001, (("a", 333, 0, None), ("b", 1, 0, None)), {"a": 2_331, "b": 7, None: 4_662}
    ),
    "a-share-ends-mid-interval": ChargeCase(
        10 * SEC,
        (("a", 500, 0, 4 * SEC), ("b", 250, 0, None)),
        {"a": 2_000, "b": 2_500, None: 5_500},
    ),
    "a-share-starts-mid-interval": ChargeCase(
        10 * SEC, (("a", 400, 5 * SEC, None),), {"a": 2_000, None: 8_000}
    ),
    "price-change-inside-the-interval": ChargeCase(
        10 * SEC,
        (("a", 500, 0, None), ("b", 250, 0, None)),
        {"a": 5_000, "b": 2_500, None: 2_500},
        # 1 micro/GPU-ms for the first 4 s, then 3: the GPU's 10 s cost 4,000 + 18,000
        (Price("*", HOUR_PRICE), Price("*", 3 * HOUR_PRICE, effective_us=T0_US + 4 * SEC)),
        {"a": 11_000, "b": 5_500, None: 5_500},
    ),
}


def timeline_of(case: ChargeCase) -> tuple[Holding, ...]:
    timeline: tuple[Holding, ...] = ()
    for name, share, start, _ in case.shares:
        holding = Holding(share_key(GPU, name), job(name), T0_US + start, share=share)
        timeline = assign(timeline, holding)
    for name, _, _, end in case.shares:
        if end is not None:
            timeline = release(timeline, name, T0_US + end)
    return timeline


@pytest.mark.parametrize("case", CHARGE_CASES.values(), ids=CHARGE_CASES.keys())
def test_a_share_is_charged_what_it_held(case: ChargeCase) -> None:
    # the share jobs' processes report utilisation very unlike their shares: it is not charged
    processes = tuple(
        a_process(pid=i, sm=90 if i == 0 else 5, owner=job(name))
        for i, (name, *_) in enumerate(case.shares)
    )
    sample = a_sample(
        gpu_uuid=GPU,
        interval_us=case.interval_us,
        sample_time_us=T0_US + case.interval_us,
        processes=processes,
    )
    start, end = sample.start_us, sample.sample_time_us
    timeline = timeline_of(case)
    held = [*owners_over(timeline, start, end), *shares_over(timeline, start, end)]
    usage = attribute_usage(envelope_for(sample, "sim://n"), PriceBook(case.prices), {}, held)
    ms: dict[str | None, int] = {}
    micros: dict[str | None, int] = {}
    for p in usage.txn.postings:
        if p.account == capacity_account(POOL, MODEL):
            continue
        key = None if p.account == unallocated_account(POOL, MODEL) else p.job_id
        into = ms if p.unit is Unit.GPU_MS else micros
        into[key] = into.get(key, 0) + p.amount
    assert ms == case.expected_ms
    assert sum(ms.values()) == physical_gpu_ms(sample) == usage.gpu_ms
    if case.expected_micros is not None:
        assert micros == case.expected_micros
    assert sum(micros.values()) == usage.cost_micros


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [
        (10, [1, 1, 1], [3, 4, 3]),
        (7, [333, 1, 666], [2, 0, 5]),
        (0, [5, 5], [0, 0]),
        (1_000, [250, 250, 500], [250, 250, 500]),
    ],
    ids=["thirds", "tiny-middle", "nothing", "exact"],
)
def test_cumulative_parts_sum_to_the_total(total: int, weights: list[int], parts: list[int]):
    assert cumulative_parts(total, weights) == parts
    assert sum(parts) == total


def test_a_share_does_not_end_another_share_but_a_new_share_of_its_job_ends_its_own() -> None:
    timeline = assign((), Holding("k", job("a"), T0_US, share=500))
    timeline = assign(timeline, Holding("k", job("b"), T0_US + 1, share=250))
    assert [h.to_us for h in timeline] == [None, None]
    timeline = assign(timeline, Holding("k", job("a"), T0_US + 2, share=250))
    assert [(h.owner.job_id, h.to_us) for h in timeline] == [
        ("a", T0_US + 2),
        ("b", None),
        ("a", None),
    ]
    assert owners_over(timeline, T0_US, T0_US + 5) == owners_over((), T0_US, T0_US + 5)


def share_assigned(name: str, team: str, share: int | None, at_us: int) -> GpuAssigned:
    key = share_key(GPU, name)
    return GpuAssigned(key, "node-01", POOL, MODEL, name, team, "p", "u", at_us, share=share)


def share_released(name: str, team: str, at_us: int) -> GpuReleased:
    return GpuReleased(share_key(GPU, name), "node-01", POOL, MODEL, name, team, "p", "u", at_us)


def busy_samples(count: int, *names: str):
    """10 s samples of GPU from T0 whose processes belong to `names`, the first one busiest."""
    processes = tuple(
        a_process(pid=i, sm=95 - 40 * i, owner=an_owner(team="vision", job_id=n))
        for i, n in enumerate(names)
    )
    return [
        envelope_for(
            a_sample(gpu_uuid=GPU, processes=processes, sample_time_us=T0_US + k * 10 * SEC),
            "sim://node-01",
        )
        for k in range(1, count + 1)
    ]


def test_shares_through_ingest_reconcile_to_the_gpu_time(tmp_path) -> None:
    """Two shares from the jobs topic into DuckDB: each charged its share of every sample, one
    released after a minute, the rest unallocated; a second ingestor over the same store (the
    timeline read back from its table) charges the same."""
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store)
        ledger.jobs(
            share_assigned("a", "vision", 500, T0_US), share_assigned("b", "vision", 250, T0_US)
        )
        ledger.samples(*busy_samples(6, "a", "b"))  # the first minute
        ledger.jobs(share_released("a", "vision", T0_US + 60 * SEC))
        ledger.samples(*busy_samples(12, "a", "b")[6:])  # the second: a ended
        gpu_ms = ledger.gpu_ms()
        capacity = {(r.account, r.unit): r.balance for r in store.balance_rows()}
    assert gpu_ms[consumer_account("vision", "p")] == 30_000 + 15_000 + 15_000
    assert gpu_ms[unallocated_account(POOL, MODEL)] == 15_000 + 45_000
    assert capacity[(capacity_account(POOL, MODEL), Unit.GPU_MS)] == -120_000


def test_a_share_assigned_without_its_per_mille_is_charged_by_utilisation_as_before(tmp_path):
    """An assignment written before `GpuAssigned.share` keeps the share's own timeline, which no
    sample reads: the job's processes are charged as on any shared GPU."""
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store)
        ledger.jobs(share_assigned("a", "vision", None, T0_US))
        ledger.samples(*busy_samples(1, "a"))
        gpu_ms = ledger.gpu_ms()
    assert gpu_ms == {consumer_account("vision", "detection"): 10_000}


def test_usage_booked_before_its_share_assignment_is_re_posted_to_the_shares(tmp_path) -> None:
    """A sample no process of which names an owner, ingested before the share's `GpuAssigned`:
    unallocated first, then reversed and re-posted to what the share held."""
    unowned = envelope_for(
        a_sample(gpu_uuid=GPU, processes=(a_process(),), sample_time_us=T0_US + 10 * SEC),
        "sim://node-01",
    )
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store)
        ledger.samples(unowned)
        assert ledger.gpu_ms() == {unallocated_account(POOL, MODEL): 10_000}
        ledger.jobs(share_assigned("a", "vision", 300, T0_US))
        gpu_ms = ledger.gpu_ms()
    assert gpu_ms == {
        consumer_account("vision", "p"): 3_000,
        unallocated_account(POOL, MODEL): 7_000,
    }
