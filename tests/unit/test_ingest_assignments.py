"""The scheduler's GPU assignments inside ingest: `GpuAssigned` / `GpuReleased` from the jobs
topic build each GPU's timeline in the store, and a sample that names no owner is charged to
whoever held its GPU over its interval (ownership precedence: sample → assignment →
unallocated), exactly, across restarts, once per event."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ledger.accounts import consumer_account, unallocated_account
from ledger.idle import MINUTE_US, IdlePolicy
from ledger.ingest import ConsumedMessage
from ledger.job_events import GpuAssigned, GpuReleased, JobStarted, encode_job_event
from ledger.jobs_message import decode_jobs_message
from ledger.store.hot import DuckDBStore
from tests.builders import INTERVAL_US, T0_US, a_process, a_sample, an_envelope, an_owner
from tests.ledger_harness import FOLD, SCHEDULER, Ledger

GPU = a_sample().gpu_uuid
POOL, MODEL = a_sample().pool, a_sample().model
JOBS = "tally.jobs"
NO_CENTRES = replace(FOLD, cost_centres={})


def assigned(job: str, team: str, at_us: int, gpu: str = GPU) -> GpuAssigned:
    return GpuAssigned(gpu, "node-01", POOL, MODEL, job, team, "p", "u", at_us)


def released(job: str, team: str, at_us: int, gpu: str = GPU) -> GpuReleased:
    return GpuReleased(gpu, "node-01", POOL, MODEL, job, team, "p", "u", at_us)


def unowned(end_us: int, util: int = 90, gpu: str = GPU):
    """A 10 s sample of `gpu` ending at `end_us` whose processes name no owner."""
    return an_envelope(
        sample_time_us=end_us, gpu_uuid=gpu, util_gpu_pct=util, processes=(a_process(sm=util),)
    )


@pytest.fixture
def ledger(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        yield Ledger(store, NO_CENTRES)


VISION = consumer_account("vision", "p")
SEARCH = consumer_account("search", "p")
IDLE = unallocated_account(POOL, MODEL)
END = T0_US + INTERVAL_US  # the default sample covers [T0, T0 + 10 s)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([], {IDLE: 10_000}, id="never-assigned-is-unallocated"),
        pytest.param([assigned("job-1", "vision", T0_US)], {VISION: 10_000}, id="held-throughout"),
        pytest.param(
            [assigned("job-1", "vision", T0_US + 4_000_000)],
            {IDLE: 4_000, VISION: 6_000},
            id="assigned-mid-interval",
        ),
        pytest.param(
            [assigned("job-1", "vision", T0_US), released("job-1", "vision", T0_US + 2_500_000)],
            {VISION: 2_500, IDLE: 7_500},
            id="released-mid-interval",
        ),
        pytest.param(
            [assigned("job-1", "vision", T0_US), assigned("job-2", "search", T0_US + 3_000_000)],
            {VISION: 3_000, SEARCH: 7_000},
            id="owner-changes-mid-interval",
        ),
        pytest.param(
            [assigned("job-1", "vision", T0_US, gpu="GPU-other")],
            {IDLE: 10_000},
            id="another-gpu-assigned",
        ),
        pytest.param(
            [assigned("job-1", "vision", T0_US - 60_000_000), released("job-1", "vision", T0_US)],
            {IDLE: 10_000},
            id="released-before-the-sample",
        ),
    ],
)
def test_an_unowned_sample_goes_to_the_scheduler_holder(ledger, events, expected):
    if events:
        ledger.jobs(*events)
    ledger.samples(unowned(END))
    assert ledger.gpu_ms() == expected


def test_the_owner_a_sample_names_wins_over_the_assignment(ledger):
    ledger.jobs(assigned("job-1", "search", T0_US))
    ledger.samples(an_envelope())  # its process belongs to vision/detection
    assert ledger.gpu_ms() == {consumer_account("vision", "detection"): 10_000}


def test_the_timeline_survives_a_restart_and_a_redelivery_counts_once(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        first = Ledger(store, NO_CENTRES)
        first.jobs(assigned("job-1", "vision", T0_US))
        offsets = first.offsets
    with DuckDBStore(tmp_path / "l") as store:
        again = Ledger(store, NO_CENTRES)
        again.offsets = {JOBS: 0}  # the broker redelivers from an earlier offset
        redelivered = again.jobs(assigned("job-1", "vision", T0_US))
        assert redelivered.skipped_messages == 1
        again.offsets = dict(offsets)
        resent = again.jobs(assigned("job-1", "vision", T0_US))  # the same event, a new offset
        assert resent.commit.duplicates == 1
        again.samples(unowned(END))
        assert again.gpu_ms() == {VISION: 10_000}
        assert store.gpu_timelines([GPU])[GPU][0].owner == an_owner("vision", "p", "u", "job-1")


def test_other_job_events_pass_over_and_bad_assignments_are_dead_letters(ledger):
    good = encode_job_event(assigned("job-1", "vision", T0_US), SCHEDULER)
    doc = orjson.loads(good)
    doc["data"]["time_us"] = 1.5
    other = encode_job_event(JobStarted("job-1", T0_US), SCHEDULER)
    read = decode_jobs_message(b"[" + b",".join((good, orjson.dumps(doc), other)) + b"]")
    assert (len(read.assignments), len(read.holds), read.ignored) == (1, 0, 1)
    assert "time_us" in read.dead[0].reason
    result = ledger.ingestor().apply([ConsumedMessage(JOBS, 0, 0, orjson.dumps(doc))])
    assert len(result.dead_letters) == 1
    assert ledger.store.gpu_timelines([GPU]) == {}


def test_an_assigned_gpu_left_idle_is_allocated_idle_with_its_holder(tmp_path):
    policy = IdlePolicy(5, 30 * MINUTE_US, 10, 5 * MINUTE_US)
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store, replace(NO_CENTRES, idle_policy=policy))
        ledger.jobs(assigned("job-1", "vision", T0_US))
        for m in range(40):  # 40 minutes at 0%, no process on the GPU
            end = T0_US + (m + 1) * MINUTE_US
            ledger.samples(
                an_envelope(sample_time_us=end, interval_us=MINUTE_US, util_gpu_pct=0, processes=())
            )
        alerts = [orjson.loads(m.value) for m in store.pending_outbox() if m.topic == "alerts"]
        assert [a["type"] for a in alerts] == ["tally.idle.detected"]
        assert alerts[0]["data"]["owner"]["job"] == "job-1"
        assert ledger.gpu_ms() == {VISION: 40 * 60_000}
