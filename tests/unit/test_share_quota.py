"""A GPU share counts as its share of its team's quota (quotas are whole GPUs; usage is counted
in per-mille, `scheduler.quota.units_of`): admission, borrowing within a cohort and the quota
checks agree — table tests through the real scheduling cycle."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.job_events import JobAdmitted, WaitReason
from scheduler.explain import explain
from scheduler.inventory import placeable_nodes
from scheduler.model import Flavor, Policy, QueueClass, Quota, Team
from scheduler.quota import UNITS, QuotaOutcome, check_quota, gpus_of, units_of
from tests.inventory_builders import a_record
from tests.scheduler_builders import T0_US, Cluster, a_cluster, a_queue, a_spec

WHOLE = Flavor("a100", "A100")


def cluster(nominal: int, lender: int = 0, borrowing_limit: int | None = None) -> Cluster:
    """Four whole A100s; `vision` with `nominal` GPUs of quota and, when `lender` > 0, `audio`
    lending it `lender` in one cohort."""
    fleet = [
        a_record(f"GPU-W{i}", node="node-02", index=i, pool="a100", model="A100")
        for i in range(1, 5)
    ]
    cohort = "research" if lender else None
    teams = [Team("vision", (Quota(WHOLE, nominal, borrowing_limit),), cohort=cohort)]
    if lender:
        teams.append(Team("audio", (Quota(WHOLE, lender),), cohort=cohort))
    return a_cluster(
        teams=teams,
        queues=(a_queue("dev", QueueClass.DEV), a_queue("train")),
        fleet=placeable_nodes(fleet, T0_US, 6),
        policy=Policy(preemption=False),
    )


@dataclass(frozen=True)
class QuotaCase:
    nominal: int
    jobs: tuple[int | None, ...]  # per-mille shares in order (None: one whole GPU)
    admitted: tuple[bool, ...]
    used_units: int
    lender: int = 0
    borrowing_limit: int | None = None


QUOTA_CASES = {
    "four-quarter-shares-use-one-gpu-of-quota": QuotaCase(
        1, (250, 250, 250, 250, 250), (True, True, True, True, False), 1_000
    ),
    "a-share-beside-a-whole-gpu": QuotaCase(
        2, (None, 500, 500, 1), (True, True, True, False), 2_000
    ),
    "shares-of-several-gpus-add-up": QuotaCase(1, (600, 600), (True, False), 600),
    "a-share-borrows-only-its-share": QuotaCase(
        1, (None, 500, 500, 1), (True, True, True, False), 2_000, lender=1
    ),
    "the-borrowing-limit-counts-shares": QuotaCase(
        1, (None, 500, 500, 1), (True, True, True, False), 2_000, lender=2, borrowing_limit=1
    ),
}


@pytest.mark.parametrize("case", QUOTA_CASES.values(), ids=QUOTA_CASES.keys())
def test_a_share_counts_as_its_share_of_quota(case: QuotaCase) -> None:
    c = cluster(case.nominal, case.lender, case.borrowing_limit)
    for i, share in enumerate(case.jobs):
        queue = "train" if share is None else "dev"
        c.submit(a_spec(f"j-{i}", queue=queue, gpu_share=share, submit_us=T0_US + i))
        c.cycle()
    for i, expected in enumerate(case.admitted):
        running = c.state.running_job(f"j-{i}") is not None
        assert running is expected, f"j-{i}: {c.reason(f'j-{i}')}"
        if not expected:
            assert c.reason(f"j-{i}") in (WaitReason.QUOTA_EXHAUSTED, WaitReason.COHORT_EXHAUSTED)
    assert c.state.used("vision", WHOLE) == case.used_units


def test_a_borrowing_share_is_admitted_as_one_borrowed_gpu_rounded_up() -> None:
    c = cluster(1, lender=1)
    c.run(a_spec("whole", queue="train"))
    c.submit(a_spec("share", queue="dev", gpu_share=250, submit_us=T0_US + 1))
    c.cycle()
    admitted = [e for e in c.log if isinstance(e, JobAdmitted) and e.job_id == "share"]
    assert [e.borrowed_gpus for e in admitted] == [1]
    assert c.state.used("vision", WHOLE) == 1_250


@pytest.mark.parametrize(
    ("used", "units", "outcome"),
    [
        (750, 250, QuotaOutcome.FITS),
        (750, 251, QuotaOutcome.NOT_ALLOWED),
        (0, 1_000, QuotaOutcome.FITS),
        (1, 1_000, QuotaOutcome.NOT_ALLOWED),
    ],
    ids=["a-quarter-fills-the-gpu", "one-per-mille-too-many", "whole-gpu", "whole-after-a-share"],
)
def test_check_quota_in_units(used: int, units: int, outcome: QuotaOutcome) -> None:
    book = cluster(1).state.quotas
    check = check_quota(book, "vision", WHOLE, units, lambda _: used, may_borrow=True)
    assert check.outcome is outcome


def test_units_of_a_job() -> None:
    assert units_of(a_spec(gpus=3)) == 3 * UNITS
    assert units_of(a_spec(queue="dev", gpu_share=125)) == 125
    assert [gpus_of(u) for u in (0, 1, 1_000, 1_001, 2_250)] == [0, 1, 1, 2, 3]


def test_explain_says_a_share_and_why_it_waits_for_quota() -> None:
    c = cluster(1)
    for i in range(5):
        c.submit(a_spec(f"q-{i}", queue="dev", gpu_share=250, submit_us=T0_US + i))
        c.cycle()
    text = explain("q-4", c.log)
    assert "0.25 of a GPU" in text and "quota_exhausted" in text
