"""The seeded ledger the dashboard tests share, and the rollups' figures on it.

`seed_ledger(dir)` builds a real sealed ledger (DuckDBStore + Ingestor): five days from
2026-10-30 to 2026-11-04 (UTC) at 15-minute samples, two pools (h100: four GPUs on two nodes;
a100: two GPUs on one node), two teams in two cost centres, a GPU allocated but idle at the end
(GPU-H1, vision), one unallocated throughout (GPU-H3), an idle episode that ended (GPU-A0,
search), daily jobs, a money budget for vision in 2026-11, and 2026-10 closed.

The scheduler's side goes through the worker's real ingest path, so it lands in the raw-event
archive: quotas (`QuotaSet` on the admin topic) and a jobs-topic history (`job_events()`) for
every job in the samples — submitted a few minutes before its first usage, admitted, started,
finished when its usage ends before the end of the data (job-a1 fails instead) — plus job-v-big
(vision, waiting on its quota), job-s-pre (search, preempted by job-v4 to reclaim lent quota,
waiting again) and job-s-cancel (cancelled while waiting); one message is resent (a duplicate
that must count once) and job-v4 holds part of vision's budget (an open hold).
"""

from __future__ import annotations

import functools
import zlib
from pathlib import Path

import pytest

from ledger.admin import QuotaSet, admin_envelope, encode_admin
from ledger.balances import budget_status
from ledger.closing import ClosedPeriod
from ledger.events import encode_batch
from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
    encode_job_event,
)
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import Price, PriceBook
from ledger.read import job_history, rollups
from ledger.read.balances import sealed_balances
from ledger.read.reports import ReportQueries, cost_report
from ledger.read.rollups.capacity import _weekday
from ledger.store.hot import DuckDBStore
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.port import OffsetRange, SourcedTransaction
from ledger.store.side_files import write_closed_period
from ledger.units import Unit
from tests.builders import T0_US, a_process, an_envelope, an_owner

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
STEP_US = 15 * 60_000_000
START_US = T0_US - 2 * rollups.DAY_US  # 2026-10-30T00:00Z
END_US = T0_US + 3 * rollups.DAY_US  # 2026-11-04T00:00Z
STEPS = (END_US - START_US) // STEP_US
H100_PRICE = 3_600_000  # per GPU-hour
A100_PRICE = 2_000_000
BUDGET_MICROS = 100_000_000
CENTRES = {"vision": "research", "search": "product"}
# gpu, node, pool, model
GPUS = (
    ("GPU-H0", "node-h1", "h100", H100),
    ("GPU-H1", "node-h1", "h100", H100),
    ("GPU-H2", "node-h2", "h100", H100),
    ("GPU-H3", "node-h2", "h100", H100),
    ("GPU-A0", "node-a1", "a100", A100),
    ("GPU-A1", "node-a1", "a100", A100),
)
IDLE_FROM_US = END_US - 6 * rollups.HOUR_US  # GPU-H1 idle for the last six hours
A0_IDLE = (
    T0_US + rollups.DAY_US + 6 * rollups.HOUR_US,
    T0_US + rollups.DAY_US + 12 * rollups.HOUR_US,
)


def _usage(gpu: str, start_us: int) -> tuple[tuple[str, str | None, str, str] | None, int]:
    """(owner as team, project, user, job — or None, utilisation %) of `gpu` at `start_us`."""
    day = (start_us - START_US) // rollups.DAY_US
    half = (start_us - START_US) // (12 * rollups.HOUR_US)
    if gpu == "GPU-H0":
        return ("vision", "detection", "ada", f"job-v{day}"), 80
    if gpu == "GPU-H1":
        util = 0 if start_us >= IDLE_FROM_US else 70
        return ("vision", "segmentation", "ada", "job-notebook"), util
    if gpu == "GPU-H2":
        return ("search", "ranking", "bob", f"job-s{half}"), 60
    if gpu == "GPU-H3":
        return None, 0
    if gpu == "GPU-A0":
        util = 0 if A0_IDLE[0] <= start_us < A0_IDLE[1] else 55
        return ("search", "ranking", "bob", f"job-a{day}"), util
    if start_us >= T0_US:  # GPU-A1
        return ("vision", "detection", "cy", f"job-w{day}"), 90
    return None, 0


