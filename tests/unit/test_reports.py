"""Cost and idle reports over a real sealed ledger, with exact integers (the ledger: the fleet
of `tests.ledger_builders`)."""

from __future__ import annotations

import pytest

from ledger.read.reports import (
    CostLine,
    IdleSharing,
    PoolIdle,
    ReportQueries,
    TeamIdle,
    cost_report,
    idle_report,
    ledger_money_total,
    share_idle,
)
from tests.ledger_builders import NOV, NOV_TOTAL, OCT, build_fleet


@pytest.fixture
def fleet(tmp_path):
    return build_fleet(tmp_path / "ledger").seal()


@pytest.fixture
def queries(fleet):
    q = ReportQueries(fleet)
    yield q
    q.close()


def test_the_fleet_totals_are_what_the_builder_says(queries):
    assert ledger_money_total(queries, NOV) == NOV_TOTAL
    assert ledger_money_total(queries, OCT) == 36_000


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        pytest.param(
            ("team",),
            [
                (("language",), 66_000, 134_000, 0, 0),
                (("vision",), 136_000, 130_000, 18_000, 18_000),
            ],
            id="team",
        ),
        pytest.param(
            ("team", "project"),
            [
                (("language", "pretraining"), 66_000, 134_000, 0, 0),
                (("vision", "segmentation"), 82_000, 82_000, 0, 0),
                (("vision", "detection"), 54_000, 48_000, 18_000, 18_000),
            ],
            id="team-project",
        ),
        pytest.param(
            ("user",),
            [
                (("cy",), 66_000, 134_000, 0, 0),
                (("bob",), 72_000, 72_000, 0, 0),
                (("ada",), 54_000, 48_000, 18_000, 18_000),
                (("dee",), 10_000, 10_000, 0, 0),
            ],
            id="user",
        ),
        pytest.param(
            ("job_id",),
            [
                (("j3",), 66_000, 134_000, 0, 0),
                (("j2",), 72_000, 72_000, 0, 0),
                (("j1",), 54_000, 48_000, 18_000, 18_000),
                (("j4",), 10_000, 10_000, 0, 0),
            ],
            id="job",
        ),
        pytest.param(
            ("cost_centre",),
            [(("nlp",), 66_000, 134_000, 0, 0), (("research",), 136_000, 130_000, 18_000, 18_000)],
            id="cost-centre",
        ),
        pytest.param(
            ("model",),
            [(("A100",), 66_000, 134_000, 0, 0), (("H100",), 136_000, 130_000, 18_000, 18_000)],
            id="model",
        ),
        pytest.param(
            ("pool", "team"),
            [
                (("a100", "language"), 66_000, 134_000, 0, 0),
                (("h100", "vision"), 136_000, 130_000, 18_000, 18_000),
            ],
            id="pool-team",
        ),
    ],
)
def test_cost_by_dimensions(queries, dims, expected):
    report = cost_report(queries, dims, NOV)
    got = [
        (ln.keys, ln.gpu_ms, ln.money_micros, ln.idle_gpu_ms, ln.idle_waste_micros)
        for ln in report.lines
    ]
    assert got == expected
    assert report.consumer_micros == 264_000
    assert (report.unallocated_gpu_ms, report.unallocated_micros) == (3_684_000, 614_001)
    assert report.unshared_micros == 614_001
    assert report.total_micros == NOV_TOTAL


@pytest.mark.parametrize(
    ("period", "expected"),
    [
        pytest.param(OCT, [(("vision",), 36_000, 36_000)], id="october-has-only-its-own-usage"),
        pytest.param(
            None,
            [(("vision",), 172_000, 166_000), (("language",), 66_000, 134_000)],
            id="all-time",
        ),
    ],
)
def test_a_period_selects_what_was_booked_into_it(queries, period, expected):
    report = cost_report(queries, ("team",), period)
    assert [(ln.keys, ln.gpu_ms, ln.money_micros) for ln in report.lines] == expected


