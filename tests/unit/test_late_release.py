"""A `GpuReleased` (or a holder replaced) folded after the sample whose interval spans it: the
usage the timeline split among its holders is reversed and re-posted as the changed timeline
splits it, so the ledger books exactly what it books when the jobs were folded first — row for
row in the balances, per account, and per job in a samples shard's job usage
(`ledger.job_owners.retimed`, `ledger.ingest.jobs` `by_timeline`). Both orders are folded
through the real ingest into the in-memory store, as a whole ledger and as a samples shard,
whose jobs arrive through the view feed and go through the same fold."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ledger.balances import ShardStamp, decode_balance_update
from ledger.events import SampleEnvelope
from ledger.fractional import share_key
from ledger.holds import HoldPlaced, HoldReleased
from ledger.ingest import OutputTopics
from ledger.ingest.shards import ShardRole
from ledger.job_events import GpuAssigned, GpuReleased
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.rebuild import rebuild
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_mig, an_envelope
from tests.ledger_harness import FOLD
from tests.ledger_harness import Ledger as IngestLedger

BALANCES = "tally.balances"
GPU = "GPU-00000000-0000-0000-0000-000000000001"
POOL, MODEL = "h100", "NVIDIA H100 80GB HBM3"
SEC = 1_000_000
MIG = f"{GPU}/gi1"

JobItem = GpuAssigned | GpuReleased | HoldPlaced | HoldReleased


def team_of(job: str) -> str:
    return "language" if job.startswith("k") else "vision"


def assigned(job: str, at_s: float, gpu: str = GPU, share: int | None = None) -> GpuAssigned:
    key = share_key(gpu, job) if share is not None else gpu
    return GpuAssigned(
        key, "node-01", POOL, MODEL, job, team_of(job), "p", "u", T0_US + int(at_s * SEC), share
    )


def released(job: str, at_s: float, gpu: str = GPU, share: bool = False) -> GpuReleased:
    key = share_key(gpu, job) if share else gpu
    at = T0_US + int(at_s * SEC)
    return GpuReleased(key, "node-01", POOL, MODEL, job, team_of(job), "p", "u", at)


def held(job: str, gpu_ms: int) -> HoldPlaced:
    return HoldPlaced(job, team_of(job), "p", Unit.GPU_MS, gpu_ms, T0_US + 3600 * SEC, T0_US)


def hold_ended(job: str, at_s: float) -> HoldReleased:
    return HoldReleased(job, T0_US + int(at_s * SEC), "reclaimed")


def idle(rounds: int = 1, first: int = 1, **fields: object) -> tuple[SampleEnvelope, ...]:
    """`rounds` consecutive 10 s samples naming nobody (no process), the first ending at
    `first` × 10 s: one message (a collector packing several rounds)."""
    return tuple(
        an_envelope(sample_time_us=T0_US + (first + i) * INTERVAL_US, processes=(), **fields)
        for i in range(rounds)
    )


def mig_idle() -> tuple[SampleEnvelope, ...]:
    return idle(mig=a_mig(slices=3, gi=1))


@dataclass(frozen=True)
class Case:
    before: tuple[JobItem, ...]  # jobs folded before everything
    samples: tuple[tuple[SampleEnvelope, ...], ...]  # one message each
    late: tuple[tuple[JobItem, ...], ...]  # jobs batches: folded before or after the samples
    corrected: tuple[int, ...]  # samples (flattened) whose usage the late order corrects


CASES = {
    "whole-gpu": Case((assigned("j1", 0),), (idle(),), ((released("j1", 4),),), (0,)),
    "whole-gpu-with-energy": Case(
        (assigned("j1", 0),), (idle(energy_delta_mj=7_001),), ((released("j1", 4.2),),), (0,)
    ),
    "mig-slice": Case((assigned("j1", 0, MIG),), (mig_idle(),), ((released("j1", 3, MIG),),), (0,)),
    "shared-gpu": Case(
        (assigned("j1", 0, share=500), assigned("j2", 0, share=250)),
        (idle(),),
        ((released("j1", 6, share=True),),),
        (0,),
    ),
    "shared-gpu-both-released-in-turn": Case(
        (assigned("j1", 0, share=500), assigned("j2", 0, share=250)),
        (idle(),),
        ((released("j1", 6, share=True),), (released("j2", 8, share=True),)),
        (0,),
    ),
    "release-at-a-sample-boundary": Case(
        (assigned("j1", 0),), (idle(), idle(first=2)), ((released("j1", 10),),), (1,)
    ),
    "release-inside-a-packed-multi-round-sample": Case(
        (assigned("j1", 0),), (idle(3),), ((released("j1", 13.5),),), (1, 2)
    ),
    "release-then-reassign-inside-the-sample": Case(
        (assigned("j1", 0), held("k1", 1_000_000)),
        (idle(),),
        ((released("j1", 3), assigned("k1", 6)),),
        (0,),
    ),
    "release-then-reassign-in-separate-batches": Case(
        (assigned("j1", 0),),
        (idle(),),
        ((released("j1", 3),), (assigned("k1", 6),)),
        (0,),
    ),
    "reassigned-without-a-release": Case(
        (assigned("j1", 0),), (idle(),), ((assigned("k1", 7),),), (0,)
    ),
    "redelivered-release": Case(
        (assigned("j1", 0),), (idle(2),), ((released("j1", 15),), (released("j1", 15),)), (1,)
    ),
    "released-with-its-hold": Case(
        (assigned("j1", 0), held("j1", 6_000)),
        (idle(2),),
        ((hold_ended("j1", 12), released("j1", 12)),),
        (1,),
    ),
    "no-usage-after-the-release": Case(
        (assigned("j1", 0),), (idle(2),), ((released("j1", 25),),), ()
    ),
}


class Ledger(IngestLedger):
    """The real ingest over a memory store (or `store`), as a whole ledger or a samples shard
    (whose balance messages carry its stamp)."""

    def __init__(self, role: ShardRole, store: DuckDBStore | None = None) -> None:
        shard = ShardStamp("samples-0", 1) if role is ShardRole.SAMPLES else None
        settings = replace(FOLD, role=role)
        topics = OutputTopics("alerts", "dl", BALANCES)
        super().__init__(store or MemoryStore(), settings, topics=topics, shard=shard, strict=True)

    def job_usage(self) -> dict[str, list[tuple[str, str, int]]]:
        """Per account, the job lines of its latest balance message (a shard's job usage)."""
        latest: dict[str, list[tuple[str, str, int]]] = {}
        for message in self.store.pending_outbox(10_000):
            if message.topic == BALANCES:
                update = decode_balance_update(message.value)
                latest[update.account] = sorted((j.job_id, j.unit, j.amount) for j in update.jobs)
        return latest


def fold(case: Case, role: ShardRole, jobs_first: bool, store: DuckDBStore | None = None) -> Ledger:
    ledger = Ledger(role, store)
    ledger.jobs(*case.before)
    if jobs_first:
        for batch in case.late:
            ledger.jobs(*batch)
    for message in case.samples:
        ledger.samples(*message)
    if not jobs_first:
        for batch in case.late:
            ledger.jobs(*batch)
    return ledger


@pytest.mark.parametrize("role", [ShardRole.WHOLE, ShardRole.SAMPLES], ids=["whole", "shard"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_release_folded_after_the_sample_books_what_folding_it_first_books(
    case: Case, role: ShardRole
) -> None:
    early, late = fold(case, role, jobs_first=True), fold(case, role, jobs_first=False)
    assert late.store.balance_rows() == early.store.balance_rows()
    assert late.account_totals() == early.account_totals()
    assert late.store.folded_balances() == late.store.balance_rows()
    envelopes = [e for message in case.samples for e in message]
    corrected = tuple(i for i, e in enumerate(envelopes) if late.store.reversed_by(e.id))
    assert corrected == case.corrected
    assert not any(early.store.reversed_by(e.id) for e in envelopes)
    if role is ShardRole.SAMPLES:
        assert late.job_usage() == early.job_usage()


def test_the_late_order_would_differ_without_the_correction() -> None:
    """The table's premise: folded after the sample, the release changes what it books (the
    whole sample was the released job's), and the correction moves exactly that difference."""
    case = CASES["whole-gpu"]
    late = Ledger(ShardRole.WHOLE)
    late.jobs(*case.before)
    late.samples(*case.samples[0])
    charged = late.account_totals()[("consumer:vision/p", Unit.GPU_MS.value)]
    for batch in case.late:
        late.jobs(*batch)
    after = late.account_totals()
    assert charged == 10_000
    assert after[("consumer:vision/p", Unit.GPU_MS.value)] == 4_000
    assert after[(f"unallocated:{POOL}/{MODEL}", Unit.GPU_MS.value)] == 6_000


def test_a_correction_caused_by_a_redelivered_release_is_committed_once() -> None:
    case = CASES["whole-gpu"]
    ledger = fold(case, ShardRole.WHOLE, jobs_first=False)
    rows = ledger.store.balance_rows()
    ledger.jobs(*case.late[0])  # the same release, redelivered at a new offset
    assert ledger.store.balance_rows() == rows


def test_the_duckdb_ledger_books_the_same_verifies_and_rebuilds_to_the_same(tmp_path) -> None:
    """The DuckDB store keeps the awaiting usage as the memory store does (its `held:` rows
    and their corrections); the sealed ledger verifies and a rebuild repeats the corrections."""
    case = Case(
        (assigned("j1", 0), held("k1", 1_000_000)),
        (idle(3),),
        ((released("j1", 13),), (assigned("k1", 16),), (released("j1", 13),)),
        (1, 2),
    )
    store = DuckDBStore(tmp_path / "ledger")
    late = fold(case, ShardRole.WHOLE, jobs_first=False, store=store)
    early = fold(case, ShardRole.WHOLE, jobs_first=True)
    assert late.store.balance_rows() == early.store.balance_rows()
    corrected = tuple(i for i, e in enumerate(case.samples[0]) if store.reversed_by(e.id))
    assert corrected == case.corrected
    store.seal()
    store.close()
    assert verify_ledger(tmp_path / "ledger").ok
    report = rebuild(tmp_path / "ledger", tmp_path / "rebuilt", FOLD)
    assert report.identical, report.differences
