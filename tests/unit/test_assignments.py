"""The scheduler's GPU assignments as ownership over time, and attribution that falls back to
them when a sample names no owner."""

from __future__ import annotations

import pytest

from ledger.assignments import Holding, OwnedPiece, assign, owners_over, release
from ledger.attribution import attribute_sample
from ledger.events import envelope_for
from ledger.postings import validate
from ledger.pricing import Price, PriceBook
from tests.builders import a_process, a_sample, an_owner

ADA = an_owner("vision", "detection", "ada", "job-1")
BOB = an_owner("search", "ranking", "bob", "job-2")
PRICES = PriceBook((Price("*", 3_600_000),))  # 1 micro per GPU-ms


def _timeline(*steps):
    timeline: tuple[Holding, ...] = ()
    for step in steps:
        if step[0] == "assign":
            _, owner, at = step
            timeline = assign(timeline, Holding("GPU-1", owner, at))
        else:
            _, job, at = step
            timeline = release(timeline, job, at)
    return timeline


@pytest.mark.parametrize(
    ("steps", "start", "end", "expected"),
    [
        pytest.param([], 0, 10, [(0, 10, None)], id="never-assigned"),
        pytest.param([("assign", ADA, 0)], 5, 15, [(5, 15, ADA)], id="held-throughout"),
        pytest.param(
            [("assign", ADA, 4)], 0, 10, [(0, 4, None), (4, 10, ADA)], id="assigned-mid-interval"
        ),
        pytest.param(
            [("assign", ADA, 0), ("release", "job-1", 6)],
            0,
            10,
            [(0, 6, ADA), (6, 10, None)],
            id="released-mid-interval",
        ),
        pytest.param(
            [("assign", ADA, 0), ("assign", BOB, 3)],
            0,
            10,
            [(0, 3, ADA), (3, 10, BOB)],
            id="owner-changes-mid-interval",
        ),
        pytest.param(
            [("assign", ADA, 0), ("release", "job-9", 5)],
            0,
            10,
            [(0, 10, ADA)],
            id="release-of-another-job-changes-nothing",
        ),
    ],
)
def test_owners_over(steps, start, end, expected):
    pieces = owners_over(_timeline(*steps), start, end)
    assert [(p.start_us, p.end_us, p.owner) for p in pieces] == expected


def _consumer_ms(txn):
    out = {}
    for p in txn.postings:
        if p.unit.value == "gpu_ms" and p.amount > 0:
            out[p.account] = out.get(p.account, 0) + p.amount
    return out


def test_an_owner_change_mid_interval_splits_the_time_exactly():
    sample = a_sample(processes=())  # NVML saw no process it could place
    start, end = sample.start_us, sample.sample_time_us
    held = [OwnedPiece(start, start + 3_000_000, ADA), OwnedPiece(start + 3_000_000, end, BOB)]
    txn = attribute_sample(envelope_for(sample, "nvml://n"), PRICES, {}, held)
    assert validate(txn) == ()
    assert _consumer_ms(txn) == {
        "consumer:vision/detection": 3_000,
        "consumer:search/ranking": 7_000,
    }


def test_the_samples_own_owner_wins_over_the_assignment():
    sample = a_sample(processes=(a_process(owner=BOB),))
    held = [OwnedPiece(sample.start_us, sample.sample_time_us, ADA)]
    txn = attribute_sample(envelope_for(sample, "nvml://n"), PRICES, {}, held)
    assert _consumer_ms(txn) == {"consumer:search/ranking": 10_000}


def test_time_nobody_held_stays_unallocated():
    sample = a_sample(processes=())
    held = [
        OwnedPiece(sample.start_us, sample.start_us + 2_500_000, ADA),
        OwnedPiece(sample.start_us + 2_500_000, sample.sample_time_us, None),
    ]
    txn = attribute_sample(envelope_for(sample, "nvml://n"), PRICES, {}, held)
    ms = _consumer_ms(txn)
    assert ms["consumer:vision/detection"] == 2_500
    assert ms["unallocated:h100/NVIDIA H100 80GB HBM3"] == 7_500