JOBS_TOPIC = "tally.jobs"
ADMIN_TOPIC = "tally.admin"
SCHEDULER = "tally://scheduler"
SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US
HOLD_MICROS = 5_000_000  # job-v4's open hold on vision's money budget
PREEMPTED_AT_US = T0_US + 2 * rollups.DAY_US - 2 * SECOND_US  # job-v4 reclaims vision's quota
BIG_SUBMITTED_US = END_US - 3 * rollups.HOUR_US
BIG_NOTE = f"vision uses 2 of its 2 nominal GPUs of {H100} in h100"
PRE_NOTE = f"vision takes back 1 lent GPU of {H100} in h100"
# team, pool, model, nominal GPUs, borrowing limit, lending limit
QUOTAS = (
    ("vision", "h100", H100, 2, 1, 1),
    ("vision", "a100", A100, 1, 0, None),
    ("search", "h100", H100, 1, 1, None),
    ("search", "a100", A100, 1, 1, None),
)
WAITS_MIN = (5, 10, 20, 40, 90)  # queueing delays handed out to the jobs of the samples


@functools.cache
def usage_jobs() -> dict[str, tuple[str, str, str, str, str, str, str, int, int]]:
    """job → (team, project, user, gpu, node, pool, model, first usage start, last usage end)."""
    spans: dict[str, tuple[str, str, str, str, str, str, str, int, int]] = {}
    for step in range(STEPS):
        start = START_US + step * STEP_US
        for gpu, node, pool, model in GPUS:
            owner, _ = _usage(gpu, start)
            if owner is None:
                continue
            team, project, user, job = owner
            assert project is not None
            first = spans[job][7] if job in spans else start
            spans[job] = (team, project, user, gpu, node, pool, model, first, start + STEP_US)
    return spans


def wait_of(job: str) -> int:
    """The queueing delay (submission → start) of a job of the samples."""
    return WAITS_MIN[sorted(usage_jobs()).index(job) % len(WAITS_MIN)] * MINUTE_US


def _spec(job: str, team: str, project: str, user: str, queue: str, gpus: int, **kw) -> JobSpec:
    return JobSpec(job, team, project, user, queue, gpus, **kw)