@pytest.mark.parametrize(
    ("dims", "sharing", "expected_shares", "unshared"),
    [
        pytest.param(("user",), IdleSharing.NONE, {}, 614_001, id="none"),
        pytest.param(
            ("user",),
            IdleSharing.WEIGHTED,
            # h100's 54,001 by GPU-ms ada 54,000 : bob 72,000 : dee 10,000 (largest remainder:
            # bob and dee take the two spare micro-units); a100's 60,000 all to cy
            {("ada",): 21_441, ("bob",): 28_589, ("dee",): 3_971, ("cy",): 60_000},
            500_000,
            id="weighted-by-user",
        ),
        pytest.param(
            ("user",),
            IdleSharing.EVEN,
            # 54,001 / 3: the spare micro-unit goes to the first row in key order
            {("ada",): 18_001, ("bob",): 18_000, ("dee",): 18_000, ("cy",): 60_000},
            500_000,
            id="even-by-user",
        ),
        pytest.param(
            ("team", "project"),
            IdleSharing.WEIGHTED,
            {
                ("vision", "detection"): 21_442,
                ("vision", "segmentation"): 32_559,
                ("language", "pretraining"): 60_000,
            },
            500_000,
            id="weighted-by-team-project",
        ),
        pytest.param(
            ("team",),
            IdleSharing.EVEN,
            {("vision",): 54_001, ("language",): 60_000},
            500_000,
            id="even-by-team-shares-only-pools-each-used",
        ),
    ],
)
def test_idle_sharing_modes_sum_exactly(queries, dims, sharing, expected_shares, unshared):
    report = cost_report(queries, dims, NOV, sharing)
    shares = {ln.keys: ln.shared_idle_micros for ln in report.lines if ln.shared_idle_micros}
    assert shares == expected_shares
    assert report.unshared_micros == unshared
    own = sum(ln.money_micros for ln in report.lines)
    assert own + sum(shares.values()) + report.unshared_micros == NOV_TOTAL
    for line in report.lines:
        assert line.total_micros == line.money_micros + line.shared_idle_micros


@pytest.mark.parametrize("sharing", list(IdleSharing), ids=str)
@pytest.mark.parametrize(
    "dims",
    [
        ("team",),
        ("project",),
        ("user",),
        ("job_id",),
        ("pool",),
        ("model",),
        ("gpu_uuid",),
        ("team", "user", "job_id"),
    ],
    ids=",".join,
)
def test_sharing_never_changes_the_total(queries, sharing, dims):
    report = cost_report(queries, dims, NOV, sharing, include_unallocated=True)
    assert sum(ln.total_micros for ln in report.lines) == NOV_TOTAL
    assert sum(ln.gpu_ms for ln in report.lines if not ln.unallocated) == 202_000


