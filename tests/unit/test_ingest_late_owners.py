"""Owners known only by a job id (`TALLY_JOB_ID`, or `slurm:<id>` of a job Tally submitted),
resolved by the ledger from the jobs topic: known before the sample (charged at once), known
after (the suspense posting reversed and re-posted to the owner), never known (kept visible on
unallocated with its job id), redelivered (corrected once), in both stores; the same race for
samples booked before the `GpuAssigned` covering them; and the DuckDB ledger rebuilds to the
same postings and reports the suspense in `cost_report`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.accounts import consumer_account, unallocated_account
from ledger.envelope import event_id
from ledger.events import Owner
from ledger.holds import HoldPlaced
from ledger.job_events import GpuAssigned, JobStarted, JobSubmitted
from ledger.job_owners import ASSIGNMENT_GRACE_US, IDENTITY_SOURCE
from ledger.postings import TransactionKind
from ledger.read.reports import ReportQueries, cost_report
from ledger.store.hot import DuckDBStore
from ledger.store.rebuild import rebuild
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.ledger_harness import FOLD, Ledger, a_store
from tests.scheduler_builders import a_spec

JOBS, SAMPLES = "tally.jobs", "tally.samples"
POOL, MODEL = "h100", "NVIDIA H100 80GB HBM3"
SUSPENSE = unallocated_account(POOL, MODEL)
CAPACITY = f"capacity:{POOL}/{MODEL}"
VISION = consumer_account("vision", "vision-project")
LANGUAGE = consumer_account("language", "language-project")
SUBMIT_7 = JobSubmitted(a_spec("job-7"), T0_US)
SUBMIT_8 = JobSubmitted(a_spec("job-8", team="language"), T0_US)
SLURM_STARTED = JobStarted("job-7", T0_US + 1, slurm_job_id="4242")


def job_only(job: str, user: str | None = "ada") -> Owner:
    return Owner(None, None, user, job)


def sample(job: str, end_us: int = T0_US + INTERVAL_US):
    """A 10 s sample whose one process names only `job` (and a user)."""
    return an_envelope(sample_time_us=end_us, processes=(a_process(owner=job_only(job)),))


def shared(end_us: int = T0_US + INTERVAL_US):
    """Two processes: vision's own (SM 30) and one naming only job-8 (SM 10): 7_500 + 2_500."""
    return an_envelope(
        sample_time_us=end_us,
        processes=(
            a_process(1, sm=30, owner=an_owner("vision", "vision-project", "ada", "job-1")),
            a_process(2, sm=10, owner=job_only("job-8")),
        ),
    )


S1 = sample("job-7")
S_SLURM = sample("slurm:4242", T0_US + 2 * INTERVAL_US)  # samples of one GPU: distinct times
S_SHARED = shared(T0_US + 3 * INTERVAL_US)


@dataclass(frozen=True)
class Case:
    steps: tuple[tuple[str, tuple[object, ...]], ...]
    gpu_ms: dict[str, int]
    corrected: tuple[str, ...]  # sample ids reversed and re-posted
    charged: tuple[tuple[str, str, str, str], ...]  # (account, user, job, txn) legs of GPU time


def _legs(store, txn_id: str) -> list[tuple[str, str | None, str | None, int]]:
    txn = store.find_transaction(txn_id)
    assert txn is not None
    return [(p.account, p.user, p.job_id, p.amount) for p in txn.postings if p.unit == Unit.GPU_MS]


def repost_id(txn_id: str) -> str:
    return event_id(IDENTITY_SOURCE, f"{txn_id}/repost", 0)


def reversal_id(txn_id: str) -> str:
    return event_id(IDENTITY_SOURCE, f"{txn_id}/reversal", 0)


