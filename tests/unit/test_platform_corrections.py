"""The Platform and Capacity pages count a corrected sample once: usage booked to the suspense
(`unallocated:`) before its job's owner was known is reversed and re-posted to the owner
(`ledger.job_owners.correction`), and the rollups net the reversal out — the fleet now (each
GPU's latest sample, read from the postings) and the GPU time per day (read from the rollups)
alike — instead of showing the GPU both unallocated and in use."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.events import Owner, encode_batch
from ledger.idle import IdlePolicy
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.job_events import JobSubmitted, encode_job_event
from ledger.pricing import Price, PriceBook
from ledger.read import rollups
from ledger.read.reports import ReportQueries
from ledger.store.hot import DuckDBStore
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope
from tests.scheduler_builders import a_spec

JOBS, SAMPLES = "tally.jobs", "tally.samples"
PRICES = PriceBook((Price("*", 3_600_000),))  # one micro per GPU-ms


def _sample(step: int, sm: int = 50) -> object:
    owner = Owner(None, None, "ada", "job-7")  # names only its job: suspense until known
    return an_envelope(
        sample_time_us=T0_US + step * INTERVAL_US,
        util_gpu_pct=sm,
        processes=(a_process(sm=sm, owner=owner),),
    )


@dataclass(frozen=True)
class Case:
    submitted: str  # the job the jobs topic makes known after the samples
    sm: int  # the samples' utilisation: 0 is idle (confirmed after one 10 s sample)
    busy: int
    idle: tuple[tuple[rollups.GpuState, str | None, int], ...]  # (state, team, GPU-ms of run)
    allocated_ms: int  # of the physical GPU time


CASES = {
    "owner-known-late-counted-once-as-busy": Case("job-7", 50, 1, (), 30_000),
    "owner-known-late-idle-run-counted-once": Case(
        "job-7", 0, 0, ((rollups.GpuState.ALLOCATED_IDLE, "vision", 30_000),), 30_000
    ),
    "owner-never-known-stays-unallocated": Case(
        "job-8", 50, 0, ((rollups.GpuState.UNALLOCATED, None, 30_000),), 0
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_corrected_sample_is_counted_once(tmp_path, case):
    with DuckDBStore(tmp_path / "ledger") as store:
        ingest = Ingestor(
            store,
            "c",
            PRICES,
            {},
            IdlePolicy(min_duration_us=INTERVAL_US),
            topics=OutputTopics("alerts", "dl", None),
            inputs=InputTopics(jobs=JOBS),
        )
        samples = encode_batch([_sample(step, case.sm) for step in (1, 2, 3)])  # type: ignore[misc]
        submitted = encode_job_event(
            JobSubmitted(a_spec(case.submitted), T0_US), "tally://scheduler"
        )
        ingest.apply([ConsumedMessage(SAMPLES, 0, 0, samples)])
        ingest.apply([ConsumedMessage(JOBS, 0, 0, submitted)])
        store.seal()
    q = ReportQueries(tmp_path / "ledger")
    now = rollups.fleet_now(q)
    assert (now.gpus, now.busy) == (1, case.busy)
    assert tuple((g.state, g.team, g.gpu_ms) for g in now.idle) == case.idle
    (day,) = rollups.daily_usage(q)  # from the rollups
    assert (day.allocated_gpu_ms, day.physical_gpu_ms) == (case.allocated_ms, 30_000)
    (summary,) = rollups.utilisation_summary(q, T0_US, T0_US + rollups.HOUR_US)
    assert (summary.physical_gpu_ms, summary.allocated_gpu_ms) == (30_000, case.allocated_ms)
    (occupied,) = rollups.occupancy(q, T0_US, T0_US + rollups.HOUR_US, rollups.HOUR_US)
    assert (occupied.allocated_gpu_ms, occupied.physical_gpu_ms) == (case.allocated_ms, 30_000)
