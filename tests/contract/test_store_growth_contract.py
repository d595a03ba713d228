"""The store contract for what a long-lived sharded ledger drops, over each store (`store`:
DuckDB and in memory):

- a global shard's hold baselines (`hold_baselines`, `ledger.holds.HoldBook.finish`): a global
  shard `Ingestor` folds holds, retries and ends and the shards' watermarks
  (`ShardsSealedThrough`): the baseline of a job that ended for good goes with its last
  settlement, one that may come back (a retry) stays, and events resent after the drop book
  nothing (a duplicate, or refused past the dedupe window);
- a samples shard's jobs' usage so far (`job_usage`, `ledger.store.job_usage`): a job's rows
  go at the first watermark past its end that no longer covers it, unless it still holds a
  GPU; a running job's stay; a sample of the job folded after the drop is booked as ever and
  starts a row of its own."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import orjson
import pytest

from ledger.admin import admin_envelope, admin_envelope_to_dict
from ledger.admin.events import LEDGER_ACTOR
from ledger.admin.sealed_events import JobUsage, ShardsSealedThrough
from ledger.envelope import event_id
from ledger.events import encode_batch
from ledger.holds import (
    LEDGER_HOLDS_SOURCE,
    HoldPlaced,
    HoldReleased,
    encode_hold,
    hold_envelope,
)
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.shards import ShardRole
from ledger.job_events import FailReason, GpuAssigned, JobFailed, JobFinished, encode_job_event
from ledger.pricing import Price, PriceBook
from ledger.store.port import LedgerStore
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

ADMIN, JOBS = "admin", "jobs"
MONEY = Unit.MONEY
HOUR = 3_600_000_000


def at(hours: int) -> int:
    return T0_US + hours * HOUR


def placement(job: str, amount: int, hours: int) -> HoldPlaced:
    return HoldPlaced(job, "vision", None, MONEY, amount, at(hours + 100), at(hours))


def placed(job: str, amount: int, hours: int) -> bytes:
    return encode_hold(hold_envelope(placement(job, amount, hours)))[1]


def settled(store: LedgerStore, job: str, placed_at: int, amount: int, end: int) -> int | None:
    """What the settlement of the hold `placement(job, amount, placed_at)` first placed, ended
    at `end`, moved off the hold (None: no settlement)."""
    first = hold_envelope(placement(job, amount, placed_at)).id
    txn = store.find_transaction(
        event_id(LEDGER_HOLDS_SOURCE, f"{job}/{MONEY}/{first}/settled", at(end))
    )
    if txn is None:
        return None
    return -sum(p.amount for p in txn.postings if p.account.startswith("hold:"))


def released(job: str, hours: int) -> bytes:
    return encode_hold(hold_envelope(HoldReleased(job, at(hours), "done")))[1]


def failed(job: str, hours: int, retry: bool) -> bytes:
    event = JobFailed(job, FailReason.EXIT_NONZERO, 1, retry, at(hours))
    return encode_job_event(event, "tally://scheduler")


def finished(job: str, hours: int) -> bytes:
    return encode_job_event(JobFinished(job, at(hours)), "tally://scheduler")


def sealed(hours: int, covers: tuple[str, ...] | None = None, **usage: int) -> bytes:
    """The watermark at `hours` with each job's usage (money) up to it, covering `covers`."""
    event = ShardsSealedThrough(
        at(hours),
        ("samples-0",),
        tuple(JobUsage(job, MONEY, amount) for job, amount in sorted(usage.items())),
        (),
        LEDGER_ACTOR,
        "watermark",
        at(hours),
        covers=covers,
    )
    return orjson.dumps([admin_envelope_to_dict(admin_envelope(event))])


@dataclass
class Shard:
    """A shard's ingest over `store` (the global one unless `role` says), numbering each
    topic's offsets."""

    store: LedgerStore
    offsets: Counter[str]
    role: ShardRole = ShardRole.GLOBAL

    def __post_init__(self) -> None:
        self.ingest = Ingestor(
            self.store,
            "c",
            PriceBook((Price("*", 3_600_000),)),
            {},
            topics=OutputTopics("alerts", "dl", None),
            inputs=InputTopics(ADMIN, JOBS),
            role=self.role,
        )

    def fold(self, *items: tuple[str, bytes]) -> None:
        batch = []
        for topic, value in items:
            batch.append(ConsumedMessage(topic, 0, self.offsets[topic], value))
            self.offsets[topic] += 1
        self.ingest.apply(batch)


@pytest.fixture
def shard(store: LedgerStore) -> Shard:
    return Shard(store, Counter())