def test_unshared_idle_appears_as_unallocated_rows_when_asked(queries):
    report = cost_report(queries, ("pool",), NOV, include_unallocated=True)
    got = [(ln.keys, ln.unallocated, ln.gpu_ms, ln.money_micros) for ln in report.lines]
    assert got == [
        (("l4",), True, 3_600_000, 500_000),
        (("a100",), False, 66_000, 134_000),
        (("h100",), False, 136_000, 130_000),
        (("a100",), True, 30_000, 60_000),
        (("h100",), True, 54_000, 54_001),
    ]
    weighted = cost_report(queries, ("team",), NOV, IdleSharing.WEIGHTED, include_unallocated=True)
    assert [ln for ln in weighted.lines if ln.unallocated] == [
        CostLine((None,), 3_600_000, 500_000, 0, 0, 0, True)
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"dims": ("colour",)}, "unknown dimension", id="unknown-dimension"),
        pytest.param({"dims": ()}, "unknown dimension", id="no-dimension"),
        pytest.param({"dims": ("team", "team")}, "repeated", id="repeated-dimension"),
        pytest.param(
            {"dims": ("user",), "where": {"team": "vision"}, "sharing": IdleSharing.EVEN},
            "cannot be filtered",
            id="filtered-sharing",
        ),
        pytest.param({"dims": ("team",), "period": "Nov"}, "not a month", id="bad-period"),
    ],
)
def test_bad_report_requests_are_refused(queries, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cost_report(queries, **kwargs)


def test_where_narrows_to_a_team(queries):
    report = cost_report(queries, ("user",), NOV, where={"team": "vision"})
    assert [(ln.keys, ln.money_micros) for ln in report.lines] == [
        (("bob",), 72_000),
        (("ada",), 48_000),
        (("dee",), 10_000),
    ]


def test_idle_report_keeps_the_two_kinds_apart(queries):
    report = idle_report(queries, NOV)
    assert report.pools == (
        PoolIdle("l4", "L4", 0, 0, 0, 3_600_000, 500_000),
        PoolIdle("a100", "A100", 66_000, 0, 0, 30_000, 60_000),
        # the unallocated h100 transaction is flagged idle: still unallocated, never waste
        PoolIdle("h100", "H100", 136_000, 18_000, 18_000, 54_000, 54_001),
    )
    assert report.teams == (
        TeamIdle("vision", 136_000, 18_000, 18_000),
        TeamIdle("language", 66_000, 0, 0),
    )
    assert (report.unallocated_micros, report.idle_waste_micros) == (614_001, 18_000)
    assert report.pools[2].physical_gpu_ms == 190_000


def test_idle_report_with_sharing_gives_each_team_its_share(queries):
    report = idle_report(queries, NOV, IdleSharing.WEIGHTED)
    assert {t.team: t.shared_unallocated_micros for t in report.teams} == {
        "vision": 54_001,
        "language": 60_000,
    }


def test_an_empty_ledger_reports_nothing(tmp_path):
    q = ReportQueries(tmp_path / "none")
    report = cost_report(q, ("team",), NOV, IdleSharing.WEIGHTED)
    assert (report.lines, report.total_micros, report.unshared_micros) == ((), 0, 0)
    assert idle_report(q, NOV).pools == ()


@pytest.mark.parametrize(
    ("total", "weights", "sharing", "expected"),
    [
        pytest.param(
            10,
            {("a",): 1, ("b",): 1, ("c",): 1},
            IdleSharing.EVEN,
            {("a",): 4, ("b",): 3, ("c",): 3},
            id="even-spare-to-first",
        ),
        pytest.param(
            10,
            {("b",): 1, ("a",): 3},
            IdleSharing.WEIGHTED,
            {("a",): 8, ("b",): 2},
            id="weighted-tie-to-first-in-key-order",
        ),
        pytest.param(
            7,
            {("a",): 0, ("b",): 0},
            IdleSharing.WEIGHTED,
            {("a",): 4, ("b",): 3},
            id="zero-weights-share-evenly",
        ),
        pytest.param(
            9,
            {("a",): -5, ("b",): 5},
            IdleSharing.WEIGHTED,
            {("a",): 0, ("b",): 9},
            id="net-credit-rows-weigh-nothing",
        ),
        pytest.param(
            -5,
            {("a",): 1, ("b",): 1},
            IdleSharing.EVEN,
            {("a",): -2, ("b",): -3},
            id="negative-idle-cost",
        ),
        pytest.param(5, {("a",): 1}, IdleSharing.NONE, {}, id="none-shares-nothing"),
        pytest.param(5, {}, IdleSharing.EVEN, {}, id="nobody-to-share-with"),
        pytest.param(0, {("a",): 1}, IdleSharing.EVEN, {}, id="nothing-to-share"),
        pytest.param(
            5,
            {(None,): 1, ("a",): 1},
            IdleSharing.EVEN,
            {("a",): 3, (None,): 2},
            id="none-keys-sort-last",
        ),
    ],
)
def test_share_idle(total, weights, sharing, expected):
    shares = share_idle(total, weights, sharing)
    assert shares == expected
    if expected:
        assert sum(shares.values()) == total