CASES = {
    "tally-job-known-before-the-sample": Case(
        ((JOBS, (SUBMIT_7,)), (SAMPLES, (S1,))),
        {VISION: 10_000},
        (),
        ((VISION, "vision-user", "job-7", S1.id),),
    ),
    "tally-job-known-after-the-sample": Case(
        ((SAMPLES, (S1,)), (JOBS, (SUBMIT_7,))),
        {VISION: 10_000},
        (S1.id,),
        ((SUSPENSE, "ada", "job-7", S1.id), (VISION, "vision-user", "job-7", repost_id(S1.id))),
    ),
    "slurm-id-known-before-the-sample": Case(
        ((JOBS, (SUBMIT_7, SLURM_STARTED)), (SAMPLES, (S_SLURM,))),
        {VISION: 10_000},
        (),
        ((VISION, "vision-user", "job-7", S_SLURM.id),),
    ),
    "slurm-id-known-after-the-sample": Case(
        ((SAMPLES, (S_SLURM,)), (JOBS, (SUBMIT_7, SLURM_STARTED))),
        {VISION: 10_000},
        (S_SLURM.id,),
        (
            (SUSPENSE, "ada", "slurm:4242", S_SLURM.id),
            (VISION, "vision-user", "job-7", repost_id(S_SLURM.id)),
        ),
    ),
    "slurm-start-after-the-sample-submit-before": Case(
        ((JOBS, (SUBMIT_7,)), (SAMPLES, (S_SLURM,)), (JOBS, (SLURM_STARTED,))),
        {VISION: 10_000},
        (S_SLURM.id,),
        ((VISION, "vision-user", "job-7", repost_id(S_SLURM.id)),),
    ),
    "unknown-job-forever-stays-in-suspense": Case(
        ((SAMPLES, (S1,)), (JOBS, (SUBMIT_8,))),
        {SUSPENSE: 10_000},
        (),
        ((SUSPENSE, "ada", "job-7", S1.id),),
    ),
    "redelivered-sample-and-job-event-corrected-once": Case(
        (
            (SAMPLES, (S1,)),
            (JOBS, (SUBMIT_7,)),
            (SAMPLES, (S1,)),
            (JOBS, (SUBMIT_7, SLURM_STARTED)),
            (JOBS, (SUBMIT_7,)),
        ),
        {VISION: 10_000},
        (S1.id,),
        ((VISION, "vision-user", "job-7", repost_id(S1.id)),),
    ),
    "shared-gpu-only-the-awaiting-leg-moves": Case(
        ((SAMPLES, (S_SHARED,)), (JOBS, (SUBMIT_8,))),
        {VISION: 7_500, LANGUAGE: 2_500},
        (S_SHARED.id,),
        (
            (consumer_account("vision", "vision-project"), "ada", "job-1", repost_id(S_SHARED.id)),
            (LANGUAGE, "language-user", "job-8", repost_id(S_SHARED.id)),
            (SUSPENSE, "ada", "job-8", S_SHARED.id),
        ),
    ),
}


@pytest.fixture(params=["memory", "duckdb"])
def ledger(request, tmp_path):
    store = a_store(request.param, tmp_path / "ledger")
    yield Ledger(store, strict=True)
    store.close()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_job_id_only_owner_is_charged_to_its_job_s_team(ledger, case):
    for topic, items in case.steps:
        ledger.feed(topic, items)
    store = ledger.store
    assert ledger.gpu_ms() == {**case.gpu_ms}
    assert store.folded_balances() == store.balance_rows()
    capacity = sum(
        r.balance for r in store.balance_rows() if r.account == CAPACITY and r.unit == Unit.GPU_MS
    )
    assert capacity == -10_000  # one sample's GPU time, whoever it is charged to
    for account, user, job, txn in case.charged:
        assert any(
            (a, u, j) == (account, user, job) and amount > 0
            for a, u, j, amount in _legs(store, txn)
        ), (account, user, job, _legs(store, txn))
    for original in case.corrected:
        assert store.reversed_by(original) == reversal_id(original)
        reversal = store.find_transaction(reversal_id(original))
        assert reversal is not None and reversal.kind is TransactionKind.REVERSAL
        assert _legs(store, reversal_id(original)) == [
            (a, u, j, -amount) for a, u, j, amount in _legs(store, original)
        ]
    assert store.seen_ids([reversal_id(t) for t in (S1.id, S_SLURM.id, S_SHARED.id)]) == {
        reversal_id(t) for t in case.corrected
    }