def job_events() -> list[JobEvent]:
    """The scheduler's events of the seeded ledger, in publication order."""
    events: list[JobEvent] = []
    for job, (team, project, user, gpu, node, pool, model, s, e) in usage_jobs().items():
        queue = "interactive" if job == "job-notebook" else "train" if team == "vision" else "batch"
        submitted = s - wait_of(job)
        spec = _spec(job, team, project, user, queue, 1, submit_us=submitted,
                     estimated_runtime_us=e - s, model=model, pool=pool)  # fmt: skip
        events.append(JobSubmitted(spec, submitted))
        if wait_of(job) >= 20 * MINUTE_US:
            events.append(JobWaiting(job, WaitReason.NO_CAPACITY, submitted + SECOND_US))
        hold = HOLD_MICROS if job == "job-v4" else 0
        admitted = JobAdmitted(
            job, team, queue, pool, model, (gpu,), (node,), priority=0, borrowed_gpus=0,
            preemptible=False, hold_micros=hold, hold_gpu_ms=0, attempt=1, time_us=s - SECOND_US,
        )  # fmt: skip
        events.append(admitted)
        events.append(JobStarted(job, s))
        if job == "job-a1":
            events.append(JobFailed(job, FailReason.EXIT_NONZERO, 1, False, e, exit_code=1))
        elif e < END_US:
            events.append(JobFinished(job, e))
    big = _spec("job-v-big", "vision", "detection", "ada", "train", 4, submit_us=BIG_SUBMITTED_US,
                estimated_runtime_us=8 * rollups.HOUR_US, model=H100, pool="h100")  # fmt: skip
    events += [
        JobSubmitted(big, BIG_SUBMITTED_US),
        JobWaiting("job-v-big", WaitReason.QUOTA_EXHAUSTED, BIG_SUBMITTED_US + SECOND_US, BIG_NOTE),
    ]
    pre_at = PREEMPTED_AT_US - 2 * rollups.HOUR_US
    pre = _spec("job-s-pre", "search", "ranking", "bob", "batch", 1, submit_us=pre_at,
                estimated_runtime_us=6 * rollups.HOUR_US, model=H100, pool="h100")  # fmt: skip
    events += [
        JobSubmitted(pre, pre_at),
        JobAdmitted(
            "job-s-pre",
            "search",
            "batch",
            "h100",
            H100,
            ("GPU-H3",),
            ("node-h2",),
            priority=0,
            borrowed_gpus=1,
            preemptible=True,
            hold_micros=0,
            hold_gpu_ms=0,
            attempt=1,
            time_us=pre_at + MINUTE_US,
        ),
        JobStarted("job-s-pre", pre_at + 2 * MINUTE_US),
        JobPreempted(
            "job-s-pre", "job-v4", PreemptReason.RECLAIM_LENT_QUOTA, PREEMPTED_AT_US, PRE_NOTE
        ),
        JobWaiting("job-s-pre", WaitReason.COHORT_EXHAUSTED, PREEMPTED_AT_US + MINUTE_US),
    ]
    cancel_at = T0_US + 6 * rollups.HOUR_US
    cancel = _spec("job-s-cancel", "search", "ranking", "bob", "batch", 2, submit_us=cancel_at,
                   estimated_runtime_us=rollups.HOUR_US, model=A100, pool="a100")  # fmt: skip
    events += [
        JobSubmitted(cancel, cancel_at),
        JobWaiting("job-s-cancel", WaitReason.NO_CAPACITY, cancel_at + SECOND_US),
        JobFailed("job-s-cancel", FailReason.CANCELLED, 0, False, cancel_at + 2 * rollups.HOUR_US),
    ]
    return sorted(events, key=lambda e: e.time_us)


