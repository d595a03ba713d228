"""The simulated cluster `make up` runs: the submit schedule (`collectors.workload`), the
collector's view of what the scheduler runs (`collectors.jobs_follower`), and the history a new
ledger is backfilled with (`tally.history`), folded by the real ingest into a real DuckDB
ledger: its job history has queue waits, every team has costs, holds and budgets are booked.
"""

from __future__ import annotations

import pytest

from collectors.jobs_follower import JobsView
from collectors.simulated import TeamSpec, WorkloadKind
from collectors.workload import (
    HOUR_US,
    JobKind,
    PlannedJob,
    TeamPool,
    arrival_pct,
    in_flight,
    submit_schedule,
)
from ledger.admin import AdminView, admin_envelope, encode_admin, plan_admin
from ledger.events import GpuSample, encode_batch, envelope_for
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import GpuAssigned, GpuReleased, JobSpec, JobSubmitted, encode_job_event
from ledger.periods import period_label
from ledger.read import job_history, rollups
from ledger.read.reports import ReportQueries, cost_report
from ledger.store.hot import DuckDBStore
from ledger.units import Unit
from tally.components import desired_admin_state, simulated_fleet
from tally.config import TallyConfig, load_config
from tally.history import history_fleet, history_samples, simulate_history
from tally.workload_runner import resumed, submit_body
from tests.conftest import REPO

MONDAY_US = 1_764_547_200_000_000  # 2025-12-01T00:00Z, a Monday
DAY_US = 24 * HOUR_US
TEAMS = (
    TeamPool(TeamSpec("vision", ("detection",), ("ada",)), "h100", "H100"),
    TeamPool(TeamSpec("search", ("ranking",), ("edsger",)), "a100", "A100"),
)
MIX = ((JobKind.TRAINING, 40), (JobKind.INFERENCE, 20), (JobKind.NOTEBOOK, 15))


def _week(seed: int = 7, mix=MIX, rate: int = 20) -> list[PlannedJob]:
    return submit_schedule(seed, TEAMS, mix, rate, MONDAY_US, MONDAY_US + 7 * DAY_US)


def test_the_schedule_is_a_function_of_its_seed():
    assert _week() == _week()
    assert _week() != _week(seed=8)
    # any window is the same jobs as the whole: an hour can be generated on its own
    tuesday = MONDAY_US + DAY_US
    assert [j for j in _week() if tuesday <= j.submit_us < tuesday + HOUR_US] == submit_schedule(
        7, TEAMS, MIX, 20, tuesday, tuesday + HOUR_US
    )
    keys = [j.key for j in _week()]
    assert len(set(keys)) == len(keys)


def test_no_job_asks_for_more_gpus_than_its_teams_quota():
    small = (TeamPool(TeamSpec("search", ("ranking",)), "a100", "A100", max_gpus=2),)
    jobs = submit_schedule(7, small, ((JobKind.TRAINING, 1),), 20, MONDAY_US, MONDAY_US + DAY_US)
    assert jobs and {j.gpus for j in jobs} == {1, 2}