def test_later_samples_of_a_resolved_job_are_charged_at_once(ledger):
    ledger.feed(SAMPLES, (S1,))
    ledger.feed(JOBS, (SUBMIT_7,))
    later = sample("job-7", T0_US + 5 * INTERVAL_US)
    ledger.feed(SAMPLES, (later,))
    assert ledger.gpu_ms() == {VISION: 20_000}
    assert _legs(ledger.store, later.id)[0] == (VISION, "vision-user", "job-7", 10_000)
    assert ledger.store.reversed_by(later.id) is None


def test_usage_of_a_resolved_slurm_id_settles_the_tally_job_s_hold(ledger):
    hold = HoldPlaced(
        "job-7", "vision", "vision-project", Unit.GPU_MS, 50_000, T0_US + 3600 * 10**6, T0_US
    )
    ledger.feed(JOBS, (SUBMIT_7, SLURM_STARTED, hold))
    ledger.feed(SAMPLES, (S_SLURM,))
    balances = {(r.account, r.unit): r.balance for r in ledger.store.balance_rows()}
    assert balances[("hold:vision", Unit.GPU_MS)] == 40_000
    assert ledger.gpu_ms()[VISION] == 10_000


def test_a_correction_settles_a_hold_only_by_what_it_adds_to_the_job_s_usage(ledger):
    """A shared GPU's sample: vision's own leg (job-1) settles job-1's hold when it is folded;
    the re-posting once job-8 is known repeats that leg, which must not settle it again."""
    hold = HoldPlaced(
        "job-1", "vision", "vision-project", Unit.GPU_MS, 50_000, T0_US + 3600 * 10**6, T0_US
    )
    ledger.feed(JOBS, (hold,))
    ledger.feed(SAMPLES, (S_SHARED,))
    ledger.feed(JOBS, (SUBMIT_8,))
    assert ledger.store.reversed_by(S_SHARED.id) == reversal_id(S_SHARED.id)
    balances = {(r.account, r.unit): r.balance for r in ledger.store.balance_rows()}
    assert balances[("hold:vision", Unit.GPU_MS)] == 50_000 - 7_500


def test_the_rebuild_reproduces_the_corrections_and_the_report_shows_the_suspense(tmp_path):
    store = DuckDBStore(tmp_path / "ledger")
    ledger = Ledger(store, strict=True)
    forever = sample("job-404", T0_US + 4 * INTERVAL_US)
    other = an_envelope(gpu_uuid="GPU-2", processes=(a_process(owner=None),))
    ledger.feed(SAMPLES, (S1, S_SLURM, S_SHARED, other))
    ledger.feed(JOBS, (SUBMIT_7, SLURM_STARTED))
    ledger.feed(SAMPLES, (forever,))
    ledger.feed(JOBS, (SUBMIT_8, assigned("job-5", "vision", T0_US, "GPU-2")))
    store.seal()
    store.close()
    assert verify_ledger(tmp_path / "ledger").ok
    report = rebuild(tmp_path / "ledger", tmp_path / "rebuilt", FOLD)
    assert report.identical, report.differences
    cost = cost_report(
        ReportQueries(tmp_path / "ledger"), ("team", "job_id"), include_unallocated=True
    )
    lines = {(line.keys, line.unallocated): line.gpu_ms for line in cost.lines if line.gpu_ms}
    assert lines == {
        (("vision", "job-7"), False): 20_000,
        (("vision", "job-1"), False): 7_500,
        (("language", "job-8"), False): 2_500,
        (("vision", "job-5"), False): 10_000,
        ((None, "job-404"), True): 10_000,
    }


# ------------------------------------------------------------- samples before their GpuAssigned

GPU = S1.data.gpu_uuid


def assigned(job: str, team: str, at_us: int, gpu: str = "") -> GpuAssigned:
    team_project = f"{team}-project"
    return GpuAssigned(gpu or GPU, "node-01", POOL, MODEL, job, team, team_project, "u", at_us)


def unowned(end_us: int = T0_US + INTERVAL_US):
    """A 10 s sample ending at `end_us` whose one process names no owner."""
    return an_envelope(sample_time_us=end_us, processes=(a_process(owner=None),))


