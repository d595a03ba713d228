"""Idle detection sees a job whose owner is known only late as allocated to that job: the
samples it ran while its owner was unknown (booked to `unallocated:`, awaiting the owner) step
the idle detector as the job's, so the correction's re-posting carries the idle flag the usage
would have had, and learning the owner continues the episode (no spurious resolve, no second
grace period). Checked against the same samples with the owner known from the start."""

from __future__ import annotations

import pytest

from ledger.accounts import consumer_account
from ledger.envelope import event_id
from ledger.events import Owner, encode_batch
from ledger.idle import AlertKind, IdlePolicy
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.job_events import JobSubmitted, encode_job_event
from ledger.job_owners import IDENTITY_SOURCE
from ledger.pricing import Price, PriceBook
from ledger.store.memory import MemoryStore
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope
from tests.scheduler_builders import a_spec

JOBS, SAMPLES = "tally.jobs", "tally.samples"
VISION = consumer_account("vision", "vision-project")
POLICY = IdlePolicy(min_duration_us=2 * INTERVAL_US)  # confirmed at the end of the 2nd sample


def repost_id(txn_id: str) -> str:
    return event_id(IDENTITY_SOURCE, f"{txn_id}/repost", 0)


def _sample(step: int, sm: int) -> object:
    owner = Owner(None, None, "ada", "job-7")  # names only its job
    return an_envelope(
        sample_time_us=T0_US + step * INTERVAL_US,
        util_gpu_pct=sm,
        processes=(a_process(sm=sm, owner=owner),),
    )


def _run(utils: tuple[int, ...], known_after: int) -> tuple[list[tuple[object, ...]], int]:
    """Samples of job-7 at `utils`; its `JobSubmitted` folded after the first `known_after`.
    (idle alerts as (kind, since, at, job), idle GPU-ms charged to vision)."""
    store = MemoryStore()
    ingest = Ingestor(
        store,
        "c",
        PriceBook((Price("*", 3_600_000),)),
        {},
        POLICY,
        topics=OutputTopics("alerts", "dl", None),
        inputs=InputTopics(jobs=JOBS),
    )
    submitted = encode_job_event(JobSubmitted(a_spec("job-7"), T0_US), "tally://scheduler")
    alerts = []
    offsets = {SAMPLES: 0, JOBS: 0}

    def apply(topic: str, value: bytes) -> None:
        result = ingest.apply([ConsumedMessage(topic, 0, offsets[topic], value)])
        offsets[topic] += 1
        assert not result.dead_letters
        alerts.extend((a.kind, a.since_us, a.at_us, a.owner.job_id) for a in result.alerts)

    samples = [_sample(step, util) for step, util in enumerate(utils, start=1)]
    for step, sample in enumerate(samples, start=1):
        if step == known_after + 1:
            apply(JOBS, submitted)
        apply(SAMPLES, encode_batch([sample]))  # type: ignore[list-item]
    if known_after >= len(utils):
        apply(JOBS, submitted)
    charged = [  # each sample's usage as it stands: its re-posting, if it was corrected
        store.find_transaction(repost_id(s.id)) or store.find_transaction(s.id)  # type: ignore[attr-defined]
        for s in samples
    ]
    idle_ms = sum(
        p.amount
        for txn in charged
        if txn is not None and txn.idle
        for p in txn.postings
        if p.account == VISION and p.unit is Unit.GPU_MS
    )
    return alerts, idle_ms


CASES = {
    "idle-all-along-known-after-two": ((0, 0, 0, 0), 2),
    "idle-all-along-known-at-the-end": ((0, 0, 0, 0), 4),
    "idle-then-busy-known-after-three": ((0, 0, 0, 90, 90), 3),
    "busy-while-unknown-then-idle": ((90, 90, 0, 0, 0), 2),
}


@pytest.mark.parametrize(("utils", "known_after"), CASES.values(), ids=CASES.keys())
def test_a_late_owner_gets_the_idle_split_and_alerts_an_early_one_gets(utils, known_after):
    early_alerts, early_idle = _run(utils, 0)
    late_alerts, late_idle = _run(utils, known_after)
    assert late_idle == early_idle
    assert late_alerts == early_alerts
    assert [a[0] for a in early_alerts].count(AlertKind.DETECTED) == (1 if 0 in utils else 0)