def test_arrivals_follow_the_working_week():
    jobs = _week()
    by_hour: dict[int, int] = {}
    for j in jobs:
        by_hour[j.submit_us % DAY_US // HOUR_US] = (
            by_hour.get(j.submit_us % DAY_US // HOUR_US, 0) + 1
        )
    weekdays = [j for j in jobs if j.submit_us < MONDAY_US + 5 * DAY_US]
    weekend = [j for j in jobs if j.submit_us >= MONDAY_US + 5 * DAY_US]
    assert sum(by_hour.get(h, 0) for h in (13, 14, 15)) > 3 * sum(
        by_hour.get(h, 0) for h in (2, 3, 4)
    )
    assert len(weekdays) / 5 > 2 * len(weekend) / 2
    assert arrival_pct(MONDAY_US + 14 * HOUR_US) == 100
    assert arrival_pct(MONDAY_US + 5 * DAY_US + 14 * HOUR_US) == 35  # Saturday afternoon
    # the rate is the weekday-afternoon peak: 20 an hour, give or take one
    assert (
        19
        <= len(
            [j for j in jobs if MONDAY_US + 14 * HOUR_US <= j.submit_us < MONDAY_US + 15 * HOUR_US]
        )
        <= 21
    )


@pytest.mark.parametrize(
    ("kind", "queue", "gpus", "minutes", "idle"),
    [
        (JobKind.TRAINING, "training", {1, 2, 4}, (60, 360), False),
        (JobKind.INFERENCE, "inference", {1, 2}, (120, 480), False),
        (JobKind.NOTEBOOK, "dev", {1}, (30, 180), True),
    ],
    ids=["training", "inference", "notebook"],
)
def test_each_kind_has_its_queue_size_and_length(kind, queue, gpus, minutes, idle):
    jobs = _week(mix=((kind, 1),))
    assert jobs and {j.kind for j in jobs} == {kind}
    assert {j.queue for j in jobs} == {queue}
    assert {j.gpus for j in jobs} <= gpus
    assert all(minutes[0] * 60_000_000 <= j.runtime_us < minutes[1] * 60_000_000 for j in jobs)
    assert {j.idle for j in jobs} == {idle}
    assert {(j.team, j.pool) for j in jobs} == {("vision", "h100"), ("search", "a100")}


def test_jobs_in_flight_go_to_the_live_submitter_with_what_is_left_of_their_runtime():
    now = MONDAY_US + 15 * HOUR_US
    jobs = submit_schedule(7, TEAMS, MIX, 20, now - 8 * HOUR_US, now)
    flying = in_flight(jobs, now)
    assert flying and len(flying) < len(jobs)
    assert all(j.submit_us < now < j.submit_us + j.runtime_us for j in flying)
    again = resumed(flying, now)
    assert [j.submit_us + j.runtime_us for j in again] == [
        max(now + 60_000_000, j.submit_us + j.runtime_us) for j in flying
    ]
    body = submit_body(again[0])
    assert body["command"] == ["sleep", str(again[0].runtime_us // 1_000_000)]
    assert (body["queue"], body["pool"], body["gpus"]) == (
        again[0].queue,
        again[0].pool,
        again[0].gpus,
    )


def _source(sample: GpuSample) -> str:
    return f"sim://{sample.node}"


@pytest.fixture(scope="module")
def config() -> TallyConfig:
    return load_config(REPO / "deploy/examples/tally.yaml")


def test_the_collector_meters_what_the_scheduler_placed(config):
    fleet = simulated_fleet(config)
    gpu = fleet.gpus[0]
    view = JobsView(fleet)
    spec = JobSpec("job-1", "vision", "detection", "ada", "dev", 1, 1, 3_600_000_000)
    assigned = GpuAssigned(
        gpu.uuid, gpu.node, gpu.pool, gpu.model, "job-1", "vision", "detection", "ada", 10
    )
    view.apply(encode_job_event(assigned, "tally://scheduler"))  # before its submission
    assert fleet.workload_at(gpu, 20).kind is WorkloadKind.TRAINING
    view.apply(encode_job_event(JobSubmitted(spec=spec, time_us=5), "tally://scheduler"))
    work = fleet.workload_at(gpu, 20)
    assert work.kind is WorkloadKind.NOTEBOOK  # the dev queue: an idle notebook
    assert work.owner is not None and work.owner.job_id == "job-1"
    assert work.owner.team == "vision"
    sample = fleet.sample(gpu, 30)
    assert sample.processes[0].owner == work.owner and sample.util_gpu_pct <= 1
    released = GpuReleased(
        gpu.uuid, gpu.node, gpu.pool, gpu.model, "job-1", "vision", "detection", "ada", 40
    )
    view.apply(encode_job_event(released, "tally://scheduler"))
    assert gpu.uuid not in fleet.jobs
    after = fleet.workload_at(gpu, 50)  # an external notebook, or nothing
    assert after.owner is None or not (after.owner.job_id or "").startswith("job-")


def test_the_backfilled_history_folds_into_queue_waits_team_costs_and_budgets(config, tmp_path):
    end = MONDAY_US + 2 * DAY_US + 15 * HOUR_US  # Wednesday afternoon
    start = end - 2 * DAY_US
    history = simulate_history(config, start, end)
    kinds = {type(m.event).__name__ for m in history.messages}
    assert {"JobSubmitted", "JobAdmitted", "JobStarted", "GpuAssigned", "HoldPlaced"} <= kinds
    assert [m.seq for m in history.messages] == sorted({m.seq for m in history.messages})
    assert all(m.seq < end * 1000 for m in history.messages)

    plan = plan_admin(desired_admin_state(config), AdminView(), "test", "history", start)
    admin = [
        ConsumedMessage("tally.admin", 0, i, encode_admin(admin_envelope(e))[1])
        for i, e in enumerate(plan.events)
    ]
    jobs = [
        ConsumedMessage("tally.jobs", 0, i, m.value, m.key) for i, m in enumerate(history.messages)
    ]
    fleet = history_fleet(config)
    fleet.interval_us = 900_000_000  # coarser than the example's, to keep the test short
    rounds = [
        ConsumedMessage(
            "tally.samples", 0, i, encode_batch([envelope_for(s, f"sim://{s.node}") for s in r])
        )
        for i, r in enumerate(history_samples(fleet, history))
    ]
    with DuckDBStore(tmp_path) as store:
        ingestor = Ingestor(store, "c", config.price_book(), config.organisation.cost_centre_of())
        ingestor.apply(admin)
        ingestor.apply(jobs)
        for i in range(0, len(rounds), 48):
            ingestor.apply(rounds[i : i + 48])
        store.seal()

    rows = job_history.fold_jobs(job_history.read_job_event_log(tmp_path).events)
    assert len(rows) == history.planned
    waits = job_history.daily_queue_waits(rows)
    assert len({w.day_us for w in waits}) >= 2 and any(w.p95_us > 0 for w in waits)
    queries = ReportQueries(tmp_path)
    try:
        report = cost_report(queries, ("team",), period_label(end))
        teams = {line.keys[0]: line for line in report.lines if not line.unallocated}
        assert set(teams) == {t.name for t in config.organisation.teams()}
        assert all(line.money_micros > 0 for line in teams.values())
        by_job = cost_report(queries, ("job_id",), period_label(end))
        assert any(str(line.keys[0]).startswith("sim-") for line in by_job.lines)
        # the recurring budgets are granted for the window's month and burn down
        budget = rollups.team_budget(queries, "vision", period_label(end)).status
        assert budget is not None
        money = budget.line(Unit.MONEY)
        assert money is not None and money.granted >= 25_000_000_000 and money.consumed > 0
    finally:
        queries.close()
