"""The seeded ledger the dashboard tests share, and the rollups' figures on it.

`seed_ledger(dir)` builds a real sealed ledger (LedgerStore + Ingestor): five days from
2026-10-30 to 2026-11-04 (UTC) at 15-minute samples, two pools (h100: four GPUs on two nodes;
a100: two GPUs on one node), two teams in two cost centres, a GPU allocated but idle at the end
(GPU-H1, vision), one unallocated throughout (GPU-H3), an idle episode that ended (GPU-A0,
search), daily jobs, a money budget for vision in 2026-11, and 2026-10 closed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import rollups
from ledger.closing import ClosedPeriod, write_closed_period
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import Price, PriceBook
from ledger.reports import ReportQueries, cost_report
from ledger.store import SEGMENTS_DIR, LedgerStore, OffsetRange, SourcedTransaction
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
    with LedgerStore(data_dir) as store:
        Ingestor(store, "c", prices, CENTRES).apply(messages)
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
        (d * rollups.DAY_US, 100 + 2 * d + (10 if rollups._weekday(d * rollups.DAY_US) >= 5 else 0))
        for d in range(28)
    ]
    found = rollups.forecast_daily([(d, float(v)) for d, v in series], 7)
    assert found is not None
    assert found.slope_per_day == pytest.approx(2, abs=0.2)
    first = found.days[0]
    expected = 100 + 2 * 28 + (10 if rollups._weekday(first) >= 5 else 0)
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
