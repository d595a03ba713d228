"""`tally report cost|idle|statement` and `tally export focus` from the command line."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, a_config_dict, a_process, an_envelope, an_owner
from tests.conftest import write_config
from tests.ledger_builders import NOV_TOTAL, build_fleet


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    return build_fleet(tmp_path_factory.mktemp("cli") / "ledger").seal()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize(
    "path",
    [("report", "cost"), ("report", "idle"), ("report", "statement"), ("export",),
     ("export", "focus")],
    ids=" ".join,
)  # fmt: skip
def test_help(path):
    result = run(*path, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ["--by", "team,project"],
            "team,project,gpu_hours,cost\n"
            "language,pretraining,0.018,0.134000\n"
            "vision,segmentation,0.023,0.082000\n"
            "vision,detection,0.015,0.048000",
            id="by-team-project",
        ),
        pytest.param(
            ["--by", "team,project", "--idle-sharing", "weighted"],
            "team,project,gpu_hours,cost,shared_idle,total\n"
            "language,pretraining,0.018,0.134000,0.060000,0.194000\n"
            "vision,segmentation,0.023,0.082000,0.032559,0.114559\n"
            "vision,detection,0.015,0.048000,0.021442,0.069442",
            id="weighted-sharing",
        ),
        pytest.param(
            ["--by", "user", "--wide"],
            "user,gpu_hours,cost,idle_gpu_hours,idle_waste,shared_idle,total\n"
            "cy,0.018,0.134000,0.000,0.000000,0.000000,0.134000\n"
            "bob,0.020,0.072000,0.000,0.000000,0.000000,0.072000\n"
            "ada,0.015,0.048000,0.005,0.018000,0.000000,0.048000\n"
            "dee,0.003,0.010000,0.000,0.000000,0.000000,0.010000",
            id="wide-shows-idle-waste",
        ),
        pytest.param(
            ["--by", "pool", "--include-unallocated"],
            "pool,gpu_hours,cost,unallocated\n"
            "l4,1.000,0.500000,yes\n"
            "a100,0.018,0.134000,no\n"
            "h100,0.038,0.130000,no\n"
            "a100,0.008,0.060000,yes\n"
            "h100,0.015,0.054001,yes",
            id="unallocated-rows",
        ),
    ],
)
def test_report_cost_csv(fleet_dir, args, expected):
    result = run(
        "report", "cost", "--data-dir", fleet_dir, "--period", "2026-11", *args, "-o", "csv"
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == expected


def test_report_cost_table_mentions_unshared_idle(fleet_dir):
    result = run("report", "cost", "--data-dir", fleet_dir, "--period", "2026-11")
    assert result.exit_code == 0, result.output
    assert "not shown: 0.61 of unallocated capacity" in result.output


def test_report_cost_rejects_a_repeated_dimension(fleet_dir):
    result = run("report", "cost", "--data-dir", fleet_dir, "--by", "team,team")
    assert result.exit_code == 2
    assert "repeated" in result.output


def test_report_idle_json_keeps_the_kinds_apart(fleet_dir):
    result = run("report", "idle", "--data-dir", fleet_dir, "--period", "2026-11", "-o", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    pools = {(r["pool"], r["model"]): r for r in rows if r["scope"] == "pool"}
    teams = {r["team"]: r for r in rows if r["scope"] == "team"}
    assert pools[("h100", "H100")] == {
        "scope": "pool",
        "pool": "h100",
        "model": "H100",
        "team": None,
        "allocated_gpu_hours": "0.038",
        "idle_gpu_hours": "0.005",
        "idle_waste": "0.018000",
        "unallocated_gpu_hours": "0.015",
        "unallocated_cost": "0.054001",
        "shared_unallocated": None,
    }
    assert teams["vision"]["idle_waste"] == "0.018000"
    assert teams["vision"]["unallocated_cost"] is None
    assert set(pools) == {("h100", "H100"), ("a100", "A100"), ("l4", "L4")}


@pytest.mark.parametrize(
    ("by", "present", "absent"),
    [
        pytest.param("both", ["By pool and GPU model", "By team"], [], id="both"),
        pytest.param("pool", ["By pool and GPU model"], ["By team"], id="pool"),
        pytest.param("team", ["By team"], ["By pool"], id="team"),
    ],
)
def test_report_idle_table(fleet_dir, by, present, absent):
    result = run("report", "idle", "--data-dir", fleet_dir, "--period", "2026-11", "--by", by)
    assert result.exit_code == 0, result.output
    for text in present:
        assert text in result.output
    for text in absent:
        assert text not in result.output


def test_report_idle_csv_with_sharing(fleet_dir):
    result = run(
        "report", "idle", "--data-dir", fleet_dir, "--period", "2026-11", "--by", "team",
        "--idle-sharing", "even", "-o", "csv",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines() == [
        "scope,pool,model,team,allocated_gpu_hours,idle_gpu_hours,idle_waste,"
        "unallocated_gpu_hours,unallocated_cost,shared_unallocated",
        "team,,,vision,0.038,0.005,0.018000,,,0.054001",
        "team,,,language,0.018,0.000,0.000000,,,0.060000",
    ]


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        pytest.param("table", "Statement for team vision, 2026-11 (USD)", id="table"),
        pytest.param("json", '"team": "vision"', id="json"),
        pytest.param("csv", "total,vision,0.037778,0.130000,0.005000,0.018000", id="csv"),
    ],
)
def test_report_statement(fleet_dir, fmt, expected):
    result = run(
        "report", "statement", "--data-dir", fleet_dir, "--team", "vision", "--period", "2026-11",
        "-o", fmt,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert expected in result.output


def test_report_statement_uses_the_configured_currency(fleet_dir, tmp_path):
    config = write_config(
        tmp_path / "c.yaml",
        a_config_dict(ledger={"data_dir": str(fleet_dir), "currency": "EUR"}),
    )
    result = run(
        "report", "statement", "--config", config, "--team", "vision", "--period", "2026-11",
        "-o", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["currency"] == "EUR"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--period", "2026-11"], "Missing option '--team'", id="no-team"),
        pytest.param(["--team", "vision", "--period", "Nov"], "--period:", id="bad-period"),
    ],
)
def test_report_statement_bad_usage_exits_2(fleet_dir, args, message):
    result = run("report", "statement", "--data-dir", fleet_dir, *args)
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("name", "extra", "reader"),
    [
        pytest.param("nov.csv", [], "csv", id="csv-from-suffix"),
        pytest.param("nov.parquet", [], "parquet", id="parquet-from-suffix"),
        pytest.param("nov.out", ["--format", "parquet"], "parquet", id="explicit-format"),
    ],
)
def test_export_focus(fleet_dir, tmp_path, name, extra, reader):
    out = tmp_path / name
    result = run(
        "export", "focus", "--data-dir", fleet_dir, "--period", "2026-11", "--out", out,
        *extra, "-o", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)[0]
    assert summary["rows"] == 11
    assert summary["billed_cost"] == "0.878001"
    assert summary["format"] == reader
    if reader == "parquet":
        billed = sum(pq.read_table(out).column("BilledCost").to_pylist())
    else:
        lines = out.read_text().splitlines()[1:]
        billed = sum(Decimal(line.split(",", 1)[0]) for line in lines)
    assert billed == Decimal(NOV_TOTAL).scaleb(-6)


def test_export_focus_table_summary_and_billing_account(fleet_dir, tmp_path):
    out = tmp_path / "nov.parquet"
    result = run(
        "export", "focus", "--data-dir", fleet_dir, "--period", "2026-11", "--out", out,
        "--billing-account-id", "acme-gpu", "--issuer", "ACME Platform",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote 11 FOCUS 1.2 rows for 2026-11" in result.output
    assert "BilledCost 0.878001 USD" in result.output
    table = pq.read_table(out)
    assert set(table.column("BillingAccountId").to_pylist()) == {"acme-gpu"}
    assert set(table.column("InvoiceIssuerName").to_pylist()) == {"ACME Platform"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--period", "2026-13", "--out", "{tmp}/x.csv"], "--period:", id="bad-month"),
        pytest.param(
            ["--period", "2026-11", "--out", "{tmp}/missing/x.csv"],
            "does not exist",
            id="missing-directory",
        ),
        pytest.param(["--out", "{tmp}/x.csv"], "Missing option '--period'", id="no-period"),
        pytest.param(
            ["--period", "2026-11", "--out", "{tmp}/x.csv", "--format", "xlsx"],
            "Invalid value for '--format'",
            id="bad-format",
        ),
    ],
)
def test_export_focus_bad_usage_exits_2(fleet_dir, tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = run("export", "focus", "--data-dir", fleet_dir, *args)
    assert result.exit_code == 2
    assert message in result.output


def test_export_focus_from_ingested_samples(tmp_path):
    """A ledger written by the real ingest path (samples → attribution → store → seal)."""
    data_dir = tmp_path / "ledger"
    owners = [an_owner(), an_owner(team="language", project="pretraining", user="cy"), None]
    with DuckDBStore(data_dir) as store:
        messages = [
            ConsumedMessage(
                "s",
                0,
                i,
                encode_batch(
                    [
                        an_envelope(
                            sample_time_us=T0_US + (i + 1) * INTERVAL_US,
                            processes=(a_process(owner=owners[i % 3]),),
                        )
                    ]
                ),
            )
            for i in range(9)
        ]
        Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {}).apply(messages)
        store.seal()
    out = tmp_path / "nov.csv"
    result = run("export", "focus", "--data-dir", data_dir, "--period", "2026-11", "--out", out,
                 "-o", "csv")  # fmt: skip
    assert result.exit_code == 0, result.output
    # nine 10-second samples at one micro-unit per GPU-ms: 90,000 µ; one row per owner (one hour)
    assert result.output.strip().splitlines()[1].split(",")[3:6] == ["1.2", "3", "0.090000"]
    header, *rows = out.read_text().splitlines()
    assert header.startswith('"BilledCost","BillingAccountId"')
    assert sorted(Decimal(r.split(",", 1)[0]) for r in rows) == [Decimal("0.030000")] * 3


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        pytest.param("1.2", "InvoiceId", "RegionId", id="focus-1.2"),
        pytest.param("1.0", "RegionId", "InvoiceId", id="focus-1.0"),
    ],
)
def test_export_focus_versions_price_from_the_config(tmp_path, version, present, absent):
    data_dir = tmp_path / "ledger"
    with DuckDBStore(data_dir) as store:
        envelope = an_envelope(sample_time_us=T0_US + INTERVAL_US)
        message = ConsumedMessage("s", 0, 0, encode_batch([envelope]))
        Ingestor(store, "c", PriceBook((Price("*", 3_200_000),)), {}).apply([message])
        store.seal()
    config = write_config(tmp_path / "tally.yaml", a_config_dict())
    out = tmp_path / "nov.parquet"
    result = run("export", "focus", "--config", config, "--data-dir", data_dir, "--period",
                 "2026-11", "--out", out, "--focus-version", version)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"FOCUS {version} rows" in result.output
    table = pq.read_table(out)
    assert present in table.column_names and absent not in table.column_names
    assert table.column("ListUnitPrice").to_pylist() == [Decimal("3.200000")]
    assert table.column("BilledCost").to_pylist() == [Decimal("0.008889")]  # 10 s at 3.20/h


def test_export_of_an_empty_ledger_writes_only_a_header(tmp_path):
    out = tmp_path / "x.csv"
    DuckDBStore(tmp_path / "fresh").close()  # what the worker creates before it seals anything
    result = run("export", "focus", "--data-dir", tmp_path / "fresh", "--period", "2026-11",
                 "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote 0 FOCUS 1.2 rows" in result.output
    assert len(out.read_text().splitlines()) == 1