def test_a_finished_jobs_baseline_goes_with_its_last_settlement(shard: Shard) -> None:
    """job-a fails and is retried, job-b fails for good, job-c finishes: after the watermark
    settles them, only job-a's baseline is kept (its retry reads it). The retry is placed past
    that baseline, then job-a finishes: its open hold is marked final before the watermark
    settles it, and the settlement drops the baseline instead of moving it."""
    shard.fold(
        (JOBS, placed("job-a", 1_000, 1)),
        (JOBS, placed("job-b", 1_000, 1)),
        (JOBS, placed("job-c", 1_000, 1)),
    )
    shard.fold(
        (JOBS, failed("job-a", 2, retry=True)),
        (JOBS, released("job-a", 2)),
        (JOBS, failed("job-b", 2, retry=False)),
        (JOBS, released("job-b", 2)),
    )
    shard.fold((JOBS, finished("job-c", 2)), (JOBS, released("job-c", 2)))
    shard.fold((ADMIN, sealed(3, **{"job-a": 300, "job-b": 400, "job-c": 500})))
    assert shard.store.open_holds() == {}
    assert shard.store.hold_baselines() == {("job-a", MONEY): 300}

    shard.fold((JOBS, placed("job-a", 1_000, 4)))  # the retry starts past its baseline
    retry = shard.store.open_holds()[("job-a", MONEY)]
    assert (retry.baseline, retry.final) == (300, False)
    shard.fold((JOBS, finished("job-a", 5)), (JOBS, released("job-a", 5)))
    assert shard.store.open_holds()[("job-a", MONEY)].final  # kept across commits and reads
    assert shard.store.hold_baselines() == {("job-a", MONEY): 300}  # until it settles
    shard.fold((ADMIN, sealed(6, **{"job-a": 450})))
    assert (shard.store.open_holds(), shard.store.hold_baselines()) == ({}, {})
    found = [
        settled(shard.store, "job-a", 1, 1_000, 2),
        settled(shard.store, "job-b", 1, 1_000, 2),
        settled(shard.store, "job-c", 1, 1_000, 2),
        settled(shard.store, "job-a", 4, 1_000, 5),
    ]
    assert found == [300, 400, 500, 150]  # the retry by the usage past its baseline

    # resent after the drop (at new offsets): the retry's placement is a duplicate, the end
    # events find nothing open, the watermark no hold to settle: nothing booked, nothing kept
    booked = (shard.store.balance_rows(), len(shard.store.dead_letters()))
    shard.fold((JOBS, placed("job-a", 1_000, 4)))
    shard.fold((JOBS, finished("job-a", 5)), (JOBS, released("job-a", 5)))
    shard.fold((ADMIN, sealed(6, **{"job-a": 450})))
    assert (shard.store.balance_rows(), len(shard.store.dead_letters())) == booked
    assert (shard.store.open_holds(), shard.store.hold_baselines()) == ({}, {})
    # once the dedupe window forgot it, the placement is refused (too late to deduplicate),
    # never booked as a new hold with no baseline
    shard.store.prune_seen_events(HOUR // 2)
    shard.fold((JOBS, placed("job-a", 1_000, 4)))
    assert (shard.store.balance_rows(), len(shard.store.dead_letters())) == (
        booked[0],
        booked[1] + 1,
    )
    assert (shard.store.open_holds(), shard.store.hold_baselines()) == ({}, {})


# ---------------------------------------------------------------------------- job usage

SAMPLES = "samples"
GPUS = {"job-a": "GPU-a", "job-b": "GPU-b", "job-c": "GPU-c", "job-d": "GPU-d"}


def used(job: str, *minutes: int) -> tuple[str, bytes]:
    """Samples of `job`'s own GPU (its process names it) ending `minutes` after the start."""
    owner = an_owner(job_id=job)
    return (
        SAMPLES,
        encode_batch(
            [
                an_envelope(
                    gpu_uuid=GPUS[job],
                    sample_time_us=at(0) + m * 60_000_000,
                    processes=(a_process(owner=owner),),
                )
                for m in minutes
            ]
        ),
    )


def usage_of(store: LedgerStore) -> dict[str, int]:
    """GPU-ms so far per job, as the shard's `job_usage` has it."""
    return {job: n for (_, job, unit), n in store.job_usage_rows().items() if unit == "gpu_ms"}


def test_a_jobs_usage_so_far_goes_once_a_watermark_settles_its_end(store: LedgerStore) -> None:
    """job-a ends (finished), job-b fails for good but still holds its GPU (no release yet),
    job-c runs on, job-d's end is folded before its samples: a watermark past the ends that
    still covers job-a (the global shard held its hold) keeps it and drops job-d; the next,
    covering nothing, drops job-a; a late sample of job-a is booked and starts a row again."""
    shard = Shard(store, Counter(), ShardRole.SAMPLES)
    assign = GpuAssigned(
        "GPU-b",
        "node-01",
        "h100",
        "NVIDIA H100 80GB HBM3",
        "job-b",
        "vision",
        "detection",
        "ada",
        at(0),
    )
    shard.fold((JOBS, encode_job_event(assign, "tally://scheduler")))
    shard.fold(used("job-a", 1, 2), used("job-b", 1, 2), used("job-c", 1, 2))
    shard.fold(
        (JOBS, finished("job-a", 1)),
        (JOBS, failed("job-b", 1, retry=False)),
        (JOBS, finished("job-d", 1)),
    )
    shard.fold(used("job-d", 1, 2))  # its samples come after its end
    running = {job: 2 * INTERVAL_US // 1_000 for job in GPUS}  # two samples of 10 s each
    assert usage_of(store) == running
    shard.fold((ADMIN, sealed(0, ())))  # before the ends: nothing settled
    assert usage_of(store) == running
    shard.fold((ADMIN, sealed(2, ("job-a",))))  # the global shard still holds job-a's hold
    del running["job-d"]
    assert usage_of(store) == running
    shard.fold((ADMIN, sealed(3, ())))
    assert usage_of(store) == {"job-b": running["job-b"], "job-c": running["job-c"]}
    assert {job for _, job, _ in store.job_usage_rows()} == {"job-b", "job-c"}  # both units

    before = {r.account: r.balance for r in store.balance_rows() if r.unit == "gpu_ms"}
    shard.fold(used("job-a", 3))  # late: booked as ever, its row starts over
    after = {r.account: r.balance for r in store.balance_rows() if r.unit == "gpu_ms"}
    assert after["consumer:vision/detection"] - before["consumer:vision/detection"] == (
        INTERVAL_US // 1_000
    )
    assert usage_of(store)["job-a"] == INTERVAL_US // 1_000