def _scheduler_messages() -> tuple[list[ConsumedMessage], list[ConsumedMessage]]:
    """The admin messages (quotas) and the jobs-topic messages, as the worker consumes them:
    jobs keyed by job id over two partitions, one message resent, and job-v4's hold."""
    admin = []
    for offset, (team, pool, model, nominal, borrow, lend) in enumerate(QUOTAS):
        quota = QuotaSet(team, pool, model, nominal, borrow, lend, "platform", "seed",
                         START_US - rollups.DAY_US)  # fmt: skip
        key, value = encode_admin(admin_envelope(quota))
        admin.append(ConsumedMessage(ADMIN_TOPIC, 0, offset, value, key))
    values: list[tuple[str, bytes]] = []
    for event in job_events():
        values.append((event.job_id, encode_job_event(event, SCHEDULER)))
        if isinstance(event, JobAdmitted) and event.hold_micros:
            expires = END_US + rollups.DAY_US
            placed = HoldPlaced(
                event.job_id, event.team, "detection", Unit.MONEY, event.hold_micros, expires,
                event.time_us,
            )  # fmt: skip
            values.append((event.job_id, encode_hold(hold_envelope(placed, SCHEDULER))[1]))
    values.append(values[len(values) // 2])  # a resend: the same event at a later offset
    offsets = [0, 0]
    jobs = []
    for job, value in values:
        partition = zlib.crc32(job.encode()) % 2
        jobs.append(ConsumedMessage(JOBS_TOPIC, partition, offsets[partition], value, job.encode()))
        offsets[partition] += 1
    return admin, jobs


def seed_ledger(data_dir: Path) -> Path:
    messages = []
    for step in range(STEPS):
        start = START_US + step * STEP_US
        envelopes = []
        for gpu, node, pool, model in GPUS:
            owner, util = _usage(gpu, start)
            processes = ()
            if owner is not None:
                team, project, user, job = owner
                processes = (a_process(sm=util, owner=an_owner(team, project, user, job)),)
            envelopes.append(
                an_envelope(
                    source=f"sim://{node}",
                    gpu_uuid=gpu,
                    node=node,
                    pool=pool,
                    model=model,
                    util_gpu_pct=util,
                    sample_time_us=start + STEP_US,
                    interval_us=STEP_US,
                    processes=processes,
                )
            )
        messages.append(ConsumedMessage("s", 0, step, encode_batch(envelopes)))
    prices = PriceBook((Price(H100, H100_PRICE), Price(A100, A100_PRICE)))
    admin, jobs = _scheduler_messages()
    with DuckDBStore(data_dir) as store:
        ingestor = Ingestor(store, "c", prices, CENTRES)
        ingestor.apply(admin)
        ingestor.apply(messages)
        half = len(jobs) // 2  # two batches: the archive's order spans batches
        ingestor.apply(jobs[:half])
        ingestor.apply(jobs[half:])
        grant = Transaction(
            txn_id="grant-vision-2026-11",
            kind=TransactionKind.BUDGET_GRANT,
            start_us=T0_US,
            end_us=T0_US + 1,
            gpu_uuid="",
            model="",
            pool="",
            node="",
            postings=(
                Posting(
                    "budget:vision", Unit.MONEY, -BUDGET_MICROS, "vision", cost_centre="research"
                ),
                Posting(
                    "funding:research", Unit.MONEY, BUDGET_MICROS, "vision", cost_centre="research"
                ),
            ),
            cause=("grant-vision-2026-11",),
            period="2026-11",
        )
        store.commit(
            "c", (OffsetRange("admin", 0, 0, 0),), (SourcedTransaction(grant, "admin", 0, 0),)
        )
        store.seal()
    write_closed_period(
        data_dir / SEGMENTS_DIR,
        ClosedPeriod("2026-10", "close-2026-10", T0_US, "finance", "month end", 0, "-"),
    )
    return data_dir


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_ledger(tmp_path_factory.mktemp("seeded") / "ledger")


@pytest.fixture
def q(seeded: Path):
    queries = ReportQueries(seeded)
    yield queries
    queries.close()


def test_extent_lists_what_the_ledger_holds(q, seeded):
    found = rollups.extent(q)
    assert found.periods == ("2026-11", "2026-10")
    assert found.teams == ("search", "vision")
    assert found.pools == ("a100", "h100")
    assert found.newest_us == END_US
    assert rollups.closed_periods(seeded) == ("2026-10",)


def test_cost_table_matches_the_cost_report_and_narrows_by_team_and_pool(q):
    report = cost_report(q, ("team",), "2026-11")
    table = rollups.cost_table(q, "team", rollups.Filters("2026-11"))
    assert {r.key: r.money_micros for r in table.rows} == {
        line.keys[0]: line.money_micros for line in report.lines
    }
    # vision: H0 + H1 (3 days of H100) + A1 (3 days of A100)
    assert {r.key: r.money_micros for r in table.rows}["vision"] == 72 * (
        2 * H100_PRICE + A100_PRICE
    )
    narrowed = rollups.cost_table(q, "project", rollups.Filters("2026-11", "vision", "a100"))
    assert [(r.key, r.money_micros) for r in narrowed.rows] == [("detection", 72 * A100_PRICE)]
    assert narrowed.unallocated_micros == 0  # a100 was fully allocated in November


def test_weighted_sharing_shares_all_idle_capacity_of_used_pools(q):
    table = rollups.cost_table(q, "team", rollups.Filters("2026-11"), rollups.IdleSharing.WEIGHTED)
    assert table.shared_micros == table.unallocated_micros == 72 * H100_PRICE


def test_fleet_now_finds_the_idle_and_the_unallocated_gpu(q):
    now = rollups.fleet_now(q)
    assert now.gpus == 6 and now.busy == 4
    (idle,) = [g for g in now.idle if g.state is rollups.GpuState.ALLOCATED_IDLE]
    assert (idle.gpu_uuid, idle.team, idle.job_id) == ("GPU-H1", "vision", "job-notebook")
    # flagged from the sample that completes the 30-minute grace period: 5.75 h at 3.60/h
    assert idle.since_us == IDLE_FROM_US + STEP_US
    assert idle.money_micros == 23 * STEP_US // 1_000 * H100_PRICE // 3_600_000
    (free,) = [g for g in now.idle if g.state is rollups.GpuState.UNALLOCATED]
    assert (free.gpu_uuid, free.since_us, free.money_micros) == (
        "GPU-H3",
        START_US,
        120 * H100_PRICE,
    )
    assert rollups.fleet_now(q, "a100").idle == ()


def test_budget_burn_forecasts_from_the_run_rate(q):
    (burn,) = rollups.budget_burn(q, "2026-11", END_US, "vision")
    daily = 24 * (2 * H100_PRICE + A100_PRICE)
    assert burn.granted_micros == BUDGET_MICROS
    assert burn.spent_micros == 3 * daily
    assert burn.daily[-1] == (T0_US + 2 * rollups.DAY_US, 3 * daily)
    assert burn.forecast_micros == 30 * daily  # three days of data, same rate to the 30th


def test_forecast_recovers_a_linear_trend_with_weekly_seasonality():
    series = [
        (d * rollups.DAY_US, 100 + 2 * d + (10 if _weekday(d * rollups.DAY_US) >= 5 else 0))
        for d in range(28)
    ]
    found = rollups.forecast_daily([(d, float(v)) for d, v in series], 7)
    assert found is not None
    assert found.slope_per_day == pytest.approx(2, abs=0.2)
    first = found.days[0]
    expected = 100 + 2 * 28 + (10 if _weekday(first) >= 5 else 0)
    assert found.values[0] == pytest.approx(expected, abs=3)
    assert rollups.forecast_daily([(0, 1.0), (rollups.DAY_US, 2.0)]) is None


def test_erlang_c_matches_a_textbook_value_and_sizing_meets_the_target():
    # 10 servers, 8 Erlangs: P(wait) ≈ 0.409 (standard Erlang-C tables)
    assert rollups.erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-3)
    found = rollups.Demand("m", None, 0, 100 * rollups.HOUR_US, 10, 0, 0, 0, 0, 0, 0)
    found = rollups.Demand(
        "m", None, 0, 100 * rollups.HOUR_US, 10, 8 * 100 * 3_600_000, 10 * 100 * 3_600_000,
        400, 400, 400 * 7200, 8 * 100 * 3_600_000,
    )  # fmt: skip
    sizing = rollups.size_for_wait(found, target_hours=0.25)
    assert sizing.load_jobs == pytest.approx(8.0)
    assert sizing.gpus_per_job == pytest.approx(1.0)
    assert sizing.gpus_needed is not None
    needed = sizing.gpus_needed
    assert rollups.wait_quantile_hours(needed, 4.0, 2.0, 0.95) <= 0.25
    assert rollups.wait_quantile_hours(needed - 1, 4.0, 2.0, 0.95) > 0.25


def test_heatmap_and_occupancy_come_from_the_capacity_legs(q):
    cells = rollups.utilisation_heatmap(q, END_US - rollups.HOUR_US, END_US, rollups.HOUR_US)
    util = {c.gpu_uuid: c.util_pct for c in cells}
    assert util == {
        "GPU-H0": 80,
        "GPU-H1": 0,
        "GPU-H2": 60,
        "GPU-H3": 0,
        "GPU-A0": 55,
        "GPU-A1": 90,
    }
    occ = rollups.occupancy(q, T0_US, END_US, END_US - T0_US, "h100")
    assert [(o.allocated_gpu_ms, o.physical_gpu_ms) for o in occ] == [
        (3 * 72 * 3_600_000, 4 * 72 * 3_600_000)
    ]


def test_fleet_now_caps_how_far_back_it_looks(q):
    now = rollups.fleet_now(q, lookback_us=2 * rollups.HOUR_US)
    by_gpu = {g.gpu_uuid: g for g in now.idle}
    assert by_gpu["GPU-H3"].since_capped and by_gpu["GPU-H1"].since_capped
    assert by_gpu["GPU-H3"].since_us == END_US - 2 * rollups.HOUR_US
    assert by_gpu["GPU-H3"].money_micros == 2 * H100_PRICE
    assert not any(g.since_capped for g in rollups.fleet_now(q).idle)


# ---------------------------------------------------------------------- jobs and teams


def test_job_history_is_read_from_the_archived_jobs_topic(q):
    found = rollups.job_history_of(q, JOBS_TOPIC)
    assert found.rows == job_history.fold_jobs(job_events())  # the resend counted once
    _, jobs = _scheduler_messages()
    assert (found.messages, found.undecodable) == (len(jobs), 0)
    assert found.teams == ("search", "vision")
    rows = {r.job_id: r for r in found.rows}
    big = rows["job-v-big"]
    assert (big.state, big.wait_reason, big.wait_detail, big.since_us) == (
        job_history.JobState.WAITING, WaitReason.QUOTA_EXHAUSTED, BIG_NOTE, BIG_SUBMITTED_US,
    )  # fmt: skip
    (stopped,) = rows["job-s-pre"].preemptions
    assert (stopped.by, stopped.time_us) == ("job-v4", PREEMPTED_AT_US)
    assert rows["job-a1"].state is job_history.JobState.FAILED
    assert rollups.job_history_of(q, "not.the.jobs.topic").rows == ()


def test_job_costs_are_the_postings_by_job_id(q):
    costs = rollups.job_costs(q, rollups.Filters("2026-11", "vision"))
    direct = q.rows(
        "SELECT job_id, sum(amount) FROM {postings} WHERE account LIKE 'consumer:%' "
        "AND unit = 'money_micros' AND period = '2026-11' AND team = 'vision' "
        "AND job_id IS NOT NULL GROUP BY job_id"
    )
    assert {c.job_id: c.money_micros for c in costs} == {j: int(m) for j, m in direct}
    assert {c.job_id: c.money_micros for c in costs}["job-notebook"] == 72 * H100_PRICE
    pool = rollups.job_costs(q, rollups.Filters("2026-11", "vision", "a100"))
    assert [c.job_id for c in pool] == ["job-w2", "job-w3", "job-w4"]


def test_team_budget_is_the_balances_projection(q, seeded):
    budget = rollups.team_budget(q, "vision")
    assert (budget.period, budget.current) == ("2026-11", True)
    assert budget.status == budget_status("vision", "2026-11", sealed_balances(seeded))
    assert budget.status is not None
    (money,) = budget.status.lines
    assert (money.granted, money.consumed, money.open_holds) == (
        BUDGET_MICROS, 72 * (2 * H100_PRICE + A100_PRICE), HOLD_MICROS,
    )  # fmt: skip
    assert money.remaining == BUDGET_MICROS - money.consumed - HOLD_MICROS
    october = rollups.team_budget(q, "vision", "2026-10")
    assert (october.period, october.current) == ("2026-10", False)
    assert october.status is not None and october.status.lines[0].granted == 0
    assert rollups.team_budget(q, "search").status is None


def test_team_quotas_come_from_the_admin_log_with_gpus_in_use(q):
    quotas = rollups.team_quotas(q, "vision", JOBS_TOPIC)
    assert quotas.problem is None
    assert [(x.pool, x.nominal_gpus, x.borrowing_limit, x.lending_limit) for x in quotas.lines] == [
        ("a100", 1, 0, None),
        ("h100", 2, 1, 1),
    ]
    # running at the end: job-w4 on a100; job-notebook and job-v4 on h100
    assert [(x.in_use_gpus, x.borrowed_gpus) for x in quotas.lines] == [(1, 0), (2, 0)]
    assert rollups.team_quotas(q, "nobody", JOBS_TOPIC).lines == ()


def test_fair_share_decays_metered_usage_per_quota_gpu(q):
    half_life = rollups.DEFAULT_HALF_LIFE_US
    share = rollups.fair_share(q, END_US, half_life)
    per_posting = q.rows(
        "SELECT team, end_us, amount FROM {postings} "
        "WHERE account LIKE 'consumer:%' AND unit = 'gpu_ms'"
    )
    for row in share.rows:
        exact = sum(
            a * 2.0 ** (-(END_US - e) / half_life) for t, e, a in per_posting if t == row.team
        )
        # decayed from the end of the hour each posting ended in: at most an hour's decay apart
        assert row.decayed_gpu_ms == pytest.approx(exact, rel=1 - 2 ** (-1 / 168))
        assert row.standing == row.decayed_gpu_ms * rollups.STANDING_SCALE // row.weight
    assert [(r.team, r.weight, r.rank) for r in share.rows] == [("vision", 3, 1), ("search", 2, 2)]
    forever = rollups.fair_share(q, END_US, 10**24)
    totals = dict(q.rows(
        "SELECT team, sum(amount) FROM {postings} WHERE account LIKE 'consumer:%' "
        "AND unit = 'gpu_ms' GROUP BY team"
    ))  # fmt: skip
    assert {r.team: r.decayed_gpu_ms for r in forever.rows} == pytest.approx(
        {t: int(v) for t, v in totals.items()}, abs=1
    )


def test_queue_waits_are_submission_to_first_start(q):
    expected: dict[tuple[int, str, str], list[int]] = {}
    for job, (_, _, _, _, _, pool, model, start, _) in usage_jobs().items():
        expected.setdefault((start - start % rollups.DAY_US, pool, model), []).append(wait_of(job))
    pre_start = PREEMPTED_AT_US - 2 * rollups.HOUR_US + 2 * MINUTE_US  # job-s-pre, 2 min
    expected[(T0_US + rollups.DAY_US, "h100", H100)].append(2 * MINUTE_US)
    assert pre_start - pre_start % rollups.DAY_US == T0_US + rollups.DAY_US
    found = rollups.queue_wait_trends(q, JOBS_TOPIC)
    assert {(d.day_us, d.pool, d.model): (d.jobs, d.p50_us, d.p95_us) for d in found} == {
        key: (len(w), job_history.quantile_us(w, 50), job_history.quantile_us(w, 95))
        for key, w in expected.items()
    }
    assert {d.pool for d in rollups.queue_wait_trends(q, JOBS_TOPIC, pool="a100")} == {"a100"}
    seen = rollups.observed_queue_waits(q, JOBS_TOPIC, H100, START_US, END_US)
    h100 = [w for (_, pool, _), waits in expected.items() if pool == "h100" for w in waits]
    assert (seen.started, seen.p95_us) == (len(h100), job_history.quantile_us(h100, 95))
    # still waiting at the end: job-v-big (3 h) and job-s-pre (since its preemption)
    assert (seen.waiting, seen.longest_waiting_us) == (2, END_US - PREEMPTED_AT_US)