U1 = unowned()
U_LATE = unowned(T0_US + INTERVAL_US + ASSIGNMENT_GRACE_US + INTERVAL_US)
ASSIGN_1 = assigned("job-1", "vision", T0_US)


@dataclass(frozen=True)
class AssignmentCase:
    steps: tuple[tuple[str, tuple[object, ...]], ...]
    gpu_ms: dict[str, int]
    corrected: tuple[str, ...]


ASSIGNMENT_CASES = {
    "assigned-over-the-whole-interval": AssignmentCase(
        ((SAMPLES, (U1,)), (JOBS, (ASSIGN_1,))), {VISION: 10_000}, (U1.id,)
    ),
    "assigned-from-the-middle-of-the-interval": AssignmentCase(
        ((SAMPLES, (U1,)), (JOBS, (assigned("job-1", "vision", T0_US + 5_000_000),))),
        {VISION: 5_000, SUSPENSE: 5_000},
        (U1.id,),
    ),
    "assigned-after-the-interval-changes-nothing": AssignmentCase(
        ((SAMPLES, (U1,)), (JOBS, (assigned("job-1", "vision", T0_US + INTERVAL_US),))),
        {SUSPENSE: 10_000},
        (),
    ),
    "the-assignment-wins-over-a-job-only-owner-known-later": AssignmentCase(
        ((SAMPLES, (S1,)), (JOBS, (assigned("job-8", "language", T0_US),)), (JOBS, (SUBMIT_7,))),
        {LANGUAGE: 10_000},
        (S1.id,),
    ),
    "the-job-s-own-assignment-from-mid-interval-gives-it-the-whole": AssignmentCase(
        ((SAMPLES, (S1,)), (JOBS, (assigned("job-7", "vision", T0_US + 5_000_000),))),
        {VISION: 10_000},
        (S1.id,),
    ),
    "a-redelivered-assignment-corrects-once": AssignmentCase(
        ((SAMPLES, (U1,)), (JOBS, (ASSIGN_1,)), (JOBS, (ASSIGN_1,)), (SAMPLES, (U1,))),
        {VISION: 10_000},
        (U1.id,),
    ),
    "usage-older-than-the-grace-stays-unallocated": AssignmentCase(
        ((SAMPLES, (U1,)), (SAMPLES, (U_LATE,)), (JOBS, (ASSIGN_1,))),
        {VISION: 10_000, SUSPENSE: 10_000},
        (U_LATE.id,),
    ),
}


@pytest.mark.parametrize("case", ASSIGNMENT_CASES.values(), ids=ASSIGNMENT_CASES.keys())
def test_usage_booked_before_its_gpu_assignment_is_re_posted_to_the_holder(ledger, case):
    for topic, items in case.steps:
        ledger.feed(topic, items)
    store = ledger.store
    assert ledger.gpu_ms() == case.gpu_ms
    assert store.folded_balances() == store.balance_rows()
    samples = {e.id for _, items in case.steps for e in items if e in (U1, U_LATE, S1)}
    assert {t for t in samples if store.reversed_by(t) is not None} == set(case.corrected)
    for original in case.corrected:
        repost = _legs(store, repost_id(original))
        assert sum(a for acc, _, _, a in repost if acc != CAPACITY) == 10_000


@pytest.mark.parametrize(
    ("job", "sample", "known_by"),
    [
        pytest.param("job-7", S1, SUBMIT_7, id="owner-known-late"),
        pytest.param("job-1", U1, ASSIGN_1, id="assignment-known-late"),
    ],
)
def test_re_posted_usage_settles_the_job_s_open_hold(ledger, job, sample, known_by):
    hold = HoldPlaced(job, "vision", "vision-project", Unit.GPU_MS, 50_000, T0_US + 10**10, T0_US)
    ledger.feed(SAMPLES, (sample,))
    ledger.feed(JOBS, (hold, known_by))
    balances = {(r.account, r.unit): r.balance for r in ledger.store.balance_rows()}
    assert balances[("hold:vision", Unit.GPU_MS)] == 40_000
    assert ledger.gpu_ms()[VISION] == 10_000
