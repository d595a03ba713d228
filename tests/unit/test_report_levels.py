"""`ledger_money_total` and `idle_report` read the daily rollups (`{daily}`: no hours, far fewer
rows than `{coarse}`) and answer exactly what a scan of the postings answers, per booked period.

One small ledger per zone, written in that zone on the real DuckDB store and sealed: a busy
GPU, an idle one (allocated-but-idle legs) and one nobody holds (unallocated legs), sampled
every 30 minutes from two hours before the first instant of November in Asia/Shanghai
(2026-10-31T16:00Z) to two hours after November's first UTC instant. In Shanghai a UTC day
then holds postings booked into October and into November (the zone's month begins inside
it); in Asia/Kolkata (UTC+05:30) the daily level is read from the postings
(`LedgerQueries._rollup_source`). The expected figures are folded in Python from the posting
rows themselves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.periods import parse_zone
from ledger.pricing import Price, PriceBook
from ledger.read.reports import ReportQueries, idle_report, ledger_money_total
from ledger.store.hot import DuckDBStore
from ledger.store.identity import claim_zone
from ledger.store.rollup_files import DAY_US
from tests.builders import T0_US, a_process, an_envelope, an_owner

HALF_HOUR = 1_800_000_000
B = 1_793_462_400_000_000  # 2026-10-31T16:00:00Z = 2026-11-01T00:00 in Asia/Shanghai
STARTS = range(B - 4 * HALF_HOUR, T0_US + 4 * HALF_HOUR, HALF_HOUR)
PRICES = PriceBook((Price("A100", 7_200_000), Price("H100", 9_000_000)))
GPUS = (  # (GPU, pool, model, owner, utilisation)
    ("GPU-busy", "train", "H100", an_owner("vision", "det", "ada", "job-1"), 90),
    ("GPU-idle", "train", "A100", an_owner("search", "rank", "bob", "job-2"), 0),
    ("GPU-free", "dev", "A100", None, 0),
)


def _ledger(data_dir: Path, zone_name: str) -> Path:
    zone = parse_zone(zone_name)
    claim_zone(data_dir, zone)
    envelopes = [
        an_envelope(
            gpu_uuid=gpu,
            pool=pool,
            model=model,
            util_gpu_pct=util,
            sample_time_us=start + HALF_HOUR,
            interval_us=HALF_HOUR,
            processes=() if owner is None else (a_process(sm=util, owner=owner),),
        )
        for start in STARTS
        for gpu, pool, model, owner, util in GPUS
    ]
    with DuckDBStore(data_dir) as store:
        Ingestor(
            store,
            "c",
            PRICES,
            {},
            topics=OutputTopics("alerts", "dl", None),
            inputs=InputTopics("admin", "jobs"),
            zone=zone,
        ).apply([ConsumedMessage("samples", 0, 0, encode_batch(envelopes))])
        store.seal()
    return data_dir


class Recording(ReportQueries):
    """The real queries, remembering the SQL each read asked for."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.asked: list[str] = []

    def rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        started: tuple[int, int] | None = None,
        booked: str | None = None,
    ) -> list[tuple[Any, ...]]:
        self.asked.append(sql)
        return super().rows(sql, params, started, booked)


@pytest.fixture(scope="module", params=["UTC", "Asia/Shanghai", "Asia/Kolkata"])
def ledger(request, tmp_path_factory) -> tuple[Path, str]:
    return _ledger(tmp_path_factory.mktemp("levels") / "ledger", request.param), request.param


def _scanned(q: ReportQueries, period: str | None) -> tuple[int, dict[Any, list[int]], dict]:
    """(money total, per pool and model, per team) folded from the posting rows."""
    rows = q.rows("SELECT account, unit, amount, idle, period, pool, model, team FROM {postings}")
    money = 0
    pools: dict[Any, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    teams: dict[Any, list[int]] = defaultdict(lambda: [0, 0, 0])
    for account, unit, amount, idle, booked, pool, model, team in rows:
        if period is not None and booked != period:
            continue
        consumer, free = account.startswith("consumer:"), account.startswith("unallocated:")
        if not (consumer or free):
            continue
        if unit == "money_micros":
            money += amount
        in_pool, in_team = pools[(pool, model)], teams[team] if consumer else [0, 0, 0]
        if consumer and unit == "gpu_ms":
            in_pool[0] += amount
            in_team[0] += amount
        if consumer and idle and unit == "gpu_ms":
            in_pool[1] += amount
            in_team[1] += amount
        if consumer and idle and unit == "money_micros":
            in_pool[2] += amount
            in_team[2] += amount
        if free and unit == "gpu_ms":
            in_pool[3] += amount
        if free and unit == "money_micros":
            in_pool[4] += amount
    return money, dict(pools), dict(teams)


PERIODS = [
    pytest.param("2026-10", id="october"),
    pytest.param("2026-11", id="november"),
    pytest.param(None, id="all-time"),
]


@pytest.mark.parametrize("period", PERIODS)
def test_money_total_and_idle_report_from_the_daily_rollups_equal_the_postings(ledger, period):
    data_dir, zone = ledger
    q = Recording(data_dir)
    try:
        money, pools, teams = _scanned(q, period)
        q.asked.clear()
        total = ledger_money_total(q, period)
        report = idle_report(q, period)
        straddled = q.rows(
            f"SELECT max(n) FROM (SELECT count(DISTINCT period) AS n FROM {{daily}} "
            f"GROUP BY start_us // {DAY_US})"
        )[0][0]
    finally:
        q.close()
    assert all("{daily}" in sql and "{coarse}" not in sql for sql in q.asked[:3])
    assert total == money > 0
    assert {
        (p.pool, p.model): [
            p.allocated_gpu_ms,
            p.idle_gpu_ms,
            p.idle_waste_micros,
            p.unallocated_gpu_ms,
            p.unallocated_micros,
        ]
        for p in report.pools
    } == pools
    assert {
        t.team: [t.allocated_gpu_ms, t.idle_gpu_ms, t.idle_waste_micros] for t in report.teams
    } == teams
    assert report.idle_waste_micros > 0 and report.unallocated_micros > 0
    # Shanghai's November begins inside a UTC day: one daily row group holds both months.
    assert (straddled > 1) is (zone != "UTC")
